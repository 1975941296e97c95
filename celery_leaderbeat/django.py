"""django-celery-beat's ``DatabaseScheduler`` behind the gate (:mod:`celery_leaderbeat.gate`).

Where the state lives: the schedule (rows, admin, ``enabled``, ``one_off``,
``start_time``, ``expires``, and for display ``last_run_at`` and ``total_run_count``)
in the database; leadership, each entry's last slot and the history in Redis. Slots
come from each row's schedule and bounds, never from ``last_run_at``.

django-celery-beat 2.6 to 2.9 traps this module respects:

- ``ModelEntry.is_due()`` disables expired and one-off rows and saves them: it never
  runs here. The same rules are slot rules instead, the same on every node: no slot
  before ``start_time``, none at or after ``expires``, one slot for a one-off or
  clocked row, none at or before the row's last save (``date_changed``: a
  re-enabled row does not replay its disabled stretch); the row is then disabled
  in the database, as is_due() would.
- the ``schedule`` property runs ``sync()`` (one ``UPDATE`` per dirty row in stock
  beat) before it re-reads a changed table, and re-reads every enabled row: both
  run on a database thread (:mod:`celery_leaderbeat._djangoio`), and ``sync()``
  writes this node's run counts as increments, 1,000 rows per statement.
- Cron strings in ``beat_schedule`` become crontab rows (the database stores
  crontabs), when a crontab means the same; otherwise start-up stops, naming the
  entry.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from croniter import croniter
from django.utils import timezone as dj_timezone
from django_celery_beat.clockedschedule import clocked
from django_celery_beat.tzcrontab import TzAwareCrontab

from ._clocks import NEVER, BoundedClock, IntervalClock, OnceClock, _Clock
from ._djangoio import Bookkeeping, DatabaseThread, db_time
from .errors import ConfigurationError
from .gate import Adapter
from .leader import Leader
from .node import utcnow
from .schedules import cron
from .slots import SlotClock, clock_for

logger = logging.getLogger(__name__)

_MS = timedelta(milliseconds=1)
#: seconds between two looks at the database for changes (one cheap query each)
READ_PACE = 1.0
#: seconds after its save during which a row with no slot state starts at its save
FRESH = 60.0
#: seconds between two reads of every row's (id, date_changed), whatever the change marker
#: says (an edit by QuerySet.update() moves neither; django-celery-beat waits 300 s)
FULL_READ = 300.0


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

    def __init__(self, inner: Any, *, tz: tzinfo | None, start: datetime | None,
                 end: datetime | None, once: bool, origin: datetime | None,
                 restart: datetime | None = None) -> None:
        self.inner = inner
        self.tz = tz
        self.start = start
        self.end = end
        self.once = once
        self.origin = origin
        self.restart = restart

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
    """A row as the slots see it: its name and its bounded schedule."""

    __slots__ = ("name", "schedule")

    def __init__(self, name: str, schedule: Bounded) -> None:
        self.name = name
        self.schedule = schedule


class DatabaseAdapter(Adapter):
    """django-celery-beat's DatabaseScheduler: rows, their bounds, their bookkeeping."""

    background = True

    def __init__(self, scheduler: Any) -> None:
        super().__init__(scheduler)
        from django_celery_beat.models import PeriodicTask

        self.books = Bookkeeping(getattr(scheduler, "Model", PeriodicTask))
        scheduler.Entry = _keeping_last_run_at(scheduler.Entry)
        self._thread: DatabaseThread | None = None
        self._disabled: set[tuple[Any, Any]] = set()  # (pk, date_changed) asked to disable
        self._known: dict[Any, tuple[Any, Any]] | None = None  # pk -> (date_changed, entry)
        self._full_at = 0.0  # monotonic time of the last read of every row

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
                model.expires, model.date_changed, once and model.total_run_count,
                once and getattr(model, "leaderbeat_last_run_at", model.last_run_at))

    def view(self, entry: Any) -> Any | None:
        return row_view(entry)

    def anchors(self, view: Any) -> dict[str, datetime]:
        """Where the leader starts rows it has no slot state for, before it tracks them.

        A one-off or clocked row: just before its one slot, so a leader that first sees
        it after that slot still sends it (late, or as the catch-up policy says). A row
        saved in the last :data:`FRESH` seconds: at its save, so its first slot is one
        interval after the save (as django-celery-beat counts it), whenever the leader
        sees it. Older rows with no state start from "now", as any new entry.
        """
        s = self.scheduler
        found = {}
        fresh_since = utcnow() - timedelta(seconds=FRESH)
        for name, shown in view.items():
            bounded = getattr(shown, "schedule", None)
            if not isinstance(bounded, Bounded):
                continue
            if bounded.once:
                options = s._entry_options.get(name)
                at = bounded.once_at(name, bounded.tz or (options.tz if options else None)
                                     or s.app.timezone)
                if at < NEVER:
                    found[name] = at - _MS
            elif bounded.restart is not None and bounded.restart >= fresh_since:
                found[name] = bounded.restart
        return found

    # -- what this node writes -----------------------------------------------------------------

    def sent(self, entry: Any, slot: datetime, *, leading: bool) -> None:
        """Counted on every node that sends (a standby's rescue too), written in the background."""
        model = getattr(entry, "model", None)
        if model is None:
            return
        model.total_run_count += 1
        model.last_run_at = db_time(slot)
        if _once(model, entry):
            self._disable(model, f"one-off: sent its slot {slot.isoformat()}")
        else:
            self.books.ran(model.pk, db_time(slot))

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
                                         f"{tracked.last.isoformat()}: sent by another node, "
                                         "or missed under the catch-up policy; see the "
                                         "history)")

    def _disable(self, model: Any, why: str) -> None:
        """As django-celery-beat's is_due() would, written by the database thread (once per
        save of the row: a read before the write lands shows it enabled still)."""
        model.enabled = False  # in memory: asked once
        mark = (model.pk, model.date_changed)
        if mark in self._disabled:
            return
        self._disabled.add(mark)
        self.books.disable(model.pk, f"{model.name!r}: {why}")
        if self._thread is not None:
            self._thread.poke()

    # -- the database thread ---------------------------------------------------------------

    def thread(self, work: Any) -> DatabaseThread:
        pace = min(float(self.scheduler.max_interval or 5.0), READ_PACE)
        self._thread = DatabaseThread(work, pace, name="leaderbeat-db")
        return self._thread

    def flush(self) -> None:
        self.books.flush()

    def read(self) -> dict[str, Any] | None:
        """The enabled rows, when django-celery-beat's change marker moved (or every
        :data:`FULL_READ` seconds); None when nothing changed.

        Only the rows whose ``date_changed`` moved are fetched and built again: one
        query of (id, date_changed) pairs finds them, so an edit storm does not make
        every beat rebuild every row on every pass, as the base's ``schedule`` does.
        """
        s = self.scheduler
        changed = s.schedule_changed()
        now = time.monotonic()
        if not changed and self._known is not None and now - self._full_at < FULL_READ:
            return None
        if self._known is None or now - self._full_at >= FULL_READ:
            self._full_at = now
        query = s.enabled_models_qs() if hasattr(s, "enabled_models_qs") else \
            s.Model.objects.enabled()
        stamps = dict(query.values_list("pk", "date_changed"))
        known = self._known or {}
        fetch = [pk for pk, stamp in stamps.items() if pk not in known or known[pk][0] != stamp]
        if not fetch and stamps.keys() == known.keys():
            return None
        rows = {pk: known[pk] for pk in stamps if pk in known and pk not in set(fetch)}
        for i in range(0, len(fetch), 1000):
            for model in query.filter(pk__in=fetch[i:i + 1000]):
                try:
                    rows[model.pk] = (model.date_changed, s.Entry(model, app=s.app))
                except ValueError:
                    pass  # as django-celery-beat: a row it cannot build is left out
        self._known = rows
        return {entry.name: entry for _, entry in rows.values()}

    def sync(self, *, leading: bool) -> None:
        """Increments and disables, safe from any node (they never overwrite a value)."""
        self.books.flush()

    # -- roles ---------------------------------------------------------------------------------

    def promoted(self) -> None:
        self._full_at = float("-inf")  # the next pass looks at every row's date_changed
        if self._thread is not None:
            self._thread.poke()


@functools.cache
def _keeping_last_run_at(entry_class: type) -> type:
    """``entry_class`` that keeps the row's stored ``last_run_at`` on the model.

    django-celery-beat fills in an empty ``last_run_at`` as it builds the entry: with
    ``date_changed`` in 2.9, with the time of the read in 2.6. A one-off's slot comes
    from the stored value, so that every node computes the same one.
    """

    class Entry(entry_class):  # type: ignore[misc, valid-type]
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
    return RowView(entry.name, Bounded(schedule, tz=tz, start=start, end=end, once=once,
                                       origin=origin, restart=changed))


def database_rows(app: Any, base: Any) -> dict[str, dict[str, Any]]:
    """Every enabled row of ``base``'s table, as ``beat_schedule`` entries (for the CLI)."""
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()
    rows = {}
    for model in base.Model.objects.enabled():
        try:
            entry = _keeping_last_run_at(base.Entry)(model, app=app)
            shown = row_view(entry)
        except Exception as exc:  # noqa: BLE001 - one bad row never hides the others
            logger.warning("leaderbeat: row %r cannot be shown: %s", model.name, exc)
            continue
        if shown is not None:
            rows[model.name] = {"task": entry.task, "schedule": shown.schedule}
    return rows


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
