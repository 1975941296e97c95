"""A django-celery-beat site whose beats keep leaderbeat's state in the site's own
PostgreSQL database (``CELERY_LEADERBEAT_STORE_URL = "django"``), RabbitMQ as the broker:
no Redis process anywhere.

Two ``celery beat`` processes of the test site (tests/support/djangosite) read their
entries from django-celery-beat's tables; one leads, and when it is SIGKILLed the other
rescues and takes over. Every message is read back from a RabbitMQ queue of the test's own.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator

import psycopg
import pytest

from celery_leaderbeat.config import Config
from tests.support.beat import BeatCluster, duplicates, slots_by_entry
from tests.support.djangosite.testing import SETTINGS, migrated
from tests.support.pg_beats import by_pid, holder, pid_of, slot_ms, wait_holder
from tests.support.postgres import postgres_database

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("heavy")]

pytest.importorskip("django_celery_beat", reason="needs the django extra")

APP = "tests.support.djangosite"
DEFAULTS = Config.from_values({"store_url": "postgresql://x", "key_prefix": "p", "node_id": "n"})
TTL = DEFAULTS.lease_ttl


@pytest.fixture
def django_db(monkeypatch) -> Iterator[str]:
    """This test's own PostgreSQL database, migrated, with the ORM pointed at it."""
    with postgres_database("lbdjpg") as name:
        # restored afterwards: later tests' subprocesses must not inherit this site
        monkeypatch.setenv("LB_DJANGO_DB", name)
        monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS)
        with migrated(name):
            yield name


def add_row(name: str, seconds: int) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    PeriodicTask.objects.create(name=name, task="tests.noop", interval=interval)


def steps(slots: list[int]) -> set[int]:
    return {b - a for a, b in itertools.pairwise(sorted(slots))}


def test_two_beats_of_a_django_site_on_its_database_one_leads_and_one_takes_over(
        tmp_path, django_db, amqp_recorder, key_prefix):
    for i in range(3):
        add_row(f"row-{i}", 2)
    conninfo = f"host=127.0.0.1 port=5432 user=postgres dbname={django_db}"
    env = {"LB_DJANGO_DB": django_db, "LB_BROKER_URL": amqp_recorder.url, "LB_PREFIX": key_prefix,
           "DJANGO_SETTINGS_MODULE": "tests.support.djangosite.settings",
           "LB_SETTINGS": json.dumps({"leaderbeat_store_url": "django",
                                      "task_default_queue": amqp_recorder.queue})}
    with BeatCluster(2, env, tmp_path, app_module=APP) as beats:
        node = wait_holder(conninfo, key_prefix, timeout=40)
        amqp_recorder.wait_for(6, timeout=30)
        amqp_recorder.watch(4)
        held = holder(conninfo, key_prefix)
        killed_at = time.time()
        by_pid(beats, pid_of(node)).kill()
        new = wait_holder(conninfo, key_prefix, other_than=node, timeout=TTL + 5)
        amqp_recorder.watch(6)
        messages = amqp_recorder.drain_all()
        logs = beats.logs()
    with psycopg.connect(conninfo) as conn:  # leaderbeat's tables beside the site's
        tables = {row[0] for row in conn.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables")}
    by_row = {str(e): sorted(slot_ms(s) for s in slots)
              for e, slots in slots_by_entry(messages).items()}
    assert held is not None and held[0] == node  # one of two leads; the other stands by
    assert new != node and pid_of(new) in {b.pid for b in beats}
    assert {"leaderbeat.lease", "public.django_celery_beat_periodictask"} <= tables
    assert duplicates(messages) == [], logs[-5000:]
    for i in range(3):
        slots = by_row[f"row-{i}"]
        assert steps(slots) == {2000}, (f"row-{i}", slots, logs[-5000:])  # none missed
        assert slots[-1] > killed_at * 1000 + 2000, "the row goes on after the failover"
    assert "Redis" not in "".join(line for line in logs.splitlines() if "ERROR" in line)
