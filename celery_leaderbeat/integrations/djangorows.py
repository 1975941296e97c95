"""django-celery-beat's rows as the slots see them: bounds, one-offs, the restart at a save.

Pure functions of a row (its schedule, ``enabled``, ``one_off``, ``start_time``,
``expires``, ``last_run_at``, ``date_changed``), so that every node computes the
same slots from the same row.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import KW_ONLY, dataclass
from datetime import datetime, timezone, tzinfo
from typing import Any

from django.utils import timezone as dj_timezone
from django_celery_beat.clockedschedule import clocked
from django_celery_beat.tzcrontab import TzAwareCrontab

from ..roles.shared import utcnow
from ..timing.clocks import NEVER, BoundedClock, IntervalClock, OnceClock, _Clock
from ..timing.slots import SlotClock, clock_for

logger = logging.getLogger(__name__)


@dataclass(eq=False, repr=False)  # compared by identity, like the schedule it wraps
class Bounded:
    """A row's schedule with the row's own bounds; builds the row's slot clock.

    ``once`` (one-off or clocked): one slot, the schedule's first after ``origin``
    (``last_run_at``, else ``date_changed``, as django-celery-beat counts), at or
    after ``start``; every node computes the same single slot, and the leader
    anchors the row just before it (see :meth:`DatabaseAdapter.anchors`), so a
    leader that first sees the row after that slot still sends it, late.

    ``restart`` (the row's ``date_changed``): a save restarts the row at its next
    slot. No slot at or before the last save is sent after it: a re-enabled row
    does not replay the slots that fell while it was disabled, whatever the last
    slot stored for it.
    """

    inner: Any
    _: KW_ONLY
    tz: tzinfo | None
    start: datetime | None
    end: datetime | None
    once: bool
    origin: datetime | None
    restart: datetime | None = None

    def leaderbeat_clock(self, *, name: str, tz: tzinfo, jitter: float | None) -> SlotClock:
        zone = self.tz or tz
        if self.once:
            return OnceClock(self.once_at(name, zone), name=name, jitter=jitter)
        if self.start is None and self.end is None:
            inner = clock_for(self.inner, name=name, tz=zone)
        else:
            inner = BoundedClock(clock_for(self.inner, name=name, tz=zone), start=self.start,
                                 end=self.end, name=name, jitter=None)
        if self.restart is None:
            return clock_for(inner, name=name, tz=zone, jitter=jitter) if jitter else inner
        return Restarted(inner, after=self.restart, name=name, jitter=jitter)

    def once_at(self, name: str, zone: tzinfo) -> datetime:
        """The single slot of a one-off or clocked row (NEVER when it is past ``end``)."""
        if isinstance(self.inner, clocked):
            at = _aware(self.inner.clocked_time)
        else:
            inner = BoundedClock(clock_for(self.inner, name=name, tz=zone), start=self.start,
                                 end=None, name=name, jitter=None)
            at = inner.next_after(self.origin or utcnow())
        assert at is not None
        return NEVER if self.end is not None and at >= self.end else at

    def __repr__(self) -> str:
        return (f"<bounded {self.inner!r} start={self.start} end={self.end} "
                f"once={self.once}>")

    def leaderbeat_fingerprint(self) -> str:
        """Which slots exist: the schedule and its bounds; not the last save, which
        moves on every save and changes no later slot."""
        from ..roles.fingerprint import describe_schedule

        return (f"bounded {describe_schedule(self.inner)} tz={self.tz} start={self.start} "
                f"end={self.end} once={self.once}")


class Restarted(_Clock):
    """Another clock's slots, less those at or before ``after`` (the row's last save).

    An interval keeps its phase: the first slot after ``after`` on the same grid.
    """

    def __init__(self, inner: SlotClock, *, after: datetime, name: str,
                 jitter: float | None) -> None:
        super().__init__(name, jitter)
        self.inner = inner
        self.after = after

    def next_after(self, t: datetime) -> datetime:
        s = self.inner.next_after(t)
        if t >= self.after or s > self.after or s >= NEVER:
            return s
        inner = self.inner
        if isinstance(inner, IntervalClock) and not inner.relative:
            return inner.nth(t, inner.count(t, self.after) + 1)
        return inner.next_after(self.after)


class RowView:
    """A row as the slots see it: its name and bounded schedule, and what it sends (the
    definition's fingerprint covers the task and its arguments)."""

    __slots__ = ("args", "kwargs", "name", "schedule", "task")

    def __init__(self, entry: Any, schedule: Bounded) -> None:
        self.name = entry.name
        self.schedule = schedule
        self.task, self.args, self.kwargs = entry.task, entry.args, entry.kwargs


@functools.cache
def _keeping_last_run_at(entry_class: type) -> type:
    """``entry_class`` that keeps the row's stored ``last_run_at`` on the model.

    django-celery-beat fills in an empty ``last_run_at`` as it builds the entry: with
    ``date_changed`` in 2.9, with the time of the read in 2.6. A one-off's slot comes
    from the stored value, so that every node computes the same one.
    """

    class Entry(entry_class):
        def __init__(self, model: Any, *args: Any, **kwargs: Any) -> None:
            model.leaderbeat_last_run_at = model.last_run_at
            super().__init__(model, *args, **kwargs)

    Entry.__name__ = Entry.__qualname__ = f"Leaderbeat{entry_class.__name__}"
    return Entry


def row_view(entry: Any) -> Any | None:
    """A ``ModelEntry`` as the slots see it (None: no slots, it is disabled or ran once)."""
    model = getattr(entry, "model", None)
    if model is None:
        return entry
    if not model.enabled:
        return None
    once = _once(model, entry)
    if once and model.total_run_count > 0:
        return None  # it ran: django-celery-beat disables it, and so does the leader
    schedule = entry.schedule
    tz = schedule.tz if isinstance(schedule, TzAwareCrontab) else None
    start, end = _aware(model.start_time), _aware(model.expires)
    changed = _aware(model.date_changed)
    # the stored last_run_at: the entry's own may be filled in with its read time (2.6)
    origin = _aware(getattr(model, "leaderbeat_last_run_at", model.last_run_at)) or changed
    return RowView(entry, Bounded(schedule, tz=tz, start=start, end=end, once=once,
                                       origin=origin, restart=changed))


def _once(model: Any, entry: Any) -> bool:
    return bool(model.one_off) or isinstance(getattr(entry, "schedule", None), clocked)


def _aware(value: datetime | None) -> datetime | None:
    """A database datetime in UTC (a naive one is in Django's TIME_ZONE, USE_TZ off)."""
    if value is None:
        return None
    if dj_timezone.is_naive(value):
        value = dj_timezone.make_aware(value, dj_timezone.get_default_timezone())
    return value.astimezone(timezone.utc)
