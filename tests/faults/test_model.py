"""Model-based test: three in-process nodes on a real Redis, driven by hypothesis; the same
on PostgreSQL (:mod:`tests.faults.pg_sim`) and on the in-memory store.

Each example starts three nodes (see :mod:`tests.faults.sim`: a virtual clock,
every Redis call through the fault seam, publishes recorded) on an empty Redis
and applies a random sequence of rules: time passes, a node crashes (forgets
everything) or starts again, pauses (SIGSTOP: neither ticked nor renewed) or
resumes, one Redis call fails (before, after, delayed past the ttl, connection
dropped, retried), Redis restarts empty, Redis is restored from an older
snapshot, one node sees a schedule change before the others, the CLI steps the
leader down, triggers an entry, or backfills a range (past or future).

After every step: I1 (no slot published twice, by anyone), I4 (a standby's
rescue is of the definition its leader plans: here, every rescuer has the
same definition of the entry as the node leading when it rescues), and no beat
exited. At the end of an example every node is resumed or restarted, faults
stop, time runs on for longer than the lease ttl, and I2 (every due slot
published or recorded with a reason) is checked over everything published and
every history event ever seen (the history is read after every step, so a Redis
restart does not hide what was recorded before it); except in an example where
every node that remembered anything when Redis last lost its data was gone
before the end (crashed): nothing can tell that loss from a first start, a
limit pinned by design in ``test_regressions.py``, so only I1 and I4 hold there.

CI runs :data:`EXAMPLES` examples (``LEADERBEAT_MODEL_EXAMPLES`` for more); a
failure prints its
rule sequence (shrunk with ``LEADERBEAT_MODEL_SHRINK=1``), which becomes a plain
test in ``test_regressions.py``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_leaderbeat.ops.cluster import Cluster
from celery_leaderbeat.roles.shared import utcnow
from tests.support.postgres import postgres_database
from tests.support.redis_server import RedisServer

from .invariants import duplicates
from .memory_sim import MemoryWorld
from .model_world import NODES, World
from .pg_sim import PostgresDatabase, PostgresWorld
from .seam import KINDS

EXAMPLES = int(os.environ.get("LEADERBEAT_MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("LEADERBEAT_MODEL_STEPS", "25"))
#: shrinking a failure takes minutes here: only when asked (the unshrunk steps are printed)
SHRINK = os.environ.get("LEADERBEAT_MODEL_SHRINK") == "1"


class LeaderbeatModel(RuleBasedStateMachine):
    """Rules act on a :class:`World`; invariants are checked after each one."""

    server: RedisServer  # set by the test before the machine runs

    def __init__(self) -> None:
        super().__init__()
        self.world = World(self.server)

    def cli(self) -> Cluster:
        """What ``celery leaderbeat ...`` uses: a Cluster on a client of its own."""
        cluster = Cluster(self.world.sim.app("cli"))
        self.world.clis.append(cluster)
        return cluster

    @initialize()
    def start_three_nodes(self) -> None:
        for node_id in NODES:
            self.world.sim.start(node_id)
        self.world.run(1.0)

    # -- time and processes -------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 3.0, 6.0, 12.0]))
    def time_passes(self, seconds: float) -> None:
        self.world.run(seconds)

    @rule(node=st.sampled_from(NODES))
    def crash(self, node: str) -> None:
        if node in self.world.sim.nodes:
            self.world.sim.crash(node)

    @rule(node=st.sampled_from(NODES))
    def start(self, node: str) -> None:
        if node not in self.world.sim.nodes:
            self.world.sim.start(node)

    @rule(node=st.sampled_from(NODES))
    def pause(self, node: str) -> None:
        if node in self.world.sim.nodes:
            self.world.sim.nodes[node].paused = True

    @rule(node=st.sampled_from(NODES))
    def resume(self, node: str) -> None:
        if node in self.world.sim.nodes:
            self.world.sim.nodes[node].paused = False

    # -- Redis ---------------------------------------------------------------------------

    @rule(kind=st.sampled_from(KINDS), ahead=st.integers(0, 40))
    def a_redis_call_fails(self, kind: str, ahead: int) -> None:
        """The ``ahead``-th Redis call from now fails this way."""
        seam = self.world.sim.seam
        seam.plan[seam.count + ahead] = kind

    @rule()
    def redis_restarts_empty(self) -> None:
        self.world.redis_restarts_empty()

    @rule()
    def redis_snapshot(self) -> None:
        self.world.take_snapshot()

    @precondition(lambda self: self.world.snapshot is not None)
    @rule()
    def redis_restarts_from_the_snapshot(self) -> None:
        self.world.restore_snapshot()

    # -- operations ----------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES))
    def schedule_change_seen_by_one_node(self, node: str) -> None:
        self.world.change_schedule(node)

    @rule()
    def schedule_change_seen_by_all(self) -> None:
        for node in NODES:
            self.world.change_schedule(node)

    @rule()
    def step_down(self) -> None:
        self.cli().step_down()

    @rule(entry=st.sampled_from(["s1", "s2", "s3"]))
    def trigger(self, entry: str) -> None:
        self.cli().trigger(entry, "model")

    @rule(entry=st.sampled_from(["s1", "s2", "s3"]), back=st.sampled_from([2.0, 6.0, 20.0]),
          ahead=st.sampled_from([-1.0, 0.0, 4.0, 8.0]))
    def backfill(self, entry: str, back: float, ahead: float) -> None:
        cluster = self.cli()
        now = utcnow()
        try:
            never, _, _ = cluster.backfill_slots(entry, now - timedelta(seconds=back),
                                                 now + timedelta(seconds=ahead))
        except LookupError:  # no slot in Redis yet: the CLI refuses, nothing queued
            return
        if never:
            cluster.backfill(entry, never, "model")

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def nothing_published_twice_and_no_beat_exited(self) -> None:
        world = self.world
        world.collect_history()
        problems = duplicates(world.sim.published, world.sim.prefix)
        problems += [f"exit: {line}" for line in world.sim.exits]
        problems += world.rescues_of_another_definition()
        assert problems == [], "\n".join(problems[:20])

    def teardown(self) -> None:
        try:
            problems = self.world.settle_and_check()
            assert problems == [], "\n".join(problems[:20])
        finally:
            self.world.close()


class MemoryModel(LeaderbeatModel):
    """The same rules and invariants on the in-memory store ("Redis" there: the store)."""

    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        self.world = MemoryWorld()


class PostgresModel(LeaderbeatModel):
    """The same rules and invariants on PostgreSQL ("Redis" there: the database, which
    loses its rows or goes back to a snapshot)."""

    database: PostgresDatabase  # set by the test before the machine runs

    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        self.world = PostgresWorld(self.database)


@pytest.fixture(scope="module")
def model_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(workdir=tmp_path_factory.mktemp("model-redis")) as server:
        yield server


@pytest.fixture(scope="module")
def model_postgres() -> Iterator[PostgresDatabase]:
    with postgres_database("lbmodel") as name:
        yield PostgresDatabase(name)


#: what the model runs on: the module's Redis, its PostgreSQL database, or the in-memory store
Store = RedisServer | PostgresDatabase | None


@pytest.fixture(params=["redis", "memory", "postgres"])
def store(request: pytest.FixtureRequest) -> Store:
    """The module's Redis or PostgreSQL database, or the in-memory store (None)."""
    if request.param == "memory":
        return None
    found: Store = request.getfixturevalue(f"model_{request.param}")
    return found


def _model(store: Store) -> type[LeaderbeatModel]:
    """The machine for ``store``, pointed at it."""
    if store is None:
        return MemoryModel
    if isinstance(store, PostgresDatabase):
        PostgresModel.database = store
        return PostgresModel
    LeaderbeatModel.server = store
    return LeaderbeatModel


@contextmanager
def _example(store: Store) -> Iterator[LeaderbeatModel]:
    """One example of the machine on ``store``, three nodes started: the body's steps,
    then the teardown's checks (I1, I2, I4); the world closed whatever happens."""
    state = _model(store)()
    try:
        state.start_three_nodes()
        yield state
    except BaseException:
        state.world.close()
        raise
    state.teardown()


@pytest.mark.xdist_group("heavy")  # CPU-heavy: never beside another heavy test
def test_the_protocol_keeps_its_invariants_under_any_sequence_of_faults(store, caplog):
    """Crashes, pauses, failing calls (every kind), the store restarted empty or from an
    older snapshot, schedule changes, step-downs, triggers and backfills, in any order: no
    slot twice, every due slot sent or recorded. On Redis, PostgreSQL and the in-memory
    store."""
    caplog.set_level(logging.CRITICAL)
    run_state_machine_as_test(_model(store), settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True,
        database=None, suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate] + ([Phase.shrink] if SHRINK else [])))


def test_slots_due_while_nobody_may_lead_after_two_losses_are_recorded(store):
    """Found by the model on Redis and the in-memory store: Redis restarted empty twice while nobody led (the
    leader crashed, one standby paused, the other holding back for the node that led last):
    the slots due until a new process leads are recorded, the new leader's margin reaching
    back to the newest slot a live node knew settled."""
    with _example(store) as state:
        state.resume(node='b')
        state.a_redis_call_fails(ahead=12, kind='delay')
        state.schedule_change_seen_by_all()
        state.time_passes(seconds=12.0)
        state.pause(node='c')
        state.trigger(entry='s3')
        state.step_down()
        state.schedule_change_seen_by_all()
        state.crash(node='a')
        state.crash(node='a')
        state.redis_restarts_empty()
        state.time_passes(seconds=3.0)
        state.trigger(entry='s1')
        state.backfill(ahead=8.0, back=6.0, entry='s3')
        state.pause(node='a')
        state.redis_restarts_empty()
        state.a_redis_call_fails(ahead=21, kind='delay')
        state.start(node='b')
        state.crash(node='a')
        state.trigger(entry='s1')
        state.schedule_change_seen_by_one_node(node='b')
        state.schedule_change_seen_by_all()
        state.pause(node='a')
        state.resume(node='a')


def test_slots_due_after_the_store_lost_its_data_four_times_in_a_row_are_accounted_for(
        store, request):
    """Found by the model on PostgreSQL: the store emptied four times with no time between
    (a node started, then crashed, in between); then every node comes back.

    On PostgreSQL the leader's (b's) pooled connections died with the restart. When the
    pool handed one out, b's first call after it, a renewal, failed instead of answering
    "no lease" (as the Redis client, which reconnects, and the in-memory store do): b
    found the loss at its next claim, was refused it (a node started afresh, a, was
    elected meanwhile and anchored every entry from its start), stepped down, was elected
    again and went on from a's anchors, and the slots from the loss to those anchors were
    neither sent nor recorded. The pool now drops a connection the server ended while it
    was idle (``store/postgres/pool.py``), so the renewal answers as on the other stores."""
    with _example(store) as state:
        state.schedule_change_seen_by_all()
        state.crash(node='a')
        state.time_passes(seconds=12.0)
        state.schedule_change_seen_by_all()
        state.trigger(entry='s1')
        state.time_passes(seconds=2.0)
        state.time_passes(seconds=3.0)
        state.resume(node='b')
        state.schedule_change_seen_by_all()
        state.start(node='a')
        state.redis_restarts_empty()
        state.resume(node='b')
        state.schedule_change_seen_by_one_node(node='c')
        state.redis_restarts_empty()
        state.a_redis_call_fails(ahead=15, kind='late')
        state.resume(node='a')
        state.redis_restarts_empty()
        state.redis_restarts_empty()
        state.crash(node='a')
        state.redis_restarts_empty()


def test_slots_due_after_the_store_is_emptied_with_only_a_long_paused_node_left_are_accounted_for(
        store, request):
    """Found by the model on PostgreSQL (200 examples under another derandomized seed: the
    88th); it fails on every store alike. ``c`` leads while ``a`` (the first leader) and
    ``b`` are paused; then, at one instant, the store is emptied three times, ``b`` and ``c``
    crash. The only process left, ``a``, was paused before any slot was settled: it can
    tell the store lost writes (it saw the generation) but knows no settled slot of any
    entry, and ``c``, which knew what it sent, is gone. The slots due from ``c``'s last send
    until a new leader sends (about 7 s) are neither sent nor recorded: no live process
    can date them. The model counts a node that saw only the generation as remembering,
    so it checks I2 here; what would account for them is a witness that knew a settled
    slot, as in the first case of ``test_regressions.py``."""
    request.applymarker(pytest.mark.xfail(strict=True, reason=(
        "the store emptied with the only live process paused since before any slot was "
        "settled: it knows of the loss but of no settled slot, so nobody can date the slots "
        "due until a new leader sends (every store)")))
    with _example(store) as state:
        state.pause(node='b')
        state.pause(node='a')
        state.time_passes(seconds=12.0)
        state.a_redis_call_fails(ahead=4, kind='repeat')
        state.pause(node='b')
        state.time_passes(seconds=3.0)
        state.time_passes(seconds=0.5)
        state.start(node='a')
        state.redis_restarts_empty()
        state.pause(node='b')
        state.redis_restarts_empty()
        state.crash(node='b')
        state.start(node='c')
        state.pause(node='a')
        state.pause(node='c')
        state.pause(node='c')
        state.a_redis_call_fails(ahead=16, kind='after')
        state.crash(node='c')
        state.redis_restarts_empty()
        state.start(node='c')
        state.time_passes(seconds=6.0)
        state.pause(node='a')
        state.a_redis_call_fails(ahead=0, kind='after')
        state.redis_restarts_empty()


def test_slots_due_after_losses_with_a_late_answer_and_a_dropped_connection_are_accounted_for(
        store):
    """Found by the model on PostgreSQL (40 examples, the derandomized seed of CI): the
    store emptied three times while nodes crashed and started again, one answer late past
    the ttl and a node's connection dropped; then every node comes back. The leader b
    found the last loss and asked to start again past it, then lost its lease to a new
    process before a claim carried that; elected again, its first claim still lifted the
    generation, clearing the loss another node had reported, so b carried on from the new
    process's anchors and nobody recorded the slots between (about 8 s). A start past a
    loss is now its own term's (``reset_generation(epoch)``)."""
    with _example(store) as state:
        state.schedule_change_seen_by_all()
        state.crash(node='a')
        state.time_passes(seconds=12.0)
        state.schedule_change_seen_by_all()
        state.trigger(entry='s1')
        state.time_passes(seconds=2.0)
        state.time_passes(seconds=3.0)
        state.resume(node='b')
        state.schedule_change_seen_by_all()
        state.start(node='a')
        state.redis_restarts_empty()
        state.resume(node='b')
        state.schedule_change_seen_by_one_node(node='c')
        state.redis_restarts_empty()
        state.a_redis_call_fails(ahead=15, kind='late')
        state.schedule_change_seen_by_all()
        state.schedule_change_seen_by_one_node(node='b')
        state.time_passes(seconds=12.0)
        state.start(node='b')
        state.redis_restarts_empty()
        state.crash(node='c')
        state.schedule_change_seen_by_one_node(node='a')
        state.schedule_change_seen_by_all()
        state.a_redis_call_fails(ahead=11, kind='drop')


@pytest.mark.xfail(strict=True, reason=(
    "the store restored twice from one snapshot with the leader crashed between: a standby "
    "rescues a slot the leader sent after the snapshot (every store)"))
def test_a_slot_sent_before_two_restores_from_one_snapshot_is_not_rescued_again(store):
    """Found by the model on the in-memory store at 1,000 examples: the store restarted
    empty, restored from a snapshot, the leader crashed, restored from the same snapshot
    again; a standby rescues a slot the leader had sent after the snapshot."""
    with _example(store) as state:
        state.time_passes(seconds=3.0)
        state.resume(node='a')
        state.step_down()
        state.pause(node='a')
        state.redis_restarts_empty()
        state.crash(node='a')
        state.start(node='c')
        state.time_passes(seconds=0.5)
        state.time_passes(seconds=0.5)
        state.start(node='a')
        state.time_passes(seconds=12.0)
        state.schedule_change_seen_by_all()
        state.schedule_change_seen_by_all()
        state.redis_snapshot()
        state.redis_restarts_empty()
        state.redis_restarts_from_the_snapshot()
        state.resume(node='a')
        state.schedule_change_seen_by_one_node(node='b')
        state.time_passes(seconds=0.5)
        state.resume(node='b')
        state.schedule_change_seen_by_one_node(node='c')
        state.crash(node='a')
        state.redis_restarts_from_the_snapshot()
        state.backfill(ahead=-1.0, back=6.0, entry='s2')


def test_a_rescue_in_the_round_a_resumed_leader_first_plans_its_change_is_of_that_change(store):
    """Found by the model on PostgreSQL (150 examples, CI's derandomized seed): b, started
    and shown a change of ``x`` while paused, resumes, is elected and plans the change in
    the first round; a standby rescues ``x`` under the change later in that same round.
    The check (I4) read b's plan as of the round before (the old definition) and called
    the rescue one of another definition: the checker's error, not the beats'. A node's
    plan is now noted at its own tick."""
    with _example(store) as state:
        state.start(node='c')
        state.trigger(entry='s3')
        state.start(node='c')
        state.pause(node='c')
        state.trigger(entry='s2')
        state.crash(node='b')
        state.start(node='a')
        state.step_down()
        state.schedule_change_seen_by_one_node(node='a')
        state.time_passes(seconds=2.0)
        state.crash(node='a')
        state.crash(node='b')
        state.pause(node='b')
        state.time_passes(seconds=3.0)
        state.step_down()
        state.start(node='b')
        state.schedule_change_seen_by_one_node(node='b')
        state.pause(node='b')
        state.time_passes(seconds=6.0)
        state.time_passes(seconds=3.0)
        state.start(node='c')
        state.pause(node='a')
        state.start(node='b')
        state.crash(node='c')
