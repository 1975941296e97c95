"""The test Django site (tests/support/djangosite) for bench/reliability.py's django scenario.

Each run gets its own PostgreSQL database (127.0.0.1:5432, user postgres),
migrated in this process; rows are created and changed through the ORM, as an
admin or a deploy would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.postgres import postgres_database

APP = "tests.support.djangosite"
SETTINGS = "tests.support.djangosite.settings"


@contextmanager
def database() -> Iterator[str]:
    """A fresh, migrated database; the ORM of this process points at it."""
    with postgres_database("lbrel") as name:
        os.environ["LB_DJANGO_DB"] = name
        os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
        import django
        from django.core.management import call_command
        from django.db import connections

        django.setup()
        connections["default"].close()
        connections["default"].settings_dict["NAME"] = name
        call_command("migrate", verbosity=0)
        try:
            yield name
        finally:
            connections.close_all()


def env(name: str, broker_url: str, redis_url: str, prefix: str) -> dict[str, str]:
    return {"LB_DJANGO_DB": name, "LB_BROKER_URL": broker_url, "LB_REDIS_URL": redis_url,
            "LB_PREFIX": prefix, "DJANGO_SETTINGS_MODULE": SETTINGS}


def _every(seconds: float):  # type: ignore[no-untyped-def]
    from django_celery_beat.models import IntervalSchedule

    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    return interval


def add(name: str, seconds: float) -> None:
    from django_celery_beat.models import PeriodicTask

    PeriodicTask.objects.create(name=name, task="tests.noop", interval=_every(seconds))


def change(name: str, seconds: float) -> float:
    """Give row ``name`` a new interval (``save()``); the wall time of the save."""
    from django_celery_beat.models import PeriodicTask

    row = PeriodicTask.objects.get(name=name)
    row.interval = _every(seconds)
    row.save()
    return time.time()
