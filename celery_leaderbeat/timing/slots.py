"""Slots: which scheduled times an entry has, which are due now, and which to send.

Pure functions, no Redis and no Celery app. A *slot* is the exact scheduled time of
one run of one entry (never the dispatch time); every node computes the same slots
and the same :func:`slot_id` for them, which is what makes a claim in Redis unique.

Catch-up rule, applied in :func:`plan` (docs/architecture.md, "Catch-up"): a due slot at or after
``since`` (the moment this node started leading, or a detected wall-clock step) is
on time and always sent. A due slot before ``since`` was missed while no leader
existed; the entry's :class:`CatchupPolicy` decides whether it is sent.

Huge gaps: interval slots are counted and picked by arithmetic (``last + k*every``).
Other schedules are walked slot by slot for at most ``_HEAD_LIMIT`` missed slots;
past that, :func:`plan` estimates the mean gap between slots from the walk, jumps to
a point shortly before ``since`` that should leave enough missed slots to fill the
record and the catch-up, walks from there, and *estimates* how many slots it jumped
over (``Plan.missed_estimated`` is then True) from that mean gap: exact for evenly
spaced schedules, rough for uneven ones (a business-hours-only schedule over a
weekend was measured at about 2x). Skipped slots are never sent by any policy and
are older than every recorded one, so only the count is approximate, never what is
sent or recorded. On-time slots (at or after ``since``) are always all walked.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from functools import cached_property
from typing import Any, Protocol

from celery.schedules import crontab, schedule, solar

from ..errors import ConfigurationError
from .clocks import (
    CronClock,
    GenericClock,
    IntervalClock,
    OnceClock,
    SolarClock,
    clock_tz,
    from_ms,
    to_ms,
)
from .policy import CatchupPolicy
from .schedules import cron, engine_for_crontab

__all__ = [
    "MISSED_RECORD_LIMIT",
    "CatchupPolicy",
    "Missed",
    "Plan",
    "SlotClock",
    "clock_for",
    "from_ms",
    "plan",
    "slot_id",
    "to_ms",
]

MISSED_RECORD_LIMIT = 100
_HEAD_LIMIT = 1000  # missed slots walked one by one before plan() jumps ahead
# Fixed forever: changing it would change every task id of every deployment.
_SLOT_NAMESPACE = uuid.UUID("5b0d6a52-3f0e-5c1a-9a43-6c6561646572")
_NAMESPACE_BYTES = _SLOT_NAMESPACE.bytes
UTC = timezone.utc


class SlotClock(Protocol):
    """The slots of one entry. All datetimes are aware, in UTC."""

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t``."""
        ...

    def fire_time(self, slot: datetime) -> datetime:
        """When ``slot`` is sent: the slot plus the entry's deterministic jitter."""
        ...


def clock_for(schedule_: Any, *, name: str, tz: tzinfo, jitter: float | None = None) -> SlotClock:
    """The slot clock of entry ``name`` for a Celery schedule, crontab, solar or cron.

    ``tz`` is the zone crontab fields are read in (a cron with its own zone keeps it).
    Interval slots are ``last + k*every``; a one-time schedule with a ``clocked_time``
    (django-celery-beat's ``clocked``) has that one slot; a schedule with its own
    ``leaderbeat_clock(name=, tz=, jitter=)`` builds its clock itself (see
    :mod:`celery_leaderbeat.integrations.djangorows`); any other ``BaseSchedule`` falls back to
    ``t + remaining_estimate(t)`` with the schedule's ``now()`` pinned to ``t``.
    """
    if jitter is not None and (not isinstance(jitter, (int, float)) or jitter < 0):
        raise ConfigurationError(
            f"entry {name!r}: jitter={jitter!r} must be a number of seconds >= 0"
        )
    own = getattr(schedule_, "leaderbeat_clock", None)
    if callable(own):
        return own(name=name, tz=tz, jitter=jitter)  # type: ignore[no-any-return]
    at = getattr(schedule_, "clocked_time", None)
    if isinstance(at, datetime) and at.tzinfo is not None:
        # remaining_estimate() of a clocked schedule goes negative after its time:
        # the generic clock would then find a slot every millisecond.
        return OnceClock(at, name=name, jitter=jitter)
    if isinstance(schedule_, cron):
        return CronClock(schedule_.engine(name, tz), name=name, jitter=jitter)
    if isinstance(schedule_, crontab):
        return CronClock(engine_for_crontab(schedule_, clock_tz(tz)), name=name, jitter=jitter)
    if isinstance(schedule_, solar):
        return SolarClock(schedule_, name=name, jitter=jitter)
    if isinstance(schedule_, schedule):
        every = schedule_.run_every
        if every <= timedelta(0) or every % timedelta(milliseconds=1):
            raise ConfigurationError(
                f"entry {name!r}: interval {every.total_seconds()!r}s must be a positive"
                " whole number of milliseconds (slots are stored in milliseconds)"
            )
        return IntervalClock(every, relative=schedule_.relative, name=name, jitter=jitter)
    if hasattr(schedule_, "remaining_estimate"):
        return GenericClock(schedule_, name=name, jitter=jitter)
    raise ConfigurationError(
        f"entry {name!r}: schedule {schedule_!r} is not a Celery schedule, crontab, solar or cron"
    )


def slot_id(prefix: str, name: str, slot: datetime) -> str:
    """The Celery task id of one slot: a uuid5 of (key prefix, entry, slot ms), same on every node.

    Computed as RFC 4122 defines uuid5 (``uuid.uuid5`` gives the same string, at
    several times the cost: it is on the path of every send).
    """
    d = bytearray(hashlib.sha1(_NAMESPACE_BYTES + f"{prefix}\x1f{name}\x1f{to_ms(slot)}".encode(),
                               usedforsecurity=False).digest()[:16])
    d[6] = (d[6] & 0x0F) | 0x50  # version 5
    d[8] = (d[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = d.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(frozen=True)
class Missed:
    """A missed slot that is not sent, and why: skip, latest, window or max_catchup."""

    slot: datetime
    reason: str


@dataclass(frozen=True)
class Plan:
    """What the scheduler does for one entry now; see :func:`plan`."""

    send: tuple[datetime, ...]
    missed: tuple[Missed, ...]
    missed_total: int
    last: datetime
    next_due: datetime
    next_fire: datetime
    missed_estimated: bool = False  # True when missed_total counts jumped-over slots by estimate

    # In ms on the plan itself: the entries of one schedule share it, so a look at a
    # thousand of them converts its times once, not once per entry.
    @cached_property
    def last_ms(self) -> int:
        """``last`` in milliseconds since the epoch."""
        return to_ms(self.last)

    @cached_property
    def newest_sent_ms(self) -> int | None:
        """The newest slot of ``send`` in milliseconds (None: it sends none)."""
        return to_ms(self.send[-1]) if self.send else None


@dataclass
class _Due:
    missed: deque[datetime]  # the newest missed slots, oldest first
    missed_count: int
    on_time: list[datetime]
    following: datetime  # the first slot after the due ones
    estimated: bool = False


#: plans of shared schedules, by (share key, last, now, since, policy.key), the times as UTC
#: instants; a burst of entries on one schedule plans once (a Plan is immutable: sharing
#: it is safe)
_plans: dict[tuple[Any, ...], Plan] = {}
_PLANS_KEPT = 1024


def plan(
    clock: SlotClock, *, last: datetime, now: datetime, since: datetime, policy: CatchupPolicy
) -> Plan:
    """Decide which due slots of an entry to send now and which were missed.

    Due slots are those after ``last`` whose fire time is at or before ``now``. Those at
    or after ``since`` are on time and all sent. Those before it follow ``policy``:
    ``latest`` sends only the newest (and none when an on-time slot is due too),
    ``skip`` none, ``all`` each, oldest first, at most ``max_catchup`` (the newest);
    with a window, missed slots older than ``now - window`` are never sent.

    Entries whose clocks share a schedule (see ``share_key``) share the plan: it is
    computed once per distinct schedule, not once per entry.
    """
    share = getattr(clock, "share_key", None)
    if share is None:
        return _plan(clock, last=last, now=now, since=since, policy=policy)
    # UTC instants: aware datetimes of one zone compare by wall time, ignoring fold
    key = (share, _utc(last), _utc(now), _utc(since), policy.key)
    found = _plans.get(key)
    if found is None:
        found = _plan(clock, last=last, now=now, since=since, policy=policy)
        if len(_plans) >= _PLANS_KEPT:
            _plans.clear()
        _plans[key] = found
    return found


def _utc(at: datetime) -> datetime:
    """``at`` as a UTC instant: as it is when it is one already (every slot and ``now``
    the roles pass), converted otherwise."""
    return at if at.tzinfo is UTC else at.astimezone(UTC)


def _plan(
    clock: SlotClock, *, last: datetime, now: datetime, since: datetime, policy: CatchupPolicy
) -> Plan:
    sent_missed_max = policy.max_catchup if policy.mode == "all" else 1
    keep = MISSED_RECORD_LIMIT + sent_missed_max
    if isinstance(clock, IntervalClock):
        due = _due_interval(clock, last, now, since, keep)
    else:
        due = _due_walk(clock, last, now, since, keep)

    missed = list(due.missed)
    oldest_allowed = now - policy.window if policy.window is not None else None
    eligible = [s for s in missed if oldest_allowed is None or s >= oldest_allowed]
    if policy.mode == "all":
        sent_missed = eligible[-policy.max_catchup :]
    elif policy.mode == "latest" and eligible and not due.on_time:
        sent_missed = eligible[-1:]
    else:
        sent_missed = []
    passed_over = {"latest": "latest", "skip": "skip", "all": "max_catchup"}[policy.mode]
    sent = set(sent_missed)
    not_sent = [
        Missed(s, "window" if oldest_allowed is not None and s < oldest_allowed else passed_over)
        for s in missed
        if s not in sent
    ]
    due_slots = missed[-1:] + due.on_time[-1:]
    return Plan(
        send=tuple(sent_missed + due.on_time),
        missed=tuple(not_sent[-MISSED_RECORD_LIMIT:]),
        missed_total=due.missed_count - len(sent_missed),
        last=max(due_slots) if due_slots else last,
        next_due=due.following,
        next_fire=clock.fire_time(due.following),
        missed_estimated=due.estimated,
    )


def _due_interval(
    clock: IntervalClock, last: datetime, now: datetime, since: datetime, keep: int
) -> _Due:
    """Due interval slots by arithmetic: O(keep + on-time slots) whatever the gap."""
    count = clock.count(last, now)
    if count and clock.fire_time(clock.nth(last, count)) > now:
        count -= 1  # the newest slot has passed but its jittered fire time has not
    missed_count = min(count, clock.count(last, since - timedelta(microseconds=1)))
    first_kept = max(1, missed_count - keep + 1)
    return _Due(
        missed=deque(clock.nth(last, k) for k in range(first_kept, missed_count + 1)),
        missed_count=missed_count,
        on_time=[clock.nth(last, k) for k in range(missed_count + 1, count + 1)],
        following=clock.nth(last, count + 1),
    )


def _due_walk(clock: SlotClock, last: datetime, now: datetime, since: datetime, keep: int) -> _Due:
    """Due slots by walking the clock, jumping over the middle of a huge missed stretch."""
    missed: deque[datetime] = deque(maxlen=keep)
    count, estimated = 0, False
    first = s = clock.next_after(last)
    while s < since and clock.fire_time(s) <= now:
        if count == _HEAD_LIMIT:
            jumped = _jump(clock, first, s, now, since, keep, mean_gap=(s - first) / count)
            if jumped is not None:
                counted, tail, s = jumped
                count += counted
                missed.extend(tail)
                estimated = True
                break
        missed.append(s)
        count += 1
        s = clock.next_after(s)
    on_time = []
    while clock.fire_time(s) <= now:
        on_time.append(s)
        s = clock.next_after(s)
    return _Due(missed, count, on_time, s, estimated)


def _jump(
    clock: SlotClock,
    first: datetime,
    frontier: datetime,
    now: datetime,
    since: datetime,
    keep: int,
    mean_gap: timedelta,
) -> tuple[int, list[datetime], datetime] | None:
    """Walk only the newest missed slots: (slots counted, newest ``keep``, slot after them).

    ``frontier`` is the first slot not yet counted. Returns None when the stretch left
    is short enough to walk.
    """
    cut = min(since, now)
    span = max(mean_gap, timedelta(seconds=1)) * keep * 2
    while cut - span > frontier:
        tail: list[datetime] = []
        s = clock.next_after(cut - span)
        while s < since and clock.fire_time(s) <= now:
            tail.append(s)
            s = clock.next_after(s)
        if len(tail) >= keep:
            break
        span *= 4
    else:
        return None
    skipped = max(0, round((tail[0] - frontier) / mean_gap))
    return skipped + len(tail), tail[-keep:], s
