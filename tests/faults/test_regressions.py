"""Failures the sweep and the model found, each as a plain deterministic test.

Each is marked ``xfail(strict=True)`` until its fix lands: strict, so the
test turns red once the bug is fixed and the marker must come off. Faults are
aimed at a call site (label) and its n-th occurrence, not at an index, so the
tests keep hitting the same call when the code around it changes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest

from celery_leaderbeat.cluster import Cluster
from celery_leaderbeat.node import utcnow
from tests.support.redis_server import RedisServer

from . import scenario
from .invariants import duplicates, unaccounted
from .model_world import World
from .seam import AFTER, BEFORE, Seam
from .sim import Sim

#: a leader's claim of a chunk in a batch, and its record of the batch's last chunk
BATCH_CLAIM = "EVALSHA[claim] ledger.Ledger._call<ledger.Ledger.claim<batch.LeaderGate.claim"
BATCH_RECORD = "EVALSHA[claim] ledger.Ledger._call<ledger.Ledger.record<batch.LeaderGate.record"


@pytest.fixture(scope="module")
def regression_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(workdir=tmp_path_factory.mktemp("regression-redis")) as server:
        yield server


@pytest.fixture
def empty_redis(regression_redis: RedisServer) -> RedisServer:
    admin = regression_redis.client()
    admin.flushall()
    admin.script_flush()
    admin.close()
    return regression_redis


def play_scenario(server: RedisServer, monkeypatch: pytest.MonkeyPatch,
                  seam: Seam) -> tuple[Sim, list[str]]:
    sim = Sim(server.url, "regression", scenario.schedule(), seam=seam).install(monkeypatch)
    try:
        scenario.play(sim)
        return sim, scenario.check(sim)
    finally:
        sim.close()


@pytest.mark.xfail(strict=True, reason="a chunk's 'sent' rides on the next claim; when that "
                   "call fails the chunk is pushed back un-advanced and claim.lua grants the "
                   "same value again: the chunk is published twice")
def test_a_claim_that_fails_before_reaching_redis_does_not_resend_the_previous_chunk(
        empty_redis, monkeypatch, caplog):
    caplog.set_level(logging.ERROR)
    seam = Seam()
    seam.aim(BATCH_CLAIM, BEFORE, occurrence=2)  # the second chunk of the first burst
    sim, problems = play_scenario(empty_redis, monkeypatch, seam)
    assert len(seam.injected()) == 1
    assert problems == []


@pytest.mark.xfail(strict=True, reason="the batch's last chunk is recorded 'sent' by a call "
                   "of its own; when it fails before reaching Redis the chunk is pushed back "
                   "un-advanced and sent again at the next tick")
def test_a_record_of_the_last_chunk_that_fails_does_not_resend_the_chunk(
        empty_redis, monkeypatch, caplog):
    caplog.set_level(logging.ERROR)
    seam = Seam()
    seam.aim(BATCH_RECORD, BEFORE, occurrence=1)
    sim, problems = play_scenario(empty_redis, monkeypatch, seam)
    assert len(seam.injected()) == 1
    assert problems == []


@pytest.mark.xfail(strict=True, reason="backfill trusts the history alone: a range reaching "
                   "into the future publishes slots that are sent again when they come due")
def test_a_backfill_reaching_into_the_future_does_not_send_a_slot_twice(empty_redis, caplog):
    caplog.set_level(logging.ERROR)
    world = World(empty_redis)
    try:
        for node in ("a", "b", "c"):
            world.sim.start(node)
        world.run(8.0)  # the entries' first slots (5 s after the start) have gone out
        cluster = Cluster(world.sim.app("cli"))
        world.clis.append(cluster)
        now = utcnow()
        never, _, _ = cluster.backfill_slots("s2", now - timedelta(seconds=6),
                                             now + timedelta(seconds=8))
        assert never, "nothing to backfill: the test would prove nothing"
        cluster.backfill("s2", never, "regression")
        world.run(12.0)
        assert duplicates(world.sim.published, world.sim.prefix) == []
    finally:
        world.close()


#: a standby's rescue claim
RESCUE_CLAIM = "EVALSHA[claim] ledger.Ledger._call<ledger.Ledger.rescue<batch.RescueGate.claim"


@pytest.mark.xfail(strict=True, reason="a rescue claim granted in Redis whose reply is lost: "
                   "the standby never sends those slots and nothing records them (no unsent "
                   "report, no missed): lost without a trace")
def test_a_rescue_claim_whose_reply_is_lost_leaves_no_slot_unrecorded(
        empty_redis, monkeypatch, caplog):
    caplog.set_level(logging.ERROR)
    seam = Seam()
    seam.aim(RESCUE_CLAIM, AFTER, occurrence=2)  # a rescue while the crashed leader's lease lives
    sim, problems = play_scenario(empty_redis, monkeypatch, seam)
    assert len(seam.injected()) == 1
    assert problems == []


@pytest.mark.xfail(strict=True, reason="after Redis restarts empty the leader re-anchors every "
                   "entry 5 s ahead: the slots due until then are neither sent nor recorded")
def test_slots_due_after_redis_restarts_empty_are_sent_or_recorded(empty_redis, caplog):
    caplog.set_level(logging.ERROR)
    world = World(empty_redis)
    try:
        for node in ("a", "b", "c"):
            world.sim.start(node)
        world.run(12.0)
        world.redis_restarts_empty()
        world.run(20.0)
        world.collect_history()
        horizon = int((world.sim.clock.time() - 3.0) * 1000)
        problems = unaccounted(world.sim.published, list(world.events.values()),
                               world.intervals(), horizon, world.sim.prefix)
        assert problems == []
    finally:
        world.close()


@pytest.mark.xfail(strict=True, reason="Redis restored from an older snapshot rolls slot states "
                   "back; nothing detects it and the next leader sends again what was sent")
def test_slots_sent_before_redis_is_restored_from_an_older_snapshot_are_not_sent_again(
        empty_redis, caplog):
    caplog.set_level(logging.ERROR)
    world = World(empty_redis)
    try:
        for node in ("a", "b", "c"):
            world.sim.start(node)
        world.run(1.0)
        world.take_snapshot()  # the entries are anchored, nothing sent yet
        world.run(7.0)  # a sends the first slots
        assert world.sim.published, "nothing sent before the restore: the test proves nothing"
        world.sim.crash("a")
        world.restore_snapshot()
        world.run(15.0)
        assert duplicates(world.sim.published, world.sim.prefix) == []
    finally:
        world.close()


@pytest.mark.xfail(strict=True, reason="a standby that has not seen a schedule change rescues "
                   "slots of the old definition that the leader no longer plans")
def test_a_standby_with_an_old_definition_does_not_rescue_slots_the_leader_does_not_plan(
        empty_redis, caplog):
    caplog.set_level(logging.ERROR)
    world = World(empty_redis)
    try:
        for node in ("a", "b", "c"):
            world.sim.start(node)
        world.run(1.0)
        assert world.sim.leader() == "a"
        world.change_schedule("a")  # x: every 2 s -> every 6 s, seen by the leader only
        world.run(15.0)
        assert world.rescues_of_another_definition() == []
    finally:
        world.close()


@pytest.mark.xfail(strict=True, reason="one Redis error on a standby while the leader is "
                   "stopped restarts its rescues from 'now': the slots due between the leader's "
                   "stop and that moment are neither rescued nor recorded")
def test_a_redis_error_on_a_standby_while_the_leader_is_paused_loses_no_slot_unrecorded(
        empty_redis, caplog):
    caplog.set_level(logging.ERROR)
    world = World(empty_redis)
    try:
        for node in ("a", "b", "c"):
            world.sim.start(node)
        world.run(1.0)
        world.sim.crash("b")  # one standby left: c
        world.run(12.0)
        assert world.sim.leader() == "a"
        world.sim.nodes["a"].paused = True  # SIGSTOP: its lease runs out in 10 s
        world.sim.seam.aim("EVALSHA[acquire] lease.Lease.try_acquire", BEFORE)  # c's next try
        world.run(12.0)
        world.sim.crash("a")
        world.run(1.0)
        assert len(world.sim.seam.injected()) == 1
        assert world.settle_and_check() == []
    finally:
        world.close()
