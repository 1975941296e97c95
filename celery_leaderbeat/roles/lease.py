"""This node's view of the leader lease: a fencing epoch, a deadline, self-fencing, and the
heartbeat thread that renews it.

The store holds the lease (:class:`~celery_leaderbeat.store.base.LeaseStore`: acquire,
renew, release); this side keeps what the answers mean for the node. Self-fencing:
the holder measures time with ``time.monotonic()``. A renewal that *started* at ``t``
proves the lease valid until ``t + ttl``; the node stops sending at ``t + ttl -
safety_margin``, before the store could give the lease to anyone else, even while the
store does not answer at all.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..config import Config, store_name
from ..errors import LeaseLostError
from ..store.base import STORE_ERRORS, LeaseStore
from ..store.records import LOSS
from .loss import Losses

logger = logging.getLogger(__name__)


class LeaseView:
    """This node's view of the leader lease: what the store's answers mean for the node."""

    def __init__(self, store: LeaseStore, config: Config, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] | None = None,
                 losses: Losses | None = None) -> None:
        self.store = store
        #: what this node knows of losses of writes (roles/loss.py): by default, a view
        #: of its own that asks the store nothing about them
        self.losses = losses if losses is not None else Losses(config)
        self.config = config
        self.clock = clock
        self.wall = wall or (lambda: time.time())  # looked up per call: tests may shift it
        self.token: str | None = None
        self.epoch: int | None = None
        self._valid_until = 0.0
        #: when the latest call that proved the lease began (monotonic), and the longest
        #: time between two such calls since it was taken: a long one means the lease may
        #: have lapsed (a pause) and another node led meanwhile
        self.confirmed_at: float | None = None
        self.longest_gap = 0.0
        self._lost = threading.Event()
        #: seconds this node's clock is ahead of Redis (negative: behind); None until measured
        self.clock_skew: float | None = None
        self._heartbeat: Heartbeat | None = None
        #: told the seconds each heartbeat renewal took, or None when Redis did not answer
        self.on_renew: Callable[[float | None], None] = lambda seconds: None
        #: the highest fencing epoch this node has seen; acquire lifts the counter above
        #: it, so epochs never go backwards even after Redis lost its data
        self.highest_epoch = 0
        #: the last attempt was refused because Redis lost writes and this node did not
        #: lead last: it holds back while the node that led takes the lease again
        self.held_back = False

    def observe_epoch(self, epoch: int | None) -> None:
        """Note an epoch seen elsewhere (a holder's token, a stored slot state)."""
        if epoch is not None and epoch > self.highest_epoch:
            self.highest_epoch = epoch

    @property
    def ttl_ms(self) -> int:
        return int(self.config.lease_ttl * 1000)

    def is_held(self) -> bool:
        """True while this node may send: it holds a token, not lost, deadline not passed."""
        return (self.token is not None and not self._lost.is_set()
                and self.clock() < self._valid_until)

    @property
    def lost(self) -> bool:
        """True once Redis said the lease belongs to someone else (not merely unconfirmed)."""
        return self._lost.is_set()

    def credentials(self) -> tuple[str, int]:
        """(token, epoch) of the lease this node holds; LeaseLostError when it holds none."""
        if self.token is None or self.epoch is None:
            raise LeaseLostError("this node holds no lease")
        return self.token, self.epoch

    def remaining(self) -> float:
        """Seconds until self-fencing stops this node from sending."""
        return max(0.0, self._valid_until - self.clock()) if self.token else 0.0

    def confirm(self, started: float) -> None:
        """A call that began at monotonic ``started`` proved the lease: push the deadline."""
        deadline = started + self.config.lease_ttl - self.config.safety_margin
        self._valid_until = max(self._valid_until, deadline)
        if self.confirmed_at is not None:
            self.longest_gap = max(self.longest_gap, started - self.confirmed_at)
        self.confirmed_at = max(self.confirmed_at or started, started)

    def try_acquire(self, *, despite_loss: bool = False) -> bool:
        """Take the lease if it is free. Returns whether this node now leads.

        Redis holding older state than this node has seen (a lower generation) and no
        lease: only the node that led last takes it at once; the others are refused
        (``held_back``) unless ``despite_loss`` (they have held back long enough).
        A reply that never comes changes nothing here: the next attempt asks again.
        """
        started = self.clock()
        losses = self.losses
        answer = self.store.acquire(self.highest_epoch, losses.highest_generation,
                                    despite_loss=losses.led_last or despite_loss)
        acquired = answer.acquired
        self._measured(started, answer.now)
        losses.observe_generation(answer.generation)
        self.held_back = not acquired and not answer.holder and answer.pttl == LOSS
        if self.held_back:
            return False
        losses.attempted(answer.generation, acquired=acquired)
        if not acquired:
            self.observe_epoch(_epoch_of(answer.holder))
            return False
        self.epoch = answer.epoch
        self.observe_epoch(self.epoch)
        self.token = f"{self.config.node_id}|{self.epoch}"
        self._lost.clear()
        self._valid_until = 0.0
        self.confirmed_at, self.longest_gap = None, 0.0
        self.confirm(started)
        return True

    def renew(self, token: str | None = None) -> None:
        """Extend the lease ``token`` (default: the one held now).

        Raises LeaseLostError when the key holds another token. A renewal of a token
        this node no longer holds (a heartbeat thread that outlived its lease) neither
        confirms nor marks lost the lease held now.
        """
        token = token or self.token
        if token is None:
            raise LeaseLostError("no lease to renew")
        started = self.clock()
        answer = self.store.renew(token)
        current = token == self.token
        if not answer.renewed:
            if current:
                if not answer.holder and self.clock() < self._valid_until:
                    self.losses.vanished_while_held = True
                    logger.warning("leaderbeat: the lease %s vanished while still valid: %s "
                                   "lost its data (restarted empty, or older state)", token,
                                   store_name(self.config))
                self.mark_lost()
            holder = answer.holder
            lost = LeaseLostError(f"lease {token} lost; held by {holder or 'nobody'}")
            lost.holder, lost.answered = holder, True
            raise lost
        if not current:
            return
        self.confirm(started)
        if answer.now is not None:
            self._measured(started, answer.now)

    def _measured(self, started: float, store_now: float) -> None:
        """A call that began at monotonic ``started`` read the store's clock: note the skew."""
        elapsed = self.clock() - started
        self.clock_skew = self.wall() - elapsed / 2 - store_now

    def measure_skew(self) -> float:
        """Compare this node's clock with the store's (one round trip)."""
        before = self.wall()
        store_now = self.store.now()
        after = self.wall()
        self.clock_skew = (before + after) / 2 - store_now
        return self.clock_skew

    def mark_lost(self) -> None:
        """Forget the lease at once (fenced by Redis, or told so by a claim)."""
        self._lost.set()
        self._valid_until = 0.0

    def release(self, reason: str = "released") -> bool:
        """Delete the lease if it is still ours and wake the standbys."""
        token, self.token = self.token, None
        self._valid_until = 0.0
        if token is None:
            return False
        return self.store.release(token, reason)

    def holder(self) -> tuple[str | None, int]:
        """The holder's token and its remaining ttl in ms (-2 when none)."""
        return self.store.holder()

    def start_heartbeat(self, wake_by: Callable[[], float]) -> Heartbeat:
        """Renew in the background while the main loop keeps its word (see Heartbeat)."""
        self.stop_heartbeat()
        self._heartbeat = Heartbeat(self, wake_by)
        self._heartbeat.start()
        return self._heartbeat

    def heartbeat_stopped(self) -> str | None:
        """Why the heartbeat thread ended, if it did while this node still holds a token."""
        beat = self._heartbeat
        if beat is None or beat.is_alive():
            return None
        return beat.stopped_because or "ended"

    def stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None


class Heartbeat(threading.Thread):
    """Renews one lease every ``renew_interval``, whatever the main loop is doing.

    The main loop says when it will be back (``wake_by()``, a monotonic time: the
    end of the sleep it was told to take, or the start of the pass it is in). A
    leader asleep until its next slot is kept alive all along; one that has not
    come back by ``wake_by() + ttl`` is wedged and lets go. The thread renews
    only the token it was started for, holds only a weak reference to its lease,
    and records why it ended in ``stopped_because``.
    """

    def __init__(self, lease: LeaseView, wake_by: Callable[[], float]) -> None:
        super().__init__(name=f"leaderbeat-heartbeat-{lease.epoch}", daemon=True)
        self._lease = weakref.ref(lease)
        self._token = lease.token
        self._wake_by = wake_by
        self._interval = lease.config.renew_interval
        self._ttl = lease.config.lease_ttl
        self._stop_event = threading.Event()
        self.stopped_because: str | None = None

    def stop(self, timeout: float = 2.0) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)

    def run(self) -> None:
        failing = False
        try:
            while not self._stop_event.wait(self._interval):
                lease = self._lease()
                if lease is None or lease.token != self._token:
                    self.stopped_because = "lease gone"
                    return
                overdue = time.monotonic() - self._wake_by()
                if overdue > self._ttl:
                    logger.warning("leaderbeat: beat is %.1f s past its planned wake-up (more "
                                   "than the lease ttl, %.1f s); no longer renewing the lease",
                                   overdue, self._ttl)
                    self.stopped_because = "main loop stalled"
                    return
                started = time.monotonic()
                try:
                    lease.renew(self._token)
                    lease.on_renew(time.monotonic() - started)
                except LeaseLostError as exc:
                    logger.warning("leaderbeat: %s", exc)
                    self.stopped_because = "lost"
                    return
                except STORE_ERRORS as exc:
                    lease.on_renew(None)
                    if not failing:
                        logger.warning("leaderbeat: lease renewal failed (%s); the leader stops "
                                       "sending in %.1f s unless the store answers",
                                       exc, lease.remaining())
                    failing = True
                    continue
                if failing:
                    logger.info("leaderbeat: lease renewal works again")
                failing = False
                logger.debug("leaderbeat: lease %s renewed", self._token)
        except Exception as exc:  # never die silently
            logger.exception("leaderbeat: heartbeat thread died")
            self.stopped_because = f"crashed: {exc!r}"


def _epoch_of(token: Any) -> int | None:
    """The epoch in a ``<node_id>|<epoch>`` token, None when there is none."""
    if not token:
        return None
    _, _, epoch = str(token).rpartition("|")
    return int(epoch) if epoch.isdigit() else None
