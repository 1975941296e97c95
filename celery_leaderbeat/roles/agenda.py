"""The leader's agenda: the entries it tracks, when each fires next, what is due.

Pure: no Redis, no Celery app, no clock of its own (``now`` is a parameter).
On election, and whenever the schedule changes, the scheduler builds the
agenda with :func:`load` from the schedule and the slot states stored in
Redis; each tick it takes the due entries off with :meth:`Agenda.pop_due`,
claims and sends their slots, and puts each one back with :meth:`Agenda.push`.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, NamedTuple

from ..entries import EntryOptions
from ..store.types import ClaimItem, ClaimResult, Op, Refused, SlotState, SlotStatus
from ..timing.clocks import IntervalClock
from ..timing.policy import CatchupPolicy
from ..timing.slots import Plan, SlotClock, clock_for, from_ms, plan, to_ms

logger = logging.getLogger(__name__)

#: seconds before an entry whose schedule raised is asked again
RETRY_BROKEN = 60.0


class Tracked:
    """What the leader knows of one entry: its clock, options and last slot."""

    __slots__ = ("clock", "fingerprint", "last", "name", "next_fire", "options")

    def __init__(self, name: str, clock: SlotClock, options: EntryOptions,
                 last: datetime, fingerprint: str = "") -> None:
        self.name = name
        self.clock = clock
        self.options = options
        self.fingerprint = fingerprint  # of the definition this node plans (see fingerprint)
        self.next_fire = last
        self.advance(last)

    def advance(self, last: datetime) -> None:
        """Make ``last`` the entry's last slot; its next fire time follows from it.

        A schedule that raises here (a user's own) is asked again later, not fatal.
        """
        self.last = last
        try:
            self.next_fire = self.clock.fire_time(self.clock.next_after(last))
        except Exception as exc:  # noqa: BLE001 - a user's schedule: one bad entry never stops the rest
            logger.error("leaderbeat: the schedule of entry %r raised %r after slot %s; asked "
                         "again in %.0f s", self.name, exc, last.isoformat(), RETRY_BROKEN)
            self.next_fire = max(last, _utcnow()) + timedelta(seconds=RETRY_BROKEN)

    def advance_past(self, p: Plan, settled_ms: int | None = None) -> None:
        """Advance past every slot ``p`` found due, or to ``settled_ms`` when that slot is
        later (settled in the store beyond this node's plan). Past the plan, the next fire
        time is the plan's own, the one :meth:`advance` would find: the entries that share
        the plan do not each ask the clock again."""
        if settled_ms is not None and settled_ms > p.last_ms:
            self.advance(from_ms(settled_ms))
        else:
            self.last, self.next_fire = p.last, p.next_fire


class Unsent(NamedTuple):
    """A slot an earlier leader claimed and never confirmed sent."""

    name: str
    slot: datetime
    unreported: bool  # still 'claimed': no leader has reported it yet (then it is 'unsent')
    claimed_ms: int | None = None  # a standby's claim: when (Redis TIME) it was made
    overtaken: bool = False  # a newer claim of the entry replaced it (kept apart in Redis)


class Loaded(NamedTuple):
    """What :func:`load` found: the entries, and what the leader must do about them."""

    tracked: dict[str, Tracked]
    #: entries with no stored slot yet (anchored at ``start``), entries whose definition
    #: changed (re-anchored at ``start``), and entries whose stored slot is older than one
    #: this process knows was settled (restored, or started again: Redis lost writes)
    anchors: list[ClaimItem]
    unsent: list[Unsent]  # slots claimed under another epoch, never confirmed sent
    #: run-time entries planned from their anchor in the entry store (see ``anchored``)
    runtime: frozenset[str] = frozenset()


#: builds the slot clock of one entry: (name, schedule, zone, jitter) -> clock
ClockOf = Callable[[str, Any, tzinfo, "float | None"], SlotClock]

#: the fingerprint of one entry's definition: (name, entry, zone, jitter) -> text
FingerprintOf = Callable[[str, Any, tzinfo, "float | None"], str]


def _build(name: str, schedule_: Any, tz: tzinfo, jitter: float | None) -> SlotClock:
    return clock_for(schedule_, name=name, tz=tz, jitter=jitter)


def _no_fingerprint(name: str, entry: Any, tz: tzinfo, jitter: float | None) -> str:
    return ""


def small_change(changed: Collection[str], tracked: int) -> bool:
    """Is a change of the ``changed`` entries, out of ``tracked``, taken in entry by entry?
    A larger one reloads the whole schedule: one read of every state costs less then."""
    return len(changed) <= max(100, tracked // 10)


@dataclass(frozen=True)
class Reading:
    """How :func:`load` reads the entries: their options and zone, clocks, fingerprints."""

    tz: tzinfo  # the app's: for entries without a zone of their own
    options: Mapping[str, EntryOptions]
    default: EntryOptions  # an entry's options when it has none of its own
    clock_of: ClockOf = _build
    fingerprint_of: FingerprintOf = _no_fingerprint


@dataclass(frozen=True)
class Known:
    """What the process that loads knows beside the stored states (see :func:`load`)."""

    epoch: int | None  # the leader's own (None: a standby)
    #: the fingerprints stored beside the slot states (None: not read, a standby)
    definitions: Mapping[str, str] | None = None
    #: the newest slot of an entry this process knows was settled
    remembered: Callable[[str], int | None] = lambda name: None
    trust_memory: bool = False  # it led until Redis lost writes: nobody sent later
    rolled_back: bool = False  # Redis went back to older state: no stored slot trusted
    trusted_epoch: int | None = None  # except one stored under this epoch
    anchored: Collection[str] = ()  # run-time entries whose state is their store's anchor
    runtime: Collection[str] = ()  # the entries defined at run time


def load(schedule: Mapping[str, Any], stored: Mapping[str, SlotState], *, start: datetime,
         reading: Reading, known: Known) -> Loaded:
    """Track every entry of ``schedule`` from its stored last slot, else from ``start``.

    ``known.epoch`` is the leader's own: a claimed or unsent slot of any other epoch
    was left behind by an earlier leader. ``known.definitions`` are the fingerprints
    stored beside the slot states (a leader loads them; an entry whose stored
    fingerprint differs from its own starts again from ``start``).
    ``known.remembered`` gives the newest slot this process knows settled of an entry: a
    stored slot older than that means Redis lost writes. With ``trust_memory``
    (this process led until Redis lost them: nobody can have sent later slots)
    the entry carries on after what was published; otherwise another node may
    have sent later slots than this one remembers, so the entry is treated as
    unknown and starts from ``start``, like an entry with no state. With
    ``rolled_back`` (Redis went back to older state) no stored slot is trusted:
    every entry with state starts from ``start`` too, except one stored under
    ``trusted_epoch`` (the leader's own, when another node reported the loss:
    what this leader wrote is still there).

    ``known.runtime`` names the entries defined at run time: their phase is the entry
    store's (the save, by Redis TIME), the same on every node. ``anchored`` are those
    whose state in ``stored`` is that anchor, not Redis's (none stored yet, or an older
    one): the leader writes it as it is, with no margin, so a standby can rescue from
    it. A run-time entry whose definition changed and whose timing did not keeps its
    phase: only the leader's fingerprint is written.
    """
    tz, options, default = reading.tz, reading.options, reading.default
    tracked: dict[str, Tracked] = {}
    anchors: list[ClaimItem] = []
    unsent: list[Unsent] = []
    for name, entry in schedule.items():
        opts = options.get(name) or default
        try:
            clock = reading.clock_of(name, entry.schedule, opts.tz or tz, opts.jitter)
            fp = reading.fingerprint_of(name, entry, opts.tz or tz, opts.jitter)
        except Exception as exc:  # noqa: BLE001 - an entry added at runtime: the others go on
            logger.error("leaderbeat: entry %r is left out: its schedule cannot be followed (%s)",
                         name, exc)
            continue
        anchor, last = _start_of(name, stored.get(name), fp, start, known)
        if anchor is not None:
            anchors.append(anchor)
        state = stored.get(name)
        if (anchor is None and state is not None
                and state.state in (SlotStatus.CLAIMED, SlotStatus.UNSENT)
                and state.epoch != known.epoch):
            unsent.append(Unsent(name, last, state.state == SlotStatus.CLAIMED,
                                 state.claimed_ms))
        tracked[name] = Tracked(name, clock, opts, last, fp)
    runtime = known.runtime
    return Loaded(tracked, anchors, unsent, frozenset(n for n in tracked if n in runtime)
                  if len(tracked) < len(runtime) else frozenset(n for n in runtime if n in tracked))


def _start_of(name: str, state: SlotState | None, fp: str, start: datetime,
              known: Known) -> tuple[ClaimItem | None, datetime]:
    """Where one entry starts (see :func:`load`): the anchor to claim, if any, and the
    last slot it counts as settled."""
    sent_ms = known.remembered(name)
    if sent_ms is not None and _older(state, sent_ms) and known.trust_memory:
        return ClaimItem(name, sent_ms, Op.RESTORE, fingerprint=fp), from_ms(sent_ms)
    if state is None:
        return ClaimItem(name, to_ms(start), Op.ANCHOR, fingerprint=fp), start
    if _rolled_back(state, sent_ms, known):
        # rolled back (an older snapshot, a lagging replica): unknown, as if empty
        at = max(to_ms(start), state.slot_ms, sent_ms or 0)
        return ClaimItem(name, at, Op.ROLLED_BACK, fingerprint=fp), from_ms(at)
    if name in known.anchored:
        return ClaimItem(name, state.slot_ms, Op.REANCHOR, fingerprint=fp), from_ms(state.slot_ms)
    return _start_from_stored(name, state, fp, start, known)


def _start_from_stored(name: str, state: SlotState, fp: str, start: datetime,
                       known: Known) -> tuple[ClaimItem | None, datetime]:
    """:func:`_start_of` for an entry whose stored slot is trusted: after that slot, unless
    its definition changed."""
    if not _redefined(name, fp, known):
        return None, from_ms(state.slot_ms)
    if name in known.runtime:
        return ClaimItem(name, 0, Op.DEFINE, fingerprint=fp), from_ms(state.slot_ms)
    return (ClaimItem(name, to_ms(start), Op.REANCHOR, fingerprint=fp),
            max(start, from_ms(state.slot_ms)))


def _older(state: SlotState | None, sent_ms: int) -> bool:
    """Whether the stored slot (or none) is older than one this process knows was settled:
    Redis lost writes."""
    return state is None or state.slot_ms < sent_ms


def _rolled_back(state: SlotState, sent_ms: int | None, known: Known) -> bool:
    """Whether the stored slot is not trusted: Redis went back to older state and the slot
    is not stored under the trusted epoch, or Redis lost writes this process remembers."""
    if known.rolled_back and (known.trusted_epoch is None or state.epoch != known.trusted_epoch):
        return True
    return sent_ms is not None and _older(state, sent_ms)


def _redefined(name: str, fp: str, known: Known) -> bool:
    """Whether the fingerprint stored for the entry differs from the one this node plans
    (none on either side, as on a standby: not changed)."""
    stored_fp = (known.definitions or {}).get(name)
    return bool(stored_fp) and bool(fp) and stored_fp != fp


#: slots listed one by one in :func:`margin_slots` (older ones are counted, not listed)
MARGIN_LISTED = 100


def margin_slots(clock: SlotClock, since: datetime, anchor: datetime
                 ) -> tuple[list[datetime], int]:
    """An entry with no known state is anchored after a margin: its first slot sent is the
    one after ``anchor``. Its slots from ``since`` (when this node began following the
    schedule) up to the anchor, itself included, are not sent.

    Returns the newest :data:`MARGIN_LISTED` of them, oldest first, and how many older
    ones there are besides. An interval's slots are counted back from the anchor (its phase).
    """
    if anchor < since:
        return [], 0
    if isinstance(clock, IntervalClock) and not clock.relative:
        total = (anchor - since) // clock.every + 1
        listed = [anchor - k * clock.every for k in range(min(total, MARGIN_LISTED) - 1, -1, -1)]
        return listed, total - len(listed)
    slots: list[datetime] = []
    older = 0
    s = clock.next_after(since - timedelta(milliseconds=1))
    while s <= anchor:
        slots.append(s)
        if len(slots) > MARGIN_LISTED:
            slots.pop(0)
            older += 1
        s = clock.next_after(s)
    return slots, older


def adopt_refused_anchors(loaded: Loaded, results: Sequence[ClaimResult]) -> None:
    """An anchor refused: another leader stored a slot since ``load``; start from that one."""
    for item, result in zip(loaded.anchors, results):
        if isinstance(result, Refused):
            loaded.tracked[item.name].advance(from_ms(result.state.slot_ms))


class Agenda:
    """The tracked entries and a heap of their next fire times."""

    def __init__(self, tracked: dict[str, Tracked] | None = None) -> None:
        self.tracked: dict[str, Tracked] = tracked if tracked is not None else {}
        self._heap = [(t.next_fire.timestamp(), name) for name, t in self.tracked.items()]
        heapq.heapify(self._heap)
        self.broken: list[tuple[str, str]] = []

    def earliest(self) -> float | None:
        """The earliest next fire time (a timestamp), None when nothing is tracked."""
        self._drop_stale_top()
        return self._heap[0][0] if self._heap else None

    def _drop_stale_top(self) -> None:
        """Take stale items off the top of the heap: a dropped entry's, or an older copy of
        one tracked afresh or put back at another time. Left there, each would wake the
        loop at a time nothing is due (a storm of run-time edits leaves one per edit)."""
        heap = self._heap
        while heap and self._current(*heap[0]) is None:
            heapq.heappop(heap)

    def _current(self, at: float, name: str) -> Tracked | None:
        """The entry a heap item stands for, None when the item is stale: the entry was
        dropped, or tracked afresh or put back at another time (its older copy stays in
        the heap until it comes up)."""
        tracked = self.tracked.get(name)
        return tracked if tracked is not None and at == tracked.next_fire.timestamp() else None

    def pop_due(self, now: datetime, since: datetime, policy: CatchupPolicy | None = None,
                limit: int | None = None) -> list[tuple[Tracked, Plan]]:
        """Take every entry due by ``now`` off the heap (the ``limit`` earliest), with its plan.

        ``since`` is when this node could first have sent (see :func:`slots.plan`):
        due slots before it were missed. ``policy`` overrides every entry's own (a
        standby plans with ``skip``: it never catches up). Each entry stays off the
        heap until :meth:`push` puts it back. An entry whose schedule raises is put
        back :data:`RETRY_BROKEN` seconds later and reported in :attr:`broken`; the
        others go on.
        """
        due: list[tuple[Tracked, Plan]] = []
        taken: set[str] = set()
        now_ts = now.timestamp()
        while self._heap and self._heap[0][0] <= now_ts and (limit is None or len(due) < limit):
            tracked = self._current(*heapq.heappop(self._heap))
            if tracked is None or tracked.name in taken:
                continue  # stale, or a second item of an entry pushed twice at one time
            taken.add(tracked.name)
            try:
                due.append((tracked, plan(tracked.clock, last=tracked.last, now=now,
                                          since=since, policy=policy or tracked.options.policy)))
            except Exception as exc:  # noqa: BLE001 - a user's schedule: one bad entry never stops the rest
                self._broken(tracked, now_ts, exc)
        return due

    def upcoming(self, until_ts: float) -> list[tuple[str, datetime]]:
        """(name, slot) of every entry whose next fire time is by ``until_ts``, earliest
        first (the slot is the fire time but for a jittered entry). The heap is walked
        only below items due by then: the cost is the entries returned."""
        heap, found, seen = self._heap, [], set()
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            at, name = heap[i]
            if at > until_ts:
                continue  # nothing below an item is due before it
            tracked = self._current(at, name)
            if tracked is not None and name not in seen:
                seen.add(name)
                slot = _slot_of(tracked)
                if slot is not None:
                    found.append((at, name, slot))
            stack.extend(j for j in (2 * i + 1, 2 * i + 2) if j < len(heap))
        found.sort(key=lambda item: item[0])
        return [(name, fire) for _, name, fire in found]

    def _broken(self, tracked: Tracked, now_ts: float, exc: Exception) -> None:
        logger.error("leaderbeat: the schedule of entry %r raised %r; it is skipped and asked "
                     "again in %.0f s", tracked.name, exc, RETRY_BROKEN, exc_info=exc)
        self.broken.append((tracked.name, f"{type(exc).__name__}: {exc}"[:200]))
        tracked.next_fire = datetime.fromtimestamp(now_ts + RETRY_BROKEN, timezone.utc)
        self.push(tracked)

    def take_broken(self) -> list[tuple[str, str]]:
        """Entries whose schedule raised since the last call, with what it raised."""
        broken, self.broken = self.broken, []
        return broken

    def push(self, tracked: Tracked) -> None:
        """Put an entry back on the heap at its (updated) next fire time."""
        heapq.heappush(self._heap, (tracked.next_fire.timestamp(), tracked.name))

    def add(self, tracked: Tracked) -> None:
        """Track one more entry (or track it afresh: the older copy is dropped)."""
        self.tracked[tracked.name] = tracked
        self.push(tracked)

    def drop(self, name: str) -> None:
        """Stop tracking ``name`` (its heap item is skipped when it comes up)."""
        self.tracked.pop(name, None)

    def push_all(self, due: Sequence[tuple[Tracked, Plan]]) -> None:
        """Put back every entry :meth:`pop_due` took."""
        for tracked, _ in due:
            self.push(tracked)

    def delay(self, now_ts: float, limit: float) -> float:
        """Seconds from ``now_ts`` until the next fire time, at most ``limit``."""
        earliest = self.earliest()
        if earliest is None:
            return limit
        return max(0.0, min(earliest - now_ts, limit))


def _slot_of(tracked: Tracked) -> datetime | None:
    """The slot of ``tracked``'s next fire time (None: its schedule raised; said when due)."""
    if not tracked.options.jitter:
        return tracked.next_fire
    try:
        return tracked.clock.next_after(tracked.last)
    except Exception:  # noqa: BLE001 - a user's schedule: pop_due says what it raised
        return None


def _utcnow() -> datetime:
    return datetime.fromtimestamp(time.time(), timezone.utc)
