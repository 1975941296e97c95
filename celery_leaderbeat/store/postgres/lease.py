"""The seam's lease over :mod:`.lease_sql`: this node's view of the lease row.

Self-fencing as on Redis: a renewal that *started* at ``t`` proves the lease until
``t + ttl``; the node stops sending at ``t + ttl - safety_margin`` whatever the server
answers meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ...config import Config
from ...errors import LeaseLostError
from . import lease_sql
from .place import Place, channel, holder_id

logger = logging.getLogger(__name__)


class PostgresLease:
    """This node's view of the lease row (the seam's lease, over :mod:`.lease_sql`)."""

    def __init__(self, place: Place, config: Config, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.place, self.config, self.clock, self.wall = place, config, clock, wall
        self.holder_id = holder_id(config.node_id)
        self.token: str | None = None
        self.epoch: int | None = None
        self.highest_epoch = 0
        self.clock_skew: float | None = None
        self.vanished_while_held = False
        self.confirmed_at: float | None = None
        self.longest_gap = 0.0
        self.led_last = False
        self.held_back = False
        self.on_renew: Callable[[float | None], None] = lambda seconds: None
        self.on_generation: Callable[[int], None] = lambda generation: None
        self._valid_until = 0.0
        self._lost = threading.Event()

    @property
    def ttl_ms(self) -> int:
        return int(self.config.lease_ttl * 1000)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def try_acquire(self, *, despite_loss: bool = False) -> bool:
        """Take the lease if nobody holds it, under an epoch above every one seen."""
        started = self.clock()
        got = self.place.run(lease_sql.acquire, holder=self.holder_id, node=self.config.node_id,
                             ttl_ms=self.ttl_ms, seen_epoch=self.highest_epoch,
                             wait_ms=max(100, int(self.config.socket_timeout * 1000)))
        self._measured(started, got.server_ms)
        self.on_generation(got.generation)
        self.led_last = got.epoch is not None
        if got.epoch is None:
            self.observe_epoch(got.held_epoch)
            self.vanished_while_held = False
            return False
        self.epoch = got.epoch
        self.observe_epoch(got.epoch)
        self.token = f"{self.holder_id}|{got.epoch}"
        self._lost.clear()
        self._valid_until = 0.0
        self.confirmed_at, self.longest_gap = None, 0.0
        self.confirm(started)
        return True

    def renew(self, token: str | None = None) -> None:
        """Extend the lease; LeaseLostError when it expired, was taken or released."""
        token = token or self.token
        if token is None:
            raise LeaseLostError("no lease to renew")
        holder, _, epoch = token.rpartition("|")
        started = self.clock()
        now_ms = self.place.run(lease_sql.renew, holder=holder, epoch=int(epoch),
                                ttl_ms=self.ttl_ms)
        current = token == self.token
        if now_ms is None:
            valid = self.clock() < self._valid_until
            who = self.holder()[0]
            if current:
                if who is None and valid:
                    self.vanished_while_held = True
                    logger.warning("leaderbeat: the lease %s vanished while still valid: the "
                                   "database lost writes (a replica promoted, a backup "
                                   "restored)", token)
                self.mark_lost()
            lost = LeaseLostError(f"lease {token} lost; held by {who or 'nobody'}")
            lost.holder, lost.answered = who, True
            raise lost
        if current:
            self.confirm(started)
            self._measured(started, now_ms)

    def release(self, reason: str = "released") -> bool:
        """Give the lease up, fenced by holder and epoch; wakes the standbys."""
        if self.token is None or self.epoch is None:
            return False
        token, epoch = self.token, self.epoch
        self.mark_lost()
        self.token = None
        return bool(self.place.run(lease_sql.release, holder=token.rpartition("|")[0],
                                   epoch=epoch, node=self.config.node_id, reason=reason,
                                   channel=channel(self.place)))

    def holder(self) -> tuple[str | None, int]:
        """The holder's token (None: nobody) and its remaining ttl in ms."""
        who, epoch, remaining = self.place.run(lease_sql.current_holder)
        return (None, 0) if who is None else (f"{who}|{epoch}", remaining)

    def is_held(self) -> bool:
        return (self.token is not None and not self._lost.is_set()
                and self.clock() < self._valid_until)

    def credentials(self) -> tuple[str, int]:
        if self.token is None or self.epoch is None:
            raise LeaseLostError("this node holds no lease")
        return self.token, self.epoch

    def remaining(self) -> float:
        return max(0.0, self._valid_until - self.clock()) if self.token else 0.0

    def confirm(self, started: float) -> None:
        """A call that began at monotonic ``started`` proved the lease: push the deadline."""
        deadline = started + self.config.lease_ttl - self.config.safety_margin
        self._valid_until = max(self._valid_until, deadline)
        if self.confirmed_at is not None:
            self.longest_gap = max(self.longest_gap, started - self.confirmed_at)
        self.confirmed_at = max(self.confirmed_at or started, started)

    def observe_epoch(self, epoch: int | None) -> None:
        if epoch is not None and epoch > self.highest_epoch:
            self.highest_epoch = epoch

    def measure_skew(self) -> float:
        """Compare this node's clock with the server's ``clock_timestamp()``."""
        started = self.clock()
        now_ms = self.place.run(lease_sql.now_ms)
        self._measured(started, now_ms)
        assert self.clock_skew is not None
        return self.clock_skew

    def mark_lost(self) -> None:
        self._lost.set()
        self._valid_until = 0.0

    def _measured(self, started: float, server_ms: int) -> None:
        """A call that began at monotonic ``started`` read the server's clock."""
        elapsed = self.clock() - started
        self.clock_skew = self.wall() - elapsed / 2 - server_ms / 1000
