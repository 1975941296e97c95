"""The thin adapter: the store seam's lease and slots over the SQL functions.

Not selectable yet (no URL chooses it): a test builds it with :func:`open_store`. Each
method takes a connection from the pool, runs one function of :mod:`.lease_sql`,
:mod:`.claims_sql` or :mod:`.state_sql`, and turns its answer into the seam's types.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg_pool

from ...config import Config
from ...errors import LeaseLostError, RolledBackError
from ..ledger import DIFFERS, EARLY, ENQUEUED, PAUSED, UNKNOWN, Claimed, ClaimItem, Event, SlotState
from . import claims_sql, lease_sql, rules, state_sql
from .events import channel_name
from .pool import connection, make_pool
from .schema import DEFAULT_SCHEMA, ensure_schema

logger = logging.getLogger(__name__)

#: ms a leader's claimed slot may lie ahead of the server's clock beyond max_clock_skew
_AHEAD_GRACE_MS = 1000
#: a rescue waits while the lease holder claimed something this recently (ms)
_BUSY_LEADER_MS = 1000
#: the history is pruned to its bounds every this many writes of it
_PRUNE_EVERY = 200
#: history rows and grants older than this many seconds go at the latest
_KEEP_SECONDS = 7 * 24 * 3600.0

#: the seam's answer for each of the rules' codes
_ANSWERS = {rules.PAUSED: PAUSED, rules.ENQUEUED: ENQUEUED, rules.EARLY: EARLY,
            rules.UNKNOWN: UNKNOWN, rules.DIFFERS: DIFFERS}


@dataclass(frozen=True)
class Place:
    """Where one app's state lives: a pool, a schema, and the app's key in it."""

    pool: psycopg_pool.ConnectionPool
    schema: str
    app: str

    def run(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with connection(self.pool) as conn:
            return call(conn, self.schema, self.app, *args, **kwargs)


def holder_id(node_id: str) -> str:
    """This process's holder id: the node id and a token no other process has."""
    return f"{node_id}/{secrets.token_hex(6)}"


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
                             ttl_ms=self.ttl_ms, seen_epoch=self.highest_epoch)
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
            if current:
                self.mark_lost()
            who = self.holder()[0]
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
        now_ms = self._server_ms()
        self._measured(started, now_ms)
        assert self.clock_skew is not None
        return self.clock_skew

    def _server_ms(self) -> int:
        with connection(self.place.pool) as conn:
            return lease_sql.server_ms(conn)

    def mark_lost(self) -> None:
        self._lost.set()
        self._valid_until = 0.0

    def _measured(self, started: float, server_ms: int) -> None:
        """A call that began at monotonic ``started`` read the server's clock."""
        elapsed = self.clock() - started
        self.clock_skew = self.wall() - elapsed / 2 - server_ms / 1000


def channel(place: Place) -> str:
    """The NOTIFY channel of one app's events."""
    return channel_name(place.schema, place.app)


def _events(events: Iterable[Event]) -> claims_sql.Events:
    out = claims_sql.Events([], [], [], [])
    for ev in events:
        out.names.append(ev.name)
        out.slots.append(ev.slot_ms)
        out.events.append(ev.event)
        out.details.append(ev.detail)
    return out


def _state(row: rules.Row) -> SlotState:
    return SlotState(row.slot_ms, row.epoch, row.state, row.node or None, row.claimed_ms)


def _answer(answer: rules.Answer) -> SlotState | None | str:
    if answer is None:
        return None
    if isinstance(answer, rules.Row):
        return _state(answer)
    return _ANSWERS[answer]


class PostgresLedger:
    """The slots, the history, definitions and nodes (the seam's slot store)."""

    def __init__(self, place: Place, config: Config) -> None:
        self.place, self.config = place, config
        #: the highest generation of the app's state this node has seen
        self.generation = 0
        #: the database answered a lower generation than this node has seen (it lost
        #: writes): set until the node reported what it knew settled
        self.loss_seen = False
        self.loss_reported = False
        self._loss_below: int | None = None
        self._reset_generation = False
        self._writes = 0

    def observe_generation(self, generation: int | None) -> None:
        """Note a generation seen elsewhere (an acquire attempt's answer); a lower one than
        this node has seen means the database lost writes (:attr:`loss_seen`)."""
        if generation is None:
            return
        if generation >= self.generation:
            self.generation = generation
            self._loss_below = None
        else:
            if self._loss_below is None or generation < self._loss_below:
                self.loss_seen = True
            self._loss_below = generation

    @property
    def below(self) -> bool:
        """The generation was last seen below the highest this node saw."""
        return self._loss_below is not None

    def reset_generation(self) -> None:
        """The next claim re-anchors after a loss of writes: it lifts the generation."""
        self._reset_generation = True

    def _older_state(self, older: claims_sql.OlderState) -> RolledBackError:
        self.observe_generation(older.generation)
        self.loss_reported = False
        error = RolledBackError(f"{older} (a replica promoted that lacked commits, or a "
                                "backup restored)")
        error.generation = older.generation
        return error

    def claim(self, token: str, epoch: int, items: Sequence[ClaimItem],
              events: Sequence[Event] = ()) -> list[SlotState | None | str]:
        """Leader: write ``events``, then claim ``items`` in order, fenced by ``token``."""
        holder = token.rpartition("|")[0]
        limits = claims_sql.Limits(
            ahead_ms=int(self.config.max_clock_skew * 1000) + _AHEAD_GRACE_MS,
            recover_age_ms=int(self.config.lease_ttl * 1000))
        lift = self.generation if self._reset_generation else 0
        self._reset_generation = False
        fence = claims_sql.Fence(holder, epoch, int(self.config.lease_ttl * 1000),
                                 self.generation, lift)
        got = self._claim(fence, limits, events, items)
        if got.lost:
            lost = LeaseLostError(f"claim refused: lease {token} lost; held by "
                                  f"{got.holder or 'nobody'}")
            lost.holder, lost.answered = got.holder, True
            raise lost
        return [_answer(a) for a in got.answers]

    def rescue(self, items: Sequence[ClaimItem], events: Sequence[Event] = ()) -> Claimed:
        """Standby: claim slots nobody claimed ``rescue_after`` past their fire time."""
        limits = claims_sql.Limits(rescue_after_ms=int(self.config.rescue_after * 1000),
                                   busy_ms=_BUSY_LEADER_MS)
        got = self._claim(claims_sql.Fence(None, 0, 0, self.generation), limits, events, items)
        return Claimed([_answer(a) for a in got.answers], got.now_ms)

    def record(self, epoch: int, events: Iterable[Event]) -> int:
        """Write events to the history; ``sent`` events mark their slot sent."""
        columns = _events(events)
        if not columns.names:
            return 0

        try:
            marked, generation = self.place.run(claims_sql.record, self.config.node_id, epoch,
                                                columns, self.generation)
        except claims_sql.OlderState as older:
            raise self._older_state(older) from None
        self.observe_generation(generation)
        self._wrote()
        return int(marked)

    def _claim(self, fence: claims_sql.Fence, limits: claims_sql.Limits,
               events: Sequence[Event], items: Sequence[ClaimItem]) -> claims_sql.Answer:
        try:
            got = self.place.run(claims_sql.claim, self.config.node_id, fence, limits,
                                 _events(events), items)
        except claims_sql.OlderState as older:
            raise self._older_state(older) from None
        self.observe_generation(got.generation)
        if events:
            self._wrote()
        return got  # type: ignore[no-any-return]

    def _wrote(self) -> None:
        self._writes += 1
        if self._writes % _PRUNE_EVERY == 0:
            self.place.run(state_sql.prune_history, keep=self.config.history_length,
                           max_age_s=_KEEP_SECONDS)

    def load(self, names: Sequence[str] | None = None) -> dict[str, SlotState]:
        return {n: _state(r) for n, r in self.place.run(state_sql.load, names).items()}

    def load_with_definitions(self, names: Sequence[str] | None = None
                              ) -> tuple[dict[str, SlotState], dict[str, str]]:
        return self.load(names), self.place.run(state_sql.definitions, names)

    def write_definitions(self, fingerprints: dict[str, str]) -> None:
        self.place.run(state_sql.write_definitions, fingerprints)

    def prune(self, scheduled: Iterable[str], *, keep_ms: int,
              node_keep_s: float) -> list[int]:
        """Forget entries no longer scheduled (after ``keep_ms``) and long-gone nodes; the
        history to its bounds too."""
        gone = self.place.run(state_sql.prune, list(scheduled), keep_ms=keep_ms,
                              node_keep_s=node_keep_s)
        self.place.run(state_sql.prune_history, keep=self.config.history_length,
                       max_age_s=_KEEP_SECONDS)
        return gone  # type: ignore[no-any-return]

    def overtaken(self) -> dict[tuple[str, int], SlotState]:
        return {k: _state(r) for k, r in self.place.run(state_sql.overtaken).items()}

    def forget_overtaken(self, fields: Sequence[tuple[str, int]]) -> None:
        self.place.run(state_sql.forget_overtaken, list(fields))

    def history(self, count: int = 50) -> list[dict[str, str]]:
        return self.place.run(state_sql.history, count)  # type: ignore[no-any-return]

    def register_node(self, role: str, info: dict[str, Any]) -> dict[str, Any] | None:
        record = dict(info, role=role, last_seen=time.time())
        return self.place.run(  # type: ignore[no-any-return]
            state_sql.register_node, self.config.node_id, record)

    def unregister_node(self) -> None:
        self.place.run(state_sql.unregister_node, self.config.node_id)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return self.place.run(state_sql.nodes)  # type: ignore[no-any-return]


def open_store(conninfo: str, config: Config, *, schema: str = DEFAULT_SCHEMA,
               create: bool = True, **connection_options: Any
               ) -> tuple[PostgresLease, PostgresLedger]:
    """The lease and the ledger of ``config``'s app (its key prefix) on one new pool;
    the schema created or migrated first unless ``create`` is False.
    ``connection_options`` go to every connection (``prepare_threshold=5``: server-side
    prepared statements, where no transaction-mode pooler older than PgBouncer 1.21 sits
    in between)."""
    pool = make_pool(conninfo, timeout=config.socket_timeout, **connection_options)
    place = Place(pool, schema, config.key_prefix)
    if create:
        with connection(pool) as conn:
            ensure_schema(conn, schema)
    return PostgresLease(place, config), PostgresLedger(place, config)
