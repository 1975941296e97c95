"""Wall-clock steps and large catch-ups, in-process, on each store.

A forward step (a VM resumed from suspension, an NTP step) must apply the
catch-up policy instead of firing every slot it jumped over; a backward step
must never re-send a claimed slot. The state is a Redis server of the test's own,
or a PostgreSQL database of its own; the broker a Redis server of its own.
"""

from __future__ import annotations

import logging
import time

import pytest

from celery_leaderbeat.scheduler import LEADER, Scheduler
from tests.support.beat import NOOP, Recorder, duplicates
from tests.support.postgres import HOST, PORT, USER, postgres_database
from tests.test_scheduler import make_app, tick_until


@pytest.fixture(params=["redis", "postgresql"])
def servers(request, make_redis_server):
    """(the store's settings, the broker): Redis or PostgreSQL for the state."""
    broker = make_redis_server()
    if request.param == "redis":
        yield {"leaderbeat_redis_url": make_redis_server().url}, broker
        return
    with postgres_database("steps") as name:
        yield {"leaderbeat_store_url": f"postgresql://{USER}@{HOST}:{PORT}/{name}",
               "leaderbeat_redis_url": None}, broker


def app_of(state: dict, broker, prefix: str, schedule: dict, **settings):
    app = make_app("", broker.url, prefix, schedule, **settings)
    app.conf.update(state)
    return app


def shift_clock(monkeypatch, seconds: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def test_a_forward_clock_step_applies_the_catchup_policy_instead_of_firing_every_slot(
        servers, key_prefix, monkeypatch):
    state, broker = servers
    # Skew tolerance is opened wide so only the step detection is under test (a real
    # forward step usually also moves Redis's host: a suspended VM, say).
    app = app_of(state, broker, key_prefix, {"a": {"task": NOOP, "schedule": 1.0}},
                   leaderbeat_catchup="skip", leaderbeat_max_clock_skew=100_000)
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        tick_until(scheduler, lambda: len(recorder.drain_all()) >= 2)
        shift_clock(monkeypatch, 3600)
        before = len(recorder.messages)
        tick_until(scheduler, lambda: len(recorder.drain_all()) >= before + 2, timeout=10)
        history = scheduler.ledger.history(400)
    finally:
        scheduler.close()
    after_step = recorder.messages[before:]
    assert len(after_step) <= 4, f"{len(after_step)} sends after a 1-hour step: a burst"
    skipped = [h for h in history if h["event"] == "missed" and h["entry"] == "a"]
    assert skipped and skipped[0]["detail"] == "skip"
    listed = sum(1 for h in skipped if h["detail"] == "skip")
    unlisted = sum(int(h["detail"].split()[0]) for h in skipped if "not listed" in h["detail"])
    assert 3590 <= listed + unlisted <= 3601, "every slot jumped over is accounted for"
    assert duplicates(recorder.messages) == []


def test_a_backward_clock_step_never_resends_a_claimed_slot(servers, key_prefix, monkeypatch):
    state, broker = servers
    app = app_of(state, broker, key_prefix, {"a": {"task": NOOP, "schedule": 0.5}},
                 leaderbeat_max_clock_skew=100_000)
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        tick_until(scheduler, lambda: len(recorder.drain_all()) >= 3)
        shift_clock(monkeypatch, -30)
        sent = len(recorder.drain_all())
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            time.sleep(min(scheduler.tick(), 0.1))
        assert len(recorder.drain_all()) <= sent + 1, "slots before the last claim came back"
        monkeypatch.undo()
        tick_until(scheduler, lambda: len(recorder.drain_all()) >= sent + 2)
        assert scheduler.role == LEADER
    finally:
        scheduler.close()
    assert duplicates(recorder.messages) == []


def test_a_catchup_larger_than_max_catchup_sends_the_newest_and_says_so_once(
        servers, key_prefix, caplog):
    state, broker = servers
    schedule = {"a": {"task": NOOP, "schedule": 0.2,
                      "leaderbeat": {"catchup": "all", "max_catchup": 3}}}
    first = Scheduler(app=app_of(state, broker, key_prefix, schedule))
    recorder = Recorder(broker.client())
    tick_until(first, lambda: len(recorder.drain_all()) >= 1)
    first.lease.stop_heartbeat()  # dies without a word: its lease must lapse
    time.sleep(3.2)  # the ttl: about 15 slots come due with no leader
    second = Scheduler(app=app_of(state, broker, key_prefix, schedule))
    try:
        with caplog.at_level(logging.WARNING, logger="celery_leaderbeat"):
            tick_until(second, lambda: second.role == LEADER, timeout=10)
            tick_until(second, lambda: len(recorder.drain_all()) >= 8)
    finally:
        second.close()
    said = [r for r in caplog.records if "more missed slots than max_catchup=3" in r.getMessage()]
    assert len(said) == 1
    assert duplicates(recorder.messages) == []
    capped = [h for h in second.ledger.history(200) if h.get("detail") == "max_catchup"]
    assert len(capped) >= 5
