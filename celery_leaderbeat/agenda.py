"""The leader's agenda: the entries it tracks, when each fires next, what is due.

Pure: no Redis, no Celery app, no clock of its own (``now`` is a parameter).
On election, and whenever the schedule changes, the scheduler builds the
agenda with :func:`load` from the schedule and the slot states stored in
Redis; each tick it takes the due entries off with :meth:`Agenda.pop_due`,
claims and sends their slots, and puts each one back with :meth:`Agenda.push`.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from datetime import datetime, tzinfo
from typing import Any, NamedTuple

from .entries import EntryOptions
from .ledger import ANCHOR, CLAIM, CLAIMED, SKIP, UNSENT, ClaimItem, Event, SlotState
from .slots import Plan, SlotClock, clock_for, from_ms, plan, to_ms


class Tracked:
    """What the leader knows of one entry: its clock, options and last slot."""

    __slots__ = ("clock", "last", "name", "next_fire", "options")

    def __init__(self, name: str, clock: SlotClock, options: EntryOptions,
                 last: datetime) -> None:
        self.name = name
        self.clock = clock
        self.options = options
        self.last = last
        self.next_fire = clock.fire_time(clock.next_after(last))

    def advance(self, last: datetime) -> None:
        """Make ``last`` the entry's last slot; its next fire time follows from it."""
        self.last = last
        self.next_fire = self.clock.fire_time(self.clock.next_after(last))


class Unsent(NamedTuple):
    """A slot an earlier leader claimed and never confirmed sent."""

    name: str
    slot: datetime
    unreported: bool  # still 'claimed': no leader has reported it yet (then it is 'unsent')


class Loaded(NamedTuple):
    """What :func:`load` found: the entries, and what the leader must do about them."""

    tracked: dict[str, Tracked]
    anchors: list[ClaimItem]  # entries with no stored slot yet: anchored at ``start``
    unsent: list[Unsent]  # slots claimed under another epoch, never confirmed sent


def load(schedule: Mapping[str, Any], stored: Mapping[str, SlotState], *, start: datetime,
         tz: tzinfo, options: Mapping[str, EntryOptions], default: EntryOptions,
         epoch: int | None) -> Loaded:
    """Track every entry of ``schedule`` from its stored last slot, else from ``start``.

    ``epoch`` is the leader's own: a claimed or unsent slot of any other epoch
    was left behind by an earlier leader.
    """
    tracked: dict[str, Tracked] = {}
    anchors: list[ClaimItem] = []
    unsent: list[Unsent] = []
    for name, entry in schedule.items():
        opts = options.get(name) or default
        clock = clock_for(entry.schedule, name=name, tz=opts.tz or tz, jitter=opts.jitter)
        state = stored.get(name)
        if state is None:
            anchors.append(ClaimItem(name, to_ms(start), ANCHOR))
            last = start
        else:
            last = from_ms(state.slot_ms)
            if state.state in (CLAIMED, UNSENT) and state.epoch != epoch:
                unsent.append(Unsent(name, last, state.state == CLAIMED))
        tracked[name] = Tracked(name, clock, opts, last)
    return Loaded(tracked, anchors, unsent)


def adopt_refused_anchors(loaded: Loaded, refused: Sequence[SlotState | None]) -> None:
    """An anchor refused: another leader stored a slot since ``load``; start from that one."""
    for item, state in zip(loaded.anchors, refused):
        if state is not None:
            loaded.tracked[item.name].advance(from_ms(state.slot_ms))


class Agenda:
    """The tracked entries and a heap of their next fire times."""

    def __init__(self, tracked: dict[str, Tracked] | None = None) -> None:
        self.tracked: dict[str, Tracked] = tracked if tracked is not None else {}
        self._heap = [(t.next_fire.timestamp(), name) for name, t in self.tracked.items()]
        heapq.heapify(self._heap)

    def earliest(self) -> float | None:
        """The earliest next fire time (a timestamp), None when nothing is tracked."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: datetime, since: datetime) -> list[tuple[Tracked, Plan]]:
        """Take every entry due by ``now`` off the heap, with its plan.

        ``since`` is when this node started leading (or the wall clock last
        stepped forward): due slots before it were missed, see :func:`slots.plan`.
        Each entry stays off the heap until :meth:`push` puts it back.
        """
        due = []
        now_ts = now.timestamp()
        while self._heap and self._heap[0][0] <= now_ts:
            _, name = heapq.heappop(self._heap)
            tracked = self.tracked[name]
            due.append((tracked, plan(tracked.clock, last=tracked.last, now=now,
                                      since=since, policy=tracked.options.policy)))
        return due

    def push(self, tracked: Tracked) -> None:
        """Put an entry back on the heap at its (updated) next fire time."""
        heapq.heappush(self._heap, (tracked.next_fire.timestamp(), tracked.name))

    def delay(self, now_ts: float, limit: float) -> float:
        """Seconds from ``now_ts`` until the next fire time, at most ``limit``."""
        if not self._heap:
            return limit
        return max(0.0, min(self._heap[0][0] - now_ts, limit))


def claim_items(due: Sequence[tuple[Tracked, Plan]]) -> list[ClaimItem]:
    """What to claim for the due entries: each slot to send, and a skip past newer missed ones."""
    items: list[ClaimItem] = []
    for tracked, p in due:
        items += [ClaimItem(tracked.name, to_ms(s), CLAIM) for s in p.send]
        # missed slots newer than anything sent: advance past them without sending
        if (not p.send or p.last > p.send[-1]) and p.last > tracked.last:
            items.append(ClaimItem(tracked.name, to_ms(p.last), SKIP))
    return items


def missed_events(tracked: Tracked, p: Plan) -> list[Event]:
    """History events for the slots ``p`` passes over; the oldest only as a count."""
    events = [Event(tracked.name, to_ms(m.slot), "missed", m.reason) for m in p.missed]
    if p.missed_total > len(p.missed):
        events.append(Event(tracked.name, to_ms(p.last), "missed",
                            f"{p.missed_total - len(p.missed)} older slots not listed"))
    return events
