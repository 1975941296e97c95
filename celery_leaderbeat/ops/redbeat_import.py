"""Import the entries of a RedBeat store as dynamic entries, each keeping its phase.

RedBeat keeps a sorted set ``<prefix>:schedule`` of entry keys; each key
``<prefix><name>`` is a hash with a ``definition`` (task, schedule, args, kwargs,
options, enabled) and a ``meta`` (``last_run_at``) in RedBeat's JSON, where a
datetime, an interval and a crontab are objects tagged ``__type__``. RedBeat
runs an entry next at ``last_run_at`` + the schedule's next time after it; the
import makes ``last_run_at`` the entry's anchor, so the first run after the
switch falls where RedBeat's would have (a slot missed during the switch
follows the catch-up policy; none is sent twice). An entry that never ran
starts from the import. RedBeat's keys are read by
:func:`celery_leaderbeat.store.redbeat.read_redbeat`: RedBeat need not be installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab

from ..errors import ConfigurationError
from ..store.dynamic import Entry


@dataclass
class Planned:
    """What the import does with one RedBeat entry: an entry to create, or why not."""

    name: str
    entry: Entry | None
    last_run_at: datetime | None
    skip: str | None = None  # why it is left out


class _Unsupported(ValueError):
    pass


def _decode(d: dict[str, Any]) -> Any:
    kind = d.get("__type__")
    if kind is None:
        return d
    if kind == "datetime":
        zone = d.get("timezone", "UTC")
        tz = (timezone(timedelta(seconds=zone)) if isinstance(zone, (int, float))
              else ZoneInfo(zone))
        fields = {k: d[k] for k in ("year", "month", "day", "hour", "minute", "second",
                                    "microsecond")}
        return datetime(tzinfo=tz, **fields)
    if kind == "interval":
        every = timedelta(seconds=d["every"])
        return every if not d.get("relative") else _Relative(every)
    if kind == "crontab":
        return crontab(minute=d["minute"], hour=d["hour"], day_of_week=d["day_of_week"],
                       day_of_month=d["day_of_month"], month_of_year=d["month_of_year"])
    raise _Unsupported(f"a {kind!r} schedule has no leaderbeat equivalent")


class _Relative:
    """An interval RedBeat runs relative to the clock (Celery's ``relative=True``)."""

    def __init__(self, every: timedelta) -> None:
        self.every = every


def plan(app: Any, rows: list[tuple[str, bytes | None, bytes | None]],
         prefix: str) -> list[Planned]:
    """What an import of RedBeat's ``rows`` (key, definition, meta) would do, entry by
    entry (nothing written)."""
    static = app.conf.beat_schedule or {}
    config = _config(app)  # once: every entry is checked against the same settings
    return [_plan_one(key.removeprefix(prefix), raw_def, raw_meta, static, config)
            for key, raw_def, raw_meta in rows]


def _plan_one(name: str, raw_def: bytes | None, raw_meta: bytes | None,
              static: dict[str, Any], config: Any) -> Planned:
    """One RedBeat entry's import: the entry and its last run, or why it is left out."""
    if raw_def is None:
        return Planned(name, None, None, "no definition (deleted meanwhile?)")
    try:
        definition = json.loads(raw_def, object_hook=_decode)
        meta = json.loads(raw_meta, object_hook=_decode) if raw_meta else {}
    except (_Unsupported, ValueError, KeyError) as exc:
        return Planned(name, None, None, str(exc))
    name = definition.get("name") or name
    if name.startswith("celery."):
        return Planned(name, None, None, "Celery's own entry: every beat installs it")
    if name in static:
        return Planned(name, None, None, "a beat_schedule entry of that name: it stays static")
    entry = _entry_of(name, definition)
    try:
        entry.to_json(config, static)
    except ConfigurationError as exc:
        return Planned(name, None, None, str(exc))
    last = meta.get("last_run_at")
    if isinstance(last, datetime) and last.tzinfo is None:
        last = last.replace(tzinfo=timezone.utc)
    return Planned(name, entry, last if isinstance(last, datetime) else None)


def _entry_of(name: str, definition: dict[str, Any]) -> Entry:
    """RedBeat's decoded definition as a leaderbeat runtime entry (not saved)."""
    from celery.schedules import schedule as interval

    sched = definition.get("schedule")
    if isinstance(sched, _Relative):
        sched = interval(sched.every, relative=True)
    return Entry(name, definition["task"], sched, args=definition.get("args") or (),
                 kwargs=definition.get("kwargs") or {}, options=definition.get("options") or {},
                 enabled=bool(definition.get("enabled", True)))


def _config(app: Any) -> Any:
    from ..config import Config

    return Config.from_app(app)


def describe(p: Planned) -> str:
    """One line: what the import does with this entry."""
    if p.entry is None:
        return f"skip    {p.name}: {p.skip}"
    e = p.entry
    what = (f"every {e.schedule.total_seconds():g}s" if isinstance(e.schedule, timedelta)
            else repr(e.schedule))
    phase = (f"phase from last run {p.last_run_at.isoformat()}" if p.last_run_at
             else "never ran: starts from the import")
    return (f"import  {p.name}: {e.task} {what}{'' if e.enabled else ' (disabled)'}; {phase}")


def apply(app: Any, planned: list[Planned]) -> tuple[int, int, int]:
    """Create the planned entries: (imported, already there, skipped)."""
    from ..errors import EntryExists

    done = there = skipped = 0
    for p in planned:
        if p.entry is None:
            skipped += 1
            continue
        try:
            p.entry.store(app, how="create", anchor=p.last_run_at)
            done += 1
        except EntryExists:
            there += 1
    return done, there, skipped
