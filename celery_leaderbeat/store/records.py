"""The values the store seam speaks in beside the slots: run-time entries and guarded runs.

No store implementation is imported here: every store builds and answers these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import ScriptError


@dataclass(frozen=True)
class Stored:
    """One stored entry: the store's header fields and the definition JSON."""

    name: str
    version: int
    anchor_ms: int  # slots are counted from here: creation, last timing change, re-enable
    fingerprint: str  # of the whole definition
    timing: str  # of what decides the slots (schedule, zone, jitter, at)
    enabled: bool
    ran_ms: int | None  # a one-off entry: the slot it ran, once it has
    definition: str
    kept: bool = False  # the anchor was given (an import), not the time of a change


@dataclass(frozen=True)
class Saved:
    """What a save did: ``changed`` False when the same definition was already stored."""

    changed: bool
    version: int
    anchor_ms: int


@dataclass(frozen=True)
class Changes:
    """What changed since a version: saved entries, removed names, and the new version."""

    version: int
    full: bool  # every entry is listed (the caller was too far behind): drop the others
    saved: dict[str, Stored]
    removed: list[str]


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


#: every answer a guard's start may give (see :class:`GuardDecision`)
DECISIONS = frozenset({"run", "duplicate", "overlap", "wait", "cancel"})


def guard_decision(decision: str, why: str, token: int = 0) -> GuardDecision:
    """A store's answer to a start, checked: an answer this version does not know is an
    error, never taken for a reason to skip the delivery."""
    if decision not in DECISIONS:
        raise ScriptError(f"the worker guard's start answered {decision!r} ({why!r}), not one "
                          f"of {', '.join(sorted(DECISIONS))}")
    return GuardDecision(decision, why, token)


class RunRecord(NamedTuple):
    """What the guard knows of one slot's run."""

    state: str  #: ``started`` or ``finished``
    worker: str
    alive: bool  #: its liveness has not lapsed (a started run that is not alive was lost)


#: an acquire's pttl when it was refused for a loss of writes (no holder has a negative ttl
#: below -2: Redis answers -2 for no key)
LOSS = -3


class Acquired(NamedTuple):
    """A store's answer to an attempt to take the lease."""

    acquired: bool
    epoch: int | None  #: acquired: the new epoch
    holder: str | None  #: refused: the holder's token (None: nobody, held back after a loss)
    pttl: int  #: refused: the holder's remaining ttl in ms (:data:`LOSS`: held back)
    generation: int  #: the store's state generation (see prelude.lua)
    now: float  #: the store's clock (s), so every attempt also measures clock skew


class Renewed(NamedTuple):
    """A store's answer to a renewal: renewed (with its clock), or who holds the lease."""

    renewed: bool
    holder: str | None
    now: float | None
