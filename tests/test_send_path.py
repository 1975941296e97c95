"""The send path in-process against real Redis: claim and enqueue in one step, batches, sharing.

A broker on leaderbeat's own Redis server and database takes the fast path:
the claim script runs kombu's own commands for exactly the slots it grants.
Anything else goes out in kombu batches after the claim. What holds on every path
(``path``: plain, templates after the claim, one step) is tested on each.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery, signals

from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.send import sender as sender_module
from celery_leaderbeat.send.one_step import one_step_fallback
from celery_leaderbeat.store.types import ClaimItem, Code, Op, Refused, SlotStatus
from celery_leaderbeat.timing import cronengine as _cronengine
from celery_leaderbeat.timing.policy import CatchupPolicy
from celery_leaderbeat.timing.schedules import cron
from celery_leaderbeat.timing.slots import clock_for, plan, slot_id, to_ms
from tests.support.beat import NOOP

UTC = timezone.utc
PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: "<queue><sep><priority step>"


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


def on_path(redis_server, path: str) -> tuple[str, dict, object]:
    """(broker url, leaderbeat's settings, a client of the broker's database) for ``path``:
    one step where leaderbeat's state is on the broker's database, else another database."""
    db = 0 if path == "one_step" else 1
    return (redis_server.url_for(db), {"leaderbeat_redis_url": redis_server.url_for(0)},
            redis_server.client(db=db))


def path_taken(scheduler: Scheduler) -> str:
    """The path the scheduler's chunks take (the templates go on the plain path)."""
    assert scheduler._enqueuer is not None
    return scheduler._enqueuer.path()[0]


def make_app(broker_url: str, prefix: str, schedule: dict, **settings) -> Celery:
    app = Celery("proj")
    app.conf.update(broker_url=broker_url, leaderbeat_key_prefix=prefix, beat_schedule=schedule,
                    timezone="UTC", leaderbeat_standby_poll=0.2, **settings)
    return app


def tick_until(scheduler: Scheduler, condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(min(scheduler.tick(), 0.1))


def messages(client, key: str) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(key, 0, -1)]


def test_on_the_brokers_own_redis_a_burst_is_granted_and_enqueued_in_one_step_first_chunk_first(
        redis_server, key_prefix, caplog, monkeypatch):
    """Each slot granted and enqueued in one step; the burst's first chunk is planned and
    claimed before the rest is planned."""
    from celery_leaderbeat.roles import agenda as agenda_module
    from celery_leaderbeat.roles.batch import CHUNK
    from celery_leaderbeat.store.ledger import Ledger

    planned: list[int] = []
    at_claims: list[tuple[int, int]] = []  # (entries planned so far, slots claimed)
    real_plan, real_claim = agenda_module.plan, Ledger.claim

    def counting_plan(*args, **kwargs):
        planned.append(1)
        return real_plan(*args, **kwargs)

    def watching_claim(self, token, epoch, items, events=()):
        claims = [i for i in items if i.op == Op.CLAIM]
        if claims:
            at_claims.append((len(planned), len(claims)))
        return real_claim(self, token, epoch, items, events)

    monkeypatch.setattr(agenda_module, "plan", counting_plan)
    monkeypatch.setattr(Ledger, "claim", watching_claim)
    caplog.set_level(logging.INFO, logger="celery_leaderbeat")
    n = 3 * CHUNK + 7
    app = make_app(redis_server.url_for(0), key_prefix,
                   {f"e{i}": {"task": NOOP, "schedule": 0.5} for i in range(n)})
    client = redis_server.client()
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: client.llen("celery") >= n)
        stored = scheduler.ledger.load()
    finally:
        scheduler.close()
    assert "claims and enqueues each slot in one step" in caplog.text
    sent = messages(client, "celery")
    for msg in sent:
        headers = msg["headers"]
        slot = datetime.fromisoformat(headers["leaderbeat_slot"])
        assert headers["id"] == slot_id(key_prefix, headers["leaderbeat_entry"], slot)
    # granted and enqueued in one step: stored sent at once, never "claimed, unconfirmed"
    assert {s.state for name, s in stored.items() if name.startswith("e")} <= {SlotStatus.SENT, SlotStatus.ANCHOR}
    assert any(s.state == SlotStatus.SENT for s in stored.values())
    assert at_claims[0] == (CHUNK, CHUNK)  # only the first chunk's entries planned
    assert at_claims[1][0] == n  # then the rest of the burst is planned, in one batch
    assert sum(c for _, c in at_claims[:4]) == n  # chunks of 100, 100, 100, 7


def test_a_claim_refused_runs_none_of_its_commands_and_a_retried_grant_runs_them_once(
        redis_server, key_prefix):
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 60.0}})
    client = redis_server.client()
    scheduler = Scheduler(app=app)
    try:
        ledger, lease = scheduler.ledger, scheduler.lease
        assert lease.try_acquire()
        item = ClaimItem("a", 2000, Op.CLAIM, 2000, enqueue=(("lpush", "q", "payload"),))
        with pytest.raises(Exception, match="lost"):  # another token: refused wholesale
            ledger.claim("someone-else|99", 99, [item])
        assert client.llen("q") == 0
        token, epoch = lease.credentials()
        assert ledger.claim(token, epoch, [item]) == [Code.GRANTED]
        # the reply was lost: asked again, answered "enqueued before", nothing runs twice
        assert ledger.claim(token, epoch, [item]) == [Code.ENQUEUED]
        assert client.lrange("q", 0, -1) == [b"payload"]
        older = ClaimItem("a", 1000, Op.CLAIM, 1000, enqueue=(("lpush", "q", "older"),))
        refused = ledger.claim(token, epoch, [older])
        assert isinstance(refused[0], Refused) and refused[0].state.slot_ms == 2000
        assert client.lrange("q", 0, -1) == [b"payload"]
        assert ledger.load()["a"].state == SlotStatus.SENT
        # the grant wrote its own 'sent' event (the caller writes none), once for both calls
        sent = [e for e in ledger.history() if e["event"] == "sent"]
        assert [(e["entry"], e["slot"], e["epoch"]) for e in sent] == [("a", "2000", str(epoch))]
    finally:
        scheduler.close()


def test_a_chunks_sends_are_one_log_record_whose_lines_are_the_per_send_lines(
        redis_server, key_prefix, caplog, path):
    from celery_leaderbeat.roles.batch import CHUNK

    caplog.set_level(logging.INFO, logger="celery_leaderbeat.sends")
    n = CHUNK + 50
    broker_url, settings, broker = on_path(redis_server, path)
    app = make_app(broker_url, key_prefix,
                   {f"e{i}": {"task": NOOP, "schedule": 0.5} for i in range(n)}, **settings)
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: broker.llen("celery") >= n)
        assert path_taken(scheduler) == ("one_step" if path == "one_step" else "plain")
    finally:
        scheduler.close()
    records = [r.getMessage() for r in caplog.records if r.name == "celery_leaderbeat.sends"]
    lines = [line for record in records for line in record.split("\n")]
    # a batch of 150 due goes in a chunk of 100 and one of 50: one record each
    assert max(len(record.split("\n")) for record in records) == CHUNK
    assert sorted(lines) == sorted(
        f"Scheduler: Sending due task {m['headers']['leaderbeat_entry']} ({NOOP}) "
        f"for slot {m['headers']['leaderbeat_slot']}" for m in messages(broker, "celery"))


def test_routes_priorities_expiry_and_the_global_key_prefix_land_where_kombu_puts_them(
        redis_server, key_prefix, path):
    schedule = {
        "plain": {"task": NOOP, "schedule": 0.5},
        "urgent": {"task": NOOP, "schedule": 0.5, "options": {"priority": 7}},
        "routed": {"task": "proj.routed", "schedule": 0.5},
        "expiring": {"task": NOOP, "schedule": 0.5, "options": {"expires": 3600}},
    }
    broker_url, settings, client = on_path(redis_server, path)
    app = make_app(broker_url, key_prefix, schedule,
                   task_routes={"proj.routed": {"queue": "other"}},
                   broker_transport_options={"global_keyprefix": "gk:"}, **settings)
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: client.llen(f"gk:celery{PRIORITY_SEP}6") > 0
                   and client.llen("gk:celery") > 1 and client.llen("gk:other") > 0)
        assert path_taken(scheduler) == ("one_step" if path == "one_step" else "plain")
        sent_at = datetime.now(UTC)
    finally:
        scheduler.close()
    queued = messages(client, "gk:celery")
    entries = {m["headers"]["leaderbeat_entry"] for m in queued}
    assert entries == {"plain", "expiring"}
    for m in queued:  # an hour after its send, as apply_async computes it at each publish
        if m["headers"]["leaderbeat_entry"] == "expiring":
            left = datetime.fromisoformat(m["headers"]["expires"]) - sent_at
            assert timedelta(minutes=50) < left <= timedelta(hours=1)
        else:
            assert m["headers"]["expires"] is None
    urgent = messages(client, f"gk:celery{PRIORITY_SEP}6")  # priority 7 -> kombu's step 6
    assert {m["headers"]["leaderbeat_entry"] for m in urgent} == {"urgent"}
    assert urgent[0]["properties"]["priority"] == 7
    assert {m["headers"]["leaderbeat_entry"] for m in messages(client, "gk:other")} == {"routed"}
    assert client.llen("celery") == 0 and client.llen("other") == 0


def test_before_task_publish_fires_only_for_granted_slots_and_after_task_publish_once_queued(
        redis_server, key_prefix, path):
    """With a before_task_publish receiver the chunk is claimed first: the signal never
    fires for a slot the claim refuses (a monitor counting it would count a message that
    was never sent); after_task_publish fires once the message is in the queue."""
    broker_url, settings, client = on_path(redis_server, path)
    app = make_app(broker_url, key_prefix,
                   {"a": {"task": NOOP, "schedule": 60.0}, "b": {"task": NOOP, "schedule": 60.0}},
                   **settings)
    before, after = [], []

    def on_before(headers=None, **kwargs):
        before.append((headers["leaderbeat_entry"], client.llen("celery")))

    def on_after(headers=None, **kwargs):
        after.append((headers["leaderbeat_entry"], client.llen("celery")))

    signals.before_task_publish.connect(on_before, weak=False)
    signals.after_task_publish.connect(on_after, weak=False)
    scheduler = Scheduler(app=app)
    try:
        assert scheduler.lease.try_acquire()
        token, epoch = scheduler.lease.credentials()
        sender = scheduler._chunk_sender(epoch)
        assert path_taken(scheduler) == "plain"
        if path == "one_step":
            assert "before_task_publish" in one_step_fallback(scheduler)
        slot = datetime(2020, 1, 1, tzinfo=UTC)  # in the past: a leader never claims the future
        prepared = sender.prepare([("a", slot), ("b", slot)])
        assert prepared == [None, None] and before == []  # nothing built before the claim
        # a newer slot of b's was claimed first: b's is refused, its message never built
        newer = to_ms(slot) + 60_000
        scheduler.ledger.claim(token, epoch, [ClaimItem("b", newer, Op.CLAIM, newer)])
        results = scheduler.ledger.claim(token, epoch, [
            ClaimItem(name, to_ms(slot), Op.CLAIM, to_ms(slot)) for name in "ab"])
        assert results[0] is Code.GRANTED and isinstance(results[1], Refused)
        sender.enqueued([])
        assert sender.send_many([("a", slot)]) == [True]
    finally:
        signals.before_task_publish.disconnect(on_before)
        signals.after_task_publish.disconnect(on_after)
        scheduler.close()
    assert before == [("a", 0)]  # the granted slot only, before its message was queued
    assert after == [("a", 1)]  # after the message was in the queue
    assert [m["headers"]["leaderbeat_entry"] for m in messages(client, "celery")] == ["a"]


def test_after_task_publish_fires_once_for_each_slot_sent_with_the_message_sent(
        redis_server, key_prefix, path):
    """A monitor counting after_task_publish counts each message in the queue once, with
    its own task id and headers, whichever path sent it."""
    broker_url, settings, client = on_path(redis_server, path)
    app = make_app(broker_url, key_prefix,
                   {f"e{i}": {"task": NOOP, "schedule": 0.5, "args": [i]} for i in range(5)},
                   **settings)
    after: list[tuple[str, str, str]] = []

    def on_after(headers=None, routing_key=None, **kwargs):
        after.append((headers["id"], headers["leaderbeat_slot"], routing_key))

    signals.after_task_publish.connect(on_after, weak=False)
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: client.llen("celery") >= 15)
        assert path_taken(scheduler) == ("one_step" if path == "one_step" else "plain")
    finally:
        signals.after_task_publish.disconnect(on_after)
        scheduler.close()
    queued = sorted((m["headers"]["id"], m["headers"]["leaderbeat_slot"], "celery")
                    for m in messages(client, "celery"))
    assert len(set(queued)) == len(queued)
    assert sorted(after) == queued


def test_a_broker_on_another_database_says_so_once_and_sends_batched_after_the_claim(
        redis_server, key_prefix, caplog):
    caplog.set_level(logging.INFO, logger="celery_leaderbeat")
    app = make_app(redis_server.url_for(1), key_prefix,
                   {f"e{i}": {"task": NOOP, "schedule": 0.5} for i in range(3)},
                   leaderbeat_redis_url=redis_server.url_for(0))
    broker = redis_server.client(db=1)
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: broker.llen("celery") >= 6)
    finally:
        scheduler.close()
    lines = [r.getMessage() for r in caplog.records if "claim and enqueue in one step is off" in
             r.getMessage()]
    assert len(lines) == 1
    assert "another Redis server or database" in lines[0]
    assert {m["headers"]["leaderbeat_entry"] for m in messages(broker, "celery")} == {
        "e0", "e1", "e2"}


def test_the_setting_turns_the_fast_path_off(redis_server, key_prefix, caplog):
    caplog.set_level(logging.INFO, logger="celery_leaderbeat")
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 0.5}},
                   leaderbeat_atomic_enqueue=False)
    client = redis_server.client()
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: client.llen("celery") >= 1)
        assert scheduler._enqueuer is not None and not scheduler._enqueuer.fast
    finally:
        scheduler.close()
    assert "turned off by leaderbeat_atomic_enqueue=False" in caplog.text


def test_entries_on_one_cron_share_one_engine_and_a_burst_plans_once(monkeypatch):
    clocks = [clock_for(cron("*/5 * * * *"), name=f"e{i}", tz=UTC) for i in range(1000)]
    assert len({id(c.engine) for c in clocks}) == 1
    searches = []
    real = _cronengine.CronEngine._search
    monkeypatch.setattr(_cronengine.CronEngine, "_search",
                        lambda self, t: searches.append(t) or real(self, t))
    last = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
    now = last + timedelta(minutes=5, seconds=1)
    plans = [plan(c, last=last, now=now, since=last, policy=CatchupPolicy()) for c in clocks]
    assert {p.send for p in plans} == {(last + timedelta(minutes=5),)}
    assert len(searches) <= 3  # one walk for the whole burst, not one per entry


def test_a_jittered_entry_keeps_its_own_fire_time(monkeypatch):
    a = clock_for(cron("*/5 * * * *"), name="a", tz=UTC, jitter=60)
    b = clock_for(cron("*/5 * * * *"), name="b", tz=UTC, jitter=60)
    last = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
    now = last + timedelta(minutes=6, seconds=1)
    pa = plan(a, last=last, now=now, since=last, policy=CatchupPolicy())
    pb = plan(b, last=last, now=now, since=last, policy=CatchupPolicy())
    assert pa.next_fire != pb.next_fire  # jitter is per entry: never shared



def test_a_wrapped_base_scheduler_keeps_sending_slot_by_slot_through_its_own_entries(
        redis_server, key_prefix, tmp_path):
    # the wrapper reads entries from its snapshot (a database scheduler's .schedule is a
    # query) and tells the base what was sent: chunk senders would bypass both
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 0.5}},
                   leaderbeat_base_scheduler="celery.beat:PersistentScheduler")
    wrapped = Scheduler(app=app, schedule_filename=str(tmp_path / "beat-schedule"))
    plain = Scheduler(app=make_app(redis_server.url_for(0), key_prefix + "-plain",
                                   {"a": {"task": NOOP, "schedule": 0.5}}))
    try:
        assert type(wrapped) is not Scheduler
        wrapped._connect()
        plain._connect()
        assert wrapped.chunk_sender(1) is None
        assert plain.chunk_sender(1) is not None
    finally:
        wrapped.close()
        plain.close()


def test_slot_ids_are_uuid5_of_prefix_entry_and_slot():
    import uuid

    from celery_leaderbeat.timing.slots import _SLOT_NAMESPACE

    slot = datetime(2031, 3, 4, 10, 0, 0, 123000, tzinfo=UTC)
    for prefix, name in [("lb", "report"), ("", ""), ("p:x", "ünïcode ✓"), ("a" * 50, "b" * 300)]:
        expected = uuid.uuid5(_SLOT_NAMESPACE, f"{prefix}\x1f{name}\x1f{to_ms(slot)}")
        assert slot_id(prefix, name, slot) == str(expected)


def test_a_chunk_senders_answer_reads_as_sent_or_unsent_with_its_reason():
    from celery_leaderbeat.send.base import LEASE_EXPIRED, PUBLISH_FAILED, unsent_reasons

    slots = ["a", "b", "c", "d"]
    assert unsent_reasons(slots, [True, False]) == [
        ("a", None), ("b", PUBLISH_FAILED), ("c", LEASE_EXPIRED), ("d", LEASE_EXPIRED)]
    assert unsent_reasons(slots, [True] * 4) == [(s, None) for s in slots]
    with pytest.raises(ValueError, match="an answer of 5 for a chunk of 4 slots"):
        unsent_reasons(slots, [True] * 5)
