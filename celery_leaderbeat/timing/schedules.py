"""Cron strings as Celery schedules, and the beat_schedule values we accept.

``cron("*/5 * * * *", tz="Europe/Berlin")`` is a :class:`celery.schedules.BaseSchedule`
usable anywhere a ``crontab`` is. It takes 5 fields (minute hour day-of-month month
day-of-week), 6 fields with the *seconds first* (Quartz/Spring order), the aliases
``@yearly @annually @monthly @weekly @daily @midnight @hourly``, and ``H`` hashed
fields seeded by the entry name so every node spreads an entry the same way. Like
Vixie cron, when both day fields are restricted a day matching *either* fires;
Celery's ``crontab`` instead needs both to match, and keeps that meaning here.

Both run on one engine (:mod:`celery_leaderbeat.timing.cronengine`) and so share its DST
rules: a repeated wall-clock time fires once (both passes for every-hour schedules),
a skipped one fires at the end of the gap (nothing extra for every-hour schedules).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import BaseSchedule, crontab, maybe_schedule, schedstate
from croniter import CroniterError, croniter

from ..errors import ConfigurationError
from .cronengine import CronEngine, shared_engine

__all__ = ["cron", "engine_for_crontab", "parse_entry_schedule"]

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_ALLOWED = {
    "second": "0-59",
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31 or L",
    "month": "1-12 or jan-dec",
    "day-of-week": "0-7 or sun-sat (0 and 7 are Sunday)",
}
_HASHED = re.compile(r"(^|,)h($|[(/,])", re.IGNORECASE)
_PROBE = datetime(2000, 1, 1)


def _who(name: str | None) -> str:
    return f"entry {name!r}" if name else "cron schedule"


def _zone(tz: str | tzinfo, name: str | None) -> tzinfo:
    if not isinstance(tz, str):
        return tz
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"{_who(name)}: time zone {tz!r} is not a known IANA time zone name"
            " (like 'Europe/Berlin' or 'UTC')"
        ) from None


def _parse(expr: str, name: str | None) -> str:
    """The expression with any alias spelled out; ConfigurationError if it is not valid cron."""
    if not isinstance(expr, str):
        raise ConfigurationError(f"{_who(name)}: cron expression {expr!r} must be a string")
    text, problem = _checked(" ".join(expr.split()))
    if problem is not None:
        raise ConfigurationError(f"{_who(name)}: cron expression {expr!r} {problem}")
    return text


@functools.lru_cache(maxsize=4096)
def _checked(text: str) -> tuple[str, str | None]:
    """``text`` (whitespace normalised) with any alias spelled out, and what is wrong with
    it (None: nothing). Kept per text: croniter's checks cost about 0.27 ms, and every
    run-time entry changed is checked again, while a schedule repeats a few expressions."""
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            return text, (f"is not a known alias; use one of {', '.join(ALIASES)} "
                          "(@reboot has no meaning for beat)")
        return ALIASES[text.lower()], None
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        return text, (f"has {len(fields)} fields; it needs 5 (minute hour day-of-month month "
                      "day-of-week) or 6 with the seconds first")
    names = (("second",) if len(fields) == 6 else ()) + _FIELDS
    seconds_first = len(fields) == 6
    try:
        croniter.expand(text, hash_id=b"probe", second_at_beginning=seconds_first)
    except CroniterError as exc:
        for i, (field, value) in enumerate(zip(names, fields)):
            alone = " ".join(value if j == i else "*" for j in range(len(fields)))
            if not croniter.is_valid(alone, hash_id=b"probe", second_at_beginning=seconds_first):
                return text, (f"is not valid: the {field} field {value!r} is not allowed (use "
                              f"{_ALLOWED[field]}, lists a,b, ranges a-b, steps */n or a-b/n, "
                              "or H)")
        return text, f"is not valid: {exc}"
    try:
        croniter(text, _PROBE, hash_id=b"probe", second_at_beginning=seconds_first).get_next()
    except CroniterError:
        return text, "never fires (its days never occur in its months)"
    return text, None


def _is_hashed(text: str) -> bool:
    return any(_HASHED.search(field) for field in text.split(" "))


class cron(BaseSchedule):
    """A cron expression as a Celery schedule; see the module docstring for the syntax."""

    def __init__(
        self,
        expr: str,
        tz: str | tzinfo | None = None,
        *,
        name: str | None = None,
        app: Any = None,
        nowfun: Any = None,
    ) -> None:
        self.expr = expr
        self.name = name
        self._text = _parse(expr, name)
        self._zone = None if tz is None else _zone(tz, name)
        self._engines: dict[tuple[str | None, Any], CronEngine] = {}
        super().__init__(nowfun=nowfun, app=app)

    @property
    def fields(self) -> str:
        """The expression's fields, space-separated (a nickname such as ``@daily`` expanded)."""
        return self._text

    @property
    def own_zone(self) -> tzinfo | None:
        """The cron's own zone; None: it reads its fields in the entry's or the app's."""
        return self._zone

    @property
    def tz(self) -> tzinfo:
        """The zone the fields are read in: the cron's own, else the app's."""
        return self._zone if self._zone is not None else self.app.timezone

    def engine(self, name: str | None = None, tz: str | tzinfo | None = None) -> CronEngine:
        """The engine for entry ``name`` (seeds ``H``), in the cron's own zone, else ``tz``."""
        seed = self.name or name
        if _is_hashed(self._text) and not seed:
            raise ConfigurationError(
                f"cron expression {self.expr!r} uses H, which needs the entry name: cron(..., name=)"
            )
        zone = self._zone or (_zone(tz, seed) if tz is not None else self.tz)
        key = (seed, zone)
        if key not in self._engines:
            self._engines[key] = shared_engine(
                self._text,
                zone,
                day_or=True,
                hash_id=seed if _is_hashed(self._text) else None,
                second_at_beginning=len(self._text.split(" ")) == 6,
            )
        return self._engines[key]

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time from now until the first fire time after ``last_run_at``."""
        last = self.maybe_make_aware(last_run_at)
        now: datetime = self.maybe_make_aware(self.now())
        left: timedelta = self.engine().next_after(last) - now
        return left

    def is_due(self, last_run_at: datetime) -> schedstate:
        """``(due, seconds until the next check)``, like ``crontab.is_due``."""
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        if remaining > 0:
            return schedstate(False, remaining)
        following = self.remaining_estimate(self.now()).total_seconds()
        return schedstate(True, max(following, 0))

    def _key(self) -> tuple[str, str | None, str | None]:
        zone = None if self._zone is None else str(getattr(self._zone, "key", self._zone))
        return (self._text, zone, self.name)

    def __repr__(self) -> str:
        zone = f" tz={self._key()[1]}" if self._zone is not None else ""
        name = f" name={self.name!r}" if self.name else ""
        return f"<cron: {self.expr!r}{zone}{name}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, cron):
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_restore_cron, (type(self), self.expr, self._zone, self.name))


def _restore_cron(cls: type[cron], expr: str, tz: tzinfo | None, name: str | None) -> cron:
    return cls(expr, tz, name=name)


def _cron_field(values: Iterable[int], full: range) -> str:
    chosen = sorted(set(values))
    return "*" if chosen == list(full) else ",".join(map(str, chosen))


def engine_for_crontab(schedule: crontab, tz: tzinfo) -> CronEngine:
    """The engine for a Celery ``crontab``: its parsed sets, both day fields required."""
    # celery.schedules.crontab.remaining_delta fires only on a date whose day of month
    # AND day of week both match, hence day_or=False.
    expr = " ".join(
        (
            _cron_field(schedule.minute, range(60)),
            _cron_field(schedule.hour, range(24)),
            _cron_field(schedule.day_of_month, range(1, 32)),
            _cron_field(schedule.month_of_year, range(1, 13)),
            _cron_field(schedule.day_of_week, range(7)),
        )
    )
    return shared_engine(expr, tz, day_or=False)


def parse_entry_schedule(name: str, value: Any, app_tz: tzinfo | None) -> BaseSchedule:
    """The schedule of a beat_schedule entry: a cron string, a Celery schedule, or seconds.

    Strings become ``cron(value, name=name)``; numbers and timedeltas become an
    interval as in Celery (``maybe_schedule``); schedule objects pass through. The
    result is checked to have a next slot in ``app_tz`` (UTC when None), so a schedule
    that never fires fails at start-up, naming the entry. A cron string is not pinned
    to ``app_tz``: its zone is the one :func:`~celery_leaderbeat.timing.slots.clock_for` gets.
    """
    if isinstance(value, str):
        result: Any = cron(value, name=name)
    elif isinstance(value, BaseSchedule):
        result = value
    elif isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        if seconds <= 0:
            raise ConfigurationError(
                f"entry {name!r}: schedule {value!r} must be a positive number of seconds"
            )
        result = maybe_schedule(value)
    else:
        raise ConfigurationError(
            f"entry {name!r}: schedule {value!r} must be a cron string, a number of seconds,"
            " a timedelta or a Celery schedule"
        )
    if isinstance(result, cron):
        result.engine(name, app_tz or timezone.utc).next_after(datetime.now(timezone.utc))
    return result
