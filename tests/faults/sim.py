"""Several beat nodes in one process, on one real Redis, on one virtual clock.

Each node is a real :class:`celery_leaderbeat.scheduler.Scheduler` (its own
Celery app, node id and Redis client), ticked by the test in a fixed order;
nothing in it is mocked but these seams, installed by :class:`Sim`:

- time: every package module reads the shared :class:`FakeClock` (see
  :mod:`tests.faults.clock`, which also explains how Redis expiry and ``TIME``
  relate to it);
- Redis: each node's client is a :class:`FaultyRedis` on the shared
  :class:`Seam` (see :mod:`tests.faults.seam`);
- the broker: ``publish`` (a trigger, a backfill, a lone slot) and
  ``Enqueuer.publish_one`` (each slot of a chunk) are replaced by a recorder that
  notes what would have been published (entry, the ``leaderbeat_slot`` header,
  epoch, task id); the broker is ``memory://``, so no claim enqueues anything
  itself (messages prepared in idle time are built, never sent);
- the heartbeat thread is a real ``roles.lease.Heartbeat`` whose sleep is a step the
  driver gives (:class:`SteppedHeartbeat`): it renews once per
  ``renew_interval`` of virtual time, in lockstep with the main thread, so a
  replay makes the same calls in the same order;
- a standby's wait (``Standby._wait``) reads its subscription without sleeping:
  the driver moves the clock between ticks.

A node that is *crashed* loses everything (its Scheduler is dropped, its
heartbeat ends, its connections close) and may be started again under the same
id; a *paused* node is neither ticked nor renewed while time passes (SIGSTOP).
A ``tick()`` that raises is a beat that exited: it is recorded in
:attr:`Sim.exits` and the node is crashed.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from celery import Celery

import celery_leaderbeat.integrations.guard as guard_module
import celery_leaderbeat.roles.lease as lease_module
import celery_leaderbeat.scheduler as scheduler_module
from celery_leaderbeat.config import Config
from celery_leaderbeat.roles.standby import Standby
from celery_leaderbeat.scheduler import LEADER, Scheduler
from celery_leaderbeat.send.sender import Enqueuer
from celery_leaderbeat.store.events import RELEASED
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.redis_store import RedisStore, redis_store
from celery_leaderbeat.timing.slots import slot_id, to_ms

from .clock import SKEW_TOLERANCE, FakeClock, RedisExpiry, RedisTimeValue, install_clock
from .invariants import Published, duplicates, history, unaccounted
from .seam import FaultyRedis, Seam, faulty_client

logger = logging.getLogger(__name__)

TASK = "sim.noop"


class StepEvent:
    """The heartbeat's stop event: ``wait()`` returns when the driver steps it (or on stop)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._stopped = False
        self._go = 0
        self.rounds = 0  # how many times the thread has come back to wait()

    def set(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def is_set(self) -> bool:
        return self._stopped

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            self.rounds += 1
            self._cond.notify_all()
            while not self._stopped and self._go == 0:
                self._cond.wait()
            if self._stopped:
                return True
            self._go -= 1
            return False

    def step(self, thread: threading.Thread) -> None:
        """Let the thread run one round and wait until it is back in ``wait()`` (or ended)."""
        with self._cond:
            while self.rounds == 0 and thread.is_alive() and not self._stopped:
                self._cond.wait(0.01)
            if self._stopped or not thread.is_alive():
                return
            target = self.rounds + 1
            self._go += 1
            self._cond.notify_all()
            while self.rounds < target and thread.is_alive():
                self._cond.wait(0.01)


class SteppedHeartbeat(lease_module.Heartbeat):
    """The real heartbeat thread, renewing when the driver says ``renew_interval`` passed."""

    def __init__(self, lease: Any, wake_by: Callable[[], float]) -> None:
        super().__init__(lease, wake_by)
        self._stop_event = StepEvent()  # type: ignore[assignment]
        self.next_at = lease.clock() + self._interval
        self.frozen = False  # its node is paused or stalled

    def step(self) -> None:
        self._stop_event.step(self)  # type: ignore[attr-defined]


def _sent_by() -> str:
    """``backfill``, ``request`` (trigger) or ``schedule``: who in the package is publishing."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") == "celery_leaderbeat.roles.requests":
            return "backfill" if frame.f_code.co_name == "_backfill" else "request"
        frame = frame.f_back
    return "schedule"


def _wait_without_sleeping(self: Standby, timeout: float) -> None:
    """``Standby._wait`` for a driven clock: read what was published, never sleep."""
    if self._pubsub is None:
        self._pubsub = self.shared.store.events.subscribe()
    while (message := self._pubsub.next(0.0)) is not None:
        if message == RELEASED:
            self._next_attempt = 0.0
            return


@dataclass
class SimNode:
    node_id: str
    scheduler: Scheduler
    paused: bool = False

    @property
    def client(self) -> FaultyRedis:
        assert self.scheduler._shared is not None
        return self.scheduler._shared.client

    @property
    def leading(self) -> bool:
        return self.scheduler.role == LEADER

    @property
    def heartbeat(self) -> SteppedHeartbeat | None:
        node = self.scheduler._shared
        beat = node.lease._heartbeat if node is not None else None
        return beat if isinstance(beat, SteppedHeartbeat) else None


@dataclass
class Sim:
    """The harness: build it, :meth:`install` it (a pytest ``monkeypatch``), start nodes, run."""

    redis_url: str
    prefix: str
    schedule: Mapping[str, Mapping[str, Any]]
    settings: Mapping[str, Any] = field(default_factory=dict)
    seam: Seam = field(default_factory=Seam)
    clock: FakeClock = field(default_factory=FakeClock)
    step_seconds: float = 0.1

    def __post_init__(self) -> None:
        self.keys = Keys(self.prefix)
        self.nodes: dict[str, SimNode] = {}
        self.published: list[Published] = []
        self.exits: list[str] = []
        self.seam.on_stall = self._stall
        self.clients: dict[str, FaultyRedis] = {}  # each node id's latest client
        self.admin = self._admin()
        self._frozen: set[str] = set()
        self._building: str | None = None
        self.schedules: dict[str, Mapping[str, Mapping[str, Any]]] = {}  # per-node override
        self.on_publish: list[Callable[[Published], None]] = []
        #: called with a node's id right after it ticked (a round ticks nodes one by one)
        self.on_tick: list[Callable[[str], None]] = []

    def _admin(self) -> Any:
        """The test's own client, and Redis's clocks kept in step with the virtual one."""
        admin = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        self.expiry = RedisExpiry(admin, f"{self.keys.tag}:*", self.clock)
        self.clock.listeners.append(self.expiry)
        progress = getattr(self.keys, "progress", None)
        if progress is not None:  # the leader's progress, a Redis TIME, read by rescues
            aged = RedisTimeValue(admin, progress, self.clock, lambda: self.step_seconds)
            claims = ("EVALSHA[lead]", "EVALSHA[rescue]")  # the progress's writer and reader
            self.seam.around = lambda label: aged() if label.startswith(claims) else None
        self.seam.on_drop = lambda node_id: self.clients[node_id].drop_connections()
        return admin

    # -- seams -------------------------------------------------------------------------

    def install(self, monkeypatch: Any) -> Sim:
        install_clock(monkeypatch, self.clock)
        monkeypatch.setattr(scheduler_module, "open_store", self._connect)
        # a worker guard built in this process gets a seamed client too (node id "guard")
        monkeypatch.setattr(guard_module, "open_store", self._connect_guard)
        # the broker: a trigger, a backfill and a lone slot go through ``publish``; a chunk
        # through ``Enqueuer.publish_one``. ``enqueue.publish`` is left alone: there it
        # builds a message into a capturing producer (nothing is sent), and a recorder in
        # its place would count every message built (in idle time too) as published
        for name in ("celery_leaderbeat.integrations.sending", "celery_leaderbeat.send.plain"):
            module = sys.modules.get(name) or importlib.import_module(name)
            monkeypatch.setattr(module, "publish", self._publish)
        sim = self

        def publish_one(enqueuer: Enqueuer, entry: Any, slot: datetime, epoch: int,
                        overlap: str, producer: Any) -> None:
            sim._publish(enqueuer.scheduler, entry, slot, epoch, overlap)

        monkeypatch.setattr(Enqueuer, "publish_one", publish_one)
        monkeypatch.setattr(lease_module, "Heartbeat", SteppedHeartbeat)
        monkeypatch.setattr(Standby, "_wait", _wait_without_sleeping)
        return self

    def _connect(self, config: Config) -> RedisStore:
        assert self._building is not None, "a client made outside Sim.start"
        client = faulty_client(self.seam, self._building, config.redis_url,
                               config.redis_options, config.store_timeout)
        return redis_store(client, Keys(config.key_prefix), config)

    def _connect_guard(self, config: Config) -> RedisStore:
        client = faulty_client(self.seam, "guard", config.redis_url, config.redis_options,
                               config.store_timeout)
        self.clients["guard"] = client
        return redis_store(client, Keys(config.key_prefix), config)

    def _publish(self, scheduler: Any, entry: Any, slot: datetime, epoch: int | None,
                 overlap: str = "allow", task_id: str | None = None, **_: Any) -> Any:
        tid = task_id or slot_id(scheduler.keys.prefix, entry.name, slot)
        published = Published(scheduler.lb_config.node_id, entry.name, to_ms(slot),
                              slot.isoformat(), epoch, tid, self.clock.time(), _sent_by())
        self.published.append(published)
        for hook in self.on_publish:
            hook(published)
        return tid

    # -- nodes -------------------------------------------------------------------------

    def app(self, node_id: str) -> Celery:
        app = Celery(f"sim-{node_id}", set_as_current=False)
        app.conf.update(
            broker_url="memory://", timezone="UTC", enable_utc=True,
            beat_schedule={k: dict(v) for k, v in
                           self.schedules.get(node_id, self.schedule).items()},
            leaderbeat_redis_url=self.redis_url, leaderbeat_key_prefix=self.prefix,
            leaderbeat_node_id=node_id,
            leaderbeat_max_clock_skew=SKEW_TOLERANCE,  # virtual time runs behind Redis TIME
            leaderbeat_history_length=1_000_000,  # the checks read the whole history
            **self.settings)
        return app

    def start(self, node_id: str) -> SimNode:
        """Start (or restart, with no memory) the node ``node_id``."""
        assert node_id not in self.nodes, f"{node_id} is running"
        scheduler = Scheduler(app=self.app(node_id))
        self._building = node_id
        try:
            node = scheduler._connect()
        finally:
            self._building = None
        node.lease.clock = self.clock.monotonic  # bound as a default argument at import
        self.clients[node_id] = node.client
        sim_node = SimNode(node_id, scheduler)
        self.nodes[node_id] = sim_node
        return sim_node

    def crash(self, node_id: str) -> None:
        """The process dies: no release, its heartbeat ends, its sockets close."""
        sim_node = self.nodes.pop(node_id)
        node = sim_node.scheduler._shared
        if node is not None:
            node.lease.stop_heartbeat()
            if sim_node.client is not None:
                sim_node.client.drop_connections()

    def stop(self, node_id: str) -> None:
        """A graceful shutdown (SIGTERM): ``close()`` releases the lease."""
        sim_node = self.nodes.pop(node_id)
        try:
            sim_node.scheduler.close()
        finally:
            if sim_node.client is not None:
                sim_node.client.drop_connections()

    def leader(self) -> str | None:
        leaders = [n for n, s in self.nodes.items() if s.leading]
        return leaders[0] if len(leaders) == 1 else None

    # -- time --------------------------------------------------------------------------

    def step(self, exclude: frozenset[str] = frozenset()) -> None:
        """Move the clock one step; renew the heartbeats that are due; tick every node."""
        self.clock.advance(self.step_seconds)
        self.round(exclude)

    def round(self, exclude: frozenset[str] = frozenset()) -> None:
        frozen = exclude | self._frozen
        for node_id in list(self.nodes):
            sim_node = self.nodes.get(node_id)
            if sim_node is None or sim_node.paused or node_id in frozen:
                continue
            beat = sim_node.heartbeat
            if beat is not None and beat.is_alive() and self.clock.monotonic() >= beat.next_at:
                beat.next_at = self.clock.monotonic() + beat._interval
                beat.step()
        for node_id in list(self.nodes):
            sim_node = self.nodes.get(node_id)
            if sim_node is None or sim_node.paused or node_id in frozen:
                continue
            try:
                sim_node.scheduler.tick()
                for hook in self.on_tick:
                    hook(node_id)
            except Exception as exc:  # noqa: BLE001 - a beat that would have exited
                self.exits.append(f"{node_id} at +{self.clock.elapsed:.1f}s: tick raised "
                                  f"{exc!r}")
                logger.warning("sim: %s exited: %r", node_id, exc)
                if node_id in self.nodes:
                    self.crash(node_id)

    def run(self, seconds: float, exclude: frozenset[str] = frozenset()) -> None:
        steps = round(seconds / self.step_seconds)
        for _ in range(steps):
            self.step(exclude)

    def _stall(self, node_id: str, seconds: float) -> None:
        """A ``delay`` fault: ``node_id`` is frozen while the others run ``seconds``."""
        self._frozen.add(node_id)
        try:
            self.run(seconds)
        finally:
            self._frozen.discard(node_id)

    # -- checks ------------------------------------------------------------------------

    def history(self) -> list[dict[str, str]]:
        return history(self.admin, self.keys)

    def violations(self, intervals: Mapping[str, float], horizon_ms: int,
                   events: list[dict[str, str]] | None = None) -> list[str]:
        """I1 and I2 over everything published and recorded, and beats that exited.

        ``events``: the history to judge by (default: the stream as Redis has it now).
        """
        problems = duplicates(self.published, self.prefix)
        problems += unaccounted(self.published, self.history() if events is None else events,
                                intervals, horizon_ms, self.prefix)
        problems += [f"exit: {line}" for line in self.exits]
        return problems

    def close(self) -> None:
        for node_id in list(self.nodes):
            self.crash(node_id)
        if self.admin is not None:
            self.admin.close()
