"""Helpers for tests and benchmarks that drive the test site's rows through the ORM."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from tests.support.recorder import Recorder, slots_by_entry

SETTINGS = "tests.support.djangosite.settings"


@contextmanager
def migrated(name: str) -> Iterator[str]:
    """Point this process's ORM at PostgreSQL database ``name`` and migrate it.

    The caller sets ``LB_DJANGO_DB`` and ``DJANGO_SETTINGS_MODULE`` (the beats read them).
    """
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


def every(seconds: float) -> Any:
    from django_celery_beat.models import IntervalSchedule

    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    return interval


def add(name: str, **fields: Any) -> Any:
    from django_celery_beat.models import PeriodicTask

    fields.setdefault("task", "tests.noop")
    return PeriodicTask.objects.create(name=name, **fields)


def row(name: str) -> Any:
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.get(name=name)


def leader_pid(client: Any, prefix: str) -> int | None:
    raw = client.get("{" + prefix + "}:leader")
    return int(raw.decode().split("|")[0].split(":")[-2]) if raw else None


def follow(recorder: Recorder, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        recorder.drain()
        time.sleep(0.02)


def slots(messages: Any, entry: str) -> list[datetime]:
    return sorted(datetime.fromisoformat(s) for s in slots_by_entry(messages).get(entry, []))


def steps(times: list[datetime]) -> set[float]:
    return {round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(times)}
