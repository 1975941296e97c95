"""The slot clocks behind :func:`celery_leaderbeat.slots.clock_for`, one per schedule kind.

A clock answers two questions about an entry: which slot comes first after an instant
(``next_after``) and when a slot is sent (``fire_time``: the slot plus the entry's
deterministic jitter). All datetimes are aware and in UTC.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from celery.schedules import BaseSchedule

from ._cronengine import CronEngine

UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_ms(dt: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware datetime (floored)."""
    if dt.tzinfo is None:
        raise ValueError(f"to_ms needs an aware datetime, got naive {dt.isoformat()}")
    return (dt - EPOCH) // _MS


def from_ms(ms: int) -> datetime:
    """The aware UTC datetime ``ms`` milliseconds after the Unix epoch."""
    return EPOCH + timedelta(milliseconds=int(ms))


class _Clock:
    """Shared jitter logic: ``fire_time(slot)`` is ``slot`` plus a hash-derived offset."""

    def __init__(self, name: str, jitter: float | None) -> None:
        self.name = name
        self.jitter_ms = 0 if not jitter else int(jitter * 1000)

    def next_after(self, t: datetime) -> datetime:
        raise NotImplementedError

    def fire_time(self, slot: datetime) -> datetime:
        """``slot`` + a deterministic offset in [0, jitter), always before the next slot."""
        if not self.jitter_ms:
            return slot
        gap_ms = to_ms(self.next_after(slot)) - to_ms(slot)
        digest = hashlib.sha256(f"{self.name}\x1f{to_ms(slot)}".encode()).digest()
        fraction = int.from_bytes(digest[:8], "big") / 2**64  # in [0, 1)
        # Scaling (rather than clamping) keeps the spread even when the gap is short.
        return slot + timedelta(milliseconds=int(fraction * min(self.jitter_ms, gap_ms)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class IntervalClock(_Clock):
    """Slots ``anchor + k * every``; with ``relative``, multiples of ``every`` since the epoch."""

    def __init__(self, every: timedelta, *, relative: bool, name: str, jitter: float | None):
        super().__init__(name, jitter)
        self.every = every
        self.relative = relative

    def next_after(self, t: datetime) -> datetime:
        if self.relative:
            return EPOCH + ((t - EPOCH) // self.every + 1) * self.every
        return t + self.every

    def count(self, last: datetime, t: datetime) -> int:
        """How many slots lie in (last, t], ``last`` being a slot."""
        if t <= last:
            return 0
        if self.relative:
            return (t - EPOCH) // self.every - (last - EPOCH) // self.every
        return (t - last) // self.every

    def nth(self, last: datetime, k: int) -> datetime:
        """The k-th slot after the slot ``last`` (k >= 1)."""
        if self.relative:
            return EPOCH + ((last - EPOCH) // self.every + k) * self.every
        return last + k * self.every


class CronClock(_Clock):
    """Crontab and cron-string slots: exact wall-clock times in the entry's zone."""

    def __init__(self, engine: CronEngine, *, name: str, jitter: float | None) -> None:
        super().__init__(name, jitter)
        self.engine = engine

    def next_after(self, t: datetime) -> datetime:
        return self.engine.next_after(t)


class SolarClock(_Clock):
    """Solar event slots: the event time (rounded to the second) found by ephem."""

    def __init__(self, schedule: Any, *, name: str, jitter: float | None) -> None:
        super().__init__(name, jitter)
        # A private copy: Celery's solar mutates its observer on every call.
        self.schedule = copy.copy(schedule)
        self.schedule.cal = copy.copy(schedule.cal)
        self._lock = threading.Lock()

    def _event(self, start: datetime) -> datetime:
        ephem = self.schedule.ephem
        naive = start.astimezone(UTC).replace(tzinfo=None)
        with self._lock:
            self.schedule.cal.date = naive
            found = self.schedule._next_event(ephem.Date(naive))
        event = found.datetime().replace(tzinfo=UTC)
        return event.replace(microsecond=0) + timedelta(seconds=event.microsecond >= 500_000)

    def next_after(self, t: datetime) -> datetime:
        event = self._event(t)
        if event <= t:
            # Rounding put the event on or before t: it is t's own event; look past it.
            event = self._event(t + timedelta(minutes=1))
        return event


class GenericClock(_Clock):
    """Any other schedule: ``t + remaining_estimate(t)`` with the schedule's now pinned to t."""

    def __init__(self, schedule: BaseSchedule, *, name: str, jitter: float | None) -> None:
        super().__init__(name, jitter)
        self.schedule = schedule

    def next_after(self, t: datetime) -> datetime:
        pinned = copy.copy(self.schedule)
        pinned.nowfun = lambda: t
        remaining = pinned.remaining_estimate(t)
        # Whole milliseconds, as slots are stored; a schedule that says "due now" still
        # has to move on, by at least one.
        return t + max(-(-remaining // _MS), 1) * _MS


def clock_tz(tz: tzinfo | str) -> tzinfo:
    """A tzinfo from a tzinfo or an IANA name."""
    if isinstance(tz, str):
        from zoneinfo import ZoneInfo

        return ZoneInfo(tz)
    return tz
