"""The Scheduler's life inside Celery's beat: leading, stepping down, registering, closing.

The traps it respects (docs/architecture.md, "Living inside Celery's beat"):
beat builds the scheduler twice (once ``lazy`` for the banner: no network I/O
then); ``beat_init`` swallows exceptions (so nothing happens there); ``close()``
runs twice on SIGTERM, the first time from inside the signal handler (so it waits
for the tick it interrupted, :meth:`Lifecycle.close`); under ``worker -B`` beat runs in
a forked child (clients are made per process, and only the process that made them
releases the lease).
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from ..roles.leader import Leader
from ..roles.shared import Shared, utcnow
from ..roles.standby import Standby
from ..store.base import STORE_ERRORS
from ..store.registry import earliest_follower
from .attributes import Attributes

logger = logging.getLogger(__name__)

STANDBY, LEADER = "standby", "leader"


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector waits until the tick is over.

    A burst allocates tens of thousands of objects; each collection they set off
    scans every object of the process (Celery's, the schedule's), a cost paid
    between the slot coming due and its claim. A tick is bounded, and the objects
    it leaves in cycles are collected once the collector runs again after it.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Lifecycle(Attributes):
    """Elected, stepping down, registered, closed: the role changes Celery never sees."""

    #: the thread running a tick now (see :meth:`close`), or None
    _tick_thread: int | None = None

    @contextmanager
    def _ticking(self) -> Iterator[None]:
        """Mark the calling thread as inside a tick until the block ends (nests)."""
        outer, self._tick_thread = self._tick_thread, threading.get_ident()
        try:
            yield
        finally:
            self._tick_thread = outer

    def _close_waits_for_tick(self) -> bool:
        """True when ``close()`` was called on the thread that is inside a tick: a signal
        handler running on top of it. Celery's SIGTERM and SIGINT handler closes the
        scheduler, then raises SystemExit, wherever the main thread was: perhaps in a
        store call whose transaction holds the lease row (PostgreSQL) or inside a
        connection pool's lock. Releasing the lease from there, through another
        connection, waits for the very call it interrupted: the process hangs. So that
        close does nothing; the handler's SystemExit unwinds the tick (each call ends or
        rolls back), and beat closes the scheduler again once it has (``Service.start``
        ends in ``sync()``, which closes)."""
        if self._tick_thread != threading.get_ident():
            return False
        logger.info("leaderbeat: asked to close during a tick (a stop signal); closing "
                    "once the tick has unwound")
        return True

    @property
    def role(self) -> str:
        return LEADER if self._leader is not None else STANDBY

    def _become_leader(self, shared: Shared, standby: Standby) -> Leader:
        leader = Leader(shared, since=self._on_time_since(shared, standby.since))
        self._leader = leader
        # a standby follows the run-time entries a STANDBY_EVERY behind at most: the
        # leader starts from every change saved before its election
        try:
            self._follow_changes(force=True)
        except STORE_ERRORS as exc:  # its next look, a POLL later, takes them in
            logger.warning("leaderbeat: %s could not read the run-time entries' changes as "
                           "it was elected (%s); it looks again at its next tick",
                           shared.config.node_id, exc)
        shared.lease.start_heartbeat(lambda: self._wake_by)
        logger.info("leaderbeat: %s elected leader (epoch %s); slots due since %s are on "
                    "time, older ones missed", shared.config.node_id, shared.lease.epoch,
                    leader.since.isoformat())
        self._telemetry.elected(shared.config.node_id, shared.lease.epoch)
        self._register(LEADER)
        leader.elected(self._schedule_version)
        return leader

    def _on_time_since(self, shared: Shared, own: datetime) -> datetime:
        """Slots due since a live standby followed the schedule are on time, not missed:
        it was there to rescue them (the registry says since when each node follows)."""
        try:
            earliest = earliest_follower(shared.ledger.nodes(), now=time.time(),
                                         fresh=3 * self.lb_config.renew_interval)
        except STORE_ERRORS + (ValueError, TypeError):
            return own
        if earliest is None:
            return own
        return min(own, datetime.fromtimestamp(earliest, timezone.utc))

    def _step_down(self, why: str, release: bool = False) -> None:
        if self._shared is None:
            return
        lease = self._shared.lease
        if self._leader is not None:
            logger.warning("leaderbeat: %s (epoch %s) steps down: %s", self.lb_config.node_id,
                           lease.epoch, why)
            self._lost(why)
        self._leader = None
        lease.stop_heartbeat()
        if release:
            try:
                lease.release("step-down")
            except STORE_ERRORS as exc:  # it expires on its own: ttl
                logger.warning("leaderbeat: could not release the lease on step-down (%s); "
                               "standbys take over when it expires", exc)
        lease.mark_lost()
        lease.token = None
        if self._standby is not None:
            self._standby.since = utcnow()

    def _lost(self, why: str) -> None:
        """This process stopped leading: its subscription goes, the messages framed ahead
        under its epoch go, receivers are told."""
        assert self._shared is not None
        if self._leader is not None:
            self._leader.close()
        enqueuer = getattr(self, "_enqueuer", None)
        if enqueuer is not None:
            enqueuer.ahead.clear()
        self._telemetry.lost(self.lb_config.node_id, self._shared.lease.epoch, why)

    def _refresh_registration(self) -> None:
        """Refresh this node's entry in the node registry about once per renew interval."""
        if self._registration.due(self.lb_config.renew_interval):
            self._register(self.role)

    def _register(self, role: str) -> None:
        shared = self._connect()
        self._telemetry.metrics.clock_skew(shared.lease.clock_skew)
        # A node follows the schedule only while Redis answers it: slots due while it could
        # not claim are not on time because of it (they follow the catch-up policy).
        room = self._leader if role == LEADER else self._standby
        since = max(room.since.timestamp(), self._contact_since) if room is not None else None
        self._registration.write(shared.ledger, self.lb_config.node_id, role,
                                 shared.lease.epoch if role == LEADER else None,
                                 clock_skew=shared.lease.clock_skew, following_since=since,
                                 send_path=self._send_path())

    def _send_path(self) -> str | None:
        """``one_step``, ``single_write``, or ``plain: why``; None before this node's first
        chunk."""
        enqueuer = getattr(self, "_enqueuer", None)
        if enqueuer is None:
            return None
        path, reason = enqueuer.path()
        return f"{path}: {reason}" if reason else str(path)

    def close(self) -> None:
        """Release the lease (standbys take over at once) and close; safe to call twice.
        Called from inside a tick (a signal handler), it waits for the tick to unwind."""
        if self._closed or self._close_waits_for_tick():
            return
        self._closed = True
        try:
            if self._shared is not None and self._pid == os.getpid():
                lease = self._shared.lease
                lease.stop_heartbeat()
                if self._leader is not None and lease.release("released"):
                    logger.info("leaderbeat: %s (epoch %s) released the lease",
                                self.lb_config.node_id, lease.epoch)
                    self._lost("released on shutdown")
                self._registration.forget(self._shared.ledger)
        except STORE_ERRORS as exc:
            logger.warning("leaderbeat: could not release the lease on close (%s); "
                           "standbys take over when it expires", exc)
        finally:
            if self._leader is not None:
                self._leader.close()
                self._leader = None
            if self._standby is not None:
                self._standby.close()
            if self._enqueuer is not None:
                self._enqueuer.close()
            super().close()
