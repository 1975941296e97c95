"""django-celery-beat's database as the wrapper writes and lists it, in-process, on PostgreSQL.

Cheap (no beat process), so it also runs on the oldest django-celery-beat allowed.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.support.postgres import postgres_database

pytest.importorskip("django_celery_beat", reason="needs the django extra")

from tests.support.djangosite.testing import SETTINGS, add, every, migrated, row

UTC = timezone.utc


@pytest.fixture
def db(monkeypatch):
    with postgres_database("lbdb") as name:
        monkeypatch.setenv("LB_DJANGO_DB", name)
        monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS)
        with migrated(name):
            yield name


def test_run_bookkeeping_is_written_as_increments_one_statement_per_1000_rows(db):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    from celery_leaderbeat.integrations.djangoio import Bookkeeping

    interval = every(60)
    PeriodicTask.objects.bulk_create(
        [PeriodicTask(name=f"r{i}", task="t", interval=interval) for i in range(1200)])
    pks = list(PeriodicTask.objects.order_by("pk").values_list("pk", flat=True))
    books = Bookkeeping(PeriodicTask)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for pk in pks:
        books.ran(pk, t0)
    books.ran(pks[0], t0 + timedelta(seconds=60))
    # an admin's edit between the send and the write is not overwritten; the count is added
    first = PeriodicTask.objects.get(pk=pks[0])
    first.total_run_count, first.description = 5, "edited"
    first.save()
    changed_before = PeriodicTasks.last_change()
    with CaptureQueriesContext(connection) as queries:
        assert books.flush() == 1200
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 2, [u[:80] for u in updates]  # 1,200 rows, 1,000 per statement
    first.refresh_from_db()
    assert (first.total_run_count, first.description) == (7, "edited")
    assert first.last_run_at == t0 + timedelta(seconds=60)
    assert PeriodicTask.objects.get(pk=pks[1]).total_run_count == 1
    assert PeriodicTasks.last_change() == changed_before  # no beat re-reads for a run
    assert books.pending() == 0 and books.flush() == 0


def test_a_disabled_one_off_is_off_with_its_count_reset_and_every_beat_told(db):
    from django_celery_beat.models import PeriodicTasks

    from celery_leaderbeat.integrations.djangoio import Bookkeeping

    once = add("once", interval=every(5), one_off=True)
    before = PeriodicTasks.last_change()
    books = Bookkeeping(type(once))
    books.disable(once.pk, "one-off: sent")
    assert books.flush() == 1
    once.refresh_from_db()
    assert (once.enabled, once.total_run_count, once.last_run_at) == (False, 0, None)
    assert PeriodicTasks.last_change() > before


def test_the_cli_lists_the_enabled_rows_with_their_own_slots(db):
    from celery import Celery
    from django_celery_beat.schedulers import DatabaseScheduler

    from celery_leaderbeat.integrations.django import database_rows

    add("hourly", interval=every(3600))
    add("off", interval=every(5), enabled=False)
    add("clocked-done", interval=every(5), one_off=True, total_run_count=1)
    app = Celery(set_as_current=False)
    rows = database_rows(app, DatabaseScheduler)
    assert set(rows) == {"hourly"}
    saved = row("hourly").date_changed
    clock = rows["hourly"]["schedule"].leaderbeat_clock(name="hourly", tz=UTC, jitter=None)
    assert clock.next_after(saved - timedelta(seconds=1)) > saved  # nothing before its save


def test_a_changed_table_is_read_row_by_row_only_where_date_changed_moved(db):
    from celery import Celery

    from celery_leaderbeat import Scheduler

    add("a", interval=every(60))
    add("b", interval=every(60))
    app = Celery(set_as_current=False)
    app.conf.update(leaderbeat_redis_url="redis://127.0.0.1:9/0",  # never connected here
                    leaderbeat_base_scheduler="django_celery_beat.schedulers:DatabaseScheduler")
    scheduler = Scheduler(app=app)
    adapter = scheduler.adapter
    first = adapter.read()
    assert {"a", "b"} <= set(first)
    assert adapter.read() is None  # nothing changed: one query of the change marker
    a = row("a")
    a.args = "[1]"
    a.save()
    second = adapter.read()
    assert second["a"] is not first["a"] and second["a"].args == [1]
    assert second["b"] is first["b"]  # not built again
    row("b").delete()
    assert "b" not in adapter.read()
