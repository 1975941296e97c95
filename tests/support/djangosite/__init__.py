"""A minimal Django site with django-celery-beat, for beats that wrap its scheduler.

``celery -A tests.support.djangosite beat -S celery_leaderbeat.Scheduler`` with:

- ``LB_DJANGO_DB``: the PostgreSQL database (on 127.0.0.1:5432, user postgres);
- ``LB_BROKER_URL``, ``LB_REDIS_URL``, ``LB_PREFIX``: broker, leaderbeat Redis, prefix;
- ``LB_BASE_SCHEDULER``: the wrapped class (django-celery-beat's DatabaseScheduler by default).

The Celery app is loaded from Django settings with the ``CELERY`` namespace, as a
Django project does.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.djangosite.settings")

app = Celery("djangosite")
app.config_from_object("django.conf:settings", namespace="CELERY")
