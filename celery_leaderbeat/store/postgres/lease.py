"""The lease in PostgreSQL: one row per app, holding ``<node_id>|<epoch>`` and an expiry.

The seam's :class:`~celery_leaderbeat.store.base.LeaseStore` over :mod:`.lease_sql`:
acquire, renew and release are one statement each, fenced on the row's holder and epoch
(the token), and every decision uses the server's ``clock_timestamp()``. What the answers
mean for a node (its deadline, self-fencing, the heartbeat) is the roles' side:
:mod:`celery_leaderbeat.roles.lease`.
"""

from __future__ import annotations

from ...config import Config
from ..records import LOSS, Acquired, Renewed
from . import lease_sql
from .place import Place, channel, wait_ms


class PostgresLease:
    """The lease row of one app: :func:`.lease_sql.acquire`, ``renew``, ``release``."""

    def __init__(self, place: Place, config: Config) -> None:
        self.place = place
        self.config = config
        self.ttl_ms = int(config.lease_ttl * 1000)
        #: how long a call waits for the lease row while another transaction holds it
        self.wait_ms = wait_ms(config)

    def acquire(self, seen_epoch: int, seen_generation: int = 0, *,
                despite_loss: bool = False) -> Acquired:
        node = self.config.node_id
        got = self.place.run(lease_sql.acquire, holder=node, node=node, ttl_ms=self.ttl_ms,
                             seen_epoch=seen_epoch, seen_generation=seen_generation,
                             despite_loss=despite_loss,
                             wait_ms=self.wait_ms)
        now = got.server_ms / 1000
        if got.epoch is not None:
            return Acquired(True, got.epoch, None, 0, got.generation, now)
        if got.holder is not None and got.remaining_ms > 0:
            return Acquired(False, None, f"{got.holder}|{got.held_epoch}", got.remaining_ms,
                            got.generation, now)
        if not despite_loss and got.generation < seen_generation:
            # nobody holds it and it was not taken: the app's generation is below the caller's
            return Acquired(False, None, None, LOSS, got.generation, now)
        # Refused, though the row as this statement's snapshot shows it is free: another
        # node's acquire committed while this one waited on the row (ON CONFLICT sees the
        # new row, the SELECT does not). That node holds it: read it again.
        token, remaining = self.holder()
        return Acquired(False, None, token, max(remaining, 0), got.generation, now)

    def renew(self, token: str) -> Renewed:
        holder, _, epoch = token.rpartition("|")
        now_ms = self.place.run(lease_sql.renew, holder=holder,
                                epoch=int(epoch) if epoch.isdigit() else -1,
                                ttl_ms=self.ttl_ms, wait_ms=self.wait_ms)
        if now_ms is None:
            return Renewed(False, self.holder()[0], None)
        return Renewed(True, None, now_ms / 1000)

    def release(self, token: str, reason: str) -> bool:
        holder, _, epoch = token.rpartition("|")
        if not epoch.isdigit():
            return False
        return bool(self.place.run(lease_sql.release, holder=holder, epoch=int(epoch),
                                   node=self.config.node_id, reason=reason,
                                   channel=channel(self.place), ttl_ms=self.ttl_ms,
                                   wait_ms=self.wait_ms))

    def holder(self) -> tuple[str | None, int]:
        who, epoch, remaining = self.place.run(lease_sql.current_holder)
        return (None, -2) if who is None else (f"{who}|{epoch}", remaining)

    def now(self) -> float:
        return int(self.place.run(lease_sql.now_ms)) / 1000
