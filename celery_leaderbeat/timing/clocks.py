"""The slot clocks behind :func:`celery_leaderbeat.timing.slots.clock_for`, one per schedule kind.

A clock answers two questions about an entry: which slot comes first after an instant
(``next_after``) and when a slot is sent (``fire_time``: the slot plus the entry's
deterministic jitter). All datetimes are aware and in UTC.
"""

from __future__ import annotations

import copy
import hashlib
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from celery.schedules import BaseSchedule

from .cronengine import CronEngine

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

    @property
    def share_key(self) -> object | None:
        """Equal for clocks with the same slots and fire times, whatever the entry; None
        when they are this entry's own (jitter, or a schedule compared by nothing)."""
        return None

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

    @property
    def share_key(self) -> object | None:
        return None if self.jitter_ms else ("interval", self.every, self.relative)

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

    @property
    def share_key(self) -> object | None:
        return None if self.jitter_ms else self.engine  # engines are shared per expression+zone


# Each solar event as ephem finds it: (Observer method, horizon, use the sun's centre).
# Our own table and search, reading only solar's public event/lat/lon: Celery's search
# (solar._next_event) is private and exists only from 5.7, and 5.4's table has
# dusk_astronomical at +18 degrees (fixed in 5.5). Values are those of Celery 5.5-5.7,
# so the slots are the same on every Celery version.
_SOLAR_EVENTS: dict[str, tuple[str, str, bool]] = {
    "dawn_astronomical": ("next_rising", "-18", True),
    "dawn_nautical": ("next_rising", "-12", True),
    "dawn_civil": ("next_rising", "-6", True),
    "sunrise": ("next_rising", "-0:34", False),
    "solar_noon": ("next_transit", "0", False),
    "sunset": ("next_setting", "-0:34", False),
    "dusk_civil": ("next_setting", "-6", True),
    "dusk_nautical": ("next_setting", "-12", True),
    "dusk_astronomical": ("next_setting", "-18", True),
}
_SOLAR_SEARCH_DAYS = 366  # as Celery 5.7: an event missing for a year ends the search


class SolarClock(_Clock):
    """Solar event slots: the event time (rounded to the second) found by ephem."""

    def __init__(self, schedule: Any, *, name: str, jitter: float | None) -> None:
        super().__init__(name, jitter)
        import ephem  # optional (the solar extra); solar's constructor already needed it

        self._ephem = ephem
        self.method, self.horizon, self.use_center = _SOLAR_EVENTS[schedule.event]
        self.lat, self.lon = str(schedule.lat), str(schedule.lon)

    def _search(self, start: datetime) -> Any:
        """The ephem.Date of the first event after ``start``, as Celery 5.7 searches."""
        ephem = self._ephem
        # A new observer per search: ephem moves an observer's date while it searches.
        cal = ephem.Observer()
        cal.lat, cal.lon, cal.elev = self.lat, self.lon, 0
        cal.horizon, cal.pressure = self.horizon, 0
        sun = ephem.Sun()
        find = getattr(cal, self.method)
        kwargs = {"use_center": True} if self.use_center else {}
        at = ephem.Date(start.astimezone(UTC).replace(tzinfo=None))
        for _ in range(_SOLAR_SEARCH_DAYS):
            try:
                return find(sun, start=at, **kwargs)
            except ephem.CircumpolarError:
                # Not on this day (polar day or night): search on from the next anti-transit.
                at = cal.next_antitransit(sun, start=at)
        return at

    def _event(self, start: datetime) -> datetime:
        event: datetime = self._search(start).datetime().replace(tzinfo=UTC)
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
        after: datetime = t + max(-(-remaining // _MS), 1) * _MS
        return after


def clock_tz(tz: tzinfo | str) -> tzinfo:
    """A tzinfo from a tzinfo or an IANA name."""
    if isinstance(tz, str):
        from zoneinfo import ZoneInfo

        return ZoneInfo(tz)
    return tz


#: the "slot" of a clock that has no more: later than any real slot, still a datetime
NEVER = datetime(9999, 1, 1, tzinfo=UTC)


def ceil_ms(dt: datetime) -> datetime:
    """``dt`` rounded up to the millisecond (slots are stored in ms; never before ``dt``)."""
    floor = from_ms(to_ms(dt))
    return floor if floor == dt else floor + _MS


class OnceClock(_Clock):
    """One slot at a fixed instant, then none (a clocked or one-off entry)."""

    def __init__(self, at: datetime, *, name: str, jitter: float | None) -> None:
        super().__init__(name, jitter)
        self.at = ceil_ms(at)

    def next_after(self, t: datetime) -> datetime:
        return self.at if t < self.at else NEVER


class BoundedClock(_Clock):
    """Another clock's slots from ``start`` on (``start`` itself for an interval), before ``end``.

    Every node computes the same bounded slots from the same bounds, so the bounds
    bound a slot the way the schedule does: nothing before ``start``, nothing at or
    after ``end``.
    """

    def __init__(self, inner: Any, *, start: datetime | None, end: datetime | None,
                 name: str, jitter: float | None) -> None:
        super().__init__(name, jitter)
        self.inner = inner
        self.start = None if start is None else ceil_ms(start)
        self.end = end

    def next_after(self, t: datetime) -> datetime:
        if t >= NEVER:
            return NEVER
        if self.start is not None and t < self.start:
            # An interval's first slot is its start (django-celery-beat runs it then);
            # other schedules fire at their first time at or after it.
            plain_interval = isinstance(self.inner, IntervalClock) and not self.inner.relative
            s = self.start if plain_interval else self.inner.next_after(self.start - _MS)
        else:
            s = self.inner.next_after(t)
        return NEVER if self.end is not None and s >= self.end else s
