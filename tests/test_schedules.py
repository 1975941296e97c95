"""cron(): parsing, errors, Celery schedule behaviour, pickling; parse_entry_schedule()."""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule

from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.timing.schedules import cron, parse_entry_schedule
from celery_leaderbeat.timing.slots import clock_for

UTC = timezone.utc
T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)  # a Monday


def slots(schedule_: object, n: int = 3, start: datetime = T0, name: str = "e", tz: str = "UTC") -> list[datetime]:
    clock = clock_for(schedule_, name=name, tz=ZoneInfo(tz))
    found, t = [], start
    for _ in range(n):
        t = clock.next_after(t)
        found.append(t)
    return found


def hm(values: list[datetime]) -> list[str]:
    return [v.strftime("%a %d %H:%M:%S") for v in values]


# -- parsing ---------------------------------------------------------------------------

def test_five_fields_are_minute_hour_day_month_weekday() -> None:
    assert hm(slots(cron("15 9 * * 1-5"))) == ["Tue 05 09:15:00", "Wed 06 09:15:00", "Thu 07 09:15:00"]


def test_six_fields_put_the_seconds_first() -> None:
    assert hm(slots(cron("30 * * * * *"))) == ["Mon 04 10:00:30", "Mon 04 10:01:30", "Mon 04 10:02:30"]
    assert hm(slots(cron("5 0 12 * * *"), n=1)) == ["Mon 04 12:00:05"]


@pytest.mark.parametrize(
    ("alias", "expr"),
    [("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
     ("@weekly", "0 0 * * 0"), ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"),
     ("@ANNUALLY", "0 0 1 1 *")],
)
def test_aliases_mean_their_classic_cron_lines_even_for_named_entries(alias: str, expr: str) -> None:
    assert slots(cron(alias, name="report")) == slots(cron(expr))


def test_hashed_fields_are_stable_for_one_entry_name() -> None:
    assert slots(cron("H H * * *"), name="report") == slots(cron("H H * * *"), name="report")
    assert slots(cron("H H * * *", name="report"), name="other") == slots(cron("H H * * *"), name="report")


def test_hashed_fields_spread_different_entry_names() -> None:
    times = {hm(slots(cron("H H * * *"), n=1, name=f"job-{i}"))[0] for i in range(10)}
    assert len(times) > 5


def test_hashed_fields_without_an_entry_name_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="uses H"):
        cron("H * * * *").engine()


def test_cron_strings_fire_when_either_day_field_matches_like_vixie_cron() -> None:
    fired = slots(cron("0 0 13 * 5"), n=3)
    assert hm(fired) == ["Fri 08 00:00:00", "Wed 13 00:00:00", "Fri 15 00:00:00"]


def test_celery_crontab_fires_only_when_both_day_fields_match() -> None:
    fired = slots(crontab(minute=0, hour=0, day_of_month=13, day_of_week=5), n=2)
    assert [f.date().isoformat() for f in fired] == ["2026-11-13", "2027-08-13"]


def test_a_cron_with_its_own_zone_ignores_the_app_zone() -> None:
    berlin = cron("0 9 * * *", tz="Europe/Berlin")
    assert slots(berlin, n=1, tz="America/New_York") == [datetime(2026, 5, 5, 7, 0, tzinfo=UTC)]


# -- errors ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("expr", "words"),
    [("61 * * * *", "minute field '61'"), ("* 25 * * *", "hour field '25'"),
     ("0 0 * 13 *", "month field '13'"), ("0 0 * * funday", "day-of-week field 'funday'"),
     ("61 * * * * *", "second field '61'"), ("* * * *", "has 4 fields"),
     ("1 2 3 4 5 6 7", "has 7 fields"), ("@reboot", "not a known alias"),
     ("0 0 30 2 *", "never fires"), ("*/0 * * * *", "minute field '*/0'")],
)
def test_a_bad_expression_names_the_entry_the_expression_and_the_problem(expr: str, words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        cron(expr, name="nightly-report")
    assert "'nightly-report'" in str(caught.value)
    assert repr(expr) in str(caught.value)
    assert words in str(caught.value)


def test_an_expression_checked_once_is_still_reported_with_each_entry_and_its_spelling() -> None:
    """The check is kept per expression (whitespace normalised); its error is not: each
    entry that uses the bad string is named, with the string as it wrote it."""
    for name, expr in [("first", "0 0 30 2 *"), ("second", "0  0 30 2 *"), ("first", "0 0 30 2 *")]:
        with pytest.raises(ConfigurationError) as caught:
            cron(expr, name=name)
        assert str(caught.value).startswith(f"entry {name!r}: cron expression {expr!r} never fires")
    assert cron("0  0 * * *", name="spaced").fields == cron("@daily", name="alias").fields == "0 0 * * *"


def test_a_bad_time_zone_names_the_entry_and_the_zone() -> None:
    with pytest.raises(ConfigurationError, match=r"'nightly-report'.*'Mars/Olympus_Mons'.*IANA"):
        cron("0 0 * * *", tz="Mars/Olympus_Mons", name="nightly-report")


# -- as a Celery schedule ---------------------------------------------------------------

def pinned(expr: str, now: datetime, **kw: object) -> cron:
    return cron(expr, nowfun=lambda: now, app=Celery("t", set_as_current=False), **kw)


def test_is_due_once_the_next_fire_time_after_last_run_has_passed() -> None:
    due, next_check = pinned("*/5 * * * *", T0 + timedelta(minutes=5, seconds=30)).is_due(T0)
    assert (due, next_check) == (True, 270.0)


def test_is_not_due_before_the_next_fire_time() -> None:
    due, next_check = pinned("*/5 * * * *", T0 + timedelta(minutes=2)).is_due(T0)
    assert (due, next_check) == (False, 180.0)


def test_remaining_estimate_reads_fields_in_the_crons_zone() -> None:
    berlin = pinned("0 12 * * *", T0, tz="Europe/Berlin")
    assert berlin.remaining_estimate(T0) == timedelta(hours=24)  # 12:00 CEST = 10:00Z, tomorrow


def test_a_beat_schedule_entry_accepts_a_cron() -> None:
    app = Celery("t", set_as_current=False)
    entry = ScheduleEntry(name="e", task="t.x", schedule=cron("* * * * *"), app=app,
                          last_run_at=datetime.now(UTC) - timedelta(minutes=2))
    assert entry.is_due().is_due is True


def test_cron_pickles_with_its_zone_and_name() -> None:
    original = cron("H 3 * * *", tz="Europe/Berlin", name="report")
    copy = pickle.loads(pickle.dumps(original))
    assert copy == original and hash(copy) == hash(original)
    assert slots(copy) == slots(original)


def test_crons_are_equal_when_expression_zone_and_name_are() -> None:
    assert cron("0 * * * *") == cron("0  *  * * *")
    assert cron("0 * * * *") != cron("0 * * * *", tz="UTC")
    assert cron("H * * * *", name="a") != cron("H * * * *", name="b")


def test_repr_shows_expression_zone_and_name() -> None:
    assert repr(cron("0 * * * *", tz="Europe/Berlin", name="r")) == "<cron: '0 * * * *' tz=Europe/Berlin name='r'>"


# -- parse_entry_schedule ---------------------------------------------------------------

def test_a_string_schedule_becomes_a_cron_named_after_the_entry() -> None:
    parsed = parse_entry_schedule("cleanup", "*/5 * * * *", UTC)
    assert parsed == cron("*/5 * * * *", name="cleanup")


def test_numbers_and_timedeltas_become_intervals_as_in_celery() -> None:
    assert parse_entry_schedule("e", 30, UTC).run_every == timedelta(seconds=30)
    assert parse_entry_schedule("e", 2.5, UTC).run_every == timedelta(seconds=2.5)
    assert parse_entry_schedule("e", timedelta(minutes=1), UTC).run_every == timedelta(minutes=1)


def test_celery_schedule_objects_pass_through() -> None:
    for value in (crontab(minute=0), schedule(timedelta(seconds=9))):
        assert parse_entry_schedule("e", value, UTC) is value


@pytest.mark.parametrize("value", [0, -5, None, True, ["* * * * *"]])
def test_a_schedule_of_the_wrong_kind_names_the_entry(value: object) -> None:
    with pytest.raises(ConfigurationError, match="entry 'cleanup'"):
        parse_entry_schedule("cleanup", value, UTC)


def test_a_bad_cron_string_in_beat_schedule_names_the_entry() -> None:
    with pytest.raises(ConfigurationError, match=r"entry 'cleanup'.*'\*/5 \* \* \*'"):
        parse_entry_schedule("cleanup", "*/5 * * *", UTC)
