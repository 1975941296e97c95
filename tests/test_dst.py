"""DST rules of the cron engine, as exact UTC instants over each transition day.

Expected lists are written out by hand from the zone rules:
New York 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z), 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z);
Berlin 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z), 2026-10-25 03:00 CEST -> 02:00 CET (01:00Z);
Lord Howe 2026-10-04 02:00 -> 02:30 (+10:30 -> +11), 2026-04-05 02:00 -> 01:30 (+11 -> +10:30).
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab

from celery_leaderbeat.timing.schedules import cron
from celery_leaderbeat.timing.slots import clock_for

UTC = timezone.utc
NEW_YORK, BERLIN, LORD_HOWE = "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"


def utc(text: str) -> datetime:
    """'2026-03-08 07:00' as an aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def hours(first: str, count: int, step_minutes: int = 60) -> list[datetime]:
    return [utc(first) + timedelta(minutes=step_minutes * i) for i in range(count)]


def instants(schedule: object, zone: str, day: date, until: time | None = None) -> list[datetime]:
    """Every slot from local midnight of ``day`` (inclusive) to the next local midnight or ``until``."""
    tz = ZoneInfo(zone)
    start = datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)
    end_day = day if until is not None else day + timedelta(days=1)
    end = datetime.combine(end_day, until or time(0), tzinfo=tz).astimezone(UTC)
    clock = clock_for(schedule, name="dst", tz=tz)
    found, t = [], start - timedelta(microseconds=1)
    while (t := clock.next_after(t)) < end:
        found.append(t)
    return found


HOURLY = {"expr": "0 * * * *", "fields": {"minute": 0}}
QUARTER = {"expr": "*/15 * * * *", "fields": {"minute": "*/15"}}
DAILY_0130 = {"expr": "30 1 * * *", "fields": {"minute": 30, "hour": 1}}
DAILY_0230 = {"expr": "30 2 * * *", "fields": {"minute": 30, "hour": 2}}

CASES = [
    # New York, spring forward: 02:00-02:59 does not exist.
    ("ny_spring_hourly", HOURLY, NEW_YORK, date(2026, 3, 8), None,
     hours("2026-03-08 05:00", 23)),
    ("ny_spring_quarter", QUARTER, NEW_YORK, date(2026, 3, 8), time(4),
     hours("2026-03-08 05:00", 12, 15)),  # 00:00..01:45 EST, then 03:00..03:45 EDT
    ("ny_spring_daily_0130", DAILY_0130, NEW_YORK, date(2026, 3, 8), None,
     [utc("2026-03-08 06:30")]),
    ("ny_spring_daily_0230", DAILY_0230, NEW_YORK, date(2026, 3, 8), None,
     [utc("2026-03-08 07:00")]),  # 02:30 does not exist: fires at 03:00 EDT
    # New York, fall back: 01:00-01:59 happens twice.
    ("ny_fall_hourly", HOURLY, NEW_YORK, date(2026, 11, 1), None,
     hours("2026-11-01 04:00", 25)),  # 01:00 EDT (05Z) and 01:00 EST (06Z)
    ("ny_fall_quarter", QUARTER, NEW_YORK, date(2026, 11, 1), time(3),
     hours("2026-11-01 04:00", 16, 15)),  # both passes of 01:xx, no stall
    ("ny_fall_daily_0130", DAILY_0130, NEW_YORK, date(2026, 11, 1), None,
     [utc("2026-11-01 05:30")]),  # first occurrence (EDT) only
    ("ny_fall_daily_0230", DAILY_0230, NEW_YORK, date(2026, 11, 1), None,
     [utc("2026-11-01 07:30")]),
    # Berlin, spring forward: 02:00-02:59 does not exist.
    ("berlin_spring_hourly", HOURLY, BERLIN, date(2026, 3, 29), None,
     hours("2026-03-28 23:00", 23)),
    ("berlin_spring_quarter", QUARTER, BERLIN, date(2026, 3, 29), time(4),
     hours("2026-03-28 23:00", 12, 15)),
    ("berlin_spring_daily_0130", DAILY_0130, BERLIN, date(2026, 3, 29), None,
     [utc("2026-03-29 00:30")]),
    ("berlin_spring_daily_0230", DAILY_0230, BERLIN, date(2026, 3, 29), None,
     [utc("2026-03-29 01:00")]),
    # Berlin, fall back: 02:00-02:59 happens twice.
    ("berlin_fall_hourly", HOURLY, BERLIN, date(2026, 10, 25), None,
     hours("2026-10-24 22:00", 25)),
    ("berlin_fall_quarter", QUARTER, BERLIN, date(2026, 10, 25), time(4),
     hours("2026-10-24 22:00", 20, 15)),
    ("berlin_fall_daily_0130", DAILY_0130, BERLIN, date(2026, 10, 25), None,
     [utc("2026-10-24 23:30")]),
    ("berlin_fall_daily_0230", DAILY_0230, BERLIN, date(2026, 10, 25), None,
     [utc("2026-10-25 00:30")]),  # first occurrence (CEST) only
]


@pytest.mark.parametrize("form", ["cron", "crontab"])
@pytest.mark.parametrize(
    ("spec", "zone", "day", "until", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_transition_day_fires_at_exactly_the_expected_instants(
    form: str, spec: dict, zone: str, day: date, until: time | None, expected: list[datetime]
) -> None:
    schedule = cron(spec["expr"]) if form == "cron" else crontab(**spec["fields"])
    assert instants(schedule, zone, day, until) == expected


def test_daily_0230_fires_at_0300_on_spring_forward() -> None:
    (fired,) = instants(cron("30 2 * * *"), NEW_YORK, date(2026, 3, 8))
    assert fired.astimezone(ZoneInfo(NEW_YORK)).strftime("%H:%M %Z") == "03:00 EDT"


def test_daily_0130_fires_once_at_its_first_occurrence_on_fall_back() -> None:
    (fired,) = instants(cron("30 1 * * *"), NEW_YORK, date(2026, 11, 1))
    assert fired.astimezone(ZoneInfo(NEW_YORK)).strftime("%H:%M %Z") == "01:30 EDT"


def test_hourly_fires_in_both_passes_of_the_repeated_hour() -> None:
    local = [t.astimezone(ZoneInfo(NEW_YORK)).strftime("%H:%M %Z")
             for t in instants(cron("0 * * * *"), NEW_YORK, date(2026, 11, 1), time(3))]
    assert local == ["00:00 EDT", "01:00 EDT", "01:00 EST", "02:00 EST"]


def test_several_missing_times_of_a_fixed_hour_fire_once_after_the_gap() -> None:
    assert instants(cron("*/20 2 * * *"), NEW_YORK, date(2026, 3, 8)) == [utc("2026-03-08 07:00")]


def test_a_missing_time_next_to_an_existing_one_does_not_fire_twice() -> None:
    assert instants(cron("0 2,3 * * *"), NEW_YORK, date(2026, 3, 8)) == [utc("2026-03-08 07:00")]


def test_a_fixed_hour_every_minute_schedule_runs_only_in_the_first_pass() -> None:
    fired = instants(cron("* 1 * * *"), NEW_YORK, date(2026, 11, 1))
    assert fired == hours("2026-11-01 05:00", 60, 1)


def test_lord_howe_half_hour_gap_moves_a_daily_0215_to_0230() -> None:
    assert instants(cron("15 2 * * *"), LORD_HOWE, date(2026, 10, 4)) == [utc("2026-10-03 15:30")]


def test_lord_howe_quarter_hours_continue_in_real_time_across_the_gap() -> None:
    fired = instants(cron("*/15 * * * *"), LORD_HOWE, date(2026, 10, 4), time(4))
    # 00:00..01:45 at +10:30, then 02:30..03:45 at +11: every 15 real minutes.
    assert fired == hours("2026-10-03 13:30", 14, 15)


def test_lord_howe_half_hour_repeat_fires_a_daily_0145_once() -> None:
    assert instants(cron("45 1 * * *"), LORD_HOWE, date(2026, 4, 5)) == [utc("2026-04-04 14:45")]


def test_lord_howe_quarter_hours_fire_in_both_passes_of_the_repeat() -> None:
    fired = instants(cron("*/15 * * * *"), LORD_HOWE, date(2026, 4, 5), time(3))
    # 00:00..01:45 at +11, 01:30..02:45 at +10:30: every 15 real minutes, 14 of them.
    assert fired == hours("2026-04-04 13:00", 14, 15)


# -- Celery's schedule contract over a repeated hour ---------------------------------------

def beat_fires(expr: str, zone: str, start: datetime, end: datetime) -> list[str]:
    """When Celery's beat sends ``cron(expr, tz=zone)``, asking ``is_due`` once a minute.

    The entry is a real ``celery.beat.ScheduleEntry`` in an app on ``zone``; a due
    entry is advanced as beat's ``reserve`` does (``next(entry)``), so ``last_run_at``
    is the app's ``now()``: an aware time in the app's zone, ``fold`` set in the repeat.
    """
    app = Celery("dst", set_as_current=False)
    app.conf.timezone = zone
    clock = [start]
    schedule = cron(expr, tz=zone, app=app, nowfun=lambda: clock[0].astimezone(app.timezone))
    entry = ScheduleEntry(name="e", task="t", schedule=schedule, app=app,
                          last_run_at=schedule.now())
    fired = []
    while clock[0] < end:
        if entry.is_due().is_due:
            fired.append(clock[0].strftime("%H:%M"))
            entry = next(entry)
        clock[0] += timedelta(minutes=1)
    return fired


def test_celery_beat_sends_an_hourly_cron_once_in_each_pass_of_the_repeated_hour() -> None:
    fired = beat_fires("0 * * * *", NEW_YORK, utc("2026-11-01 03:30"), utc("2026-11-01 08:30"))
    assert fired == ["04:00", "05:00", "06:00", "07:00", "08:00"]  # 01:00 EDT, 01:00 EST


def test_celery_beat_sends_a_quarter_hourly_cron_every_15_real_minutes_over_fall_back() -> None:
    fired = beat_fires("*/15 * * * *", NEW_YORK, utc("2026-11-01 04:50"), utc("2026-11-01 07:10"))
    assert fired == [f"{h:02}:{m:02}" for h in (5, 6) for m in (0, 15, 30, 45)] + ["07:00"]


def test_remaining_estimate_after_a_run_in_the_second_pass_counts_to_the_next_hour() -> None:
    app = Celery("dst", set_as_current=False)
    tz = ZoneInfo(NEW_YORK)
    first, second = utc("2026-11-01 05:00").astimezone(tz), utc("2026-11-01 06:00").astimezone(tz)
    assert (first.hour, first.fold, second.hour, second.fold) == (1, 0, 1, 1)
    schedule = cron("0 * * * *", tz=NEW_YORK, app=app, nowfun=lambda: second)
    assert schedule.remaining_estimate(first) == timedelta(0)  # 01:00 EST is due at 01:00 EST
    assert schedule.remaining_estimate(second) == timedelta(hours=1)  # then 02:00 EST


# -- a skipped day ---------------------------------------------------------------------------
# Samoa moved from -10 to +14 at 2011-12-30 10:00Z: the wall clock went from 29 December
# 23:59:59 to 31 December 00:00, so all of 30 December does not exist there.

def test_a_daily_time_on_a_skipped_day_fires_at_the_first_instant_after_it() -> None:
    clock = clock_for(cron("0 12 * * *"), name="dst", tz=ZoneInfo("Pacific/Apia"))
    fired = [clock.next_after(utc("2011-12-29 12:00"))]
    while len(fired) < 3:
        fired.append(clock.next_after(fired[-1]))
    assert fired == [utc("2011-12-29 22:00"), utc("2011-12-30 10:00"), utc("2011-12-30 22:00")]


def test_celery_beat_sends_a_daily_cron_once_for_a_skipped_day() -> None:
    fired = beat_fires("0 12 * * *", "Pacific/Apia", utc("2011-12-29 12:00"), utc("2011-12-31 00:00"))
    assert fired == ["22:00", "10:00", "22:00"]  # 12:00 on the 29th, 00:00 and 12:00 on the 31st
