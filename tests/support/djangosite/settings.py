"""Settings of the test site (see the package docstring); everything from the environment."""

from __future__ import annotations

import json
import os

SECRET_KEY = "test-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("LB_DJANGO_DB", "leaderbeat_test"),
        "HOST": os.environ.get("LB_PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("LB_PGPORT", "5432"),
        "USER": os.environ.get("LB_PGUSER", "postgres"),
    }
}
if os.environ.get("LB_SQLITE"):  # a file path: SQLite instead of PostgreSQL
    import django

    DATABASES["default"] = {"ENGINE": "django.db.backends.sqlite3",
                            "NAME": os.environ["LB_SQLITE"],
                            "OPTIONS": {"timeout": 20}}
    if django.VERSION >= (5, 1):
        # Several processes write one file: a transaction that starts as a reader and then
        # writes cannot wait for the lock (SQLite answers "database is locked" at once, as
        # two beats starting together each adding celery.backend_cleanup did); one that
        # takes the write lock when it begins waits up to the timeout.
        DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

CELERY_BROKER_URL = os.environ.get("LB_BROKER_URL", "memory://")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "celery_leaderbeat.Scheduler"
CELERY_LEADERBEAT_BASE_SCHEDULER = os.environ.get(
    "LB_BASE_SCHEDULER", "django_celery_beat.schedulers:DatabaseScheduler")
CELERY_LEADERBEAT_REDIS_URL = os.environ.get("LB_REDIS_URL")
CELERY_LEADERBEAT_KEY_PREFIX = os.environ.get("LB_PREFIX", "leaderbeat:djangosite")
CELERY_BEAT_SCHEDULE = {
    # a static entry: stored as a row at start-up by every beat, sent once per slot
    "static-cron": {"task": "tests.noop", "schedule": "* * * * *"},
}

# LB_SETTINGS: a JSON object of extra Celery settings, e.g. {"leaderbeat_catchup": "skip"}
for _name, _value in json.loads(os.environ.get("LB_SETTINGS") or "{}").items():
    globals()[f"CELERY_{_name.upper()}"] = _value
