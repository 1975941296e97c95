"""django-celery-beat's DatabaseScheduler wrapped by leaderbeat, on PostgreSQL, in real beats.

Three ``celery beat`` processes of a small Django site (tests/support/djangosite) share
one database and one Redis. Rows are added, disabled and changed through the ORM while
they run, and the leader is SIGKILLed; every message is read back from the broker by
its slot header.
"""

from __future__ import annotations

import itertools
import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.beat import BeatCluster, Recorder, duplicates, slots_by_entry
from tests.support.djangosite.testing import SETTINGS, migrated
from tests.support.postgres import postgres_database

pytestmark = pytest.mark.slow

pytest.importorskip("django_celery_beat", reason="needs the django extra")

APP = "tests.support.djangosite"
UTC = timezone.utc
#: django-celery-beat's own refresh time (its max_interval), then a rescue's delay and a poll
REFRESH, RESCUE_AFTER = 5.0, 2.0
SETTLE = REFRESH + RESCUE_AFTER + 1.0


@pytest.fixture
def django_db(monkeypatch):
    """This test's own PostgreSQL database, migrated, with the ORM pointed at it."""
    with postgres_database("lbdjango") as name:
        # restored afterwards: later tests' subprocesses must not inherit this site
        monkeypatch.setenv("LB_DJANGO_DB", name)
        monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS)
        with migrated(name):
            yield name


def every(seconds: float):
    from django_celery_beat.models import IntervalSchedule

    interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
    return interval


def add(name: str, **fields):
    from django_celery_beat.models import PeriodicTask

    fields.setdefault("task", "tests.noop")
    return PeriodicTask.objects.create(name=name, **fields)


def leader_pid(client, prefix: str) -> int | None:
    raw = client.get("{" + prefix + "}:leader")
    return int(raw.decode().split("|")[0].split(":")[-2]) if raw else None


def follow(recorder: Recorder, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        recorder.drain()
        time.sleep(0.02)


def slots(messages, entry: str) -> list[datetime]:
    return sorted(datetime.fromisoformat(s) for s in slots_by_entry(messages).get(entry, []))


def steps(times: list[datetime]) -> set[float]:
    return {round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(times)}


def test_rows_changed_through_the_orm_reach_the_leader_and_no_slot_is_sent_twice(
        tmp_path, make_redis_server, key_prefix, django_db):
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    state, broker = make_redis_server(), make_redis_server()
    add("steady", interval=every(2))
    add("to-disable", interval=every(2))
    add("to-change", interval=every(2), args=json.dumps([1]))
    env = {"LB_DJANGO_DB": django_db, "LB_BROKER_URL": broker.url_for(0),
           "LB_REDIS_URL": state.url, "LB_PREFIX": key_prefix,
           "DJANGO_SETTINGS_MODULE": "tests.support.djangosite.settings"}
    recorder, client = Recorder(broker.client()), state.client()
    with BeatCluster(3, env, tmp_path, app_module=APP) as cluster:
        recorder.wait_for(4, timeout=30)
        # -- changes through the ORM, while three beats run ------------------------------
        changed_at = datetime.now(UTC)
        add("added", interval=every(2))
        row = PeriodicTask.objects.get(name="to-disable")
        row.enabled = False
        row.save()
        row = PeriodicTask.objects.get(name="to-change")
        row.interval, row.args = every(3), json.dumps([2])
        row.save()
        add("one-off", interval=every(2), one_off=True)
        clocked_at = changed_at + timedelta(seconds=12)
        add("clocked", clocked=ClockedSchedule.objects.create(clocked_time=clocked_at),
            one_off=True)
        starts_at = changed_at + timedelta(seconds=14)
        add("starts-later", interval=every(2), start_time=starts_at)
        expires_at = changed_at + timedelta(seconds=11)
        add("expires", interval=every(2), expires=expires_at)
        follow(recorder, 10)
        # -- the leader is killed --------------------------------------------------------
        old = leader_pid(client, key_prefix)
        killed_at = time.monotonic()
        killed_wall = datetime.now(UTC)
        next(b for b in cluster if b.pid == old).kill()
        while leader_pid(client, key_prefix) in (None, old):
            recorder.drain()
            assert time.monotonic() - killed_at < 15, "no new leader"
            time.sleep(0.02)
        takeover = time.monotonic() - killed_at
        follow(recorder, 8)
        # -- a graceful stop of the new leader writes last_run_at before it lets go -------
        new = leader_pid(client, key_prefix)
        leader = next(b for b in cluster if b.pid == new)
        leader.term()
        follow(recorder, 1)
        logs = cluster.logs()
    messages = recorder.messages
    by = {name: slots(messages, name) for name in (
        "steady", "to-disable", "to-change", "added", "one-off", "clocked", "starts-later",
        "expires")}
    late = [m.lateness for m in messages]
    rescued = [m for m in messages if m.epoch == 0]
    change_args = {tuple(m.args) for m in messages if m.entry == "to-change"
                   and datetime.fromisoformat(m.slot) > changed_at + timedelta(seconds=SETTLE)}
    first_added = by["added"][0] if by["added"] else None
    print(f"\ndjango-celery-beat/PostgreSQL, 3 beats: {len(messages)} messages, "
          f"{len(duplicates(messages))} duplicate slots; new leader {takeover:.2f} s after "
          f"SIGKILL, {len(rescued)} slots rescued meanwhile; worst lateness {max(late):.2f} s; "
          f"'added' first slot {(first_added - changed_at).total_seconds():.2f} s after its "
          f"save, {len(by['added'])} slots; 'to-disable' last slot "
          f"{(by['to-disable'][-1] - changed_at).total_seconds():+.2f} s from the save; "
          f"'to-change' steps {sorted(steps(by['to-change']))}; one-off {len(by['one-off'])}, "
          f"clocked {len(by['clocked'])}, starts-later first "
          f"{(by['starts-later'][0] - starts_at).total_seconds() if by['starts-later'] else None}"
          f" s after start_time, expires last "
          f"{(by['expires'][-1] - expires_at).total_seconds():+.2f} s from expires")
    assert duplicates(messages) == [], logs[-4000:]
    # the new row: once per slot, every 2 s from its first, across the kill (rescue)
    assert first_added is not None and first_added > changed_at
    assert (first_added - changed_at).total_seconds() < REFRESH + 2 + 2 + 1
    assert steps(by["added"]) == {2.0}, by["added"]
    assert by["added"][-1] > killed_wall
    # the disabled row stops within django-celery-beat's refresh time
    assert all(s < changed_at + timedelta(seconds=SETTLE) for s in by["to-disable"])
    # the changed row follows its new interval and arguments
    assert change_args == {(2,)}
    later = [s for s in by["to-change"] if s > changed_at + timedelta(seconds=SETTLE)]
    assert len(later) >= 4 and steps(later) == {3.0}, by["to-change"]
    # the steady row never missed a slot, leader killed or not
    assert steps(by["steady"]) == {2.0}, by["steady"]
    # one-off and clocked: one run each, then disabled in the database by the leader
    assert len(by["one-off"]) == 1 and len(by["clocked"]) == 1
    assert timedelta(0) <= by["clocked"][0] - clocked_at < timedelta(milliseconds=1)
    assert not PeriodicTask.objects.get(name="one-off").enabled
    assert not PeriodicTask.objects.get(name="clocked").enabled
    # start_time: nothing before it, then its interval; expires: nothing at or after it
    assert by["starts-later"] and timedelta(0) <= by["starts-later"][0] - starts_at < timedelta(
        milliseconds=1)
    assert steps(by["starts-later"]) <= {2.0}
    assert by["expires"] and all(s < expires_at for s in by["expires"])
    assert not PeriodicTask.objects.get(name="expires").enabled
    # the leader that stopped gracefully wrote last_run_at and total_run_count; the count
    # has every run, the standbys' rescues too, less what the killed leader had not written
    # yet (its database thread writes about once a second: one or two runs of a 2 s row)
    steady = PeriodicTask.objects.get(name="steady")
    assert steady.last_run_at is not None and steady.last_run_at in by["steady"]
    assert len(by["steady"]) - 2 <= steady.total_run_count <= len(by["steady"])
    assert {m.epoch for m in rescued if m.entry == "steady"}, "a rescue was counted"
