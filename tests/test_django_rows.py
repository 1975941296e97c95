"""django-celery-beat rows in real beats on PostgreSQL: one-offs, re-enabled rows, bookkeeping.

Each test has its own PostgreSQL database (tests/support/postgres.py) and its own Redis
servers; rows change through the ORM while ``celery beat`` processes of the test site
(tests/support/djangosite) run; every message is read back from the broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.beat import REPO_ROOT, BeatProcess, Recorder, duplicates
from tests.support.postgres import postgres_database

pytestmark = pytest.mark.slow

pytest.importorskip("django_celery_beat", reason="needs the django extra")

from tests.support.djangosite.testing import (
    SETTINGS,
    add,
    every,
    follow,
    migrated,
    row,
    slots,
)

APP = "tests.support.djangosite"
UTC = timezone.utc


@pytest.fixture
def site(monkeypatch, make_redis_server, key_prefix):
    """This test's own database (migrated, the ORM on it) and the beats' environment."""
    with postgres_database("lbrows") as name:
        # restored afterwards: later tests' subprocesses must not inherit this site
        monkeypatch.setenv("LB_DJANGO_DB", name)
        monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS)
        with migrated(name):
            state, broker = make_redis_server(), make_redis_server()
            env = {"LB_DJANGO_DB": name, "LB_BROKER_URL": broker.url_for(0),
                   "LB_REDIS_URL": state.url, "LB_PREFIX": key_prefix,
                   "DJANGO_SETTINGS_MODULE": SETTINGS}
            yield env, Recorder(broker.client())


def beat(env, tmp_path, name: str) -> BeatProcess:
    return BeatProcess(APP, env, tmp_path / f"{name}.log")


def status(env) -> dict:
    """``celery -A <site> leaderbeat status --json``, as an operator runs it."""
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "celery", "-A", APP, "leaderbeat", "status",
                           "--json"], cwd=REPO_ROOT, env=full_env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return {row["entry"]: row for row in json.loads(done.stdout)["entries"]}


def test_a_one_off_whose_slot_passed_with_no_beat_running_runs_once_and_a_re_enabled_row_replays_nothing(
        tmp_path, site):
    from django_celery_beat.models import ClockedSchedule

    env, recorder = site
    add("flip", interval=every(2))
    first = beat(env, tmp_path, "first")
    try:
        recorder.wait_for(2, timeout=30)
        # -- disabled for 5 s (two slots fall), then enabled again ---------------------------
        flip = row("flip")
        flip.enabled = False
        flip.save()
        disabled_at = datetime.now(UTC)
        follow(recorder, 5)
        flip = row("flip")
        flip.enabled = True
        flip.save()
        enabled_at = datetime.now(UTC)
        follow(recorder, 5)
        add("listed", interval=every(3600))  # not run yet: listed with its next slot
        rows = status(env)
    finally:
        first.term()  # released: the next beat leads at once
    # -- one-offs due while no beat runs --------------------------------------------------
    clocked_at = datetime.now(UTC) + timedelta(seconds=1)
    add("clocked", clocked=ClockedSchedule.objects.create(clocked_time=clocked_at), one_off=True)
    once = add("one-off", interval=every(2), one_off=True)
    follow(recorder, 4)
    assert not [m for m in recorder.messages if m.entry in ("clocked", "one-off")]
    second = beat(env, tmp_path, "second")
    try:
        # a fresh leader over settled slots holds its catch-up back a loss grace (5.3 s)
        # after it began following the store, which a loaded machine starts late: wait for
        # both one-offs (up to 30 s), then a few seconds more for any second send
        deadline = time.monotonic() + 30
        while (not {"clocked", "one-off"} <= {m.entry for m in recorder.messages}
               and time.monotonic() < deadline):
            follow(recorder, 0.5)
        follow(recorder, 4)
    finally:
        second.term()
    logs = first.log_text() + second.log_text()
    messages = recorder.drain_all()
    flips = slots(messages, "flip")
    print(f"\nflip slots from the disable (s): "
          f"{[round((s - disabled_at).total_seconds(), 2) for s in flips]}; re-enabled at "
          f"{(enabled_at - disabled_at).total_seconds():.2f} s; clocked "
          f"{slots(messages, 'clocked')}, one-off {slots(messages, 'one-off')}")
    assert duplicates(messages) == [], logs[-3000:]
    # the disabled stretch is not replayed: nothing from 2 s after the disable to the re-enable
    replayed = [s for s in flips if disabled_at + timedelta(seconds=2) < s <= enabled_at]
    assert replayed == [], logs[-3000:]
    # and the row starts again once the leader has read it (about a second), from then
    # plus the margin for a restarted entry (max_clock_skew, 2 s), one interval later
    resumed = [s for s in flips if s > enabled_at]
    assert resumed and resumed[0] <= enabled_at + timedelta(seconds=1 + 2 + 2 + 1), flips
    # each one-off ran once, late, at its own slot, then was disabled in the database
    (clocked,) = slots(messages, "clocked")
    assert timedelta(0) <= clocked - clocked_at < timedelta(milliseconds=1), logs[-3000:]
    (sent_once,) = slots(messages, "one-off")
    due = once.date_changed + timedelta(seconds=2)
    assert timedelta(0) <= sent_once - due < timedelta(milliseconds=1)
    assert not row("clocked").enabled and not row("one-off").enabled
    # `leaderbeat status` lists the database rows, with their last and next slots
    assert rows["flip"]["configured"] and rows["flip"]["last_slot"] in {
        s.isoformat() for s in flips}
    assert rows["listed"]["configured"] and rows["listed"]["next_due"] is not None


@pytest.mark.xdist_group("heavy")  # CPU-heavy: never beside another heavy test
def test_the_leader_keeps_sending_while_it_writes_the_run_bookkeeping_of_1200_rows(
        tmp_path, site):
    from django_celery_beat.models import PeriodicTask

    env, recorder = site
    rows = 1200
    interval = every(15)
    PeriodicTask.objects.bulk_create(
        [PeriodicTask(name=f"bulk-{i}", task="tests.noop", interval=interval)
         for i in range(rows)])
    add("heartbeat", interval=every(1))
    add("edited", interval=every(15), args=json.dumps([1]))
    leader = beat(env, tmp_path, "leader")
    try:
        recorder.wait_for(rows, timeout=60)  # the first burst: 1,200 rows to write
        follow(recorder, 1)
        edited = row("edited")
        edited.args = json.dumps([2])
        edited.save()  # a schedule change: every beat re-reads the rows
        edited_at = datetime.now(UTC)
        follow(recorder, 7)
    finally:
        leader.term()
    messages = recorder.drain_all()
    beats = [m for m in messages if m.entry == "heartbeat"
             and edited_at < datetime.fromisoformat(m.slot) <= edited_at + timedelta(seconds=6)]
    worst = max(m.lateness for m in beats)
    sent = len([m for m in messages if m.entry == "bulk-7"])
    print(f"\nheartbeat after the edit: {len(beats)} slots, worst {worst * 1000:.0f} ms late; "
          f"bulk-7 sent {sent}, total_run_count {row('bulk-7').total_run_count}")
    assert duplicates(messages) == []
    assert len(beats) >= 5
    # the write of 1,200 rows' bookkeeping and the re-read of the rows never held up a send
    assert worst < 1.0, leader.log_text()[-3000:]
    # every run counted (written once the leader stopped, at the latest)
    assert row("bulk-7").total_run_count == sent >= 1
    assert row("bulk-7").last_run_at == max(slots(messages, "bulk-7"))
