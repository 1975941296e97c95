"""Every Redis call can fail: the protocol's answers, one failing call at a time.

Each test drives the real claim script on a real Redis and fails a chosen
call before the server ran it or after (the reply lost), then checks that no
slot is published twice and that what happened is recorded.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery.schedules import schedule

from celery_leaderbeat.config import Config
from celery_leaderbeat.entries import EntryOptions
from celery_leaderbeat.roles.agenda import Agenda, Known, Reading, Tracked, Unsent, load
from celery_leaderbeat.roles.batch import LeaderGate, RescueGate, report_unsent, run_batch
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.roles.memory import SentMemory
from celery_leaderbeat.roles.requests import LeaderSide, Request, carry_out
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.lease import Lease
from celery_leaderbeat.store.ledger import Ledger
from celery_leaderbeat.store.queue import RedisRequests
from celery_leaderbeat.store.scripts import Scripts
from celery_leaderbeat.store.types import (
    BackfillReason,
    ClaimItem,
    Code,
    Event,
    Op,
    Refused,
    SlotState,
    SlotStatus,
)
from celery_leaderbeat.timing.slots import clock_for, from_ms, to_ms

UTC = timezone.utc


@pytest.fixture
def node(redis_client, key_prefix):
    def make(name: str, **values: Any) -> SimpleNamespace:
        config = Config.from_values({"redis_url": "redis://x", "key_prefix": key_prefix,
                                     "node_id": name, **values})
        scripts, keys = Scripts(redis_client), Keys(key_prefix)
        return SimpleNamespace(lease=LeaseView(Lease(redis_client, scripts, keys, config), config),
                               ledger=Ledger(redis_client, scripts, keys, config),
                               config=config, keys=keys)
    return make


class FailingGate:
    """A gate whose n-th claim call fails: ``before`` the server ran it, or ``after``."""

    def __init__(self, gate: Any, fail_call: int, when: str) -> None:
        self.gate, self.fail_call, self.when, self.calls = gate, fail_call, when, 0
        self.detail, self.records_refusals = gate.detail, gate.records_refusals

    def claim(self, items: Any, events: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_call:
            if self.when == "before":
                raise redis.ConnectionError("injected: failed before the server ran it")
            self.gate.claim(items, events)
            raise redis.ConnectionError("injected: the reply was lost")
        return self.gate.claim(items, events)

    def may_send(self) -> bool:
        return self.gate.may_send()

    def record(self, events: Any) -> None:
        self.gate.record(events)


def redis_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def tracked_every(n: int, seconds: float, last: datetime, fp: str = "") -> list[Tracked]:
    opts = EntryOptions.defaults(Config.from_values({"redis_url": "redis://x", "key_prefix": "t", "node_id": "n"}))
    return [Tracked(f"e{i}", clock_for(schedule(timedelta(seconds=seconds)), name=f"e{i}",
                                       tz=UTC), opts, last, fp) for i in range(n)]


def due_of(entries: list[Tracked], now: datetime) -> list[Any]:
    agenda = Agenda({t.name: t for t in entries})
    return agenda.pop_due(now, since=now - timedelta(hours=1))


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_lost_claim_call_mid_batch_never_publishes_a_slot_twice(node, redis_client, when):
    leader = node("leader")
    assert leader.lease.try_acquire()
    now = from_ms(redis_ms(redis_client))
    entries = tracked_every(250, 10, now - timedelta(seconds=10))
    leader.ledger.claim(*leader.lease.credentials(),
                        [ClaimItem(t.name, to_ms(t.last), Op.ANCHOR) for t in entries])
    published: list[tuple[str, int]] = []

    def send(name: str, slot: datetime) -> bool:
        published.append((name, to_ms(slot)))
        return True

    memory, backlog = SentMemory(), []
    gate = FailingGate(LeaderGate(leader.lease, leader.ledger), fail_call=2, when=when)
    with pytest.raises(redis.ConnectionError):
        run_batch(due_of(entries, now), gate, send, memory=memory, backlog=backlog)
    assert len(published) == 100  # the first chunk went out; its record rode on call 2
    assert backlog, "the events of the failed call are kept for the next one"
    # Redis answers again: the same node plans again from where each entry was left
    outcome = run_batch(due_of(entries, now), LeaderGate(leader.lease, leader.ledger), send,
                        memory=memory, backlog=backlog)
    assert len(published) == len(set(published)) == 250
    assert outcome.sent == 150 if when == "before" else outcome.sent >= 100
    states = leader.ledger.load()
    assert {s.state for s in states.values()} == {SlotStatus.SENT}, "every slot is recorded sent"
    assert not backlog


def test_a_rescue_of_a_definition_the_leader_does_not_plan_is_refused(node, redis_client):
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    base = redis_ms(redis_client) - 20_000
    leader.ledger.claim(*leader.lease.credentials(),
                        [ClaimItem("e", base, Op.ANCHOR, fingerprint="every-10s")])
    slot = base + 5000  # the standby still follows the old 5 s interval
    result = standby.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot, base, "every-5s")])
    assert result.results == [Code.DIFFERS]
    same = standby.ledger.rescue([ClaimItem("e", base + 10_000, Op.CLAIM, base + 10_000, base,
                                            "every-10s")])
    assert same.results == [Code.GRANTED]


def test_a_rescue_planned_from_a_slot_that_is_not_the_stored_one_is_refused(node, redis_client):
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    base = redis_ms(redis_client) - 30_000
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", base, Op.ANCHOR)])
    # a standby that slept through a re-anchor still plans on the old phase
    stale = base - 3_000 + 10_000
    result = standby.ledger.rescue([ClaimItem("e", stale, Op.CLAIM, stale, base - 3_000)])
    assert isinstance(result.results[0], Refused) and result.results[0].state.slot_ms == base


def test_a_leader_whose_clock_jumped_ahead_cannot_claim_a_future_slot(node, redis_client):
    leader = node("leader", max_clock_skew=1.0)
    assert leader.lease.try_acquire()
    now = redis_ms(redis_client)
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", now - 60_000, Op.ANCHOR)])
    ahead = now + 60_000
    assert leader.ledger.claim(*leader.lease.credentials(),
                               [ClaimItem("e", ahead, Op.CLAIM, ahead)]) == [Code.EARLY]
    assert leader.ledger.claim(*leader.lease.credentials(),
                               [ClaimItem("e", now, Op.CLAIM, now)]) == [Code.GRANTED]


def test_recovery_is_refused_once_the_claimant_recorded_the_slot_sent(node, redis_client):
    old, new = node("old"), node("new")
    assert old.lease.try_acquire()
    old.ledger.claim(*old.lease.credentials(), [ClaimItem("e", 1000, Op.CLAIM, 1000)])
    old.ledger.record(old.lease.epoch, [Event("e", 1000, "sent")])  # late, but it landed
    redis_client.delete(old.keys.leader)
    assert new.lease.try_acquire()
    assert new.ledger.claim(*new.lease.credentials(), [ClaimItem("e", 1000, Op.RECOVER)]) \
        [0].state.state == SlotStatus.SENT


def test_a_young_rescue_claim_is_not_recovered_while_its_rescuer_may_still_publish(
        node, redis_client):
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    base = redis_ms(redis_client) - 10_000
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", base, Op.ANCHOR)])
    slot = base + 5000
    assert standby.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot, base)]).results == [Code.GRANTED]
    assert leader.ledger.claim(*leader.lease.credentials(),
                               [ClaimItem("e", slot, Op.RECOVER)]) == [Code.EARLY]
    gate = RescueGate(standby.ledger, window=5.0, clock=lambda: 0.0)
    gate.claim([], [])
    gate.clock = lambda: 5.1  # paused between its grant and its publish, past the window
    assert not gate.may_send()


def test_what_an_earlier_leader_claimed_and_this_process_sent_is_recorded_not_resent(
        node, redis_client):
    leader = node("leader")
    assert leader.lease.try_acquire()
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", 1000, Op.CLAIM, 1000)])
    memory = SentMemory()
    memory.note("e", 1000)  # sent by this process under its previous lease
    redis_client.delete(leader.keys.leader)
    assert leader.lease.try_acquire()
    sent: list[Any] = []
    report_unsent([Unsent("e", from_ms(1000), True)], gate=LeaderGate(leader.lease, leader.ledger),
                  send=lambda n, s: sent.append((n, s)) or True, recover=True, memory=memory)
    assert sent == []
    assert leader.ledger.load()["e"].state == SlotStatus.SENT


def test_a_leader_that_led_until_redis_lost_its_data_carries_on_after_what_it_sent():
    """No margin and no re-send: the remembered slot is restored in Redis."""
    now = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
    memory = SentMemory()
    memory.note("e", to_ms(now - timedelta(seconds=1)))
    entries = {"e": SimpleNamespace(schedule=schedule(timedelta(seconds=10)))}
    opts = EntryOptions.defaults(Config.from_values({"redis_url": "redis://x", "key_prefix": "t", "node_id": "n"}))
    loaded = load(entries, {}, start=now + timedelta(seconds=5),
                  reading=Reading(tz=UTC, options={}, default=opts),
                  known=Known(epoch=1, remembered=memory.newest_known, trust_memory=True))
    assert [(i.op, i.slot_ms) for i in loaded.anchors] == [(Op.RESTORE,
                                                           to_ms(now - timedelta(seconds=1)))]
    assert loaded.tracked["e"].next_fire == now + timedelta(seconds=9)
    # an older snapshot: the stored slot is behind the remembered one
    stale = {"e": SlotState(to_ms(now - timedelta(seconds=21)), 3, SlotStatus.SENT)}
    loaded = load(entries, stale, start=now,
                  reading=Reading(tz=UTC, options={}, default=opts),
                  known=Known(epoch=4, remembered=memory.newest_known, trust_memory=True))
    assert loaded.anchors[0].op == Op.RESTORE
    assert loaded.tracked["e"].last == now - timedelta(seconds=1)


def test_a_node_that_did_not_lead_until_redis_lost_its_data_keeps_the_margin():
    """Another node may have sent later slots than this one remembers (it led meanwhile):
    carrying on from its own memory once re-sent six slots in a chaos run."""
    now = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
    memory = SentMemory()
    memory.note("e", to_ms(now - timedelta(seconds=8)))
    entries = {"e": SimpleNamespace(schedule=schedule(timedelta(seconds=1)))}
    opts = EntryOptions.defaults(Config.from_values({"redis_url": "redis://x", "key_prefix": "t", "node_id": "n"}))
    start = now + timedelta(seconds=5)
    empty = load(entries, {}, start=start,
                 reading=Reading(tz=UTC, options={}, default=opts),
                 known=Known(epoch=9, remembered=memory.newest_known))
    assert [(i.op, i.slot_ms) for i in empty.anchors] == [(Op.ANCHOR, to_ms(start))]
    rolled_back = load(entries, {"e": SlotState(to_ms(now - timedelta(seconds=20)), 2, SlotStatus.SENT)},
                       start=start,
                       reading=Reading(tz=UTC, options={}, default=opts),
                       known=Known(epoch=9, remembered=memory.newest_known))
    assert [(i.op, i.slot_ms) for i in rolled_back.anchors] == [(Op.ROLLED_BACK, to_ms(start))]
    assert rolled_back.tracked["e"].last == start


def test_a_changed_definition_starts_again_from_now(node, redis_client):
    now = from_ms(redis_ms(redis_client))
    opts = EntryOptions.defaults(Config.from_values({"redis_url": "redis://x", "key_prefix": "t", "node_id": "n"}))
    entries = {"e": SimpleNamespace(schedule=schedule(timedelta(seconds=10)))}
    stored = {"e": SlotState(to_ms(now - timedelta(seconds=3)), 1, SlotStatus.SENT)}
    loaded = load(entries, stored, start=now,
                  reading=Reading(tz=UTC, options={}, default=opts,
                                  fingerprint_of=lambda *a: "new"),
                  known=Known(epoch=2, definitions={"e": "old"}))
    assert [i.op for i in loaded.anchors] == [Op.REANCHOR]
    assert loaded.tracked["e"].next_fire == now + timedelta(seconds=10)
    same = load(entries, stored, start=now,
                reading=Reading(tz=UTC, options={}, default=opts, fingerprint_of=lambda *a: "old"),
                known=Known(epoch=2, definitions={"e": "old"}))
    assert same.anchors == [] and same.tracked["e"].next_fire == now + timedelta(seconds=7)


def test_an_entry_added_twice_to_an_agenda_is_due_once():
    now = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
    first, again = tracked_every(1, 10, now - timedelta(seconds=10))[0], \
        tracked_every(1, 10, now - timedelta(seconds=10))[0]
    agenda = Agenda({})
    agenda.add(first)
    agenda.add(again)  # an 'unknown' rescue reply, then the leader anchored it
    due = agenda.pop_due(now, since=now - timedelta(hours=1))
    assert [t.name for t, _ in due] == ["e0"]


def _backfill(leader: SimpleNamespace, slots: tuple[int, ...], last: int,
              request_id: str = "r1") -> tuple[list[int], list[str]]:
    """Queue a backfill of ``slots`` of entry "e" and carry it out as ``leader``: what was
    published, and the details of the slots skipped."""
    leader.ledger.client.rpush(leader.keys.requests,
                               Request("backfill", "e", id=request_id, slots_ms=slots).dumps())
    sent: list[int] = []
    token, epoch = leader.lease.credentials()
    carry_out(LeaderSide(leader.ledger, RedisRequests(leader.ledger.client, leader.keys), epoch,
                         token, leader.keys.prefix,
                         lambda name, slot, task_id: sent.append(to_ms(slot)) or True,
                         known=lambda name: True, stored=lambda name: last), from_ms(last))
    skipped = [h["detail"] for h in leader.ledger.history(50)
               if h.get("event") == "skipped" and h.get("slot") in {str(s) for s in slots}]
    return sent, skipped


def test_a_backfill_never_sends_a_slot_the_schedule_has_not_settled(node, redis_client):
    leader = node("leader")
    assert leader.lease.try_acquire()
    now = redis_ms(redis_client)
    last = now + 20_000
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", last, Op.ANCHOR)])
    sent, skipped = _backfill(leader, (now + 10_000, last, now + 30_000), last)
    assert sent == [now + 10_000]
    assert skipped == ["backfill: not settled by the schedule yet (sent when due)"] * 2


def test_a_backfill_skips_a_slot_the_history_shows_sent_by_anyone(node, redis_client):
    """The command saw the slot unsent; a standby rescued it before the leader carried the
    request out: the claim script refuses it from the history, whatever the command saw."""
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    now = redis_ms(redis_client)
    last = now + 20_000
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", last, Op.ANCHOR)])
    standby.ledger.record(0, [Event("e", now - 10_000, "sent", "rescued")])
    sent, skipped = _backfill(leader, (now - 10_000, now - 9_000), last)
    assert sent == [now - 9_000]
    assert skipped == ["backfill: sent before (the history says so)"]
    again, skipped = _backfill(leader, (now - 9_000,), last, request_id="r2")
    assert again == []
    assert skipped == ["backfill: sent before (backfilled)"]


def test_a_backfill_skips_slots_due_before_redis_lost_writes(node, redis_client):
    """A leader that re-anchors after Redis went back to older state sets a floor: what was
    sent before it cannot be told, so no backfill reaches behind it."""
    leader = node("leader")
    assert leader.lease.try_acquire()
    now = redis_ms(redis_client)
    last = now + 20_000
    leader.ledger.reset_generation(leader.lease.epoch)
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", last, Op.ANCHOR)])
    sent, skipped = _backfill(leader, (now + 1_000,), last)
    assert sent == []
    assert skipped == [BackfillReason.LOST.detail]


def _guard(client: Any, keys: Keys, mode: str, task: str, worker: str, detail: str = "",
           token: int = 0) -> Any:
    scripts = Scripts(client)
    script = getattr(scripts, f"guard_{mode}")
    return script(keys=[keys.run(task), keys.alive(task), keys.overlap("e"), keys.history,
                        keys.guard_fence],
                  args=[task, worker, 600_000, 5_000, "allow", 100, "e", 1000, 1, detail, token,
                        0])


def test_a_guarded_run_still_alive_after_redis_lost_its_keys_is_not_run_again(
        redis_client, key_prefix):
    keys = Keys(key_prefix)
    started = _guard(redis_client, keys, "start", "t1", "w1")
    assert started[0] in (b"run", "run")
    redis_client.delete(keys.run("t1"), keys.alive("t1"))  # an outage longer than the lease
    _guard(redis_client, keys, "renew", "t1", "w1", token=int(started[2]))  # the worker renews
    again = _guard(redis_client, keys, "start", "t1", "w2")
    assert [x.decode() if isinstance(x, bytes) else x for x in again] == \
        ["duplicate", "running on w1"]


def test_a_guarded_run_whose_record_expired_while_it_runs_is_not_run_again(
        redis_client, key_prefix):
    keys = Keys(key_prefix)
    _guard(redis_client, keys, "start", "t2", "w1")
    redis_client.delete(keys.run("t2"))  # guard_expires passed; the run still renews
    again = _guard(redis_client, keys, "start", "t2", "w2")
    assert next(x.decode() if isinstance(x, bytes) else x for x in again) == "duplicate"


def test_prune_drops_only_old_state_of_entries_nobody_schedules(node, redis_client):
    leader = node("leader")
    assert leader.lease.try_acquire()
    now = redis_ms(redis_client)
    day = 86_400_000
    leader.ledger.claim(*leader.lease.credentials(), [
        ClaimItem("kept", now - 40 * day, Op.ANCHOR),  # still scheduled
        ClaimItem("gone", now - 40 * day, Op.ANCHOR),  # removed long ago
        ClaimItem("recent", now - day, Op.ANCHOR),  # another node may still send it
        ClaimItem("unconfirmed", now - 40 * day, Op.CLAIM, now - 40 * day),
    ])
    redis_client.hset(leader.keys.backfilled, mapping={f"kept|{now - 40 * day}": "r1",
                                                      f"kept|{now - day}": "r2"})
    leader.ledger.register_node("standby", {"host": "h"})
    redis_client.hset(leader.keys.nodes, "dead", '{"role": "standby", "last_seen": 1.0}')
    dropped = leader.ledger.prune(["kept"], keep_ms=30 * day, node_keep_s=3600)
    assert dropped == [1, 1, 1]
    assert sorted(leader.ledger.load()) == ["kept", "recent", "unconfirmed"]
    assert [k.decode() for k in redis_client.hkeys(leader.keys.backfilled)] == [f"kept|{now - day}"]
    assert list(leader.ledger.nodes()) == ["leader"]


def test_a_rescue_waits_while_the_leader_is_still_claiming_chunks_of_a_burst(
        node, redis_client):
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    base = redis_ms(redis_client) - 10_000
    leader.ledger.claim(*leader.lease.credentials(),
                        [ClaimItem("a", base, Op.ANCHOR), ClaimItem("b", base, Op.ANCHOR)])
    late = base + 5000  # 5 s late by Redis TIME: past rescue_after
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("a", late, Op.CLAIM, late)])
    # the leader is mid-burst (it claimed just now): b's rescue waits for it
    assert standby.ledger.rescue([ClaimItem("b", late, Op.CLAIM, late, base)]).results == [Code.EARLY]
    redis_client.delete(leader.keys.progress)  # it stopped claiming (dead or paused)
    assert standby.ledger.rescue([ClaimItem("b", late, Op.CLAIM, late, base)]).results == [Code.GRANTED]


def test_a_lease_that_vanishes_while_valid_says_redis_lost_its_data(node, redis_client):
    from celery_leaderbeat.errors import LeaseLostError
    leader = node("leader")
    assert leader.lease.try_acquire()
    redis_client.delete(leader.keys.leader)  # Redis restarted empty
    with pytest.raises(LeaseLostError):
        leader.lease.renew()
    assert leader.lease.losses.vanished_while_held
    other, taken = node("other"), node("taker")
    assert other.lease.try_acquire()
    redis_client.delete(other.keys.leader)
    assert taken.lease.try_acquire()  # another node leads now: nothing vanished
    with pytest.raises(LeaseLostError):
        other.lease.renew()
    assert not other.lease.losses.vanished_while_held


def test_a_paused_leaders_claimed_chunk_is_recovered_by_its_next_election_once(
        node, redis_client):
    """Paused between claiming a chunk and publishing it, past the ttl; a standby rescued
    the next slot of some entries meanwhile; the same process is elected again."""
    leader, standby = node("leader", recover_unsent=True), node("standby")
    assert leader.lease.try_acquire()
    base = redis_ms(redis_client) - 20_000
    names = [f"e{i}" for i in range(4)]
    leader.ledger.claim(*leader.lease.credentials(),
                        [ClaimItem(n, base, Op.ANCHOR) for n in names])
    slot = base + 5000
    leader.ledger.claim(*leader.lease.credentials(),
                        [ClaimItem(n, slot, Op.CLAIM, slot) for n in names])  # then paused
    redis_client.delete(leader.keys.progress)
    nxt = slot + 5000  # a standby rescues e0's and e1's next slot while it is paused
    assert standby.ledger.rescue([ClaimItem(n, nxt, Op.CLAIM, nxt, slot)
                                  for n in names[:2]]).results == [Code.GRANTED, Code.GRANTED]
    standby.ledger.record(0, [Event(n, nxt, "sent", "rescued") for n in names[:2]])
    # resumed: its lease expired; the rest of the chunk is recorded unsent, then re-elected
    leader.lease.mark_lost()
    leader.ledger.record(1, [Event(n, slot, "unsent", "lease expired") for n in names])
    redis_client.delete(leader.keys.leader)
    assert leader.lease.try_acquire()
    stored, definitions = leader.ledger.load_with_definitions()
    opts = EntryOptions.defaults(leader.config)
    entries = {n: SimpleNamespace(schedule=schedule(timedelta(seconds=5))) for n in names}
    loaded = load(entries, stored, start=from_ms(base + 30_000),
                  reading=Reading(tz=UTC, options={}, default=opts),
                  known=Known(epoch=leader.lease.epoch, definitions=definitions))
    unsent = list(loaded.unsent) + [
        Unsent(n, from_ms(s), st.state == SlotStatus.CLAIMED, st.claimed_ms, overtaken=True)
        for (n, s), st in leader.ledger.overtaken().items()]
    sent: list[tuple[str, int]] = []
    gate = LeaderGate(leader.lease, leader.ledger)

    def send(name: str, at: datetime) -> bool:
        sent.append((name, to_ms(at)))
        return True
    later = report_unsent(unsent, gate=gate, send=send, recover=True, memory=SentMemory())
    assert later == []
    assert sorted(sent) == [(n, slot) for n in names]
    # asked again (a second election, the reply lost): nothing goes twice
    again = report_unsent(unsent, gate=gate, send=send, recover=True, memory=SentMemory())
    assert again == [] and len(sent) == 4


def test_an_entry_the_leader_no_longer_schedules_is_not_rescued_and_restarts_when_back(
        node, redis_client):
    """A disabled row: a standby that has not re-read the rows must not rescue it, and
    re-enabling it starts at its next slot, not a replay of one due while disabled."""
    from celery_leaderbeat.store.ledger import REMOVED
    leader, standby = node("leader"), node("standby")
    assert leader.lease.try_acquire()
    base = redis_ms(redis_client) - 20_000
    leader.ledger.claim(*leader.lease.credentials(),
                        [ClaimItem("row", base, Op.ANCHOR, fingerprint="fp")])
    leader.ledger.write_definitions({"row": REMOVED})  # the leader's reload: row disabled
    slot = base + 5000
    assert standby.ledger.rescue([ClaimItem("row", slot, Op.CLAIM, slot, base, "fp")]).results \
        == [Code.DIFFERS]
    now = from_ms(redis_ms(redis_client))
    opts = EntryOptions.defaults(leader.config)
    stored, definitions = leader.ledger.load_with_definitions()
    back = load({"row": SimpleNamespace(schedule=schedule(timedelta(seconds=5)))}, stored,
                start=now,
                reading=Reading(tz=UTC, options={}, default=opts, fingerprint_of=lambda *a: "fp"),
                known=Known(epoch=1, definitions=definitions))
    assert [(i.op, i.slot_ms) for i in back.anchors] == [(Op.REANCHOR, to_ms(now))]
    assert leader.ledger.claim(*leader.lease.credentials(), back.anchors) == [Code.GRANTED]
    assert leader.ledger.load_with_definitions()[1]["row"] == "fp"


def test_metric_series_of_entries_no_longer_scheduled_are_dropped():
    pytest.importorskip("prometheus_client")
    from celery_leaderbeat.ops.metrics import Metrics
    metrics = Metrics()
    metrics.slots([Event("kept", 1, "sent"), Event("gone", 1, "sent"),
                   Event("gone", 2, "missed")], entries=2)
    metrics.keep_entries(["kept"])
    names = {s.labels.get("entry") for m in metrics.registry.collect() for s in m.samples
             if m.name == "leaderbeat_slots"}
    assert names == {"kept"}


def test_a_claim_no_replica_acknowledged_still_says_what_was_granted_and_what_refused(
        node, redis_client):
    from celery_leaderbeat.errors import NotReplicatedError
    leader = node("leader", min_replicas=1)
    assert leader.lease.try_acquire()
    now = redis_ms(redis_client)
    with pytest.raises(NotReplicatedError):  # the anchor: no replica here at all
        leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", now - 5000, Op.ANCHOR)])
    with pytest.raises(NotReplicatedError) as caught:
        leader.ledger.claim(*leader.lease.credentials(),
                            [ClaimItem("e", now - 6000, Op.CLAIM, now - 6000),  # older: refused
                             ClaimItem("f", now - 1000, Op.CLAIM, now - 1000)])  # granted
    refused, granted = caught.value.results
    assert isinstance(refused, Refused) and granted is Code.GRANTED


def test_a_leader_that_led_until_redis_lost_its_data_carries_on_after_what_anyone_sent():
    """Found by the chaos soak: a leader re-elected after an empty restart carried on from
    its own newest send and sent again a slot another leader had sent after it."""
    now = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
    memory = SentMemory()
    memory.note("e", to_ms(now - timedelta(seconds=120)))  # this node sent 09:58
    memory.know("e", to_ms(now - timedelta(seconds=60)))  # and saw 09:59 sent by another
    entries = {"e": SimpleNamespace(schedule=schedule(timedelta(seconds=60)))}
    opts = EntryOptions.defaults(Config.from_values({"redis_url": "redis://x", "key_prefix": "t", "node_id": "n"}))
    loaded = load(entries, {}, start=now + timedelta(seconds=5),
                  reading=Reading(tz=UTC, options={}, default=opts),
                  known=Known(epoch=9, remembered=memory.newest_known, trust_memory=True))
    assert [(i.op, i.slot_ms) for i in loaded.anchors] == \
        [(Op.RESTORE, to_ms(now - timedelta(seconds=60)))]
    assert loaded.tracked["e"].next_fire == now


def test_no_rescue_until_the_newest_leader_marked_the_definitions(node, redis_client):
    """The fingerprints stored are an earlier leader's until the newest one marks them with
    its epoch (at its election): a rescue waits, however its fingerprint compares."""
    first, second, standby = node("first"), node("second"), node("standby")
    assert first.lease.try_acquire()
    base = redis_ms(redis_client) - 20_000
    first.ledger.claim(*first.lease.credentials(),
                       [ClaimItem("e", base, Op.ANCHOR, fingerprint="every-5s"),
                        ClaimItem("", 0, Op.DEFINE)])
    assert first.lease.release()
    assert second.lease.try_acquire()  # elected with another definition, not marked yet
    slot = base + 5000
    rescue = [ClaimItem("e", slot, Op.CLAIM, slot, base, "every-5s")]
    assert standby.ledger.rescue(rescue).results == [Code.EARLY]
    second.ledger.claim(*second.lease.credentials(),
                        [ClaimItem("e", 0, Op.DEFINE, fingerprint="every-10s")])
    assert standby.ledger.rescue(rescue).results == [Code.DIFFERS]
    assert standby.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot, base, "every-10s")]
                                 ).results == [Code.GRANTED]
