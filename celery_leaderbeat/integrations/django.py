"""django-celery-beat's ``DatabaseScheduler`` wrapped (:mod:`celery_leaderbeat.integrations.wrap`).

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
  run on a database thread (:mod:`celery_leaderbeat.integrations.djangoio`), and ``sync()``
  writes this node's run counts as increments, 1,000 rows per statement.
- Cron strings in ``beat_schedule`` become crontab rows (the database stores
  crontabs), when a crontab means the same; otherwise start-up stops, naming the
  entry.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, tzinfo
from typing import Any

from croniter import croniter
from django_celery_beat.tzcrontab import TzAwareCrontab

from ..errors import ConfigurationError
from ..roles.leader import Leader
from ..roles.shared import utcnow
from ..timing.clocks import NEVER
from ..timing.schedules import cron
from .adapter import Adapter
from .djangoio import Bookkeeping, DatabaseThread, db_time
from .djangorows import Bounded, _aware, _keeping_last_run_at, _once, row_view

logger = logging.getLogger(__name__)

_MS = timedelta(milliseconds=1)
#: seconds between two looks at the database for changes (one cheap query each)
READ_PACE = 1.0
#: seconds after its save during which a row with no slot state starts at its save
FRESH = 60.0
#: seconds between two reads of every row's (id, date_changed), whatever the change marker
#: says (an edit by QuerySet.update() moves neither; django-celery-beat waits 300 s)
FULL_READ = 300.0


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

    def setup_failure(self, exc: Exception) -> Exception | None:
        from django.db import ProgrammingError

        if isinstance(exc, ProgrammingError):
            return unmigrated(self.books.model, exc)
        return None

    # -- beat_schedule into rows ---------------------------------------------------------

    def prepare(self, entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        problems = []
        for name, entry in entries.items():
            if isinstance(entry.get("schedule"), cron):
                try:
                    entry["schedule"] = as_crontab(name, entry["schedule"],
                                                   self.scheduler.zone_of(name))
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
                at = bounded.once_at(name, bounded.tz or s.zone_of(name))
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
        for name, entry in list(self.scheduler.base_entries().items()):
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
        if not self._read_due(s.schedule_changed()):
            return None
        query = s.enabled_models_qs() if hasattr(s, "enabled_models_qs") else \
            s.Model.objects.enabled()
        stamps = dict(query.values_list("pk", "date_changed"))
        known = self._known or {}
        fetch = [pk for pk, stamp in stamps.items() if pk not in known or known[pk][0] != stamp]
        if not fetch and stamps.keys() == known.keys():
            return None
        refetched = set(fetch)
        rows = {pk: known[pk] for pk in stamps if pk in known and pk not in refetched}
        rows.update(self._built(query, fetch))
        self._known = rows
        return {entry.name: entry for _, entry in rows.values()}

    def _read_due(self, changed: bool) -> bool:
        """Whether to look at the rows now: the change marker moved, nothing was read yet,
        or the last whole read is :data:`FULL_READ` seconds old (then this one is whole)."""
        now = time.monotonic()
        if self._known is None or now - self._full_at >= FULL_READ:
            self._full_at = now
            return True
        return changed

    def _built(self, query: Any, pks: list[Any]) -> dict[Any, tuple[Any, Any]]:
        """The rows ``pks`` built as entries, a thousand per query."""
        s, out = self.scheduler, {}
        for i in range(0, len(pks), 1000):
            for model in query.filter(pk__in=pks[i:i + 1000]):
                try:
                    out[model.pk] = (model.date_changed, s.Entry(model, app=s.app))
                except ValueError:
                    pass  # as django-celery-beat: a row it cannot build is left out
        return out

    def sync(self, *, leading: bool) -> None:
        """Increments and disables, safe from any node (they never overwrite a value)."""
        self.books.flush()

    # -- roles ---------------------------------------------------------------------------------

    def promoted(self) -> None:
        self._full_at = float("-inf")  # the next pass looks at every row's date_changed
        if self._thread is not None:
            self._thread.poke()


def database_rows(app: Any, base: Any) -> dict[str, dict[str, Any]]:
    """Every enabled row of ``base``'s table, as ``beat_schedule`` entries (for the CLI)."""
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()
    rows = {}
    for model in _enabled_rows(base):
        try:
            entry = _keeping_last_run_at(base.Entry)(model, app=app)
            shown = row_view(entry)
        except Exception as exc:  # noqa: BLE001 - one bad row never hides the others
            logger.warning("leaderbeat: row %r cannot be shown: %s", model.name, exc)
            continue
        if shown is not None:
            rows[model.name] = {"task": entry.task, "schedule": shown.schedule}
    return rows


def _enabled_rows(base: Any) -> list[Any]:
    """``base``'s enabled rows; ConfigurationError when its tables are not in the database
    (django-celery-beat installed, its migrations not applied)."""
    from django.db import ProgrammingError

    try:
        return list(base.Model.objects.enabled())
    except ProgrammingError as exc:
        raise unmigrated(base.Model, exc) from exc


def unmigrated(model: Any, exc: Exception) -> ConfigurationError:
    """The error of a read of ``model``'s table that failed with ``exc`` (a
    ProgrammingError: django-celery-beat installed, its migrations not applied)."""
    from django.db import connections, router

    alias = router.db_for_read(model)
    name = connections[alias].settings_dict.get("NAME")
    return ConfigurationError(
        f"django-celery-beat's tables cannot be read in database {alias!r} ({name}): "
        f"{str(exc).strip().splitlines()[0]}; its migrations must be applied first: "
        "python manage.py migrate django_celery_beat")


def as_crontab(name: str, schedule: cron, zone: tzinfo) -> TzAwareCrontab:
    """A 5-field cron string as the crontab row django-celery-beat stores."""
    text = schedule.fields
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
    zone = schedule.own_zone or zone
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


