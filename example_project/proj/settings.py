"""Settings of the example project: Django, django-celery-beat, celery-leaderbeat.

LEADERBEAT_STORE chooses where leaderbeat keeps its state:

- ``redis`` (the default): Redis, also the broker; the site's database is SQLite unless
  POSTGRES_DB is set (for several beats use PostgreSQL: POSTGRES_DB and, if needed,
  POSTGRES_HOST, POSTGRES_PORT, POSTGRES_USER, POSTGRES_PASSWORD);
- ``postgres``: no Redis at all. The site's database is PostgreSQL (POSTGRES_DB,
  ``leaderbeat_example`` unless set) and leaderbeat's state lives in it, in the schema
  ``leaderbeat``; the broker is RabbitMQ unless CELERY_BROKER_URL says otherwise.
"""

import os
from datetime import timedelta
from pathlib import Path

import django
from django.core.exceptions import ImproperlyConfigured

# not named LEADERBEAT_*: Celery reads every setting of that prefix as leaderbeat's own
STORES = ("redis", "postgres")
STORE = os.environ.get("LEADERBEAT_STORE", "redis")
if STORE not in STORES:
    raise ImproperlyConfigured(f"LEADERBEAT_STORE={STORE!r} (environment) must be one of "
                               f"{', '.join(STORES)}")
ON_POSTGRES = STORE == "postgres"

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = True
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",  # the schedule lives in the database, edited in the admin
    "reports",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "proj.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

if ON_POSTGRES or os.environ.get("POSTGRES_DB"):
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("POSTGRES_DB", "leaderbeat_example"),
        "HOST": os.environ.get("POSTGRES_HOST", "127.0.0.1"),
        "PORT": os.environ.get("POSTGRES_PORT", "5432"),
        "USER": os.environ.get("POSTGRES_USER", "postgres"),
        "PASSWORD": os.environ.get("POSTGRES_PASSWORD", ""),
    }}
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SQLITE_PATH", BASE_DIR / "db.sqlite3"),
        # several beats (and workers) write one file: take the write lock when a
        # transaction begins, so a writer waits instead of failing "database is locked"
        "OPTIONS": {"transaction_mode": "IMMEDIATE"} if django.VERSION >= (5, 1) else {},
    }}

# -- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = os.environ.get(
    "CELERY_BROKER_URL",
    "amqp://guest:guest@127.0.0.1:5672//" if ON_POSTGRES else "redis://127.0.0.1:6379/0")
# a queue other than Celery's default, for a site sharing its broker
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_TIMEZONE = TIME_ZONE
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# -- beat: celery-leaderbeat in front of django-celery-beat's DatabaseScheduler ----------------
# Run `celery -A proj beat` on as many machines as you like: one leads, every run is
# sent once. The schedule stays in the database (and the admin); leadership, the
# last slot of every entry and the history live in Redis, or with LEADERBEAT_STORE=postgres
# in the site's own PostgreSQL database (on connections of leaderbeat's own).
CELERY_BEAT_SCHEDULER = "celery_leaderbeat.Scheduler"
CELERY_LEADERBEAT_BASE_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
if ON_POSTGRES:
    CELERY_LEADERBEAT_STORE_URL = "django"  # DATABASES["default"]
else:
    CELERY_LEADERBEAT_REDIS_URL = os.environ.get("LEADERBEAT_REDIS_URL", CELERY_BROKER_URL)
CELERY_LEADERBEAT_KEY_PREFIX = os.environ.get("LEADERBEAT_KEY_PREFIX", "leaderbeat:example")
CELERY_LEADERBEAT_LEASE_TTL = 10  # a crashed leader is replaced within about 11 s
CELERY_LEADERBEAT_CATCHUP = "latest"  # after an outage of every beat: one run per entry

# Static entries: stored as rows by django-celery-beat at start-up, shown in the admin.
CELERY_BEAT_SCHEDULE = {
    "say-hello": {
        "task": "reports.tasks.say_hello",
        "schedule": timedelta(seconds=5),
    },
    "quarter-hourly-report": {
        "task": "reports.tasks.build_report",
        "schedule": "*/15 * * * *",  # cron strings become crontab rows
        "args": ["quarter-hourly"],
    },
    "nightly-digest": {
        "task": "reports.tasks.build_report",
        "schedule": "30 2 * * *",
        "args": ["nightly"],
        "leaderbeat": {"catchup": "skip"},  # leaderbeat's own per-entry options
    },
}
