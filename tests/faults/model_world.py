"""What the model-based test acts on: a :class:`Sim` plus Redis-level events and checks.

Redis "restarts" here are done on the live server, without a process restart:
"restarted empty" is ``FLUSHALL`` + ``SCRIPT FLUSH`` + closing every client
connection (what a restart without persistence leaves: no keys, no scripts,
broken sockets); "restored from an older snapshot" is the same with the keys
put back as ``DUMP`` saved them at the snapshot, each with the expiry it had
then (a key whose expiry passed since is not restored, as Redis does when it
loads an RDB file). Both are cheaper than a process restart and leave the
same state behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from celery_leaderbeat.store.keys import Keys
from tests.support.redis_server import RedisServer

from .invariants import Published, duplicates, unaccounted
from .sim import TASK, Sim

NODES = ("a", "b", "c")

#: the entries every node starts with; ``x`` is the one a schedule change touches
SCHEDULE: dict[str, dict[str, Any]] = {
    "s1": {"task": TASK, "schedule": 1.0},
    "s2": {"task": TASK, "schedule": 2.0},
    "s3": {"task": TASK, "schedule": 3.0},
    "x": {"task": TASK, "schedule": 2.0},
    **{f"m{i}": {"task": TASK, "schedule": 1.5} for i in range(6)},
}
#: the same schedule after the change: ``x`` every 6 s instead of every 2 s (longer than the
#: old interval plus rescue_after, so a stale standby finds slots the leader never claims)
CHANGED = {**SCHEDULE, "x": {"task": TASK, "schedule": 6.0}}

#: virtual seconds the example's end runs on with every node up and no fault
SETTLE = 20.0
#: I2 is checked up to this many seconds before the end
HORIZON_MARGIN = 3.0


class World:
    """One example's nodes, Redis and records."""

    def __init__(self, server: RedisServer | None) -> None:
        self.server = server
        self.patch = pytest.MonkeyPatch()  # undone in close()
        self.sim = self._sim()
        self.sim.step_seconds = 0.25
        self.sim.install(self.patch)
        self.sim.on_publish.append(self._on_publish)
        self.sim.on_tick.append(self._ticked)
        self.keys = Keys("model")
        self.snapshot: tuple[float, list[tuple[bytes, int, bytes]]] | None = None
        self.events: dict[bytes, dict[str, str]] = {}
        self.versions = {node: 1 for node in NODES}  # each node's definition of x
        #: the definition of x each node last ticked with (a paused node has not taken a
        #: change in yet: it plans what it had)
        self.planned = dict(self.versions)
        self.changed = False  # x's definition changed on some node: I2 leaves x out
        self.mixed_rescues: list[str] = []
        self.last_leader: str | None = None
        #: the nodes (their objects: a node started again is another) that remembered
        #: anything of Redis when it last lost its data
        self._rememberers: set[int] | None = None
        #: every node that remembered a loss of Redis's data was gone before the example
        #: ended: nothing can tell the loss from a first start (by design, pinned in
        #: test_regressions.py): I2 is not checked for such an example
        self.amnesia = False
        self.clis: list[Any] = []  # Cluster objects the CLI rules made (their clients closed)

    def _sim(self) -> Sim:
        assert self.server is not None
        admin = self.server.client()
        admin.flushall()
        admin.script_flush()
        admin.close()
        return Sim(self.server.url, "model", SCHEDULE)

    # -- time --------------------------------------------------------------------------

    def run(self, seconds: float) -> None:
        steps = max(1, round(seconds / self.sim.step_seconds))
        for _ in range(steps):
            self._note_forgetting()
            self.sim.step()
            self._note_leader()

    def _note_leader(self) -> None:
        try:
            token = self.sim.admin.get(self.keys.leader)
        except Exception:  # noqa: BLE001 - Redis restarting under the admin client
            return
        if token:
            self.last_leader = token.decode().rsplit("|", 1)[0]

    # -- Redis -------------------------------------------------------------------------

    def _kill_clients(self) -> None:
        admin = self.sim.admin
        admin.client_kill_filter(_type="normal", skipme=True)
        admin.client_kill_filter(_type="pubsub", skipme=True)

    def _note_forgetting(self) -> None:
        if self._rememberers is not None:
            self._rememberers &= {id(n) for n in self.sim.nodes.values()}
            if not self._rememberers:
                self.amnesia = True

    def _loss(self) -> None:
        """Redis loses its data: which running nodes remember anything of it?"""
        self._note_forgetting()
        self._rememberers = set()
        for sim_node in self.sim.nodes.values():
            node = sim_node.scheduler._shared
            if node is not None and (node.ledger.generation > 0 or node.sent.settled()):
                self._rememberers.add(id(sim_node))
        self._note_forgetting()

    def redis_restarts_empty(self) -> None:
        self._loss()
        self.collect_history()
        admin = self.sim.admin
        admin.flushall()
        admin.script_flush()
        self._kill_clients()

    def take_snapshot(self) -> None:
        admin, expiry = self.sim.admin, self.sim.expiry
        keys = [k for k in admin.keys(f"{self.keys.tag}:*")]
        self.snapshot = (self.sim.clock.time(),
                         [(k, expiry.virtual_pttl(k), admin.dump(k)) for k in keys])

    def restore_snapshot(self) -> None:
        assert self.snapshot is not None
        self._loss()
        self.collect_history()
        taken, keys = self.snapshot
        elapsed_ms = int((self.sim.clock.time() - taken) * 1000)
        admin = self.sim.admin
        admin.flushall()
        admin.script_flush()
        for key, pttl, data in keys:
            if pttl > 0 and pttl - elapsed_ms <= 0:
                continue  # expired meanwhile: an RDB load drops it
            admin.restore(key, max(0, pttl - elapsed_ms) if pttl > 0 else 0, data, replace=True)
        self._kill_clients()

    # -- schedule ----------------------------------------------------------------------

    def change_schedule(self, node: str) -> None:
        """``node`` sees ``x`` every 6 s from now on (and keeps it across restarts)."""
        if self.versions[node] == 2:
            return
        self.versions[node] = 2
        self.changed = True
        self.sim.schedules[node] = CHANGED
        sim_node = self.sim.nodes.get(node)
        if sim_node is not None:
            sim_node.scheduler.merge_inplace({k: dict(v) for k, v in CHANGED.items()})

    def _ticked(self, node: str) -> None:
        """``node`` ticked: from now on it plans the definition of ``x`` it has. Noted at
        its tick, not at the end of the round: a leader that ticks first in a round (just
        resumed, or elected) plans its definition for the standbys ticking after it."""
        self.planned[node] = self.versions[node]

    def _on_publish(self, published: Published) -> None:
        """I4: a standby's rescue of ``x`` must be of the definition its leader plans."""
        if published.name != "x" or published.epoch != 0:
            return
        self._note_leader()
        leader = self.last_leader
        if leader is not None and self.versions[published.node] != self.planned[leader]:
            self.mixed_rescues.append(
                f"I4: {published.node} rescued x slot {published.header_slot} under definition "
                f"v{self.versions[published.node]} while {leader} plans "
                f"v{self.planned[leader]}")

    def rescues_of_another_definition(self) -> list[str]:
        return list(self.mixed_rescues)

    # -- records and checks ------------------------------------------------------------

    def collect_history(self) -> None:
        """Keep every history event ever seen (a Redis restart must not hide them)."""
        try:
            rows = self.sim.admin.xrange(self.keys.history)
        except Exception:  # noqa: BLE001 - nothing to read while Redis restarts
            return
        for event_id, fields in rows:
            if event_id not in self.events:
                self.events[event_id] = {k.decode(): v.decode() for k, v in fields.items()}

    def intervals(self) -> Mapping[str, float]:
        return {name: float(entry["schedule"]) for name, entry in SCHEDULE.items()
                if not (name == "x" and self.changed)}

    def settle_and_check(self) -> list[str]:
        """Every node up, no more faults, time runs on; then I1, I2, I4 and exits."""
        sim = self.sim
        sim.seam.enabled = False
        for node in NODES:
            if node not in sim.nodes:
                sim.start(node)
            sim.nodes[node].paused = False
        self.run(SETTLE)
        self.collect_history()
        horizon = int((sim.clock.time() - HORIZON_MARGIN) * 1000)
        problems = duplicates(sim.published, sim.prefix)
        if not self.amnesia:
            problems += self.unaccounted(horizon)
        problems += [f"exit: {line}" for line in sim.exits]
        problems += self.rescues_of_another_definition()
        return problems

    def unaccounted(self, horizon_ms: int) -> list[str]:
        """I2 over everything published and every history event seen, up to ``horizon_ms``."""
        return unaccounted(self.sim.published, list(self.events.values()), self.intervals(),
                           horizon_ms, self.sim.prefix)

    def close(self) -> None:
        try:
            for cluster in self.clis:
                cluster.store.close()
            self.sim.close()
        finally:
            self.patch.undo()
