"""The web view in Django's admin: add ``"celery_leaderbeat.contrib.django_admin"`` to
``INSTALLED_APPS``, migrate (it creates no table, only its permissions), and the admin
index shows *Leaderbeat › Cluster*: the cluster page, the entries, each entry's slots,
and the actions, each behind its own permission. The Celery app is
``celery.current_app`` (the project's, once ``proj/celery.py`` is imported), or the one
the setting ``LEADERBEAT_ADMIN_CELERY_APP`` names (``"proj.celery:app"``)."""
