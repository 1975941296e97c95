"""Settings and URLs of a Django site with the admin, django-celery-beat and the
leaderbeat admin pages, for tests/test_web_admin.py (which runs it as a real server).
No tests here: pytest collects none from this module.

Environment: ``LB_SQLITE`` (the database file), ``LB_REDIS_URL``, ``LB_PREFIX``.
"""

from __future__ import annotations

import os

from celery import Celery

SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.test_web_admin_site"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "django.contrib.staticfiles",
    "django_celery_beat", "celery_leaderbeat.contrib.django_admin",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages"]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("LB_SQLITE", ":memory:")}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
STATIC_URL = "/static/"
LEADERBEAT_ADMIN_CELERY_APP = "tests.test_web_admin_site:celery_app"

celery_app = Celery("webadmin")
celery_app.conf.update(
    broker_url="memory://", timezone="UTC",
    beat_schedule={"nightly report": {"task": "tests.noop", "schedule": 3600.0}},
    leaderbeat_redis_url=os.environ.get("LB_REDIS_URL", "redis://127.0.0.1:1/0"),
    leaderbeat_key_prefix=os.environ.get("LB_PREFIX", "webadmin"),
)


def __getattr__(name: str) -> list:
    """``urlpatterns``, built when Django first asks (the apps are loaded by then)."""
    if name != "urlpatterns":
        raise AttributeError(name)
    from django.contrib import admin
    from django.urls import path

    return [path("admin/", admin.site.urls)]
