"""The one-step path (claim and enqueue) under faults and routing changes, against real Redis.

Faults are injected at named call sites through :mod:`tests.faults.seam`: a claim
whose reply is lost ran in Redis all the same.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery, signals
from kombu import Connection, Exchange, Queue

import celery_leaderbeat.scheduler as scheduler_module
from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.send import sender as sender_module
from celery_leaderbeat.send.one_step import one_step_fallback
from celery_leaderbeat.send.routing import Routes
from celery_leaderbeat.send.sender import Enqueuer
from celery_leaderbeat.store.errors import StoreError
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.redis_store import redis_store
from celery_leaderbeat.store.types import ClaimItem, Code, Op, SlotStatus
from tests.faults.seam import AFTER, BEFORE, Seam, faulty_client
from tests.support.beat import NOOP

#: a leader's claim of a chunk in a batch
BATCH_CLAIM = "EVALSHA[lead] ledger.claim<chunk.lead"


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


def make_app(broker_url: str, prefix: str, schedule: dict, **settings: Any) -> Celery:
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url=broker_url, leaderbeat_key_prefix=prefix, beat_schedule=schedule,
                    timezone="UTC", leaderbeat_standby_poll=0.2, **settings)
    return app


def tick_until(scheduler: Scheduler, condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(min(scheduler.tick(), 0.1))


def messages(client: Any, key: str) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(key, 0, -1)]


@contextmanager
def faulted(monkeypatch: pytest.MonkeyPatch, seam: Seam) -> Iterator[None]:
    """Schedulers made inside reach their Redis through ``seam``."""
    def connect(config: Any) -> Any:
        client = faulty_client(seam, config.node_id, config.redis_url, config.redis_options,
                               config.store_timeout)
        return redis_store(client, Keys(config.key_prefix), config)

    monkeypatch.setattr(scheduler_module, "open_store", connect)
    yield


@contextmanager
def published_signals() -> Iterator[tuple[list[str], list[str]]]:
    """(entries before_task_publish fired for, entries after_task_publish fired for)."""
    before: list[str] = []
    after: list[str] = []

    def on_before(headers: Any = None, **_: Any) -> None:
        before.append(headers["leaderbeat_entry"])

    def on_after(headers: Any = None, **_: Any) -> None:
        after.append(headers["leaderbeat_entry"])

    signals.before_task_publish.connect(on_before, weak=False)
    signals.after_task_publish.connect(on_after, weak=False)
    try:
        yield before, after
    finally:
        signals.before_task_publish.disconnect(on_before)
        signals.after_task_publish.disconnect(on_after)


def slots_of(client: Any, key: str) -> list[str]:
    return sorted(m["headers"]["leaderbeat_slot"] for m in messages(client, key))


# -- after_task_publish when a claim's reply is lost ---------------------------------------

@contextmanager
def published_slots() -> Iterator[list[str]]:
    """The ``leaderbeat_slot`` of every message ``after_task_publish`` fired for."""
    after: list[str] = []

    def on_after(headers: Any = None, **_: Any) -> None:
        after.append(headers["leaderbeat_slot"])

    signals.after_task_publish.connect(on_after, weak=False)
    try:
        yield after
    finally:
        signals.after_task_publish.disconnect(on_after)


@contextmanager
def lost_reply_and_lease(redis_server: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch,
                         seam: Seam) -> Iterator[tuple[Scheduler, list[str]]]:
    """A leader whose first chunk claim ran (its slot enqueued, its 'sent' event written)
    and whose reply was lost, then its lease deleted, so no retry of that claim comes;
    (the scheduler, the slots after_task_publish fired for, filled as it runs)."""
    seam.aim(BATCH_CLAIM, AFTER, occurrence=1)
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 1.0}})
    client = redis_server.client()
    with published_slots() as after, faulted(monkeypatch, seam):
        scheduler = Scheduler(app=app)
        try:
            tick_until(scheduler, lambda: seam.injected())
            assert client.llen("celery") == 1  # the lost reply's slot went out
            client.delete(Keys(key_prefix).leader)
            yield scheduler, after
        finally:
            scheduler.close()


def test_a_slot_enqueued_by_a_claim_whose_reply_was_lost_fires_after_task_publish_once(
        redis_server, key_prefix, monkeypatch, caplog):
    """The claim script enqueued the slot and wrote its 'sent' event; the reply was lost,
    and the lease with it: the next leader (this node again, a new epoch) never asks for
    that slot again. after_task_publish still fires for it, once."""
    client = redis_server.client()
    with lost_reply_and_lease(redis_server, key_prefix, monkeypatch, Seam()) as (scheduler,
                                                                                after):
        tick_until(scheduler, lambda: client.llen("celery") >= 3, timeout=40)
        history = scheduler.ledger.history(100)
    epochs = {e["epoch"] for e in history if e.get("event") == "sent"}
    assert len(epochs) == 2, "the slots after the lost reply must go out under a new epoch"
    queued = slots_of(client, "celery")
    assert len(set(queued)) == len(queued)
    assert sorted(after) == queued  # once for every message that reached the broker


def test_a_lost_replys_slot_still_fires_after_task_publish_when_its_first_read_back_failed(
        redis_server, key_prefix, monkeypatch):
    """As above, the node now a standby, and the read of what the lost claim enqueued
    fails when its first rescue batch starts: the rescue's chunk goes on, and the slot is
    read again when the next batch starts, not dropped; after_task_publish fires once."""
    seam = Seam()
    client = redis_server.client()
    with lost_reply_and_lease(redis_server, key_prefix, monkeypatch, seam) as (scheduler,
                                                                              after):
        enqueuer = scheduler._enqueuer
        assert enqueuer is not None and enqueuer.unanswered
        name, slot, _, _ = enqueuer.unanswered[0]
        seam.aim("ledger.load<sender.Enqueuer.settle", BEFORE, occurrence=1)
        rescue = scheduler.chunk_sender(0)  # a rescue batch starts: its read fails
        assert rescue is not None and rescue.prepare([(name, slot)]) == [None]
        assert after == []
        scheduler.chunk_sender(0)  # the next batch: read again
    faults = [call.label for call in seam.injected()]
    assert len(faults) == 2 and "Enqueuer.settle" in faults[1], faults
    assert after == slots_of(client, "celery")  # once, for the one message at the broker


# -- a claim retried with other broker commands than its first attempt ----------------------

@pytest.fixture
def flaky_build(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """While ``flaky["failing"]``, building a message fails (the connection the messages are
    built on dropped): the claim then carries no broker commands for it."""
    flaky = {"failing": False}
    real = Enqueuer.build

    def build(self: Enqueuer, *args: Any, **kwargs: Any) -> Any:
        if flaky["failing"]:
            raise ConnectionError("the broker connection dropped")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Enqueuer, "build", build)
    return flaky


def run_with_lost_claim_reply(redis_server: Any, key_prefix: str, monkeypatch: Any,
                              flaky: dict[str, bool], *, fail_first: bool
                              ) -> tuple[list[str], list[str], list[dict]]:
    """A leader whose first chunk claim ran but whose reply was lost; its build of messages
    fails for the first attempt (``fail_first``) or for the retry. Returns the slots
    queued, the slots after_task_publish fired for, and the history."""
    seam = Seam()
    seam.aim(BATCH_CLAIM, AFTER, occurrence=1)
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 1.0}})
    client = redis_server.client()
    flaky["failing"] = fail_first
    with published_slots() as after, faulted(monkeypatch, seam):
        scheduler = Scheduler(app=app)
        try:
            tick_until(scheduler, lambda: seam.injected())
            flaky["failing"] = not fail_first
            time.sleep(scheduler.tick())  # the retry
            flaky["failing"] = False
            tick_until(scheduler, lambda: len(scheduler.ledger.history(100)) >= 5)
            history = scheduler.ledger.history(100)
        finally:
            scheduler.close()
    return slots_of(client, "celery"), sorted(after), history


def test_a_retried_claim_carrying_commands_its_first_attempt_lacked_sends_the_slot(
        redis_server, key_prefix, monkeypatch, flaky_build, caplog):
    """The first attempt claimed the slot without commands (its message could not be
    built), and its reply was lost; the retry carries the commands. It is this leader's own
    claim: granted again and enqueued, not refused as "already claimed" and lost."""
    queued, after, history = run_with_lost_claim_reply(redis_server, key_prefix, monkeypatch,
                                                       flaky_build, fail_first=True)
    first = min(int(e["slot"]) for e in history if e.get("slot"))
    assert not [e for e in history if "already claimed" in e.get("detail", "")]
    sent = sorted(int(e["slot"]) for e in history if e.get("event") == "sent")
    assert sent[0] == first and len(sent) == len(set(sent))
    assert len(queued) == len(set(queued)) == len(sent)  # each slot queued once
    assert after == queued


def test_a_retried_claim_without_the_commands_its_first_attempt_ran_is_told_it_was_sent(
        redis_server, key_prefix, monkeypatch, flaky_build, caplog):
    """The first attempt enqueued the slot in the claim step, and its reply was lost; the
    retry carries no commands (its message could not be built). It is answered "enqueued
    before": nothing is refused or recorded skipped, the slot is queued once, and
    after_task_publish fires once for it."""
    queued, after, history = run_with_lost_claim_reply(redis_server, key_prefix, monkeypatch,
                                                       flaky_build, fail_first=False)
    assert not [e for e in history if e.get("event") == "skipped"]
    sent = sorted(int(e["slot"]) for e in history if e.get("event") == "sent")
    assert len(sent) == len(set(sent)) >= 2
    assert len(queued) == len(set(queued)) == len(sent)
    assert after == queued


# -- a broker command that would fail inside the claim script ---------------------------

def test_a_claim_whose_state_write_would_fail_writes_nothing_and_once_mended_enqueues_once(
        redis_server, key_prefix):
    """A state key of the wrong type (the history stream) fails a write inside the claim
    script. Redis does not roll a script back: checked before the first write, the claim
    writes nothing, says which key, and the slot is granted and enqueued once the key is
    mended, never stored sent with no message or no history event."""
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 60.0}})
    client = redis_server.client()
    scheduler = Scheduler(app=app)
    try:
        ledger, lease = scheduler.ledger, scheduler.lease
        assert lease.try_acquire()
        token, epoch = lease.credentials()
        key = scheduler.keys.history
        client.delete(key)
        client.hset(key, "not", "a stream")
        generation = client.get(scheduler.keys.generation)
        item = ClaimItem("a", 2000, Op.CLAIM, 2000, enqueue=(("lpush", "q", "payload"),))
        with pytest.raises(StoreError, match=f"{key} holds a hash.*nothing was written"):
            ledger.claim(token, epoch, [item])
        assert "a" not in ledger.load()
        assert client.llen("q") == 0
        assert client.get(scheduler.keys.generation) == generation
        client.delete(key)  # mended
        assert ledger.claim(token, epoch, [item]) == [Code.GRANTED]
        assert client.lrange("q", 0, -1) == [b"payload"]
        assert ledger.load()["a"].state == SlotStatus.SENT
        assert [e["slot"] for e in ledger.history() if e["event"] == "sent"] == ["2000"]
    finally:
        scheduler.close()


def test_a_claim_whose_queue_is_not_a_list_grants_that_slot_alone_without_enqueueing_it(
        redis_server, key_prefix):
    """The queue a message goes to holds a hash: the LPUSH would fail inside the script
    after the slot was stored sent. That claim is granted without its commands (stored
    claimed, not sent, no 'sent' event) for the caller to publish after it, as kombu would
    (and fail); the chunk's other claims are enqueued as usual."""
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 60.0}})
    client = redis_server.client()
    scheduler = Scheduler(app=app)
    try:
        ledger, lease = scheduler.ledger, scheduler.lease
        assert lease.try_acquire()
        token, epoch = lease.credentials()
        client.hset("badq", "not", "a list")
        items = [ClaimItem("a", 2000, Op.CLAIM, 2000, enqueue=(("lpush", "badq", "pa"),)),
                 ClaimItem("b", 2000, Op.CLAIM, 2000, enqueue=(("lpush", "q", "pb"),))]
        assert ledger.claim(token, epoch, items) == [Code.UNQUEUED, Code.GRANTED]
        stored = ledger.load()
        assert (stored["a"].state, stored["b"].state) == (SlotStatus.CLAIMED, SlotStatus.SENT)
        assert client.type("badq") == b"hash" and client.lrange("q", 0, -1) == [b"pb"]
        assert [e["entry"] for e in ledger.history() if e["event"] == "sent"] == ["b"]
    finally:
        scheduler.close()


def test_a_queue_key_of_the_wrong_type_fails_its_own_entry_and_the_others_are_enqueued(
        redis_server, key_prefix, caplog):
    """A queue's key turned into a string after the entry's messages were built (a stray
    SET): on the one-step path that entry's slots fail alone, each said with kombu's
    WRONGTYPE and recorded unsent, as stock beat fails one publish; the others are sent."""
    schedule = {name: {"task": NOOP, "schedule": 1.0} for name in ("e0", "e1")}
    schedule["bad"] = {"task": NOOP, "schedule": 1.0, "options": {"queue": "badq"}}
    app = make_app(redis_server.url_for(0), key_prefix, schedule)
    client = redis_server.client()
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: client.llen("badq") >= 1)
        client.delete("badq")
        client.set("badq", "not a list")
        turned = client.llen("celery")
        tick_until(scheduler, lambda: client.llen("celery") >= turned + 6)
        history = scheduler.ledger.history(500)
        assert scheduler._enqueuer is not None and scheduler._enqueuer.fast
    finally:
        scheduler.close()
    unsent = [e for e in history if e.get("event") == "unsent"]
    assert unsent and {e["entry"] for e in unsent} == {"bad"}
    sent_bad = [e for e in history if e.get("event") == "sent" and e["entry"] == "bad"]
    assert len(sent_bad) == 1  # its slot before the key turned, and none after
    assert "WRONGTYPE" in caplog.text


# -- routing through an exchange, at send ---------------------------------------------

def bind(broker_url: str, queue: Queue) -> None:
    """A worker started with a new ``-Q``: its queue declared and bound, from its own
    connection."""
    with Connection(broker_url) as conn:
        queue(conn.default_channel).declare()


EVENTS = Exchange("events", type="topic")
JOBS = Exchange("jobs", type="direct")
ROUTINGS = {
    # a topic exchange: the entry's queue is bound to it; a new queue bound later
    "topic": (Queue("first", EVENTS, routing_key="beat.*"), Queue("second", EVENTS,
                                                                   routing_key="beat.#"),
              {"queue": "first", "routing_key": "beat.tick"}),
    # a direct exchange: a second queue bound later with the same routing key
    "direct": (Queue("first", JOBS, routing_key="beat"), Queue("second", JOBS, routing_key="beat"),
               {"exchange": "jobs", "routing_key": "beat"}),
}


@pytest.mark.parametrize("kind", sorted(ROUTINGS))
def test_a_queue_bound_later_to_the_entrys_exchange_receives_its_messages(
        redis_server, key_prefix, kind, path, caplog):
    """kombu's Redis transport reads the exchange's bindings at every publish: a queue bound
    after beat started its messages of that shape receives the next ones, as with stock
    beat, on every path alike."""
    first, second, options = ROUTINGS[kind]
    fast = path == "one_step"  # leaderbeat's state on the broker's database, else another
    broker_url = redis_server.url_for(0 if fast else 1)
    schedule = {name: {"task": NOOP, "schedule": 1.0, "options": options} for name in "ab"}
    app = make_app(broker_url, key_prefix, schedule, task_queues=[first],
                   leaderbeat_redis_url=redis_server.url_for(0))
    broker = redis_server.client(db=0 if fast else 1)
    bind(broker_url, first)
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: broker.llen("first") >= 4)  # shapes built and in use
        assert scheduler._enqueuer is not None and scheduler._enqueuer.path()[0] == (
            "one_step" if fast else "plain")
        bind(broker_url, second)
        bound = broker.llen("first")
        tick_until(scheduler, lambda: broker.llen("first") >= bound + 4)
    finally:
        scheduler.close()
    later = messages(broker, "first")[:broker.llen("first") - bound]  # LPUSH: newest first
    ids = {m["headers"]["id"] for m in later}
    assert ids and ids <= {m["headers"]["id"] for m in messages(broker, "second")}
    # built from the kept shape, routed at send (not by apply_async every time)
    assert "built by apply_async every time" not in caplog.text


# -- whether a beat fell back from the one-step path, and why ----------------------------

def test_one_step_fallback_says_whether_and_why_a_beat_sends_after_its_claims(
        redis_server, key_prefix):
    schedule = {"a": {"task": NOOP, "schedule": 60.0}}
    fast = Scheduler(app=make_app(redis_server.url_for(0), key_prefix, schedule))
    other_db = Scheduler(app=make_app(redis_server.url_for(1), key_prefix + "-db", schedule,
                                      leaderbeat_redis_url=redis_server.url_for(0)))
    off = Scheduler(app=make_app(redis_server.url_for(0), key_prefix + "-off", schedule,
                                 leaderbeat_atomic_enqueue=False))

    def noticed(**_: Any) -> None:
        """A monitor's receiver."""

    try:
        assert one_step_fallback(fast) == "not checked yet (no chunk sent by this beat)"
        for scheduler in (fast, other_db, off):
            scheduler._chunk_sender(1)
        assert one_step_fallback(fast) is None
        assert "another Redis server or database" in one_step_fallback(other_db)
        assert "leaderbeat_atomic_enqueue=False" in one_step_fallback(off)
        signals.before_task_publish.connect(noticed, weak=False)
        try:
            assert "before_task_publish receiver is connected" in one_step_fallback(fast)
        finally:
            signals.before_task_publish.disconnect(noticed)
        assert one_step_fallback(fast) is None
    finally:
        for scheduler in (fast, other_db, off):
            scheduler.close()


def test_a_kombu_outside_the_known_range_falls_back_and_names_the_range(
        redis_server, key_prefix, monkeypatch, caplog):
    import kombu

    caplog.set_level(logging.INFO, logger="celery_leaderbeat")
    monkeypatch.setattr(kombu, "VERSION", (5, 8, 0))
    monkeypatch.setattr(kombu, "__version__", "5.8.0")
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 60.0}})
    scheduler = Scheduler(app=app)
    try:
        scheduler._chunk_sender(1)
        assert one_step_fallback(scheduler) == (
            "kombu 5.8.0 (the commands are known for kombu >=5.7,<5.8)")
        assert scheduler._enqueuer is not None and scheduler._enqueuer.path() == (
            "plain", "kombu 5.8.0 (the commands are known for kombu >=5.7,<5.8)")
    finally:
        scheduler.close()
    # said once at start, as a warning: the broker is Redis, one step would apply
    said = [r for r in caplog.records if "send path plain" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


@pytest.mark.parametrize("keyprefix", ["", "gk:"], ids=["no-prefix", "global-keyprefix"])
def test_routes_at_send_give_the_keys_kombu_publishes_to(redis_server, keyprefix):
    """For each routing key and priority, the commands a kept shape is routed to at send
    write the very lists kombu's own publish writes (topic wildcards, priorities, the
    global key prefix), and nothing more."""
    options = {"global_keyprefix": keyprefix} if keyprefix else {}
    client = redis_server.client()
    exchange = Exchange("ev", type="topic")
    bindings = {"q1": "a.*", "q2": "a.#", "q3": "#", "q4": "a.b.c", "q5": "*.b.*", "q6": "x.*"}
    with Connection(redis_server.url_for(0), transport_options=options) as conn:
        channel = conn.default_channel
        for name, key in bindings.items():
            Queue(name, exchange, routing_key=key)(channel).declare()
        routes = Routes(lambda: channel)
        producer = conn.Producer()
        for routing_key in ["a.b", "a.b.c", "a", "x.y", "b", "a.b.c.d", "q.b.r"]:
            for priority in (0, 5):
                client.flushdb()
                for name, key in bindings.items():  # flushed with the lists: bound again
                    Queue(name, exchange, routing_key=key)(channel).declare()
                producer.publish({"n": 1}, exchange=exchange, routing_key=routing_key,
                                 priority=priority)
                written = {k.decode() for k in client.keys("*")
                           if client.type(k) == b"list"}
                routes.fresh()
                route = ("ev", routing_key, priority)
                routed = {keyprefix + args[0] for name, args in routes.commands(route, "p")
                          if name == "lpush"}
                assert routed == written, (routing_key, priority)
