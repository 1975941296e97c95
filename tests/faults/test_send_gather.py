"""Send passes and the slots that fall due at instants of their own (on the virtual clock
of :mod:`tests.faults.sim`, stepped far finer than a pass may come)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

import pytest

from celery_leaderbeat.roles.leader import SEND_GATHER
from celery_leaderbeat.timing.clocks import from_ms
from tests.support.redis_server import RedisServer

from .sim import TASK, Sim

STEP = 0.01


@pytest.fixture(scope="module")
def gather_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(workdir=tmp_path_factory.mktemp("gather-redis")) as server:
        yield server


def _lateness(sim: Sim, node_id: str) -> list[float]:
    """Each message's seconds after its slot's fire time (jitter included)."""
    leader = sim.nodes[node_id].scheduler.leading
    assert leader is not None
    return [p.at - leader.tracked[p.name].clock.fire_time(from_ms(p.slot_ms)).timestamp()
            for p in sim.published]


def _run(server: RedisServer, monkeypatch: pytest.MonkeyPatch, schedule: dict) -> Sim:
    client = server.client()
    client.flushall()
    client.close()
    sim = Sim(server.url, "gather", schedule).install(monkeypatch)
    sim.step_seconds = STEP
    node = sim.start("a")
    while not node.leading:
        sim.step()
    sim.run(15.0)  # the first slots come after the margin of a first start (5 s)
    return sim


def test_slots_due_at_instants_of_their_own_go_out_in_passes_a_gather_apart(
        gather_redis, monkeypatch, caplog):
    """Forty entries jittered over their 2 s interval fall due at instants of their own:
    they go out in passes no closer than SEND_GATHER, each slot at most one gather (and
    a step of the clock) after its time, none twice."""
    caplog.set_level(logging.ERROR)
    schedule = {f"j{i}": {"task": TASK, "schedule": 2.0,
                          "options": {"leaderbeat": {"jitter": 2.0}}} for i in range(40)}
    sim = _run(gather_redis, monkeypatch, schedule)
    try:
        passes = sorted({round(p.at, 6) for p in sim.published})
        assert len(sim.published) >= 120  # about 10 s of 20 sends a second
        assert min(b - a for a, b in itertools.pairwise(passes)) >= SEND_GATHER - 1e-6
        late = _lateness(sim, "a")
        assert max(late) <= SEND_GATHER + 2 * STEP, max(late)
        assert len({(p.name, p.slot_ms) for p in sim.published}) == len(sim.published)
    finally:
        sim.close()


def test_a_slot_due_after_a_quiet_spell_goes_at_once(gather_redis, monkeypatch, caplog):
    """A lone entry every second: each pass is a second after the one before, so its
    slots are sent at their time (within a step of the clock), not held for a gather."""
    caplog.set_level(logging.ERROR)
    sim = _run(gather_redis, monkeypatch, {"lone": {"task": TASK, "schedule": 1.0}})
    try:
        late = _lateness(sim, "a")
        assert len(late) >= 6 and max(late) <= 2 * STEP, late
    finally:
        sim.close()
