"""DST as a property: every zone's offset changes from 2000 to 2040, against a brute-force reference.

For each transition (an instant where a zone's UTC offset changes) and a set of
expressions built around it (hourly, ``*/15``, ``*/30``, fixed times at the start
and in the middle of the skipped or repeated wall-clock range, a fixed hour's
``*/10``, seconds fields, ``H``), the slots are compared with a reference that
walks real time in UTC step by step and applies the README's DST rules. It is
written apart from the engine and never calls it (it parses the fields itself;
only ``H`` values come from croniter, which defines them):

* every-hour schedule (the hour field covers all 24 hours): every instant whose
  wall time matches, so both passes of a repeated time, nothing for a skipped one;
* fixed-hour schedule: an instant whose wall time matches and is that wall time's
  first occurrence; and, when a matching wall time is skipped, the first instant
  after the gap (once, however many matching times it skipped).

Each case is checked through the scheduler's slot path (``plan()`` over a
``clock_for`` clock, as the leader plans) and through ``cron(...).is_due`` as
Celery's beat drives it: a real ``ScheduleEntry`` in an app on the zone, asked
once a minute, advanced with ``next(entry)`` when due (so a fire on a seconds field
is sent at the minute after it).

CI runs a seeded sample (the always-checked zones' transitions of 2025-2027 and
some random (zone, transition) pairs); ``LEADERBEAT_DST_FULL=1`` runs every zone
and transition; ``LEADERBEAT_DST_SEED`` picks another sample.
"""

from __future__ import annotations

import functools
import math
import os
import random
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from croniter import croniter

from celery_leaderbeat.timing.schedules import cron
from celery_leaderbeat.timing.slots import CatchupPolicy, clock_for, plan

UTC = timezone.utc
FULL = os.environ.get("LEADERBEAT_DST_FULL") == "1"
SEED = int(os.environ.get("LEADERBEAT_DST_SEED", "20261101"))
SAMPLED_ZONES = 40
#: 30- and 45-minute offsets and shifts, a 2-hour shift, and the README's two zones
ALWAYS = ("Australia/Lord_Howe", "Pacific/Chatham", "Antarctica/Troll", "America/New_York",
          "Europe/Berlin")
ALWAYS_YEARS = range(2025, 2028)
FIRST, LAST = datetime(2000, 1, 1, tzinfo=UTC), datetime(2040, 1, 1, tzinfo=UTC)
ENTRY = "dst-entry"  # the entry name, which seeds H
DAY = 86400
MICRO = timedelta(microseconds=1)
TICK = timedelta(minutes=1)  # beat asks is_due once a minute (a fire on a seconds field: the tick after)


# -- the zones' transitions ---------------------------------------------------------------

@dataclass(frozen=True)
class Transition:
    """The first instant ``at`` of a new UTC offset in ``zone``."""

    zone: str
    at: datetime
    before: timedelta
    after: timedelta

    @property
    def shift(self) -> timedelta:
        return abs(self.after - self.before)

    def walls(self) -> tuple[datetime, datetime]:
        """The naive wall-clock range [lo, hi) that is skipped (forward) or repeated (back)."""
        lo = self.at + min(self.before, self.after)
        return lo.replace(tzinfo=None), (lo + self.shift).replace(tzinfo=None)

    def label(self) -> str:
        kind = "gap" if self.after > self.before else "fold"
        return f"{self.zone} {self.at:%Y-%m-%dT%H:%MZ} {kind} {self.shift}"


def _offset(zone: ZoneInfo, ts: int) -> timedelta:
    offset = datetime.fromtimestamp(ts, zone).utcoffset()
    assert offset is not None
    return offset


@functools.cache
def transitions(name: str) -> tuple[Transition, ...]:
    """Every offset change of ``name`` from 2000 to 2040: a day-by-day scan, bisected to the second."""
    zone = ZoneInfo(name)
    found = []
    ts, end = int(FIRST.timestamp()), int(LAST.timestamp())
    before = _offset(zone, ts)
    while ts < end:
        after = _offset(zone, ts + DAY)
        if after != before:
            lo, hi = ts, ts + DAY
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if _offset(zone, mid) == before else (lo, mid)
            found.append(Transition(name, datetime.fromtimestamp(hi, UTC), before, after))
            before = after
        ts += DAY
    return tuple(found)


@functools.cache
def zones_with_transitions() -> tuple[str, ...]:
    return tuple(z for z in sorted(zoneinfo.available_timezones()) if transitions(z))


def expressions(tr: Transition) -> list[str]:
    """The expressions checked over one transition; fixed ones hit its skipped/repeated range."""
    lo, hi = tr.walls()
    mid = lo + (hi - lo) / 2
    return [
        "0 * * * *",
        "*/15 * * * *",
        "*/30 * * * *",
        f"{lo.minute} {lo.hour} * * *",  # the first skipped or repeated minute
        f"{mid.minute} {mid.hour} * * *",
        f"*/10 {lo.hour} * * *",  # a fixed hour, several minutes in the range
        "30 */15 * * * *",  # seconds first: every hour
        f"15 {mid.minute} {mid.hour} * * *",  # seconds first: a fixed time
        "H * * * *",
        f"H {lo.hour} * * *",
    ]


# -- the reference ------------------------------------------------------------------------

def _field(text: str, low: int, high: int) -> frozenset[int]:
    """The values of one numeric cron field: ``*``, ``a``, ``a-b``, ``*/n``, ``a-b/n``, lists."""
    values: set[int] = set()
    for part in text.split(","):
        span, _, step = part.partition("/")
        first, last = (low, high) if span == "*" else (int(span.split("-")[0]), int(span.split("-")[-1]))
        values.update(range(first, last + 1, int(step or 1)))
    return frozenset(values)


@dataclass(frozen=True)
class Fields:
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]

    @classmethod
    def parse(cls, expr: str) -> Fields:
        if "H" in expr:  # H's values are croniter's hash of the entry name: resolved by it
            six = len(expr.split()) == 6
            expanded = croniter.expand(expr, hash_id=ENTRY.encode(), second_at_beginning=six)[0]
            parts = [",".join(map(str, f)) for f in expanded]  # croniter puts seconds last
            expr = " ".join(parts[5:] + parts[:5])
        fields = expr.split()
        if len(fields) == 5:
            fields = ["0", *fields]
        assert fields[3:] == ["*", "*", "*"], "the reference reads no day fields"
        return cls(_field(fields[0], 0, 59), _field(fields[1], 0, 59), _field(fields[2], 0, 23))

    @property
    def every_hour(self) -> bool:
        return len(self.hours) == 24

    @property
    def step(self) -> timedelta:
        """Walking in steps of the seconds' gcd meets every matching time (offsets are whole minutes)."""
        return timedelta(seconds=math.gcd(60, *self.seconds))

    def match(self, wall: datetime) -> bool:
        return wall.second in self.seconds and wall.minute in self.minutes and wall.hour in self.hours


def reference(expr: str, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """Every instant in [start, end) at which the README's DST rules fire ``expr``, walked in UTC."""
    f = Fields.parse(expr)
    step = f.step
    previous = (start - step).astimezone(zone).utcoffset()
    offsets = {previous}
    u, fired = start, []
    while u < end:
        offset = u.astimezone(zone).utcoffset()
        assert offset is not None and previous is not None
        offsets.add(offset)
        wall = (u + offset).replace(tzinfo=None)
        if f.match(wall) and (f.every_hour or _first_occurrence(wall, zone, offsets) == u):
            fired.append(u)
        elif not f.every_hour and offset > previous:
            # The offset changed exactly at u (transitions are on whole minutes): the wall
            # times [u + previous, u + offset) do not exist; a matching one fires at u.
            assert (u - timedelta(seconds=1)).astimezone(zone).utcoffset() == previous
            skipped = (wall - (offset - previous) + k * step for k in range((offset - previous) // step))
            if any(f.match(w) for w in skipped):
                fired.append(u)
        previous = offset
        u += step
    return fired


def _first_occurrence(wall: datetime, zone: ZoneInfo, offsets: set[timedelta]) -> datetime:
    """The earliest instant whose wall time in ``zone`` is ``wall``, among the offsets seen."""
    return min(at for o in offsets
               if (at := (wall - o).replace(tzinfo=UTC)).astimezone(zone).utcoffset() == o)


# -- the engine, as the leader and as Celery's beat use it --------------------------------

def window(tr: Transition) -> tuple[datetime, datetime]:
    """From an hour before the first repeated wall time to an hour after the last one."""
    start = tr.at - tr.shift - timedelta(hours=1)
    return start.replace(second=0), tr.at + tr.shift + timedelta(hours=1)


@functools.cache
def _cron(expr: str) -> cron:
    return cron(expr)


def leader_slots(expr: str, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """The slots in [start, end) the leader plans: plan() with every one of them on time."""
    clock = clock_for(_cron(expr), name=ENTRY, tz=zone)
    planned = plan(clock, last=start - MICRO, now=end - MICRO, since=start - MICRO,
                   policy=CatchupPolicy("all", max_catchup=10**6))
    assert planned.next_due >= end
    return list(planned.send)


@functools.cache
def app_on(zone: str) -> Celery:
    app = Celery("dst", set_as_current=False)
    app.conf.timezone = zone
    return app


def beat_sends(expr: str, zone: str, start: datetime, end: datetime, tick: timedelta
               ) -> tuple[list[datetime], list[tuple[datetime, float]]]:
    """When Celery's beat sends ``cron(expr)`` asking ``is_due`` every ``tick`` from ``start``,
    and the seconds-to-next-check each ``is_due`` answered, by tick."""
    app = app_on(zone)
    now = [start]
    schedule = cron(expr, tz=zone, name=ENTRY, app=app,
                    nowfun=lambda: now[0].astimezone(app.timezone))  # as app.now() does
    entry = ScheduleEntry(name=ENTRY, task="t", schedule=schedule, app=app,
                          last_run_at=schedule.now())
    sent, checks = [], []
    while now[0] < end:
        due, next_check = entry.is_due()
        checks.append((now[0], next_check))
        if due:
            sent.append(now[0])
            entry = next(entry)
        now[0] += tick
    return sent, checks


def expected_sends(fires: list[datetime], start: datetime, end: datetime, tick: timedelta
                   ) -> list[datetime]:
    """The ticks at which beat must send: each tick that a fire came due since the last one."""
    sends, at = [], start
    while at < end:
        if any(at - tick < f <= at for f in fires) and at > start:
            sends.append(at)
        at += tick
    return sends


def _expected_checks(fires: list[datetime], sent: list[datetime], start: datetime,
                     end: datetime, tick: timedelta) -> Iterator[tuple[datetime, float]]:
    """What each is_due must answer while the next fire is inside the window: when due,
    the time from now to the next fire; when not, from now to the first fire after the
    last run."""
    runs, last, at = set(sent), start, start
    while at < end:
        after = at if at in runs else last
        following = next((f for f in fires if f > after), None)
        if following is None:
            return
        yield at, max((following - at).total_seconds(), 0.0)
        last = after
        at += tick


def disagreements(tr: Transition, expr: str) -> list[str]:
    """How the leader's slots and Celery's beat differ from the reference over ``tr``."""
    zone = ZoneInfo(tr.zone)
    start, end = window(tr)
    expected = reference(expr, zone, start, end)
    problems = []
    slots = leader_slots(expr, zone, start, end)
    if slots != expected:
        problems.append(f"{tr.label()} {expr!r}: leader slots {_hm(slots, zone)},"
                        f" rules say {_hm(expected, zone)}")
    sent, checks = beat_sends(expr, tr.zone, start, end, TICK)
    wanted = expected_sends(expected, start, end, TICK)
    if sent != wanted:
        problems.append(f"{tr.label()} {expr!r}: Celery beat sends at {_hm(sent, zone)},"
                        f" rules say {_hm(wanted, zone)}")
    elif not _checks_agree(checks, list(_expected_checks(expected, sent, start, end, TICK))):
        problems.append(f"{tr.label()} {expr!r}: is_due's next-check seconds differ")
    return problems


def _checks_agree(got: list[tuple[datetime, float]], wanted: list[tuple[datetime, float]]) -> bool:
    answered = dict(got)
    return all(abs(answered[at] - seconds) < 1e-6 for at, seconds in wanted)


def _hm(instants: list[datetime], zone: ZoneInfo) -> str:
    return "[" + ", ".join(f"{u:%H:%M:%S}Z({u.astimezone(zone):%H:%M%z})" for u in instants) + "]"


# -- which cases run ----------------------------------------------------------------------

def cases() -> list[Transition]:
    """Every transition under LEADERBEAT_DST_FULL=1, else the always-checked zones' recent
    ones and two seeded random transitions of each of some seeded random zones."""
    if FULL:
        return [tr for z in zones_with_transitions() for tr in transitions(z)]
    rng = random.Random(SEED)
    chosen = [tr for z in ALWAYS for tr in transitions(z) if tr.at.year in ALWAYS_YEARS]
    others = sorted(zoneinfo.available_timezones() - set(ALWAYS))
    for zone in rng.sample(others, SAMPLED_ZONES):  # about half of them change offset
        found = transitions(zone)
        chosen += rng.sample(found, min(2, len(found)))
    return chosen


def by_zone() -> dict[str, list[Transition]]:
    grouped: dict[str, list[Transition]] = {}
    for tr in cases():
        grouped.setdefault(tr.zone, []).append(tr)
    return grouped


CASES = by_zone()


@pytest.mark.parametrize("zone", list(CASES))
def test_every_transition_fires_as_the_dst_rules_say(zone: str) -> None:
    problems = [p for tr in CASES[zone] for expr in expressions(tr) for p in disagreements(tr, expr)]
    count = len(CASES[zone]) * len(expressions(CASES[zone][0]))
    assert not problems, f"{len(problems)} of {count} cases:\n" + "\n".join(problems[:20])


def test_the_sample_holds_the_zones_with_odd_offsets_and_shifts() -> None:
    shifts = {tr.shift for z in ALWAYS for tr in CASES[z]}
    assert {timedelta(minutes=30), timedelta(hours=1), timedelta(hours=2)} <= shifts
    assert any(tr.before % timedelta(hours=1) == timedelta(minutes=45) for tr in CASES["Pacific/Chatham"])


# -- the reference itself, on the README's table ------------------------------------------

NEW_YORK = ZoneInfo("America/New_York")


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(("expr", "start", "end", "expected"), [
    ("30 2 * * *", "2026-03-08 00:00", "2026-03-09 00:00", ["2026-03-08 07:00"]),
    ("*/20 2 * * *", "2026-03-08 00:00", "2026-03-09 00:00", ["2026-03-08 07:00"]),
    ("30 1 * * *", "2026-11-01 00:00", "2026-11-02 00:00", ["2026-11-01 05:30"]),
    ("0 * * * *", "2026-11-01 04:30", "2026-11-01 07:30", ["2026-11-01 05:00", "2026-11-01 06:00",
                                                          "2026-11-01 07:00"]),
    ("*/15 * * * *", "2026-03-08 06:40", "2026-03-08 07:20", ["2026-03-08 06:45", "2026-03-08 07:00",
                                                             "2026-03-08 07:15"]),
])
def test_the_reference_reads_the_readme_table_for_new_york(
    expr: str, start: str, end: str, expected: list[str]
) -> None:
    assert reference(expr, NEW_YORK, _utc(start), _utc(end)) == [_utc(e) for e in expected]
