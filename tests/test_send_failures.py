"""One message that cannot be sent fails alone: the entries after it are sent.

A queue key of the wrong type (a string where kombu keeps a list) makes every
publish to that queue fail with WRONGTYPE. Stock beat logs that one entry's
failure at each of its slots and goes on sending the others; so must we, on every
path (the plain one, templates after the claim, claim and enqueue in one step), slot
after slot.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from celery import Celery

from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.send import sender as sender_module
from tests.support.beat import NOOP

HEALTHY = ("e0", "e1", "e2")


#: the send paths on a Redis broker: ``plain``, the reference (Celery builds every message,
#: kombu's ``Producer.batch`` sends it after the claim); ``templates``, after the claim with
#: messages built from kept shapes (leaderbeat's state on another database); ``one_step``,
#: the claim script runs kombu's commands (the state on the broker's own database)
REDIS_PATHS = ["plain", "templates", "one_step"]


@pytest.fixture(params=REDIS_PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The send path a test's scheduler takes."""
    if request.param == "plain":
        monkeypatch.setattr(sender_module, "OPTIMISED", False)
    return str(request.param)


def make_app(broker_url: str, state_url: str | None, prefix: str) -> Celery:
    # every second, so that a few slots pass in a short test (Celery's 300 s beat loop is
    # irrelevant: the test calls tick itself)
    schedule = {name: {"task": NOOP, "schedule": 1.0, "args": [name]} for name in HEALTHY}
    schedule["bad"] = {"task": NOOP, "schedule": 1.0, "options": {"queue": "badq"}}
    app = Celery("proj")
    app.conf.update(broker_url=broker_url, leaderbeat_key_prefix=prefix, timezone="UTC",
                    beat_schedule=schedule)
    if state_url:
        app.conf.leaderbeat_redis_url = state_url
    return app


def failed_slots(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    prefix = f"leaderbeat: could not send {name} for slot "
    return [r.getMessage()[len(prefix):] for r in caplog.records
            if r.getMessage().startswith(prefix)]


def sends_while_bad(scheduler: Scheduler, caplog: pytest.LogCaptureFixture, broker,
                    late: bool) -> None:
    """Tick until the bad entry failed three slots; ``late``: its key turns bad after its
    first message was sent (its shape built), else before any was built."""
    if not late:
        broker.set("badq", "not a list")  # as a user's stray SET on a queue's name
    deadline = time.monotonic() + 20
    while len(failed_slots(caplog, "bad")) < 3:
        assert time.monotonic() < deadline, "the bad entry's failures were never said"
        time.sleep(min(scheduler.tick(), 0.1))
        if late and broker.type("badq") == b"list":
            broker.delete("badq")
            broker.set("badq", "not a list")


@pytest.mark.parametrize("late", [False, True], ids=["bad from the start", "bad once built"])
def test_a_queue_key_of_the_wrong_type_fails_only_its_own_entry_slot_after_slot(
        redis_server, key_prefix, caplog, path, late):
    fast = path == "one_step"  # leaderbeat's state on the broker's database, else another
    app = make_app(redis_server.url_for(0), None if fast else redis_server.url_for(1),
                   key_prefix)
    broker = redis_server.client(db=0)
    caplog.set_level(logging.INFO, logger="celery_leaderbeat")
    scheduler = Scheduler(app=app)
    try:
        sends_while_bad(scheduler, caplog, broker, late)
        assert scheduler._enqueuer is not None and scheduler._enqueuer.path()[0] == (
            "one_step" if fast else "plain")
        unsent = {h["entry"] for h in scheduler.ledger.history(500) if h["event"] == "unsent"}
    finally:
        scheduler.close()
    sent: dict[str, set[str]] = {name: set() for name in HEALTHY}
    for raw in broker.lrange("celery", 0, -1):
        headers = json.loads(raw)["headers"]
        sent[headers["leaderbeat_entry"]].add(headers["leaderbeat_slot"])
    failed = failed_slots(caplog, "bad")
    # every slot at which the bad entry failed, and none of its neighbours' failed
    for name in HEALTHY:
        assert set(failed) <= sent[name], name
        assert failed_slots(caplog, name) == []
    assert unsent == {"bad"}  # what reached the queue is not recorded unsent
    causes = [str(r.exc_info[1]) for r in caplog.records
              if r.exc_info and r.getMessage().startswith("leaderbeat: could not send bad")]
    assert len(causes) == len(failed) and all("WRONGTYPE" in c for c in causes), causes


class Unserialisable:
    """An argument JSON cannot carry: Celery's publish of it fails, and only it."""


def test_a_message_that_cannot_be_built_fails_only_its_own_slot(redis_server, key_prefix,
                                                                caplog, path):
    fast = path == "one_step"  # leaderbeat's state on the broker's database, else another
    app = make_app(redis_server.url_for(0), None if fast else redis_server.url_for(1),
                   key_prefix)
    app.conf.beat_schedule["bad"] = {"task": NOOP, "schedule": 1.0, "args": [Unserialisable()]}
    broker = redis_server.client(db=0)
    caplog.set_level(logging.INFO, logger="celery_leaderbeat")
    scheduler = Scheduler(app=app)
    try:
        deadline = time.monotonic() + 20
        while len(failed_slots(caplog, "bad")) < 2:
            assert time.monotonic() < deadline, "the bad entry's failures were never said"
            time.sleep(min(scheduler.tick(), 0.1))
        assert scheduler._enqueuer is not None and scheduler._enqueuer.path()[0] == (
            "one_step" if fast else "plain")
        unsent = {(h["entry"], h["detail"]) for h in scheduler.ledger.history(500)
                  if h["event"] == "unsent"}
    finally:
        scheduler.close()
    sent: dict[str, set[str]] = {name: set() for name in HEALTHY}
    for raw in broker.lrange("celery", 0, -1):
        headers = json.loads(raw)["headers"]
        sent[headers["leaderbeat_entry"]].add(headers["leaderbeat_slot"])
    for name in HEALTHY:
        assert set(failed_slots(caplog, "bad")) <= sent[name], name
    assert unsent == {("bad", "publish failed")}
