"""The fault sweep: the scenario replayed with one fault at one store call, call by call.

It runs on Redis (a fault at each Redis command, pipeline and subscription read), on
the in-memory store (a fault at each call of a store member, at its boundary) and on
PostgreSQL (a fault at each SQL transaction and subscription read, the server's clock
the virtual one: see :mod:`tests.faults.pg_sim`).

A clean run counts the scenario's calls and labels each by call site (see
:mod:`tests.faults.seam`). Each replay then injects one fault kind at one call
index, and the invariants (I1: no slot published twice; I2: every due slot
published or recorded with a reason; and no beat exits) are checked after it.

In CI the replays are a seeded sample: every distinct call site once, the fault
kinds in turn, and every Lua script call site (claims, records, rescues, the
lease) also with ``before`` and ``after``, each at a randomly chosen occurrence
of that site (about 50 replays, about a minute on a busy 2-core machine); on
PostgreSQL, where a replay takes longer, every SQL call site of the same rules with
``after`` instead (39 replays, under 3 minutes). ``LEADERBEAT_SWEEP=full`` replays every index with every kind
(6,498 replays of 1,083 calls, about an hour and a half); ``LEADERBEAT_SWEEP_SHARD=i/n``
splits it among n processes; ``LEADERBEAT_SWEEP_SEED`` picks another sample.

Failures found are asserted together at the end, one line each; each one is
also written as a plain test in ``test_regressions.py``.
"""

from __future__ import annotations

import logging
import os
import random
from collections import defaultdict
from collections.abc import Iterator

import pytest

from tests.support.postgres import postgres_database
from tests.support.redis_server import RedisServer

from . import scenario
from .memory_sim import MemorySim
from .pg_sim import PostgresDatabase, PostgresSim, server_time_uses
from .seam import AFTER, BEFORE, KINDS, Seam
from .sim import Sim

FULL = os.environ.get("LEADERBEAT_SWEEP") == "full"
#: PostgreSQL's SQL functions of the Lua scripts' rules (the lease, claims, rescues, records)
PG_RULES = ("SQL[acquire]", "SQL[renew]", "SQL[release]", "SQL[claim]", "SQL[record]")
SEED = int(os.environ.get("LEADERBEAT_SWEEP_SEED", "14"))
#: "i/n": this run replays the i-th of n interleaved shares of the full sweep (0-based),
#: so n processes share one full sweep (``LEADERBEAT_SWEEP=full`` only)
SHARD = os.environ.get("LEADERBEAT_SWEEP_SHARD", "0/1")


@pytest.fixture(scope="module")
def sweep_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One Redis for every replay of the module, flushed before each."""
    with RedisServer(workdir=tmp_path_factory.mktemp("sweep-redis")) as server:
        yield server


@pytest.fixture(scope="module")
def sweep_postgres() -> Iterator[PostgresDatabase]:
    """One database for every replay of the module, emptied before each."""
    with postgres_database("lbsweep") as name:
        yield PostgresDatabase(name)


#: what a replay runs on: the module's Redis, its PostgreSQL database, or the in-memory store
Store = RedisServer | PostgresDatabase | None


@pytest.fixture(params=["redis", "memory", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    """The store the scenario runs on: the module's Redis or PostgreSQL database, or the
    in-memory store (None)."""
    if request.param == "memory":
        return None
    found: Store = request.getfixturevalue(f"sweep_{request.param}")
    return found


def replay(server: Store, monkeypatch: pytest.MonkeyPatch,
           plan: dict[int, str]) -> tuple[Sim, list[str]]:
    """One run of the scenario on an empty store with ``plan`` (index -> kind): on
    ``server``, or on a new in-memory store when it is None."""
    seam = Seam(plan=dict(plan))
    if server is None:
        sim: Sim = MemorySim.on("sweep", scenario.schedule(), seam=seam)
    elif isinstance(server, PostgresDatabase):
        sim = PostgresSim.on(server, "sweep", scenario.schedule(), seam=seam)
    else:
        admin = server.client()
        admin.flushall()
        admin.script_flush()  # a replay loads the scripts again, as the first run did
        admin.close()
        sim = Sim(server.url, "sweep", scenario.schedule(), seam=seam)
    with monkeypatch.context() as patch:
        sim.install(patch)
        try:
            scenario.play(sim)
            return sim, scenario.check(sim)
        finally:
            sim.close()


def sample(calls: list[str], rng: random.Random) -> list[tuple[int, str]]:
    """CI: every call site once, the kinds in turn; every Lua script call site (the
    protocol's state changes) also with ``before`` and ``after``, and on PostgreSQL each
    SQL call site of the same rules also with ``after`` (a replay there takes longer);
    each at a randomly chosen occurrence of the site. Full: every index with every kind."""
    if FULL:
        share, shares = (int(part) for part in SHARD.split("/"))
        every = [(index, kind) for index in range(len(calls)) for kind in KINDS]
        return every[share::shares]
    where: dict[str, list[int]] = defaultdict(list)
    for index, label in enumerate(calls):
        where[label].append(index)
    chosen = set()
    for turn, (label, indices) in enumerate(sorted(where.items())):
        chosen.add((rng.choice(indices), KINDS[turn % len(KINDS)]))
        if label.startswith(("EVALSHA", "CALL ")):  # one atomic step of the store
            chosen |= {(rng.choice(indices), BEFORE), (rng.choice(indices), AFTER)}
        if label.startswith(PG_RULES):  # a transaction committed, its answer lost
            chosen.add((rng.choice(indices), AFTER))
    return sorted(chosen)


def test_the_scenario_without_faults_keeps_every_invariant_and_replays_the_same_calls(
        store, monkeypatch):
    first, problems = replay(store, monkeypatch, {})
    assert problems == []
    labels = [call.label for call in first.seam.calls]
    second, _ = replay(store, monkeypatch, {})
    assert [call.label for call in second.seam.calls] == labels, "the replay is not deterministic"
    # the scenario holds what the sweep is meant to cover
    assert len(first.published) >= 8 * scenario.ENTRIES
    assert any(p.epoch == 0 for p in first.published), "no standby rescued anything"
    assert len({p.epoch for p in first.published if p.epoch}) >= 3, "fewer than 3 leaders sent"
    if isinstance(first, PostgresSim):  # the server's time was the virtual one
        written = max(int(event["at"]) for event in first.last_history)
        assert written <= first.clock.time() * 1000, "a time was written by the real clock"


def test_the_postgres_store_reads_the_servers_time_only_through_clock_timestamp():
    """The harness's virtual server clock takes an unqualified ``clock_timestamp()`` only
    (see pg_sim.py): another clock function in the store's SQL would run in real time."""
    assert server_time_uses() == {}


@pytest.mark.xdist_group("heavy")  # CPU-heavy: never beside another heavy test
def test_one_fault_at_any_store_call_keeps_every_invariant(store, monkeypatch, caplog):
    caplog.set_level(logging.CRITICAL)  # thousands of expected warnings: not worth keeping
    clean, problems = replay(store, monkeypatch, {})
    assert problems == []
    calls = [call.label for call in clean.seam.calls]
    runs = sample(calls, random.Random(SEED))
    failures: list[str] = []
    for index, kind in runs:
        sim, problems = replay(store, monkeypatch, {index: kind})
        hit = sim.seam.injected()
        where = hit[0].label if hit else f"(index {index} not reached)"
        failures += [f"{kind} at #{index} {where}: {line}" for line in problems[:3]]
    sites = len(set(calls))
    print(f"sweep: {len(calls)} calls, {sites} call sites, {len(runs)} injections, "
          f"kinds {', '.join(KINDS)}, {len(failures)} failure lines")
    assert failures == [], "\n".join(failures[:60])
