"""What the roles ask of the store: the seam a second store would implement.

The store holds what the beats share, and every answer it gives is atomic:

- **the lease** (:class:`LeaseStore`): one holder at a time, a fencing epoch that only
  goes up, renewed by its holder and refused to anyone else once it lapsed;
- **the slots** (:class:`SlotStore`): each entry's last slot and its state (claimed,
  sent, skipped, anchor, unsent). A claim is granted only to the current lease holder
  and only for a slot later than the stored one; a standby's rescue is granted only
  for a slot nobody claimed ``rescue_after`` past its fire time. Beside them: the
  history, the node registry, and the fingerprint of each entry's definition.

:class:`Store` is the two together. The implementation today is Redis:
:class:`~celery_leaderbeat.store.lease.Lease` (``acquire.lua``, ``renew.lua``,
``release.lua``) and :class:`~celery_leaderbeat.store.ledger.Ledger` (``claim.lua``,
``prune.lua``), made on one client by :func:`redis_store`. A second store, say
PostgreSQL for a site with no Redis, would implement the same two protocols: the lease
as one row updated under an advisory lock (the epoch a column bumped on each
acquisition: the fencing token), the slots as a table keyed by entry and claimed with
``UPDATE ... WHERE slot < $slot`` in the transaction that checks the lease row.
``tests/test_store_contract.py`` holds what any store must pass.

Where the code still reaches past this seam to Redis itself:

- the roles' wake-ups: the leader and the standby subscribe to the events channel
  (pub/sub) and ``PING`` to tell an outage from a lost lease (``roles/leader.py``,
  ``roles/standby.py``); the standby reads Redis's persistence settings once;
- the CLI's requests (trigger, backfill): a list, ``LPOP`` and ``HSETNX``
  (``roles/requests.py``);
- claiming and enqueueing in one step (``roles/enqueue.py``): the claim script runs the
  broker's commands, so it exists only where the broker is the store's Redis;
- the cluster view and ``reset`` (``ops/cluster.py``), the worker guard's script
  (``integrations/guard.py``) and the run-time entries (``store/entry_store.py``)
  speak to their keys directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import Config
from .keys import Keys
from .lease import Heartbeat, Lease
from .ledger import Claimed, ClaimItem, Event, Ledger, SlotState
from .scripts import Scripts


class LeaseStore(Protocol):
    """This node's view of the one lease: who leads, under which fencing epoch."""

    token: str | None  #: this node's lease token while it holds the lease
    epoch: int | None  #: the fencing epoch of this node's lease
    highest_epoch: int  #: the highest epoch seen: a new lease's epoch is above it
    clock_skew: float | None  #: seconds this node's clock is ahead of the store's
    vanished_while_held: bool  #: the store lost the lease while this node held it
    on_renew: Callable[[float | None], None]

    @property
    def ttl_ms(self) -> int: ...
    @property
    def lost(self) -> bool: ...
    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; a new, higher epoch."""
    def renew(self, token: str | None = None) -> None:
        """Extend this node's lease; raise LeaseLostError when it is no longer held."""
    def release(self, reason: str = "released") -> bool:
        """Give the lease up (fenced: nothing more can be claimed under it)."""
    def holder(self) -> tuple[str | None, int]:
        """The holder's token (None: nobody) and the current epoch."""
    def is_held(self) -> bool: ...
    def credentials(self) -> tuple[str, int]: ...
    def remaining(self) -> float: ...
    def confirm(self, started: float) -> None: ...
    def observe_epoch(self, epoch: int | None) -> None: ...
    def measure_skew(self) -> float: ...
    def mark_lost(self) -> None: ...
    def start_heartbeat(self, wake_by: Callable[[], float]) -> Heartbeat: ...
    def heartbeat_stopped(self) -> str | None: ...
    def stop_heartbeat(self) -> None: ...


class SlotStore(Protocol):
    """Each entry's last slot, claimed atomically; the history; the node registry."""

    def claim(self, token: str, epoch: int, items: Sequence[ClaimItem],
              events: Sequence[Event] = ()) -> list[SlotState | None | str]:
        """Leader: write ``events``, then claim ``items`` in order, fenced by ``token``."""
    def rescue(self, items: Sequence[ClaimItem], events: Sequence[Event] = ()) -> Claimed:
        """Standby: claim slots nobody claimed ``rescue_after`` past their fire time."""
    def record(self, epoch: int, events: Iterable[Event]) -> int:
        """Write events to the history; ``sent`` events mark their slot sent."""
    def load(self, names: Sequence[str] | None = None) -> dict[str, SlotState]:
        """The last slot of each entry (of ``names``, or of all)."""
    def load_with_definitions(self, names: Sequence[str] | None = None
                              ) -> tuple[dict[str, SlotState], dict[str, str]]: ...
    def write_definitions(self, fingerprints: dict[str, str]) -> None: ...
    def observe_generation(self, generation: int | None) -> None: ...
    def reset_generation(self) -> None: ...
    def prune(self, scheduled: Iterable[str], *, keep_ms: int,
              node_keep_s: float) -> list[int]:
        """Forget entries no longer scheduled (after ``keep_ms``) and long-gone nodes."""
    def overtaken(self) -> dict[tuple[str, int], SlotState]: ...
    def forget_overtaken(self, fields: Sequence[tuple[str, int]]) -> None: ...
    def history(self, count: int = 50) -> list[dict[str, str]]: ...
    def register_node(self, role: str, info: dict[str, Any]) -> dict[str, Any] | None: ...
    def unregister_node(self) -> None: ...
    def nodes(self) -> dict[str, dict[str, Any]]: ...


class Store(Protocol):
    """The lease and the slots of one app (one key prefix)."""

    @property
    def lease(self) -> LeaseStore: ...
    @property
    def ledger(self) -> SlotStore: ...


@dataclass
class RedisStore:
    """The Redis store: the lease and the ledger on one client, under one key prefix."""

    lease: Lease
    ledger: Ledger


def redis_store(client: Any, keys: Keys, config: Config) -> Store:
    """The Redis implementation of :class:`Store` on ``client``."""
    scripts = Scripts(client)
    return RedisStore(Lease(client, scripts, keys, config),
                      Ledger(client, scripts, keys, config))
