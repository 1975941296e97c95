"""The claim rules, item by item: what ``lead.lua``, ``rescue.lua`` and ``backfill.lua``
decide, as pure functions.

The claim transaction (:mod:`.claims_sql`) reads what a chunk touches (the entries'
slots locked, their fingerprints, the paused entries, the overtaken and granted slots),
hands it to :func:`decide` item by item, and writes what the decisions changed. No I/O
here: every rule is testable without a server, and the SQL stays a read and a write.

A stored slot is a :class:`Row`. Answers per item: a :class:`~..types.Code`, the
:class:`Row` that refused it (a slot not later than the stored one), or for a backfill
refused its :class:`~..types.BackfillReason`; the ledger turns them into the seam's
:data:`~..types.ClaimResult`, the same as the Redis store answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..types import BackfillReason, Code, Op, SlotStatus

#: states of an entry's last slot (the ``slots.state`` column holds their letters)
CLAIMED, SENT, SKIPPED, ANCHOR, UNSENT = (SlotStatus.CLAIMED, SlotStatus.SENT,
                                          SlotStatus.SKIPPED, SlotStatus.ANCHOR,
                                          SlotStatus.UNSENT)

#: the state each op writes when granted
_STATES = {Op.CLAIM: CLAIMED, Op.SKIP: SKIPPED, Op.ROLLED_BACK: SKIPPED, Op.ANCHOR: ANCHOR,
           Op.REANCHOR: ANCHOR, Op.RESTORE: SENT, Op.RECOVER: CLAIMED}


@dataclass(frozen=True)
class Row:
    """A stored slot: an entry's last one, an overtaken one, or a grant."""

    slot_ms: int
    epoch: int
    state: SlotStatus
    node: str = ""  #: '' for a leader's claim; the standby's id for a rescue
    claimed_ms: int | None = None  #: a rescue's claim time, by the server's clock


class Item(Protocol):
    """One claim item, as the caller asks for it."""

    @property
    def name(self) -> str: ...
    @property
    def slot_ms(self) -> int: ...
    @property
    def op(self) -> Op: ...
    @property
    def fire_ms(self) -> int: ...
    @property
    def prev_ms(self) -> int | None: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def enqueue(self) -> tuple[tuple[str, str, Any], ...]: ...


@dataclass
class Chunk:
    """What one claim call knows, and what its decisions change (written at the end)."""

    lead: bool  #: a leader's call (fenced by its lease) or a standby's rescue
    epoch: int  #: the leader's epoch; 0 for a rescue
    node: str
    now_ms: int  #: the server's clock
    ahead_ms: int = 0  #: lead: how far a claimed slot's fire time may lie ahead of now
    rescue_after_ms: int = 0
    recover_age_ms: int = 0  #: lead: how old a standby's claim must be to recover it
    leader_busy: bool = False  #: rescue: the lease holder claimed something very recently
    definitions_behind: bool = False  #: rescue: the newest leader has not defined yet
    slots: dict[str, Row] = field(default_factory=dict)
    definitions: dict[str, str] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    overtaken: dict[tuple[str, int], Row] = field(default_factory=dict)
    grants: dict[tuple[str, int], Row] = field(default_factory=dict)
    #: backfill: the request that backfilled each slot, the slots the history says were
    #: sent, the time after which the history is whole (None: no history), the floor
    backfilled: dict[tuple[str, int], str] = field(default_factory=dict)
    sent: set[tuple[str, int]] = field(default_factory=set)
    history_whole_ms: int | None = None
    floor_ms: int = 0
    # what the decisions change
    written: dict[str, Row] = field(default_factory=dict)
    new_grants: dict[tuple[str, int], Row] = field(default_factory=dict)
    recovered: set[tuple[str, int]] = field(default_factory=set)
    overtaken_added: dict[tuple[str, int], Row] = field(default_factory=dict)
    overtaken_dropped: set[tuple[str, int]] = field(default_factory=set)
    defined: dict[str, str] = field(default_factory=dict)
    defined_epoch: int | None = None
    new_backfills: dict[tuple[str, int], str] = field(default_factory=dict)

    def claimant(self) -> tuple[int, str, int | None]:
        """The epoch, node and claim time every row this chunk writes carries."""
        return (self.epoch, "", None) if self.lead else (0, self.node, self.now_ms)

    def store(self, name: str, row: Row) -> None:
        self.slots[name] = row
        self.written[name] = row

    def grant(self, name: str, row: Row, *, recovered: bool = False) -> None:
        self.grants[(name, row.slot_ms)] = row
        self.new_grants[(name, row.slot_ms)] = row
        if recovered:
            self.recovered.add((name, row.slot_ms))


Answer = Code | Row | BackfillReason


def decide(chunk: Chunk, item: Item) -> Answer:
    """One item's answer; what it grants is noted in ``chunk``."""
    stored = chunk.slots.get(item.name)
    if not chunk.lead:
        return _rescue(chunk, item, stored)
    if item.op is Op.DEFINE:
        return _define(chunk, item)
    if item.op is Op.BACKFILL:
        return _backfill(chunk, item, stored)
    if item.op not in _STATES:
        raise ValueError(f"claim item {item.name!r}: unknown op {item.op!r}")
    if item.op is Op.CLAIM and item.fire_ms > chunk.now_ms + chunk.ahead_ms:
        return Code.EARLY
    if item.op is Op.RECOVER:
        return _recover(chunk, item, stored)
    return _lead(chunk, item, stored)


def _define(chunk: Chunk, item: Item) -> Answer:
    """The leader's fingerprint of an entry (none: only the mark of its epoch)."""
    if item.name:
        _note_definition(chunk, item.name, item.fingerprint)
    chunk.defined_epoch = chunk.epoch
    return Code.GRANTED


def _lead(chunk: Chunk, item: Item, stored: Row | None) -> Answer:
    """A leader's claim, skip, anchor, reanchor, restore or rolled-back start."""
    slot_ms = item.slot_ms
    if item.op is Op.ANCHOR:
        if stored:
            return stored
    elif item.op is Op.REANCHOR:
        if chunk.definitions.get(item.name) == item.fingerprint:
            return stored or Code.UNKNOWN
        if stored and stored.slot_ms > slot_ms:
            slot_ms = stored.slot_ms  # never moves a slot backwards
    elif stored:
        refused = _asked_again_or_older(chunk, item, stored)
        if refused is not None:
            return refused
    return _granted(chunk, item, stored, slot_ms)


def _asked_again_or_older(chunk: Chunk, item: Item, stored: Row) -> Answer | None:
    """A leader's claim, skip or restore against a stored slot: the answer, or None to
    go on and grant it."""
    own = stored.slot_ms == item.slot_ms and stored.epoch == chunk.epoch and not stored.node
    if own and item.op is Op.CLAIM and stored.state == SENT:
        return Code.ENQUEUED  # asked again: recorded sent since (its reply was lost)
    if own and item.op is Op.CLAIM and stored.state == CLAIMED:
        return None  # asked again, not sent yet: granted again
    if own and stored.state == _STATES[item.op]:
        return Code.GRANTED  # a retry of this leader's own write
    if item.slot_ms <= stored.slot_ms:
        return stored
    return None


def _recover(chunk: Chunk, item: Item, stored: Row | None) -> Answer:
    """Re-send a slot an earlier claimant left claimed and unconfirmed."""
    key = (item.name, item.slot_ms)
    over = chunk.overtaken.get(key)
    current = (stored is not None and stored.slot_ms == item.slot_ms
               and stored.state in (CLAIMED, UNSENT))
    left = over or (stored if current else None)
    if left is None:
        return stored or Code.UNKNOWN
    if left.epoch == chunk.epoch and not left.node:
        return Code.GRANTED  # this leader's own recovery, asked again
    if left.claimed_ms is not None and chunk.now_ms < left.claimed_ms + chunk.recover_age_ms:
        return Code.EARLY  # a standby's claim, young enough that it may still publish it
    epoch, node, at = chunk.claimant()
    row = Row(item.slot_ms, epoch, CLAIMED, node, at)
    chunk.grant(item.name, row, recovered=True)
    if over:
        chunk.overtaken.pop(key)
        chunk.overtaken_dropped.add(key)
        return Code.GRANTED  # the newer stored slot stays as it is
    return _granted(chunk, item, stored, item.slot_ms)


def _backfill(chunk: Chunk, item: Item, stored: Row | None) -> Answer:
    """Send a slot the schedule passed without sending it (the CLI's backfill; its
    request id comes as the fingerprint): granted only when, at this moment, the stored
    slot is later, the history (whole back to it) has no ``sent`` of it, it is not
    claimed and unconfirmed, not backfilled before and not older than the floor. The
    stored slot stays. A refusal answers its reason."""
    key = (item.name, item.slot_ms)
    if stored is None or item.slot_ms >= stored.slot_ms:
        return BackfillReason.LATER
    by = chunk.backfilled.get(key)
    if by is not None:
        return Code.GRANTED if by == item.fingerprint else BackfillReason.BACKFILLED
    if key in chunk.overtaken:
        return BackfillReason.UNCONFIRMED
    if item.slot_ms < chunk.floor_ms:
        return BackfillReason.LOST
    if key in chunk.sent:
        return BackfillReason.SENT
    whole = chunk.history_whole_ms
    if whole is None or whole >= item.slot_ms - chunk.ahead_ms:
        return BackfillReason.HORIZON  # a 'sent' event of the slot may have been pruned
    chunk.backfilled[key] = item.fingerprint
    chunk.new_backfills[key] = item.fingerprint
    return Code.GRANTED


def _rescue(chunk: Chunk, item: Item, stored: Row | None) -> Answer:
    """A standby's claim (or skip): no lease, only for slots nobody claimed in time."""
    if item.op not in (Op.CLAIM, Op.SKIP) or stored is None:
        return Code.UNKNOWN
    if chunk.definitions_behind:
        return Code.EARLY
    leaders = chunk.definitions.get(item.name)
    if item.fingerprint and leaders is not None and leaders != item.fingerprint:
        return Code.DIFFERS
    state = _STATES[item.op]
    if (stored.slot_ms == item.slot_ms and stored.epoch == 0 and stored.state == state
            and stored.node == chunk.node):
        return Code.GRANTED  # a retry of this rescuer's own claim
    if item.slot_ms <= stored.slot_ms or (item.prev_ms is not None
                                          and item.prev_ms != stored.slot_ms):
        return stored
    if chunk.now_ms < item.fire_ms + chunk.rescue_after_ms or chunk.leader_busy:
        return Code.EARLY
    return _granted(chunk, item, stored, item.slot_ms)


def _granted(chunk: Chunk, item: Item, stored: Row | None, slot_ms: int) -> Answer:
    """Write the item's new state (a paused entry's claim skips past instead)."""
    epoch, node, at = chunk.claimant()
    if item.op is Op.CLAIM and item.name in chunk.paused:
        chunk.store(item.name, Row(slot_ms, epoch, SKIPPED, node, at))
        answer: Answer = Code.PAUSED
    else:
        row = Row(slot_ms, epoch, _STATES[item.op], node, at)
        if item.op is Op.CLAIM:
            granted = chunk.grants.get((item.name, slot_ms))
            if granted is not None and (granted.epoch, granted.node) != (row.epoch, row.node):
                return stored or granted  # granted once already, to another claimant
            chunk.grant(item.name, row)
        if stored and _overtakes(chunk, item, stored, slot_ms):
            chunk.overtaken[(item.name, stored.slot_ms)] = stored
            chunk.overtaken_added[(item.name, stored.slot_ms)] = stored
        chunk.store(item.name, row)
        # this store runs no broker commands: the caller publishes what they would send
        answer = Code.UNQUEUED if item.op is Op.CLAIM and item.enqueue else Code.GRANTED
    if chunk.lead and item.fingerprint:
        _note_definition(chunk, item.name, item.fingerprint)
    return answer


def _note_definition(chunk: Chunk, name: str, fingerprint: str) -> None:
    """The leader's fingerprint of ``name``, written only when it differs from the one
    stored (a burst's claims carry every entry's, nearly always unchanged)."""
    if chunk.definitions.get(name) != fingerprint:
        chunk.defined[name] = fingerprint
        chunk.definitions[name] = fingerprint


def _overtakes(chunk: Chunk, item: Item, stored: Row, slot_ms: int) -> bool:
    """The new slot replaces another claimant's claimed, unconfirmed one (reported later)."""
    if item.op is Op.RECOVER or stored.state not in (CLAIMED, UNSENT) or stored.slot_ms == slot_ms:
        return False
    if chunk.lead:
        own = stored.epoch == chunk.epoch and not stored.node
    else:
        own = stored.epoch == 0 and stored.node == chunk.node
    return not own
