"""Redis restored from a snapshot that holds the leader's own lease, in the model's world.

Three in-process nodes on a real Redis, a virtual clock (see :mod:`tests.faults.sim`).
A leader that led through the loss carries on from what it knew settled, with no
margin; one that may not have led all along (paused long enough for another node
to lead and send what the restore then erased) starts every entry again after the
margin, as after any rollback, and sends nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer

from .invariants import duplicates
from .model_world import World
from .test_regressions import three_nodes


@pytest.fixture(scope="module")
def kept_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(workdir=tmp_path_factory.mktemp("kept-redis")) as server:
        yield server


@pytest.fixture
def world(kept_redis: RedisServer) -> Iterator[World]:
    with three_nodes(kept_redis) as world:
        yield world


def just_renewed(world: World) -> None:
    """Run until the leader has just renewed its lease (nearly a whole ttl left)."""
    for _ in range(40):
        if world.sim.expiry.virtual_pttl(world.keys.leader) >= 9_600:
            return
        world.run(0.25)
    raise AssertionError("the leader did not renew its lease within 10 s")


def missed(world: World) -> list[dict[str, str]]:
    world.collect_history()
    return [e for e in world.events.values() if e.get("event") == "missed"]


def test_a_leader_that_keeps_its_lease_through_a_restore_carries_on_with_no_margin(
        world, caplog):
    caplog.set_level(logging.ERROR)
    world.run(12.0)  # a leads and sends
    assert world.sim.leader() == "a"
    world.take_snapshot()  # a's lease in it
    world.run(3.0)  # a sends more: the snapshot does not have them
    before = len(world.sim.published)
    world.restore_snapshot()  # a leads on under the same token
    world.run(2.0)
    assert world.sim.leader() == "a"
    after = [p for p in world.sim.published[before:]]
    assert after and {p.node for p in after} == {"a"}
    assert duplicates(world.sim.published, world.sim.prefix) == []
    assert missed(world) == []
    assert world.settle_and_check() == []


def test_a_leader_paused_while_another_led_does_not_carry_on_from_its_memory(world, caplog):
    """The leader b is stopped just after a renewal and a claim; Redis restarts empty;
    a, stopped since before b led (so it led last, as far as it knows), resumes, takes
    the lease at once and sends after its margin. Redis is then restored from a snapshot
    taken before the loss, with b's lease in it and still valid, and b resumes within
    its own deadline: its renewal and its token check pass, and its claim finds the
    generation lower. What a sent is in no memory of b's (and a's phase is another, so
    only the margin keeps b from sending a slot twice on a fixed-phase schedule): b has
    not led all along, so it starts every entry again after the margin, sending nothing
    sooner."""
    caplog.set_level(logging.ERROR)
    world.run(12.0)
    assert world.sim.leader() == "a"
    world.sim.nodes["a"].paused = True  # SIGSTOP: b or c leads once its lease expires
    world.run(14.0)
    led = world.last_leader
    assert led in ("b", "c")
    just_renewed(world)
    world.take_snapshot()  # the leader's lease in it, with nearly a whole ttl to live
    counter = int(world.sim.admin.get(world.keys.generation))
    ledger = world.sim.nodes[led].scheduler._shared.ledger
    for _ in range(4):  # a claim after the snapshot: the restore is a rollback to it
        if ledger.generation > counter:
            break
        world.run(0.25)
    assert ledger.generation > counter
    world.sim.nodes[led].paused = True
    world.redis_restarts_empty()
    world.sim.nodes["a"].paused = False  # leads at once, sends after its margin
    start = len(world.sim.published)
    for _ in range(32):
        if any(p.node == "a" for p in world.sim.published[start:]):
            break
        world.run(0.25)
    assert any(p.node == "a" for p in world.sim.published[start:]), "a sent nothing"
    world.restore_snapshot()  # the leader's lease comes back
    assert world.sim.expiry.virtual_pttl(world.keys.leader) > 0
    world.sim.nodes[led].paused = False
    resumed = len(world.sim.published)
    world.run(4.0)  # less than the margin (5 s here)
    assert [p for p in world.sim.published[resumed:] if p.node == led] == []
    assert duplicates(world.sim.published, world.sim.prefix) == []
    assert world.settle_and_check() == []



def test_a_restore_within_a_lease_ttl_of_the_first_start_records_no_start_margin(
        world, caplog):
    """The leader's first start anchored every entry after the margin, knowing of no loss,
    and waits a lease ttl for a report of one. Redis restored, within that ttl, from a
    snapshot taken after those anchors: the loss is later than the anchors, so it says
    nothing of the start, and the margin's slots (never due under any earlier leader)
    are not recorded ``missed``."""
    caplog.set_level(logging.ERROR)
    world.run(6.0)  # a leads and sends; its first start's entries still wait for reports
    assert world.sim.leader() == "a"
    world.take_snapshot()
    world.run(2.0)  # a sends more, still within a lease ttl of its election
    before = len(world.sim.published)
    world.restore_snapshot()
    world.run(2.0)
    assert world.sim.leader() == "a"
    assert [p for p in world.sim.published[before:]]
    assert duplicates(world.sim.published, world.sim.prefix) == []
    assert missed(world) == []
    assert world.settle_and_check() == []
