"""Click parameter types of ``celery leaderbeat``: a bad value is a usage error (64)
naming the option, the value and the rule, before anything reaches Redis."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click

from ..timing.iso import from_iso, has_fraction_of_second

if TYPE_CHECKING:  # generic in the click type-checked against; not at run time in click 8.1
    ParamType = click.ParamType[Any, Any]
else:
    ParamType = click.ParamType

def parse_moment(text: str) -> datetime:
    """An ISO 8601 date-time, the same on every Python from 3.10 (see ``from_iso``).
    Raises ValueError."""
    return from_iso(text)


def has_fraction(text: str) -> bool:
    """Does ``text`` give a fraction of a second?"""
    return has_fraction_of_second(text)


class Moment(ParamType):
    """An ISO 8601 date-time; without an offset it is UTC (or refused, ``offset=True``).

    ``through=True`` (the end of a range): a time given to the second means the end of
    that second, so a slot at 04:00:00.250 is in a range to 04:00:00, as people read
    the tables (times there are to the second)."""

    name = "datetime"

    def __init__(self, *, offset: bool = False, through: bool = False) -> None:
        self.offset = offset
        self.through = through

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            moment = parse_moment(str(value))
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 date-time (like 2026-12-01T04:00:00Z "
                      "or 2026-12-01T05:00+01:00)", param, ctx)
        if moment.tzinfo is None:
            if self.offset:
                self.fail(f"{value!r} needs a UTC offset (like 2027-01-05T09:00+01:00 or "
                          "2027-01-05T08:00Z)", param, ctx)
            moment = moment.replace(tzinfo=timezone.utc)
        if self.through and not has_fraction(str(value)):
            moment = moment.replace(microsecond=999_999)
        return moment

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "ISO-TIME"


class Zone(ParamType):
    """An IANA time zone name, checked against the zone database."""

    name = "zone"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        try:
            ZoneInfo(str(value))
        except (ZoneInfoNotFoundError, ValueError):
            self.fail(f"{value!r} is not an IANA time zone name (like Europe/Berlin or UTC)",
                      param, ctx)
        return str(value)


class Json(ParamType):
    """A JSON value of one kind (``list`` or ``dict``)."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = "json-list" if kind is list else "json-object"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, self.kind):
            return value
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            self.fail(f"{value!r} is not JSON ({exc})", param, ctx)
        if not isinstance(parsed, self.kind):
            what = "list (like [1, 2])" if self.kind is list else 'object (like {"k": 1})'
            self.fail(f"{value!r} must be a JSON {what}", param, ctx)
        return parsed


class Schedule(ParamType):
    """Seconds (a number > 0) or a cron string; the cron string is checked as
    ``beat_schedule`` checks one, when the entry is."""

    name = "schedule"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float | str:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            seconds = float(value)
        except ValueError:
            return str(value)
        if not (seconds > 0 and math.isfinite(seconds)):
            self.fail(f"{value!r} must be more than 0 seconds, or a cron string", param, ctx)
        return seconds
