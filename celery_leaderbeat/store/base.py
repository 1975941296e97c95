"""What the beats, the CLI and the worker guard ask of the store: the seam a second
store would implement.

The store holds what the beats share, and every answer it gives is atomic:

- **the lease** (:class:`LeaseStore`): one holder at a time, a fencing epoch that only
  goes up, renewed by its holder and refused to anyone else once it lapsed;
- **the slots** (:class:`SlotStore`): each entry's last slot and its state (claimed,
  sent, skipped, anchor, unsent). A claim is granted only to the current lease holder
  and only for a slot later than the stored one; a standby's rescue is granted only
  for a slot nobody claimed ``rescue_after`` past its fire time. Beside them: the
  history, the node registry, and the fingerprint of each entry's definition;
- **the events** (:class:`Events`): hints that wake a waiting node at once (a lease
  released, an entry changed, a request queued); never state, so a lost one costs a poll;
- **the requests** (:class:`RequestQueue`): the CLI's triggers and backfills, each
  taken by one leader; and which backfilled slots were sent, so none is sent twice;
- **the run-time entries** (:class:`EntryDefinitions`): versioned definitions, read
  by change;
- **the worker guard's records** (:class:`GuardStore`): each slot's run recorded
  started, alive and finished, the start decided atomically, so two workers handed
  the same slot cannot both run it;
- **what the CLI reads and does** (:class:`ClusterAdmin`) beyond the lease and the
  slots: step a leader down (fenced: the release of its own token), pause and resume
  entries, note its actions in the history, read or follow the history, forget
  long-gone nodes, reset.

:class:`Store` is all of it on one connection, and the only way the roles, the CLI and
the worker guard reach the store: none of them names a key or sends a Redis command
(``tests/test_layout.py`` checks that ``roles/`` and ``ops/`` import no ``redis``
module but for the capability below).

Three stores implement it. **Redis** (:func:`~celery_leaderbeat.store.redis_store.connect`):
:class:`~celery_leaderbeat.store.lease.Lease` (``acquire.lua``, ``renew.lua``,
``release.lua``), :class:`~celery_leaderbeat.store.ledger.Ledger` (one script per
operation, ``lead.lua``, ``rescue.lua``, ``record.lua`` and the rest, over
``prelude.lua``; ``prune.lua``), pub/sub for the events, a list for the requests,
``entries.lua`` for the entries, ``guard_*.lua`` for the guard. **Memory**
(:mod:`~celery_leaderbeat.store.memory`, ``memory://``): the same rules under one lock
in one process, the reference implementation. **PostgreSQL**
(:mod:`~celery_leaderbeat.store.postgres`): the lease as one row renewed only where
holder and epoch match, every claim one transaction that locks that row and inserts
the slot's grant ``ON CONFLICT DO NOTHING``, the events as ``LISTEN``/``NOTIFY``; no
session advisory lock carries correctness. ``tests/test_store_contract.py`` is what
every store must pass.

One capability is the Redis store's alone, and optional: **claim and enqueue in one
step** (``send/one_step.py``). When the broker is the store's own Redis server and
database, the claim script runs the broker's commands (``ClaimItem.enqueue``) for
exactly the slots it grants. A store declares it by being a :class:`OneStepEnqueue`
(its ``client``: the Redis client the enqueuer compares with the broker's); elsewhere
(another store, another server, Cluster, Sentinel) no claim carries broker commands:
a chunk is claimed first and then published in one kombu batch.

Another capability is optional too: **loss detection** (:class:`LossDetection`). A store
that can tell it lost acknowledged writes declares it by being a :class:`DetectsLoss`
(its ``loss``); the three stores here do. The roles ask for it once
(:func:`loss_detection`) and keep what a loss means on their side
(:mod:`celery_leaderbeat.roles.loss`); a store without it gets no loss handling at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from .errors import StoreError, StoreRefused, StoreUnreachable
from .records import (
    Acquired,
    Changes,
    GuardDecision,
    GuardRun,
    Renewed,
    RunRecord,
    Saved,
    Stored,
)
from .types import Claimed, ClaimItem, ClaimResult, Event, SlotState

#: what the seam speaks in, for the roles and the integrations to import from here
__all__ = [
    "STORE_ERRORS",
    "STORE_REFUSED",
    "STORE_UNREACHABLE",
    "Changes",
    "ClaimItem",
    "ClaimResult",
    "Claimed",
    "ClusterAdmin",
    "DetectsLoss",
    "EntryDefinitions",
    "Event",
    "Events",
    "GuardDecision",
    "GuardRun",
    "GuardStore",
    "LeaseStore",
    "LossDetection",
    "OneStepEnqueue",
    "RequestQueue",
    "RunRecord",
    "Saved",
    "SlotState",
    "SlotStore",
    "Store",
    "Stored",
    "Subscription",
]

#: what a failed store call raises: no answer, or an error answer (``except STORE_ERRORS``)
STORE_ERRORS: tuple[type[Exception], ...] = (StoreError,)
#: of those, the ones that mean the store could not be reached at all (an outage)
STORE_UNREACHABLE: tuple[type[Exception], ...] = (StoreUnreachable,)
#: of those, the store refusing the credentials or a command (retrying cannot help)
STORE_REFUSED: tuple[type[Exception], ...] = (StoreRefused,)


class LeaseStore(Protocol):
    """The one lease, as the store holds it: one holder at a time, a fencing epoch that
    only goes up. What an answer means for a node (its deadline, self-fencing, the
    heartbeat) is the roles' side (:mod:`celery_leaderbeat.roles.lease`)."""

    def acquire(self, seen_epoch: int, seen_generation: int = 0, *,
                despite_loss: bool = False) -> Acquired:
        """Take the lease if nobody holds it (or this node's id holds it, or a holder
        whose epoch is below ``seen_epoch``): an epoch above every one handed out and
        above ``seen_epoch``. A store that detects lost writes (:class:`LossDetection`)
        answers its generation, and refuses (``pttl`` LOSS) while its state is older than
        ``seen_generation``, unless ``despite_loss``; another answers generation 0."""
    def renew(self, token: str) -> Renewed:
        """Extend the lease held under ``token`` by one ttl; refused (with the holder)
        once another token holds it or it lapsed."""
    def release(self, token: str, reason: str) -> bool:
        """Give the lease held under ``token`` up (fenced: nothing more can be claimed
        under it), note it in the history and publish ``released``; False: not held."""
    def holder(self) -> tuple[str | None, int]:
        """The holder's token (None: nobody) and its remaining ttl in ms (-2: none)."""
    def now(self) -> float:
        """The store's clock (seconds): what every lease and skew decision is measured by."""


class SlotStore(Protocol):
    """Each entry's last slot, claimed atomically; the history; the node registry."""

    def claim(self, token: str, epoch: int, items: Sequence[ClaimItem],
              events: Sequence[Event] = ()) -> list[ClaimResult]:
        """Leader: write ``events``, then claim ``items`` in order, fenced by ``token``."""
    def mark_definitions(self, token: str, epoch: int) -> None:
        """Leader: mark the stored definitions as the ones this leader plans."""
    def backfill(self, token: str, epoch: int, name: str, slots: Sequence[int],
                 request_id: str) -> list[ClaimResult]:
        """Leader: grant a backfill of each slot or say why not, from what the store holds
        now (sent by anyone, unconfirmed, backfilled before, due before a loss)."""
    def rescue(self, items: Sequence[ClaimItem], events: Sequence[Event] = ()) -> Claimed:
        """Standby: claim slots nobody claimed ``rescue_after`` past their fire time."""
    def record(self, epoch: int, events: Iterable[Event]) -> int:
        """Write events to the history; ``sent`` events mark their slot sent."""
    def load(self, names: Sequence[str] | None = None) -> dict[str, SlotState]:
        """The last slot of each entry (of ``names``, or of all)."""
    def load_with_definitions(self, names: Sequence[str] | None = None
                              ) -> tuple[dict[str, SlotState], dict[str, str]]: ...
    def write_definitions(self, fingerprints: dict[str, str]) -> None: ...
    def prune(self, scheduled: Iterable[str], *, keep_ms: int,
              node_keep_s: float) -> list[int]:
        """Forget entries no longer scheduled (after ``keep_ms``) and long-gone nodes."""
    def tidy(self) -> None:
        """The housekeeping earlier writes owe (a history pruned to its bound), called
        between send passes so that no claim waits for it; nothing for a store that trims
        as it writes."""
    def overtaken(self) -> dict[tuple[str, int], SlotState]: ...
    def forget_overtaken(self, fields: Sequence[tuple[str, int]]) -> None: ...
    def history(self, count: int = 50) -> list[dict[str, str]]:
        """The newest ``count`` history events, oldest first, each with its ``id`` and ``at``
        (see :meth:`ClusterAdmin.all_history`)."""
    def register_node(self, role: str, info: dict[str, Any]) -> dict[str, Any] | None: ...
    def unregister_node(self) -> None: ...
    def nodes(self) -> dict[str, dict[str, Any]]: ...


class Subscription(Protocol):
    """One node's subscription to the events (see :class:`Events`)."""

    def next(self, timeout: float) -> str | None:
        """The next event, waiting up to ``timeout`` s; None: none yet (ask again until
        your own deadline: a store may answer None early)."""


class Events(Protocol):
    """Wake-ups between the nodes: ``released``, ``entries``, ``request`` (``store.events``).

    A hint, never state: a node that misses one finds the same at its next poll.
    """

    def subscribe(self) -> Subscription:
        """Start listening; events published from now on are kept until read."""
    def publish(self, message: str) -> None: ...


class RequestQueue(Protocol):
    """The CLI's requests for whichever node leads (trigger, backfill), as JSON text."""

    def push(self, request: str) -> None:
        """Queue ``request`` and publish ``request`` on the events."""
    def now_ms(self) -> int:
        """The store's time (ms): what a request is stamped with when queued."""
    def pop(self, limit: int = 1000) -> list[str]:
        """Take up to ``limit`` pending requests, oldest first; each is taken by one caller."""
    def requeue(self, requests: Sequence[str]) -> None:
        """Put back requests taken by :meth:`pop` that were not carried out: first in
        line, in their order."""
    def mark_backfilled(self, entry: str, slot_ms: int, request_id: str) -> bool:
        """Note that ``request_id`` sends this slot; False: a backfill already did (once ever)."""
    def backfilled(self, entry: str) -> set[int]:
        """The slots of ``entry`` a backfill sent."""


class EntryDefinitions(Protocol):
    """The run-time entries: every save atomic and versioned, read by change."""

    def save(self, name: str, *, fingerprint: str, timing: str, enabled: bool,
             definition: str, how: str = "upsert", anchor_ms: int | None = None,
             first_ms: int | None = None) -> Saved:
        """Store one definition (``how``: upsert, create or update; EntryExists and
        EntryUnknown refuse the last two); an unchanged one changes nothing. An enabled
        entry with no slot state gets its first one (its anchor, or ``first_ms`` when
        earlier: a one-off's slot less 1 ms), so a standby can rescue from it."""
    def delete(self, name: str) -> bool:
        """Remove one entry; False when none was stored (a repeated delete too)."""
    def finish(self, name: str, fingerprint: str, slot_ms: int) -> bool:
        """A one-off entry ran ``slot_ms``: disable it (only if still this definition)."""
    def get(self, name: str) -> Stored | None: ...
    def all(self) -> dict[str, Stored]: ...
    def names(self) -> list[str]: ...
    def changes(self, seen: int) -> Changes:
        """What changed since version ``seen`` (-1: everything), in one call."""


class GuardStore(Protocol):
    """The worker guard's records: each slot's run starts at most once."""

    def start(self, run: GuardRun, *, will_ask_again: bool = False) -> GuardDecision:
        """Start ``run`` or say why not, atomically: ``("run", "" or "rerun", token)``,
        ``("duplicate", why)`` (finished, or still alive), ``("overlap", holder)``. A run
        recorded started whose liveness lapsed died with its worker: it may run again.
        ``will_ask_again``: a "running" answer is not written to the history yet."""
    def renew(self, run: GuardRun, token: int) -> bool:
        """Keep the run started under ``token`` alive for another lease ttl (and its entry's
        overlap lock). False, changing nothing: the slot started again under another token
        (this run was taken for dead), so it is no longer this run's."""
    def finish(self, run: GuardRun, token: int, detail: str) -> bool:
        """Record the run started under ``token`` finished (``detail``: its outcome); it
        never runs again. False: superseded (as for renew); recorded in the history only."""
    def runs(self, task_ids: list[str]) -> dict[str, RunRecord]:
        """The record of each run the guard knows of, by task id."""
    def end(self, run: GuardRun, token: int, detail: str) -> tuple[bool, str]:
        """:meth:`finish`, and the message of the entry's waiting slot handed the turn
        (to publish; "" when none waits). The hand-over is kept in the store: a message
        never published is handed over again by :meth:`sweep` after two lease ttls."""
    def release(self, run: GuardRun, detail: str) -> str:
        """This worker terminated ``run`` (revoke with terminate): record it finished
        (``detail``) and hand the turn on; the message to publish, or ""."""
    def decisions(self) -> dict[tuple[str, str, str], int]:
        """How often the guard decided each (entry, policy, decision) about overlap."""
    def sweep(self) -> list[str]:
        """Hand the turn to the first waiting slot of every entry whose run's lock lapsed
        (its worker died); the messages to publish."""


class ClusterAdmin(Protocol):
    """What the CLI reads and does beyond the lease and the slots."""

    @property
    def where(self) -> str:
        """Where this app's state lives, for messages (Redis: the keys' hash tag)."""
    def step_down(self, token: str, reason: str) -> bool:
        """Release the lease held under ``token`` (fenced); False: it was not held."""
    def paused(self) -> dict[str, dict[str, Any]]:
        """Entry name -> the record of its pause (note, when, by whom)."""
    def pause(self, name: str, record: dict[str, Any]) -> None:
        """The leader skips the entry's slots (recorded ``paused``) until resumed."""
    def resume(self, name: str) -> bool:
        """False: it was not paused."""
    def note(self, fields: dict[str, str]) -> None:
        """Add one event to the history."""
    def all_history(self) -> list[dict[str, str]]:
        """Every history event kept, oldest first, each with its ``id`` (opaque: a cursor
        for :meth:`follow`) and ``at`` (when the store wrote it: ms by the store's clock)."""
    def follow(self, cursor: str | None = None, block_ms: int = 1000
               ) -> tuple[str, list[dict[str, str]]]:
        """Events after ``cursor`` (an event's ``id``, or what the last call answered;
        None: from now), waiting up to ``block_ms``; the cursor to pass next time."""
    def forget_nodes(self, node_ids: list[str]) -> None:
        """Remove these nodes from the registry."""
    def reset(self) -> int:
        """Delete this app's state (lease, slots, history, nodes, pauses, requests, guard
        records), not the run-time entries; how many records went."""


@runtime_checkable
class OneStepEnqueue(Protocol):
    """Optional: a store whose claim can run the broker's commands for exactly the slots it
    grants (the broker being the store's own Redis server and database)."""

    #: the Redis client the enqueuer compares with the broker's connection
    client: Any


def one_step_client(store: Store) -> Any:
    """The client of ``store``'s claim-and-enqueue in one step; None when it has none."""
    return store.client if isinstance(store, OneStepEnqueue) else None


@runtime_checkable
class LossDetection(Protocol):
    """Optional: a store that can tell it lost writes it acknowledged (restarted empty,
    restored from an older snapshot, a lagging replica promoted).

    Its state carries a generation that every call which may write raises; each node
    remembers the highest it saw, and a lower one means the store went back. Then the
    slot calls refuse (``RolledBackError``) until a leader starts again past the loss
    (:meth:`reset_generation`), and nodes report what they knew settled. The members
    are the node's own note of the generations it saw and the calls that act on it;
    the roles keep what a loss means (:mod:`celery_leaderbeat.roles.loss`).
    """

    generation: int  #: the highest generation of the state this node has seen (0: none)
    loss_seen: bool  #: the store answered older state than this node has seen
    loss_reported: bool  #: the last rollback answered was a loss another node reported
    @property
    def below(self) -> bool:
        """The store's generation was last seen below the highest this node saw."""
    def observe_generation(self, generation: int | None) -> None:
        """Note a generation seen elsewhere (an acquire attempt's answer); a lower one than
        this node has seen is a loss (:attr:`loss_seen`)."""
    def reset_generation(self, epoch: int) -> None:
        """The next claim of the leader of ``epoch`` re-anchors after a loss of writes: it
        lifts the generation past the loss (clears :attr:`loss_seen`). Only that term's:
        a claim under another epoch never lifts it (the leader lost its lease before a
        claim carried it; when it leads again, it finds the loss again and re-anchors
        knowing of it)."""
    def check_generation(self, token: str, epoch: int) -> None:
        """Leader: raise when the store lost writes this node saw, or ``token`` no longer
        leads; before acting on state a restore may have brought back."""
    def report_lost(self, settled: dict[str, int]) -> None:
        """Keep, for a while, the newest slot of each entry this node knew settled before
        the store lost writes (clears :attr:`loss_seen`)."""
    def lost_reports(self) -> dict[str, int]:
        """Per entry, the newest slot any node reported settled before a loss."""
    def lost_at(self) -> int | None:
        """The store's time (ms) when a leader last started again after the store lost
        writes; None if never."""


@runtime_checkable
class DetectsLoss(Protocol):
    """A store that detects losses of writes declares it by its ``loss``: the part that
    does (the store's ledger, behind the same boundary: its calls are ``ledger.*``)."""

    loss: LossDetection


def loss_detection(store: Store) -> LossDetection | None:
    """``store``'s loss detection; None when the store cannot tell it lost writes."""
    return store.loss if isinstance(store, DetectsLoss) else None


class Store(Protocol):
    """Everything of one app (one key prefix) in one store, on one connection."""

    lease: LeaseStore
    ledger: SlotStore
    events: Events
    requests: RequestQueue
    entries: EntryDefinitions
    guard: GuardStore
    admin: ClusterAdmin

    def ping(self) -> None:
        """Raise one of :data:`STORE_ERRORS` unless the store answers."""
    def warnings(self) -> list[str]:
        """What about the store's own settings puts the guarantees at risk (said once)."""
    def close(self) -> None:
        """Let the connections go."""
