"""Batches against a real Redis: chunked claims, the record riding on the next claim, rescue."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from celery.schedules import schedule

from celery_leaderbeat.config import Config
from celery_leaderbeat.entries import EntryOptions
from celery_leaderbeat.roles.agenda import Agenda, Known, Reading, load
from celery_leaderbeat.roles.batch import LeaderGate, RescueGate, run_batch
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.lease import Lease
from celery_leaderbeat.store.ledger import Ledger
from celery_leaderbeat.store.memory import MemoryStore
from celery_leaderbeat.store.memory_state import MemoryState
from celery_leaderbeat.store.scripts import Scripts
from celery_leaderbeat.store.types import ClaimItem, Code, Op, Refused, SlotStatus
from celery_leaderbeat.timing.policy import CatchupPolicy
from celery_leaderbeat.timing.slots import to_ms

UTC = timezone.utc
T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)


@pytest.fixture
def redis_node(redis_client, key_prefix):
    def make(name: str) -> SimpleNamespace:
        config = Config.from_values({"redis_url": "redis://x", "key_prefix": key_prefix,
                                     "node_id": name})
        scripts, keys = Scripts(redis_client), Keys(key_prefix)
        return SimpleNamespace(lease=LeaseView(Lease(redis_client, scripts, keys, config), config),
                               ledger=Ledger(redis_client, scripts, keys, config))
    return make


@pytest.fixture(params=["redis", "memory"])
def store(request, key_prefix):
    """(a node's lease and ledger by node id, the store's clock in ms): on Redis, or on
    one in-memory store."""
    if request.param == "redis":
        client = request.getfixturevalue("redis_client")
        return request.getfixturevalue("redis_node"), lambda: redis_ms(client)
    state = MemoryState()

    def make(name: str) -> SimpleNamespace:
        config = Config.from_values({"redis_url": "memory://", "key_prefix": key_prefix,
                                     "node_id": name})
        memory = MemoryStore(state, config, key_prefix)
        return SimpleNamespace(lease=LeaseView(memory.lease, config), ledger=memory.ledger)
    return make, state.now_ms


@pytest.fixture
def node(store):
    return store[0]


@pytest.fixture
def store_ms(store):
    return store[1]


def redis_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def rescue_item(name: str, fire_ms: int) -> ClaimItem:
    return ClaimItem(name, fire_ms, Op.CLAIM, fire_ms)


def history(ledger: Ledger) -> list[tuple[str, str, str]]:
    return [(h["event"], h.get("entry", ""), h.get("detail", "")) for h in ledger.history(100)]


def test_a_rescue_waits_until_redis_time_says_the_slot_is_rescue_after_late(node, store_ms):
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", 1000, Op.ANCHOR)])
    now = store_ms()
    # a standby whose clock runs fast asks for a slot that, by Redis, is only 1 s late
    early = standby.ledger.rescue([rescue_item("e", now - 1000)])
    assert early.results == [Code.EARLY]
    assert early.redis_now_ms >= now
    late = standby.ledger.rescue([rescue_item("e", now - 2100)])
    assert late.results == [Code.GRANTED]
    stored = standby.ledger.load()["e"]
    assert (stored.slot_ms, stored.epoch, stored.state, stored.node) == (
        now - 2100, 0, SlotStatus.CLAIMED, "standby")


def test_a_standby_never_rescues_an_entry_whose_phase_it_cannot_know(node, store_ms):
    now = store_ms()
    assert node("standby").ledger.rescue([rescue_item("new", now - 5000)]).results == [Code.UNKNOWN]
    assert node("standby").ledger.load() == {}


def test_two_standbys_rescuing_one_slot_are_granted_it_once(node, store_ms):
    leader = node("leader")
    assert leader.lease.try_acquire()
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", 1000, Op.ANCHOR)])
    slot = store_ms() - 3000
    first = node("s1").ledger.rescue([rescue_item("e", slot)]).results
    again = node("s1").ledger.rescue([rescue_item("e", slot)]).results  # its retried call
    second = node("s2").ledger.rescue([rescue_item("e", slot)]).results
    assert first == [Code.GRANTED] and again == [Code.GRANTED]
    assert isinstance(second[0], Refused) and second[0].state.node == "s1"


def test_a_leader_refused_a_slot_a_standby_rescued_records_who_had_it(node, store_ms):
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    now = datetime.fromtimestamp(store_ms() / 1000, UTC)
    tracked = load({"e": SimpleNamespace(schedule=schedule(timedelta(seconds=1)))}, {},
                   start=now - timedelta(seconds=10),
                   reading=Reading(tz=UTC, options={},
                                   default=EntryOptions(CatchupPolicy("skip"), None, None)),
                   known=Known(epoch=1)).tracked
    leader.ledger.claim(*leader.lease.credentials(),
                        [ClaimItem("e", to_ms(now - timedelta(seconds=10)), Op.ANCHOR)])
    slot = now - timedelta(seconds=9)
    assert standby.ledger.rescue([rescue_item("e", to_ms(slot))]).results == [Code.GRANTED]
    agenda = Agenda(tracked)
    due = agenda.pop_due(slot, since=slot)  # the leader, slow: it wants that very slot
    sent: list[tuple[str, datetime]] = []
    outcome = run_batch(due, LeaderGate(leader.lease, leader.ledger),
                        lambda name, s: sent.append((name, s)) or True)
    assert sent == [] and outcome.refused == 1
    assert ("skipped", "e", "already claimed by standby standby (rescue)") in history(
        leader.ledger)


class Crash(BaseException):
    """The process dies here (SIGKILL): nothing after it runs."""


def test_a_crash_mid_catchup_leaves_each_claimed_unsent_slot_in_the_slots_hash(node):
    """All catch-up slots of an entry once went in one claim: only the newest was kept."""
    leader = node("leader")
    assert leader.lease.try_acquire()
    options = EntryOptions(CatchupPolicy("all"), None, None)
    entry = SimpleNamespace(schedule=schedule(timedelta(seconds=10)))
    tracked = load({"e": entry}, {}, start=T0,
                   reading=Reading(tz=UTC, options={"e": options}, default=options),
                   known=Known(epoch=1)).tracked
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", to_ms(T0), Op.ANCHOR)])
    due = Agenda(tracked).pop_due(T0 + timedelta(seconds=35), since=T0 + timedelta(seconds=35))
    assert [len(p.send) for _, p in due] == [3]  # three missed slots, all to be sent
    published = []

    def send(name: str, slot: datetime) -> bool:
        if published:
            raise Crash  # dies publishing the second
        published.append(slot)
        return True

    with pytest.raises(Crash):
        run_batch(due, LeaderGate(leader.lease, leader.ledger), send)
    stored = leader.ledger.load()["e"]
    assert (stored.slot_ms, stored.state) == (to_ms(T0 + timedelta(seconds=20)), SlotStatus.CLAIMED), (
        "the claimed, unsent second slot must be what the next leader sees")


def test_a_rescue_gate_sends_what_it_was_granted_and_marks_it_rescued(node, store_ms):
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    now = datetime.fromtimestamp(store_ms() / 1000, UTC)
    start = now - timedelta(seconds=10)
    options = EntryOptions(CatchupPolicy("latest"), None, None)
    entries = {f"e{i}": SimpleNamespace(schedule=schedule(timedelta(seconds=5)))
               for i in range(3)}
    leader.ledger.claim(*leader.lease.credentials(),
                        [ClaimItem(name, to_ms(start), Op.ANCHOR) for name in entries])
    tracked = load(entries, standby.ledger.load(), start=now,
                   reading=Reading(tz=UTC, options={}, default=options),
                   known=Known(epoch=None)).tracked
    agenda = Agenda(tracked)
    due = agenda.pop_due(now - timedelta(seconds=2), since=start,
                         policy=CatchupPolicy("skip"))
    sent: list[tuple[str, datetime]] = []
    outcome = run_batch(due, RescueGate(standby.ledger),
                        lambda name, s: sent.append((name, s)) or True, record_missed=False)
    assert outcome.sent == 3 == len(sent)
    assert {s for _, s in sent} == {start + timedelta(seconds=5)}
    states = standby.ledger.load()
    assert {st.state for st in states.values()} == {SlotStatus.SENT} and {st.node for st in states.values()} == {
        "standby"}
    assert sorted(h for h in history(standby.ledger) if h[0] == "sent") == [
        ("sent", name, "rescued") for name in sorted(entries)]


def test_a_rescue_of_an_entrys_next_slot_keeps_the_older_unconfirmed_claim_visible(
        redis_node, redis_client):
    """A paused leader's claimed chunk once vanished when a standby rescued the next slot."""
    leader, standby = redis_node("leader"), redis_node("standby")  # it moves Redis's keys
    assert leader.lease.try_acquire()
    now = redis_ms(redis_client)
    older, newer = now - 8000, now - 3000
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", older, Op.CLAIM)])
    # ... the leader is paused before publishing (its progress goes stale: a rescue waits
    # while a live leader claims, see test_reliability); a standby rescues the next slot
    redis_client.delete(Keys(leader.lease.store.keys.prefix).progress)
    assert standby.ledger.rescue([rescue_item("e", newer)]).results == [Code.GRANTED]
    overtaken = standby.ledger.overtaken()
    assert list(overtaken) == [("e", older)]
    assert (overtaken[("e", older)].epoch, overtaken[("e", older)].state) == (1, SlotStatus.CLAIMED)
    standby.ledger.forget_overtaken(list(overtaken))
    assert standby.ledger.overtaken() == {}
