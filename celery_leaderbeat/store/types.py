"""The values the store and the roles exchange about slots: what a claim asks for,
what a slot's stored state is, what the history records.

Plain data, no Redis: a store of any kind reads and writes these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

#: states of an entry's last slot, as stored in the slots hash
CLAIMED, SENT, SKIPPED, ANCHOR, UNSENT = "c", "s", "k", "a", "u"
STATE_NAMES = {CLAIMED: "claimed", SENT: "sent", SKIPPED: "skipped", ANCHOR: "anchor",
               UNSENT: "unsent (reported)"}


class Op:
    """What a claim asks for, per item (``claim.lua`` turns each into a state)."""

    CLAIM = "claim"  # claim the slot to send it: state 'c'
    SKIP = "skip"  # advance past a slot not sent: state 'k'
    ANCHOR = "anchor"  # the entry's first slot, only if it has no state yet: state 'a'
    REANCHOR = "reanchor"  # the definition changed: start again from this slot, state 'a'
    RESTORE = "restore"  # this node sent the slot and Redis lost that: state 's'
    ROLLED_BACK = "skip"  # Redis went back to older state: start again past it, state 'k'
    RECOVER = "recover"  # re-send an earlier claimant's unconfirmed slot: state 'c'
    BACKFILL = "backfill"  # send a slot the schedule passed unsent: the stored slot stays
    DEFINE = "define"  # the leader's fingerprint of an entry, and the mark of its epoch


@dataclass(frozen=True)
class SlotState:
    """An entry's last slot as recorded in Redis; ``node`` (and ``claimed_ms``, by Redis
    TIME) are set for a standby's rescue."""

    slot_ms: int
    epoch: int
    state: str
    node: str | None = None
    claimed_ms: int | None = None

    def claimant(self) -> str:
        """Who claimed it, for a log line or the history."""
        return f"standby {self.node} (rescue)" if self.node else f"the leader of epoch {self.epoch}"


@dataclass(frozen=True)
class ClaimItem:
    name: str
    slot_ms: int
    op: str  # an Op
    fire_ms: int = 0  # the slot plus its jitter; a rescue waits for fire + rescue_after
    prev_ms: int | None = None  # rescue: the slot the rescuer planned from (must be stored)
    fingerprint: str = ""  # the definition the claimant plans (see :mod:`fingerprint`)
    #: broker commands (name, key, argument) the script runs if it grants the claim
    enqueue: tuple[tuple[str, str, Any], ...] = ()


@dataclass(frozen=True)
class Event:
    """A history event about one slot (``sent``, ``unsent``, ``missed``, ``skipped`` ...)."""

    name: str
    slot_ms: int
    event: str
    detail: str = ""


class Claimed(NamedTuple):
    """What one claim call answered: per item ``None`` (granted) or why not."""

    results: list[SlotState | None | str]  # str: PAUSED, "early" (not late enough), "unknown"
    redis_now_ms: int
