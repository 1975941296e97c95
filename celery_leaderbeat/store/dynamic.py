"""Entries defined at run time: ``Entry(...).save(app)``, ``Entry.get``, ``Entry.all``.

An entry takes what a ``beat_schedule`` entry takes (seconds, a ``timedelta``,
a ``crontab``, a ``solar``, a cron string) and the same leaderbeat options, and
is checked by the very code that checks ``beat_schedule`` at start-up, so a bad
entry raises the same :class:`~celery_leaderbeat.errors.ConfigurationError`
and nothing is stored. Entries are stored in Redis under the app's key prefix
as JSON (never pickle); every running beat follows a change within about a
second (see :mod:`celery_leaderbeat.roles.dynamic_schedule`).

    from celery.schedules import crontab
    from celery_leaderbeat import Entry

    Entry("report-42", "proj.tasks.report", crontab(hour=2, minute=30),
          kwargs={"customer": 42}, tz="Europe/Berlin").save(app)
    Entry("reminder-7", "proj.tasks.remind", at=datetime(2027, 1, 5, 9, tzinfo=UTC)).save(app)
    Entry.get(app, "report-42").delete(app)
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from celery.schedules import BaseSchedule, crontab, schedule, solar

from ..config import Config
from ..entries import split_entries
from ..errors import ConfigurationError
from ..timing.schedules import cron
from ..timing.slots import clock_for, from_ms, to_ms
from .base import EntryDefinitions
from .open import open_store
from .records import Stored


class once(BaseSchedule):
    """The schedule of a one-off entry: one slot at ``at`` (an aware datetime), then none."""

    def __init__(self, at: datetime) -> None:
        self.clocked_time = at  # what clock_for makes a one-slot clock of
        super().__init__()

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        left: timedelta = self.clocked_time - self.now()
        return left

    def is_due(self, last_run_at: datetime) -> Any:
        raise NotImplementedError("celery_leaderbeat plans one-off entries itself")

    def __repr__(self) -> str:
        return f"<once: {self.clocked_time.isoformat()}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, once) and other.clocked_time == self.clocked_time

    def __hash__(self) -> int:
        return hash(self.clocked_time)


@dataclass(init=False)
class Entry:
    """One periodic (or one-off) task defined at run time.

    ``schedule`` is anything ``beat_schedule`` accepts; ``at`` (an aware datetime)
    makes a one-off entry instead, run once, then recorded and disabled. Keyword
    options are the per-entry leaderbeat options (``catchup``, ``catchup_window``,
    ``max_catchup``, ``jitter``, ``tz``, ``overlap``). ``version``, ``anchor`` and
    ``ran_at`` are filled in by the store.
    """

    name: str
    task: str
    schedule: Any = None
    args: Any = ()
    kwargs: Any = field(default_factory=dict)
    options: Any = field(default_factory=dict)
    enabled: bool = True
    at: datetime | None = None
    leaderbeat: dict[str, Any] = field(default_factory=dict)
    version: int | None = None
    anchor: datetime | None = None
    ran_at: datetime | None = None

    def __init__(self, name: str, task: str, schedule: Any = None, args: Any = (),
                 kwargs: Any = None, options: Any = None, enabled: bool = True,
                 at: datetime | None = None, **leaderbeat: Any) -> None:
        self.name, self.task, self.schedule = name, task, schedule
        self.args, self.kwargs = args, {} if kwargs is None else kwargs
        self.options = {} if options is None else options
        self.enabled, self.at, self.leaderbeat = enabled, at, leaderbeat
        self.version = self.anchor = self.ran_at = None

    # -- the API ---------------------------------------------------------------------------

    def save(self, app: Any) -> bool:
        """Check and store this entry; True if it changed, False if already stored as is.

        Raises :class:`ConfigurationError` (nothing stored) on a bad definition or a
        name ``beat_schedule`` uses.
        """
        return self.store(app)

    def store(self, app: Any, *, how: str = "upsert", anchor: datetime | None = None) -> bool:
        """:meth:`save`, with ``how`` ('create': refused with :class:`EntryExists` if stored;
        'update': refused with :class:`EntryUnknown` if not) and the anchor to count slots
        from (an import keeps the phase an entry had elsewhere; default: now)."""
        config = Config.from_app(app)
        definition = self.to_json(config, static=app.conf.beat_schedule or {})
        saved = _store(app).save(self.name, definition=definition, enabled=self.enabled,
                                 fingerprint=fingerprint(definition), timing=self.timing(),
                                 how=how, anchor_ms=None if anchor is None else to_ms(anchor),
                                 first_ms=None if self.at is None else to_ms(self.at) - 1)
        self.version, self.anchor = saved.version, from_ms(saved.anchor_ms)
        return saved.changed

    def delete(self, app: Any) -> bool:
        """Remove this entry; False if it was not stored."""
        return _store(app).delete(self.name)

    @classmethod
    def get(cls, app: Any, name: str) -> Entry | None:
        """The stored entry ``name``, or None."""
        stored = _store(app).get(name)
        return None if stored is None else cls.from_stored(stored)

    @classmethod
    def all(cls, app: Any) -> list[Entry]:
        """Every stored entry, by name."""
        return [cls.from_stored(s) for _, s in sorted(_store(app).all().items())]

    # -- JSON --------------------------------------------------------------------------------

    def to_json(self, config: Config, static: Any = ()) -> str:
        """The definition as canonical JSON, after start-up's checks (raises on any problem)."""
        name = self.name
        if not isinstance(name, str) or not name or "\n" in name:
            raise ConfigurationError(f"entry name {name!r} must be a non-empty one-line string")
        if name in static or name.startswith("celery."):
            raise ConfigurationError(
                f"entry {name!r} is a static beat_schedule entry (or Celery's own); a dynamic "
                "entry may not take its name")
        self.check(config)
        body = {"task": self.task, "schedule": encode_schedule(name, self.schedule, self.at),
                "args": list(self.args), "kwargs": self.kwargs, "options": self.options,
                "leaderbeat": _plain_options(self.leaderbeat)}
        try:
            return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"entry {name!r}: args, kwargs and options must be JSON (entries are stored "
                f"as JSON): {exc}") from None

    def check(self, config: Config) -> None:
        """Start-up's checks of ``beat_schedule`` and of the slot clock, plus the JSON rules."""
        name, problems = self.name, []
        if self.at is not None:
            if not isinstance(self.at, datetime) or self.at.tzinfo is None:
                raise ConfigurationError(f"entry {name!r}: at={self.at!r} must be an aware datetime")
            if self.schedule is not None:
                raise ConfigurationError(f"entry {name!r}: give a schedule or at=, not both")
        if not isinstance(self.args, (list, tuple)):
            problems.append(f"entry {name!r}: args={self.args!r} must be a list")
        for what in ("kwargs", "options"):
            if not isinstance(getattr(self, what), dict):
                problems.append(f"entry {name!r}: {what}={getattr(self, what)!r} must be a dict")
        if problems:
            raise ConfigurationError(problems)
        built, opts = split_entries({name: self.raw()}, config)
        o = opts[name]
        clock_for(built[name]["schedule"], name=name, tz=o.tz or timezone.utc, jitter=o.jitter)

    def raw(self) -> dict[str, Any]:
        """The entry as a ``beat_schedule`` value (what start-up's checks read)."""
        raw: dict[str, Any] = {"task": self.task, "args": tuple(self.args),
                               "kwargs": dict(self.kwargs), "options": dict(self.options),
                               "leaderbeat": dict(self.leaderbeat)}
        if self.at is not None:
            raw["schedule"] = once(self.at)
        elif self.schedule is not None:
            raw["schedule"] = self.schedule
        return raw

    def timing(self) -> str:
        """A fingerprint of what decides the slots: a change of it re-anchors the entry."""
        lb = _plain_options(self.leaderbeat)
        return fingerprint(json.dumps(
            [encode_schedule(self.name, self.schedule, self.at), lb.get("tz"), lb.get("jitter")],
            sort_keys=True))

    @classmethod
    def from_stored(cls, stored: Stored) -> Entry:
        body = json.loads(stored.definition)
        sched, at = decode_schedule(body["schedule"])
        entry = cls(stored.name, body["task"], sched, args=body["args"], kwargs=body["kwargs"],
                    options=body["options"], enabled=stored.enabled, at=at,
                    **body["leaderbeat"])
        entry.version, entry.anchor = stored.version, from_ms(stored.anchor_ms)
        entry.ran_at = None if stored.ran_ms is None else from_ms(stored.ran_ms)
        return entry


def fingerprint(text: str) -> str:
    """A short hash of a definition (stable across processes and versions of Python)."""
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def encode_schedule(name: str, value: Any, at: datetime | None = None) -> dict[str, Any]:
    """A schedule as JSON; one a JSON store cannot hold raises, naming the entry."""
    if at is not None:
        return {"at": to_ms(at)}
    if isinstance(value, str):
        return {"cron": value}
    if isinstance(value, bool):
        pass
    elif isinstance(value, (int, float)):
        return {"every": float(value), "relative": False}
    elif isinstance(value, timedelta):
        return {"every": value.total_seconds(), "relative": False}
    elif isinstance(value, cron):
        zone = value.own_zone  # None follows the entry's or the app's
        return {"cron": value.expr, "tz": None if zone is None else _zone_name(zone)}
    elif isinstance(value, crontab):
        return {"crontab": [str(value._orig_minute), str(value._orig_hour),
                            str(value._orig_day_of_month), str(value._orig_month_of_year),
                            str(value._orig_day_of_week)]}
    elif isinstance(value, solar):
        return {"solar": [value.event, value.lat, value.lon]}
    elif isinstance(value, schedule):
        return {"every": value.run_every.total_seconds(), "relative": bool(value.relative)}
    raise ConfigurationError(
        f"entry {name!r}: schedule {value!r} cannot be stored as JSON (dynamic entries take "
        "seconds, a timedelta, a cron string, cron(), crontab() or solar())")


def decode_schedule(data: dict[str, Any]) -> tuple[Any, datetime | None]:
    """The schedule (or the one-off time) :func:`encode_schedule` wrote."""
    if "at" in data:
        return None, from_ms(int(data["at"]))
    if "every" in data:
        every = timedelta(seconds=data["every"])
        return (schedule(every, relative=True) if data.get("relative") else every), None
    if "cron" in data:
        return (cron(data["cron"], data["tz"]) if data.get("tz") else data["cron"]), None
    if "crontab" in data:
        minute, hour, dom, moy, dow = data["crontab"]
        return crontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=moy,
                       day_of_week=dow), None
    if "solar" in data:
        return solar(*data["solar"]), None
    raise ConfigurationError(f"stored schedule {data!r} is not one this version understands")


def _zone_name(zone: tzinfo) -> str:
    return str(getattr(zone, "key", zone))


def _plain_options(options: dict[str, Any]) -> dict[str, Any]:
    """Leaderbeat options as JSON values: zones by name, durations in seconds."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, timedelta):
            value = value.total_seconds()
        elif isinstance(value, tzinfo):
            value = _zone_name(value)
        out[key] = value
    return {k: out[k] for k in sorted(out)}


_stores: weakref.WeakKeyDictionary[Any, tuple[int, EntryDefinitions]] = \
    weakref.WeakKeyDictionary()


def _store(app: Any) -> EntryDefinitions:
    """One store per app and process (a forked child opens its own)."""
    made = _stores.get(app)
    if made is None or made[0] != os.getpid():
        made = (os.getpid(), open_store(Config.from_app(app)).entries)
        _stores[app] = made
    return made[1]
