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

The implementation today is Redis (:func:`~celery_leaderbeat.store.redis_store.connect`):
:class:`~celery_leaderbeat.store.lease.Lease` (``acquire.lua``, ``renew.lua``,
``release.lua``), :class:`~celery_leaderbeat.store.ledger.Ledger` (``lead.lua``,
``rescue.lua``, ``record.lua`` ... and ``prune.lua``), pub/sub for the events, a list for the requests, ``entries.lua`` for
the entries, ``guard_*.lua`` for the guard. A second store, say PostgreSQL for a site
with no Redis, would implement the same protocols: the lease as one row updated under
an advisory lock (the epoch a column bumped on each acquisition: the fencing token),
the slots as a table keyed by entry and claimed with ``UPDATE ... WHERE slot < $slot``
in the transaction that checks the lease row, the events as ``LISTEN``/``NOTIFY``, the
requests as rows taken with ``DELETE ... RETURNING``. It would add its driver's
exceptions to :data:`STORE_ERRORS`. ``tests/test_store_contract.py`` holds what any
store must pass.

One capability is the Redis store's alone, and optional: **claim and enqueue in one
step** (``send/one_step.py``). When the broker is the store's own Redis server and
database, the claim script runs the broker's commands (``ClaimItem.enqueue``) for
exactly the slots it grants. A store offers it through its ``client`` attribute (the
Redis client the enqueuer compares with the broker's); where that is ``None`` (or
another server, Cluster, Sentinel) no claim carries broker commands: a chunk is
claimed first and then published in one kombu batch, as every other store would do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from .entry_store import Changes, Saved, Stored
from .failures import ERRORS, REFUSED, UNREACHABLE
from .lease import Heartbeat
from .types import Claimed, ClaimItem, ClaimResult, Event, SlotState

#: what a failed store call raises: no answer, or an error answer (``except STORE_ERRORS``)
STORE_ERRORS = ERRORS
#: of those, the ones that mean the store could not be reached at all (an outage)
STORE_UNREACHABLE = UNREACHABLE
#: of those, the store refusing the credentials or a command (retrying cannot help)
STORE_REFUSED = REFUSED


class LeaseStore(Protocol):
    """This node's view of the one lease: who leads, under which fencing epoch."""

    token: str | None  #: this node's lease token while it holds the lease
    epoch: int | None  #: the fencing epoch of this node's lease
    highest_epoch: int  #: the highest epoch seen: a new lease's epoch is above it
    clock_skew: float | None  #: seconds this node's clock is ahead of the store's
    vanished_while_held: bool  #: the store lost the lease while this node held it
    confirmed_at: float | None  #: when the latest call that proved the lease began
    longest_gap: float  #: the longest time between two such calls since it was taken
    led_last: bool  #: this node held the lease last, as far as it knows
    held_back: bool  #: the last attempt was refused: the store lost writes, another led last
    on_renew: Callable[[float | None], None]  #: told how long each heartbeat renewal took
    on_generation: Callable[[int], None]  #: told the state generation each acquire read

    @property
    def ttl_ms(self) -> int: ...
    @property
    def lost(self) -> bool: ...
    def try_acquire(self, *, despite_loss: bool = False) -> bool:
        """Take the lease if nobody holds it; a new, higher epoch. After the store lost
        writes, only the node that led last, or one ``despite_loss``."""
    def renew(self, token: str | None = None) -> None:
        """Extend this node's lease; raise LeaseLostError when it is no longer held."""
    def release(self, reason: str = "released") -> bool:
        """Give the lease up (fenced: nothing more can be claimed under it)."""
    def holder(self) -> tuple[str | None, int]:
        """The holder's token (None: nobody) and its remaining ttl in ms."""
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
              events: Sequence[Event] = ()) -> list[ClaimResult]:
        """Leader: write ``events``, then claim ``items`` in order, fenced by ``token``."""
    def check_generation(self, token: str, epoch: int) -> None:
        """Leader: raise when the store lost writes this node saw, or ``token`` no longer
        leads; before acting on state a restore may have brought back."""
    def mark_definitions(self, token: str, epoch: int) -> None:
        """Leader: mark the stored definitions as the ones this leader plans."""
    def backfill(self, token: str, epoch: int, name: str, slots: Sequence[int],
                 request_id: str) -> list[ClaimResult]:
        """Leader: grant a backfill of each slot or say why not, from what the store holds
        now (sent by anyone, unconfirmed, backfilled before, due before a loss)."""
    def lost_at(self) -> int | None:
        """The store's time (ms) when a leader last started again after the store lost
        writes; None if never."""
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
    generation: int  #: the highest generation of the state this node has seen (0: none)
    loss_seen: bool  #: the store answered older state than this node has seen
    loss_reported: bool  #: the last rollback answered was a loss another node reported
    @property
    def below(self) -> bool:
        """The store's generation was last seen below the highest this node saw."""
    def report_lost(self, settled: dict[str, int]) -> None:
        """Keep, for a while, the newest slot of each entry this node knew settled before
        the store lost writes (clears :attr:`loss_seen`)."""
    def lost_reports(self) -> dict[str, int]:
        """Per entry, the newest slot any node reported settled before a loss."""
    def prune(self, scheduled: Iterable[str], *, keep_ms: int,
              node_keep_s: float) -> list[int]:
        """Forget entries no longer scheduled (after ``keep_ms``) and long-gone nodes."""
    def overtaken(self) -> dict[tuple[str, int], SlotState]: ...
    def forget_overtaken(self, fields: Sequence[tuple[str, int]]) -> None: ...
    def history(self, count: int = 50) -> list[dict[str, str]]:
        """The newest ``count`` history events, oldest first, each with its ``id``."""
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


@dataclass(frozen=True)
class GuardRun:
    """One guarded run of one slot, as the worker guard records it."""

    task_id: str  #: the slot's deterministic task id: what makes two deliveries one run
    entry: str
    slot_ms: int
    epoch: Any  #: the fencing epoch the slot was sent under ("" when the message has none)
    overlap: str  #: the entry's overlap policy (``skip``, ``buffer_one``, ... ``allow_all``)
    worker: str  #: ``host:pid`` of the worker running it
    retry: int = 0  #: Celery's retry number: each retry of a slot is a run of its own
    #: the message that starts the slot when it has to wait (JSON; buffer and cancel policies)
    message: str = ""
    #: this delivery is a waiting slot's message, published when its turn came
    handed_over: bool = False
    slot_text: str = ""  #: the slot as people read it (ISO 8601), for the history

    @property
    def run_id(self) -> str:
        """What makes two deliveries one run: the slot's task id, and the retry number."""
        return self.task_id if not self.retry else f"{self.task_id}~{self.retry}"


class GuardDecision(NamedTuple):
    """What the guard said to a delivery: run it (under ``token``), or why not."""

    #: ``run``, ``duplicate``, ``overlap`` (skipped), ``wait`` (it starts when its turn
    #: comes) or ``cancel`` (it waits, and the run ``why`` names is to be revoked)
    decision: str
    why: str
    token: int = 0  #: ``run``: the run's fencing token, above every token handed out before


class RunRecord(NamedTuple):
    """What the guard knows of one slot's run."""

    state: str  #: ``started`` or ``finished``
    worker: str
    alive: bool  #: its liveness has not lapsed (a started run that is not alive was lost)


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
        """Every history event kept, oldest first, each with its ``id``
        (``<ms>-<seq>``: the ms is when it was written)."""
    def follow(self, last_id: str = "$", block_ms: int = 1000
               ) -> tuple[str, list[dict[str, str]]]:
        """Events after ``last_id`` (``$``: from now), waiting up to ``block_ms``; the last
        id read, to pass next time."""
    def forget_nodes(self, node_ids: list[str]) -> None:
        """Remove these nodes from the registry."""
    def reset(self) -> int:
        """Delete this app's state (lease, slots, history, nodes, pauses, requests, guard
        records), not the run-time entries; how many records went."""


class Store(Protocol):
    """Everything of one app (one key prefix) in one store, on one connection."""

    lease: LeaseStore
    ledger: SlotStore
    events: Events
    requests: RequestQueue
    entries: EntryDefinitions
    guard: GuardStore
    admin: ClusterAdmin
    #: the Redis client, for claim-and-enqueue in one step; None where the store has none
    client: Any

    def ping(self) -> None:
        """Raise one of :data:`STORE_ERRORS` unless the store answers."""
    def warnings(self) -> list[str]:
        """What about the store's own settings puts the guarantees at risk (said once)."""
    def close(self) -> None:
        """Let the connections go."""
