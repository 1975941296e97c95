"""The Celery beat Scheduler: the glue between Celery and the two roles.

Celery calls :meth:`Scheduler.tick` in a loop and sleeps whatever it returns.
A standby (:mod:`~celery_leaderbeat.roles.standby`) tries to lead once per poll
and rescues slots the leader missed; the leader
(:mod:`~celery_leaderbeat.roles.leader`) sends every due slot in chunks and then
sleeps until the next one, while its heartbeat renews the lease. This module
keeps only what Celery calls and the per-process store client; the rest of the
class is in :mod:`celery_leaderbeat.integrations`: the schedule and its
versions (``schedule``), sending (``sending``), store and clock trouble
(``trouble``), the role changes and Celery's lifecycle traps (``lifecycle``),
and the wrapper around another scheduler class (``wrap``).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from celery import beat

from .config import DJANGO_STORE, Config, is_postgres_store
from .entries import EntryOptions
from .errors import LeaseLostError, NotReplicatedError, RolledBackError
from .integrations.lifecycle import LEADER, STANDBY, Lifecycle, _collector_paused
from .integrations.schedule import ScheduleState
from .integrations.sending import Sending
from .integrations.trouble import Trouble
from .integrations.wrap import WrapMixin
from .ops.health import Health
from .ops.telemetry import Telemetry
from .roles.dynamic_schedule import DynamicSchedule
from .roles.leader import Leader, Resign
from .roles.lease import LeaseView
from .roles.loss import Losses
from .roles.shared import Shared
from .roles.standby import Standby
from .send.sender import Enqueuer
from .store.base import STORE_ERRORS, STORE_REFUSED, SlotStore, loss_detection
from .store.connection import describe
from .store.keys import Keys
from .store.open import open_store
from .store.registry import Registration
from .store.types import Event

__all__ = ["LEADER", "STANDBY", "Scheduler", "gate_class", "wrap_class"]

logger = logging.getLogger(__name__)

#: the least sleep ahead of the loop in which it does the store's housekeeping (s)
TIDY_IDLE = 0.1


class Scheduler(ScheduleState, Sending, Trouble, Lifecycle, beat.Scheduler):
    """Highly available beat scheduler: run it on any number of nodes.

    With ``leaderbeat_base_scheduler`` set, constructing this class gives an
    instance of that scheduler class wrapped (:mod:`celery_leaderbeat.integrations.wrap`).
    """

    #: marks leaderbeat's own class, which no ``leaderbeat_base_scheduler`` may name
    leaderbeat_scheduler = True
    #: slots go out a chunk at a time (:meth:`chunk_sender`); a wrapped base scheduler
    #: sends them one by one, through its own entries and bookkeeping
    sends_chunks = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        made = cls
        if cls is Scheduler:
            app = kwargs.get("app", args[0] if args else None)
            base = Config.from_app(app).base_scheduler if app is not None else None
            if base is not None:
                made = wrap_class(base)
        return super().__new__(made)

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        self.lb_config = Config.from_app(app)
        self.keys = Keys(self.lb_config.key_prefix)
        self._entry_options: dict[str, EntryOptions] = {}
        self._schedule_version = 0
        self._pid: int | None = None
        self._shared: Shared | None = None
        self._enqueuer: Enqueuer | None = None
        self._leader: Leader | None = None
        self._standby: Standby | None = None
        self._dynamic: DynamicSchedule | None = None
        self._wake_by = time.monotonic()
        self._last_wall = (time.time(), time.monotonic())
        self._store_failures = 0
        self._led_at_outage = False  # this node led when the store stopped answering
        self._contact_since = time.time()  # the store answered without a break since then
        self._labels_version = 0  # the schedule version the metric labels follow
        #: (schedule version, entry names it changed) for changes known name by name
        self._changes: list[tuple[int, frozenset[str]]] = []
        self._closed = False
        self._registration = Registration()
        self._telemetry = Telemetry(self, self.keys.prefix)
        super().__init__(app, *args, lazy=lazy, **kwargs)

    @property
    def info(self) -> str:
        c = self.lb_config
        # The banner comes from a lazy instance whose generated node id is not the
        # running one's; the "elected" log line names the real id.
        node = c.node_id if self.app.conf.get("leaderbeat_node_id") else c.node_id.rsplit(":", 1)[0]
        store = describe(c.store_url or c.redis_url)
        if is_postgres_store(c):  # which database, and where in it
            store = (f"{store} (PostgreSQL of DATABASES['default'])" if c.store_url == DJANGO_STORE
                     else store) + f" schema={c.store_schema}"
        return (f"    . leaderbeat -> {store} prefix={c.key_prefix} "
                f"node={node} ttl={c.lease_ttl}s rescue_after={c.rescue_after}s "
                f"catchup={c.catchup} store_down_policy={c.store_down_policy}")

    # -- roles -------------------------------------------------------------------------

    @property
    def leading(self) -> Leader | None:
        """The leader room while this node leads, else None."""
        return self._leader

    @property
    def enqueuer(self) -> Enqueuer | None:
        """What this process sends its chunks through (None before its first chunk)."""
        return self._enqueuer

    @property
    def lease(self) -> LeaseView:
        return self._connect().lease

    @property
    def ledger(self) -> SlotStore:
        return self._connect().ledger

    def _connect(self) -> Shared:
        """What this process's roles share: its store, this scheduler as their Celery side
        (made again after a ``worker -B`` fork)."""
        if self._pid == os.getpid() and self._shared is not None:
            return self._shared
        self._pid = os.getpid()
        config = self.lb_config
        store = open_store(config)
        # liveness: the main loop back by its planned wake-up plus one ttl (the heartbeat's
        # rule); readiness: the store answers too (ops/health.py)
        health = Health(lambda: self._wake_by, config.lease_ttl,
                        ticks_failing=lambda: self._store_failures > 0)
        if self._telemetry.serve(config.metrics_port, health, lambda: self._enqueuer):
            logger.info("leaderbeat: metrics on http://0.0.0.0:%d/metrics, probes on /healthz "
                        "and /readyz", config.metrics_port)
        self._telemetry.metrics.overlap_from(store.guard.decisions)
        lease = LeaseView(store.lease, config, losses=Losses(config, loss_detection(store)))
        lease.on_renew = lambda seconds: self._telemetry.metrics.renewed(seconds)
        shared = self._shared = Shared(config=config, keys=self.keys, store=store, lease=lease,
                                       ledger=store.ledger, celery=self)
        self._enqueuer = None  # made again in this process, on the first batch
        self._dynamic = self._follow_dynamic(store.entries)
        self._leader = None
        self._standby = Standby(shared)
        return shared

    # -- the Celery side, as the roles see it (roles/port.py) ------------------------------

    def chunk_sender(self, epoch: int) -> Any | None:
        """A batch's sender under ``epoch``: claim and enqueue in one step where exact,
        else kombu batches; None where slots go one by one (:attr:`sends_chunks`)."""
        return self._chunk_sender(epoch) if self.sends_chunks else None

    def loop_interval(self) -> float:
        return float(self.max_interval)

    def wake_by(self) -> float:
        return self._wake_by

    def progress(self) -> None:
        """A long batch moved on: the heartbeat gives the loop another ttl."""
        self._wake_by = time.monotonic()

    def observe(self, events: Sequence[Event]) -> None:
        """What became of slots: signals and metrics."""
        self._telemetry.slots(events, len(self.schedule),
                              lambda: self._shared.lease.epoch if self._shared else None)
        if self._labels_version != self._schedule_version:  # a removed entry's series go
            self._labels_version = self._schedule_version
            self._telemetry.metrics.keep_entries(self.schedule)

    # -- the tick --------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: a standby tries to lead and rescues; the leader sends every due slot."""
        started = self._wake_by = time.monotonic()  # working: the heartbeat allows one ttl
        with self._ticking(), _collector_paused():
            delay = self._tick()
        self._wake_by = time.monotonic() + delay  # asleep as told until then
        self._telemetry.metrics.ticked(self._wake_by - delay - started)
        return delay

    def _tick(self) -> float:
        try:
            node = self._connect()
            # a leader sending through an outage (last-leader) touches the store only to
            # see whether it is back: anything else would fail, each call after a timeout,
            # before the leader's tick sends what is due
            degraded = self._leader is not None and self._leader.outage is not None
            if not degraded:
                self._follow_changes()
            self._watch_wall_clock()
            delay = self._tick_role(node)
            if not degraded:
                self._tidy(node, delay)
                self._refresh_registration()
        except Resign as exc:
            self._step_down(str(exc), release=exc.release)
            return 0.0
        except LeaseLostError as exc:
            if self._leader is not None:
                shared = self._leader.shared
                shared.losses.lease_lost(exc, held=shared.lease.is_held())
            self._step_down(str(exc))
            return 0.0
        except NotReplicatedError as exc:
            logger.warning("leaderbeat: %s; nothing unreplicated was sent", exc)
            return self.lb_config.standby_poll
        except RolledBackError as exc:
            if self._leader is not None:
                self._leader.rolled_back(str(exc))  # every entry starts again from now
                return 0.0
            logger.warning("leaderbeat: %s; not rescuing until the leader re-anchors", exc)
            return self.lb_config.standby_poll
        except STORE_REFUSED as exc:
            raise self._refused(exc) from exc
        except STORE_ERRORS as exc:
            return self._store_trouble(exc)
        if self._store_failures and (self._leader is None or self._leader.outage is None):
            self._store_back()  # (a leader sending through an outage returns without the store)
        return delay

    def _tidy(self, node: Shared, delay: float) -> None:
        """The store's owed housekeeping (a history pruned to its bound) when the loop
        has a moment before its next pass, never between two passes of a burst; a
        failure leaves it owed, for the next such moment."""
        if delay < TIDY_IDLE:
            return
        try:
            node.ledger.tidy()
        except STORE_ERRORS as exc:
            logger.warning("leaderbeat: the store's housekeeping failed (%s); trying again "
                           "after the next pass", exc)

    def _tick_role(self, node: Shared) -> float:
        """A standby's pass (try to lead, rescue) or the leader's; how long to sleep."""
        if self._leader is not None:
            delay = self._leader.tick(self._schedule_version)
            return self._warm(delay, node.lease.epoch or 0) if self.sends_chunks else delay
        assert self._standby is not None
        if self._store_failures:
            # the store answers again: the standby hears so before it tries for the lease
            # (under last-leader, the previous leader goes first)
            node.store.ping()
            self._store_back()
        if self._standby.tick(self._schedule_version):
            self._become_leader(node, self._standby)
        return 0.0

    def sync(self) -> None:
        """Nothing to persist: the shared state already lives in the store."""


@functools.cache
def wrap_class(base: type) -> type:
    """``Leaderbeat<Base>(WrapMixin, Scheduler, Base)``, built once per base class."""
    name = f"Leaderbeat{base.__name__}"
    return type(name, (WrapMixin, Scheduler, base), {"__module__": __name__, "__qualname__": name,
                                                     "wrapped": base})


#: ``wrap_class`` under the name this module has exported since the setting came
gate_class = wrap_class
