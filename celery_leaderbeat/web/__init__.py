"""An operator's view of the cluster in a browser: the leader and its lease, the nodes,
the entries a page at a time, each entry's slots and why any was missed, and the CLI's
actions. Standalone (``celery -A proj leaderbeat web``), mounted in any WSGI app
(:func:`make_wsgi_app`), or in Django's admin (:mod:`celery_leaderbeat.contrib.django_admin`).
Standard library only."""

from .wsgi import make_wsgi_app

__all__ = ["make_wsgi_app"]
