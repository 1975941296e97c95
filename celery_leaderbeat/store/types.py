"""The values the store and the roles exchange about slots: what a claim asks for,
what a slot's stored state is, what a claim answers, what the history records.

Plain data, no Redis: a store of any kind reads and writes these. The codes of
:class:`Code` and :class:`BackfillReason` are also the Lua scripts' vocabulary: the
script loader writes them into every script, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, NamedTuple


class _Word(str, Enum):
    """An enum whose members are the words the store keeps, and print as them."""

    def __str__(self) -> str:
        return str(self.value)


class SlotStatus(_Word):
    """The state of an entry's last slot, stored as one letter in the slots hash."""

    CLAIMED = "c"  # granted to be sent, not confirmed yet
    SENT = "s"  # the broker accepted it
    SKIPPED = "k"  # passed over (catch-up policy, paused entry, restarted past it)
    ANCHOR = "a"  # where an entry starts: nothing before it was settled under it
    UNSENT = "u"  # claimed and reported not sent (once, by a leader or its claimant)

    @property
    def label(self) -> str:
        """The word the CLI and the web page show."""
        return "unsent (reported)" if self is SlotStatus.UNSENT else self.name.lower()


class Op(_Word):
    """What a claim asks for, per item (the claim scripts turn each into a state)."""

    CLAIM = "claim"  # claim the slot to send it: claimed
    SKIP = "skip"  # advance past a slot not sent (catch-up policy): skipped
    ANCHOR = "anchor"  # the entry's first slot, only if it has no state yet: anchor
    REANCHOR = "reanchor"  # the definition changed: start again from this slot, anchor
    RESTORE = "restore"  # this node sent the slot and Redis lost that: sent
    #: Redis went back to older state than this node saw: start again past the slot,
    #: skipped (nothing between the loss and this slot can be told sent or not)
    ROLLED_BACK = "rolled_back"
    RECOVER = "recover"  # re-send an earlier claimant's unconfirmed slot: claimed
    BACKFILL = "backfill"  # send a slot the schedule passed unsent: the stored slot stays
    DEFINE = "define"  # the leader's fingerprint of an entry, and the mark of its epoch


@dataclass(frozen=True)
class SlotState:
    """An entry's last slot as recorded in the store; ``node`` (and ``claimed_ms``, by the
    store's clock) are set for a standby's rescue."""

    slot_ms: int
    epoch: int
    state: SlotStatus
    node: str | None = None
    claimed_ms: int | None = None

    def claimant(self) -> str:
        """Who claimed it, for a log line or the history."""
        return f"standby {self.node} (rescue)" if self.node else f"the leader of epoch {self.epoch}"


@dataclass(frozen=True)
class ClaimItem:
    """One slot a claim asks for."""

    name: str
    slot_ms: int
    op: Op
    fire_ms: int = 0  # the slot plus its jitter; a rescue waits for fire + rescue_after
    prev_ms: int | None = None  # rescue: the slot the rescuer planned from (must be stored)
    fingerprint: str = ""  # the definition the claimant plans (see :mod:`fingerprint`)
    #: broker commands (name, key, argument) the claim runs if it grants the slot
    enqueue: tuple[tuple[str, str, Any], ...] = ()


@dataclass(frozen=True)
class Event:
    """A history event about one slot (``sent``, ``unsent``, ``missed``, ``skipped`` ...)."""

    name: str
    slot_ms: int
    event: str
    detail: str = ""


class Code(IntEnum):
    """What a claim answers for one item when no stored slot refused it."""

    #: not yet: a rescue before fire + rescue_after or while the leader is busy or has not
    #: marked its definitions, a leader's slot ahead of the store's clock, a recovery of a
    #: standby's claim it may still publish
    EARLY = 0
    GRANTED = 1
    #: a paused entry's slot: skipped past, not granted; resuming does not replay it
    PAUSED = 2
    #: a rescue whose definition of the entry is not the one the leader plans
    DIFFERS = 3
    #: a leader's own slot asked again and stored sent under its epoch: enqueued by an
    #: earlier attempt of the claim (its reply was lost) or recorded sent; nothing ran again
    ENQUEUED = 4
    #: granted without running its broker commands (a queue they write is not a list): the
    #: caller publishes it after the claim, where that one message fails as kombu's would
    UNQUEUED = 5
    #: a rescue of an entry with no state yet (its phase is not known)
    UNKNOWN = 6


class BackfillReason(_Word):
    """Why a backfill of a slot was refused (decided by the store, at the claim)."""

    LATER = "later"
    SENT = "sent"
    BACKFILLED = "backfilled"
    UNCONFIRMED = "unconfirmed"
    LOST = "lost"
    HORIZON = "horizon"

    @property
    def detail(self) -> str:
        """The history's detail for a slot refused for this reason."""
        return _BACKFILL_DETAILS[self]


_BACKFILL_DETAILS = {
    BackfillReason.LATER: "backfill: not settled by the schedule yet (sent when due)",
    BackfillReason.SENT: "backfill: sent before (the history says so)",
    BackfillReason.BACKFILLED: "backfill: sent before (backfilled)",
    BackfillReason.UNCONFIRMED: "backfill: claimed and not confirmed (the next leader reports it)",
    BackfillReason.LOST: "backfill: due before Redis lost writes (what was sent then cannot be "
                         "told)",
    BackfillReason.HORIZON: "backfill: the history no longer reaches back to it",
}


@dataclass(frozen=True)
class Refused:
    """A claim refused by the entry's stored slot (the same slot or a newer one)."""

    state: SlotState
    reason: str  # for the history: who holds it

    @classmethod
    def by(cls, state: SlotState, slot_ms: int) -> Refused:
        """A claim of ``slot_ms`` refused by ``state``, with who holds it said."""
        held = "already claimed" if state.slot_ms == slot_ms else "a newer slot was claimed"
        return cls(state, f"{held} by {state.claimant()}")


@dataclass(frozen=True)
class BackfillRefused:
    """A backfill refused, and why."""

    reason: BackfillReason


#: what a claim answers for one item
ClaimResult = Code | Refused | BackfillRefused


class Claimed(NamedTuple):
    """What one rescue call answered: a result per item, and the store's clock."""

    results: list[ClaimResult]
    redis_now_ms: int
