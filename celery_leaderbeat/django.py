"""django-celery-beat's ``DatabaseScheduler`` behind the gate (:mod:`celery_leaderbeat.gate`).

Where the state lives: the schedule (rows, admin, ``enabled``, ``one_off``,
``start_time``, ``expires``, and for display ``last_run_at`` and ``total_run_count``)
in the database; leadership, each entry's last slot and the history in Redis. Slots
come from each row's schedule and bounds, never from ``last_run_at``.

django-celery-beat 2.9.0 traps this module respects (read from its source):

- ``ModelEntry.is_due()`` disables expired and one-off rows and saves them: it never
  runs here. The same rules are slot rules instead, the same on every node: no slot
  before ``start_time``, none at or after ``expires``, one slot for a one-off or
  clocked row; the leader then disables the row in the database, as is_due() would.
- ``sync()`` (``last_run_at`` and ``total_run_count``, every 180 s or
  ``beat_sync_every`` sends) and its ``Finalize`` hook write only on the leader; a
  standby's rescue is not counted there. On demotion the dirty set is dropped; on
  promotion the scheduler re-reads every row.
- Cron strings in ``beat_schedule`` become crontab rows (the database stores
  crontabs), when a crontab means the same; otherwise start-up stops, naming the
  entry.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from croniter import croniter
from django.conf import settings
from django.db.utils import DatabaseError, InterfaceError
from django.utils import timezone as dj_timezone
from django_celery_beat.clockedschedule import clocked
from django_celery_beat.tzcrontab import TzAwareCrontab

from ._clocks import NEVER, BoundedClock, OnceClock
from .errors import ConfigurationError
from .gate import Adapter
from .leader import UNKNOWN_STATE_MARGIN, Leader
from .node import utcnow
from .schedules import cron
from .slots import SlotClock, clock_for

logger = logging.getLogger(__name__)

_MS = timedelta(milliseconds=1)


class Bounded:
    """A row's schedule with the row's own bounds; builds the row's slot clock.

    ``once`` (one-off or clocked): one slot, the schedule's first after ``origin``
    (``last_run_at``, else ``date_changed``, as django-celery-beat counts), at or
    after ``start``, and never sooner than ``not_before`` (``date_changed`` plus the
    time a leader needs to see the row and start following it), so that every node
    computes the same single slot and a leader has it in its agenda in time.
    """

    def __init__(self, inner: Any, *, tz: tzinfo | None, start: datetime | None,
                 end: datetime | None, once: bool, origin: datetime | None,
                 not_before: datetime | None) -> None:
        self.inner = inner
        self.tz = tz
        self.start = start
        self.end = end
        self.once = once
        self.origin = origin
        self.not_before = not_before

    def leaderbeat_clock(self, *, name: str, tz: tzinfo, jitter: float | None) -> SlotClock:
        zone = self.tz or tz
        if self.once:
            return OnceClock(self.once_at(name, zone), name=name, jitter=jitter)
        if self.start is None and self.end is None:
            return clock_for(self.inner, name=name, tz=zone, jitter=jitter)
        return BoundedClock(clock_for(self.inner, name=name, tz=zone), start=self.start,
                            end=self.end, name=name, jitter=jitter)

    def once_at(self, name: str, zone: tzinfo) -> datetime:
        """The single slot of a one-off or clocked row (NEVER when it is past ``end``)."""
        if isinstance(self.inner, clocked):
            at = _aware(self.inner.clocked_time)
        else:
            inner = BoundedClock(clock_for(self.inner, name=name, tz=zone), start=self.start,
                                 end=None, name=name, jitter=None)
            at = inner.next_after(self.origin or utcnow())
        assert at is not None
        if self.not_before is not None:
            at = max(at, self.not_before)
        return NEVER if self.end is not None and at >= self.end else at

    def __repr__(self) -> str:
        return (f"<bounded {self.inner!r} start={self.start} end={self.end} "
                f"once={self.once}>")


class RowView:
    """A row as the slots see it: its name and its bounded schedule."""

    __slots__ = ("name", "schedule")

    def __init__(self, name: str, schedule: Bounded) -> None:
        self.name = name
        self.schedule = schedule


class DatabaseAdapter(Adapter):
    """django-celery-beat's DatabaseScheduler: rows, their bounds, its sync."""

    # -- beat_schedule into rows ---------------------------------------------------------

    def prepare(self, entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        options = self.scheduler._entry_options
        problems = []
        for name, entry in entries.items():
            if isinstance(entry.get("schedule"), cron):
                given = options.get(name)
                zone = (given.tz if given else None) or self.scheduler.app.timezone
                try:
                    entry["schedule"] = as_crontab(name, entry["schedule"], zone)
                except ConfigurationError as exc:
                    problems += exc.problems
        if problems:
            raise ConfigurationError(problems)
        return entries

    # -- rows as slots ---------------------------------------------------------------------

    def key(self, entry: Any) -> tuple[Any, ...]:
        model = getattr(entry, "model", None)
        if model is None:
            return super().key(entry)
        once = _once(model, entry)
        return (*super().key(entry), model.enabled, model.one_off, model.start_time,
                model.expires, once and model.total_run_count,
                once and model.date_changed, once and model.last_run_at)

    def view(self, entry: Any) -> Any | None:
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
        if not (once or start or end or tz):
            return entry
        origin = _aware(model.last_run_at or model.date_changed)
        changed = _aware(model.date_changed)
        return RowView(entry.name, Bounded(
            schedule, tz=tz, start=start, end=end, once=once, origin=origin,
            not_before=changed + timedelta(seconds=self.settle()) if changed else None))

    def settle(self) -> float:
        """Seconds after a row is saved before a leader surely follows it."""
        s = self.scheduler
        margin = min(s.lb_config.max_clock_skew, UNKNOWN_STATE_MARGIN)
        return float(s.max_interval or 5.0) + margin + 1.0

    # -- what the leader writes ----------------------------------------------------------------

    def sent(self, entry: Any, slot: datetime, *, leading: bool) -> None:
        model = getattr(entry, "model", None)
        if model is None or not leading:
            return  # a standby never writes to the database
        s = self.scheduler
        model.last_run_at = _db_time(slot)
        model.total_run_count += 1
        model.no_changes = True  # a run is no schedule change: no beat re-reads for it
        if _once(model, entry):
            self._disable(model, f"one-off: sent its slot {slot.isoformat()}")
        else:
            s._dirty.add(entry.name)
            s._tasks_since_sync += 1

    def housekeeping(self, leader: Leader) -> None:
        """Disable expired rows, and one-off rows whose one slot is behind them."""
        now = utcnow()
        for name, entry in list(self.scheduler._gate_entries.items()):
            model = getattr(entry, "model", None)
            if model is None or not model.enabled:
                continue
            end = _aware(model.expires)
            if end is not None and now >= end:
                self._disable(model, f"expired at {end.isoformat()}")
            elif _once(model, entry) and model.total_run_count == 0:
                tracked = leader.tracked.get(name)
                if tracked is not None and tracked.next_fire >= NEVER:
                    self._disable(model, f"one-off: its slot is behind it (last slot "
                                         f"{tracked.last.isoformat()})")

    def _disable(self, model: Any, why: str) -> None:
        """As django-celery-beat's is_due() would: enabled off, run count reset for one-offs."""
        model.enabled = False
        if model.one_off:
            model.total_run_count = 0
        model.no_changes = False  # every beat re-reads: the row leaves every schedule
        try:
            model.save(update_fields=["enabled", "last_run_at", "total_run_count",
                                      "date_changed"])
        except (DatabaseError, InterfaceError):
            logger.exception("leaderbeat: could not disable %r in the database (%s)",
                             model.name, why)
            return
        finally:
            self.scheduler._dirty.discard(model.name)
            self.scheduler.force_refresh()
        logger.info("leaderbeat: disabled %r in the database: %s", model.name, why)

    # -- roles ---------------------------------------------------------------------------------

    def promoted(self) -> None:
        s = self.scheduler
        s._initial_read = True  # the next read of .schedule re-reads every row
        s._heap = None

    def demoted(self) -> None:
        self.scheduler._dirty.clear()


def as_crontab(name: str, schedule: cron, zone: tzinfo) -> TzAwareCrontab:
    """A 5-field cron string as the crontab row django-celery-beat stores."""
    text = schedule._text
    fields = text.split(" ")
    why = None
    if len(fields) == 6:
        why = "it has a seconds field"
    elif any(c in text for c in "HL#?W"):
        why = "it uses H, L, W, # or ?"
    elif fields[2] != "*" and fields[4] != "*":
        why = ("both day fields are restricted (cron runs on a day matching either, a "
               "crontab only on a day matching both)")
    if why:
        raise ConfigurationError(
            f"beat_schedule entry {name!r}: cron string {schedule.expr!r} cannot be stored "
            f"as a django-celery-beat crontab row: {why}; use celery.schedules.crontab(...)")
    zone = getattr(schedule, "_zone", None) or zone
    minute, hour, dom, month, dow = fields
    try:
        return TzAwareCrontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=month,
                              day_of_week=dow, tz=zone)
    except ValueError:  # names or 7 for Sunday: spell every value out
        expanded = croniter(text).expanded
        spelled = ["*" if values == ["*"] else ",".join(str(v) for v in sorted(set(values)))
                   for values in expanded]
        return TzAwareCrontab(minute=spelled[0], hour=spelled[1], day_of_month=spelled[2],
                              month_of_year=spelled[3], day_of_week=spelled[4], tz=zone)


def _once(model: Any, entry: Any) -> bool:
    return bool(model.one_off) or isinstance(getattr(entry, "schedule", None), clocked)


def _aware(value: datetime | None) -> datetime | None:
    """A database datetime in UTC (a naive one is in Django's TIME_ZONE, USE_TZ off)."""
    if value is None:
        return None
    if dj_timezone.is_naive(value):
        value = dj_timezone.make_aware(value, dj_timezone.get_default_timezone())
    return value.astimezone(timezone.utc)


def _db_time(slot: datetime) -> datetime:
    """A slot as the database stores it: aware with USE_TZ, else naive local time."""
    if getattr(settings, "USE_TZ", True):
        return slot
    return dj_timezone.make_naive(slot, dj_timezone.get_default_timezone())
