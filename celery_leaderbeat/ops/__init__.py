"""Operations: the ``celery leaderbeat`` command, the cluster view, metrics and signals."""
