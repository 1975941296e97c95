"""Slot clocks and plan(): catch-up semantics, arithmetic on huge gaps, and properties."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import BaseSchedule, schedule, solar
from croniter import HOUR_FIELD, croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.timing.clocks import IntervalClock
from celery_leaderbeat.timing.schedules import cron
from celery_leaderbeat.timing.slots import (
    MISSED_RECORD_LIMIT,
    CatchupPolicy,
    Missed,
    clock_for,
    from_ms,
    plan,
    slot_id,
    to_ms,
)

UTC = timezone.utc
T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
MINUTE, SECOND = timedelta(minutes=1), timedelta(seconds=1)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def every(seconds: float, jitter: float | None = None, name: str = "e") -> IntervalClock:
    return clock_for(schedule(timedelta(seconds=seconds)), name=name, tz=UTC, jitter=jitter)  # type: ignore[return-value]


class Walked:
    """Any clock, hidden behind the plain protocol (forces plan() to walk) and counted."""

    def __init__(self, clock: object) -> None:
        self.clock, self.calls = clock, 0

    def next_after(self, t: datetime) -> datetime:
        self.calls += 1
        return self.clock.next_after(t)  # type: ignore[attr-defined]

    def fire_time(self, slot: datetime) -> datetime:
        return self.clock.fire_time(slot)  # type: ignore[attr-defined]


class CountedInterval(IntervalClock):
    calls = 0

    def next_after(self, t: datetime) -> datetime:
        self.calls += 1
        return super().next_after(t)

    def nth(self, last: datetime, k: int) -> datetime:
        self.calls += 1
        return super().nth(last, k)


def minutely_plans(**kw: object) -> list:
    """The same plan, by interval arithmetic and by walking a per-minute cron."""
    policy = kw.pop("policy", CatchupPolicy())
    clocks = [every(60), Walked(clock_for(cron("* * * * *"), name="e", tz=UTC))]
    return [plan(c, policy=policy, **kw) for c in clocks]  # type: ignore[arg-type]


# -- plan(): the policy table --------------------------------------------------------

def test_on_time_slots_are_all_sent_oldest_first() -> None:
    for p in minutely_plans(last=at(0), now=at(3.5), since=at(-60)):
        assert p.send == (at(1), at(2), at(3))
        assert (p.missed, p.missed_total, p.last, p.next_due, p.next_fire) == ((), 0, at(3), at(4), at(4))


def test_nothing_due_keeps_last_and_waits_for_the_next_slot() -> None:
    for p in minutely_plans(last=at(0), now=at(0.5), since=at(-60)):
        assert (p.send, p.missed, p.last, p.next_due) == ((), (), at(0), at(1))


def test_latest_sends_nothing_missed_when_an_on_time_slot_is_due() -> None:
    for p in minutely_plans(last=at(0), now=at(5.5), since=at(5)):
        assert p.send == (at(5),)
        assert p.missed == tuple(Missed(at(m), "latest") for m in (1, 2, 3, 4))
        assert (p.missed_total, p.last, p.next_due) == (4, at(5), at(6))


def test_latest_sends_only_the_newest_missed_slot_when_none_is_on_time() -> None:
    for p in minutely_plans(last=at(0), now=at(4.5), since=at(4.5)):
        assert p.send == (at(4),)
        assert p.missed == tuple(Missed(at(m), "latest") for m in (1, 2, 3))
        assert (p.missed_total, p.last) == (3, at(4))


def test_skip_sends_no_missed_slot_and_records_each() -> None:
    for p in minutely_plans(last=at(0), now=at(4.5), since=at(4.5), policy=CatchupPolicy("skip")):
        assert p.send == ()
        assert p.missed == tuple(Missed(at(m), "skip") for m in (1, 2, 3, 4))
        assert (p.missed_total, p.last, p.next_due) == (4, at(4), at(5))


def test_all_sends_every_missed_slot_then_the_on_time_ones() -> None:
    for p in minutely_plans(last=at(0), now=at(5.5), since=at(5), policy=CatchupPolicy("all")):
        assert p.send == (at(1), at(2), at(3), at(4), at(5))
        assert (p.missed, p.missed_total) == ((), 0)


def test_all_sends_only_the_newest_max_catchup_missed_slots() -> None:
    policy = CatchupPolicy("all", max_catchup=2)
    for p in minutely_plans(last=at(0), now=at(5.5), since=at(5), policy=policy):
        assert p.send == (at(3), at(4), at(5))
        assert p.missed == (Missed(at(1), "max_catchup"), Missed(at(2), "max_catchup"))


@pytest.mark.parametrize(
    ("mode", "sent"),
    [("latest", (at(5),)), ("all", (at(3), at(4), at(5))), ("skip", (at(5),))],
)
def test_missed_slots_older_than_the_window_are_never_sent(mode: str, sent: tuple) -> None:
    policy = CatchupPolicy(mode, window=timedelta(minutes=2.5))
    for p in minutely_plans(last=at(0), now=at(5.5), since=at(5), policy=policy):
        assert p.send == sent
        assert [m.reason for m in p.missed if m.slot < at(3)] == ["window", "window"]


def test_latest_sends_nothing_when_every_missed_slot_is_outside_the_window() -> None:
    policy = CatchupPolicy("latest", window=timedelta(seconds=20))
    for p in minutely_plans(last=at(0), now=at(4.5), since=at(4.5), policy=policy):
        assert p.send == ()
        assert {m.reason for m in p.missed} == {"window"}
        assert p.last == at(4)


def test_only_the_newest_hundred_missed_slots_are_recorded_but_all_are_counted() -> None:
    policy = CatchupPolicy("skip")
    for p in minutely_plans(last=at(0), now=at(250.5), since=at(251), policy=policy):
        assert p.missed_total == 250
        assert len(p.missed) == MISSED_RECORD_LIMIT
        assert [m.slot for m in p.missed] == [at(m) for m in range(151, 251)]


def test_a_slot_is_not_due_before_its_jittered_fire_time() -> None:
    clock = every(60, jitter=30)
    offset = clock.fire_time(at(1)) - at(1)
    assert timedelta(0) <= offset < timedelta(seconds=30)
    before = plan(clock, last=at(0), now=at(1) + offset - SECOND / 1000, since=at(-60), policy=CatchupPolicy())
    assert (before.send, before.next_due, before.next_fire) == ((), at(1), at(1) + offset)
    after = plan(clock, last=at(0), now=at(1) + offset, since=at(-60), policy=CatchupPolicy())
    assert after.send == (at(1),)


def test_a_last_slot_in_the_future_makes_nothing_due() -> None:
    for p in minutely_plans(last=at(10), now=at(5), since=at(-60)):
        assert (p.send, p.last, p.next_due) == ((), at(10), at(11))


def test_a_bad_policy_is_a_configuration_error_naming_the_value() -> None:
    with pytest.raises(ConfigurationError, match="'sometimes'"):
        CatchupPolicy("sometimes")
    with pytest.raises(ConfigurationError, match="max_catchup=0"):
        CatchupPolicy(max_catchup=0)


# -- huge gaps ---------------------------------------------------------------------------

MONTH = timedelta(days=30)


def test_an_every_second_interval_after_a_month_is_planned_by_arithmetic() -> None:
    clock = CountedInterval(SECOND, relative=False, name="e", jitter=None)
    p = plan(clock, last=T0, now=T0 + MONTH, since=T0 + MONTH, policy=CatchupPolicy("all"))
    assert p.send[-1] == T0 + MONTH and len(p.send) == 100 + 1  # 100 caught up, 1 on time
    assert p.missed_total == 30 * 86400 - 1 - 100
    assert (p.missed_estimated, len(p.missed)) == (False, MISSED_RECORD_LIMIT)
    assert clock.calls < 500


def test_an_every_second_cron_after_a_month_walks_a_few_thousand_slots_at_most() -> None:
    clock = Walked(clock_for(cron("* * * * * *"), name="e", tz=ZoneInfo("Europe/Berlin")))
    p = plan(clock, last=T0, now=T0 + MONTH, since=T0 + MONTH - 9 * SECOND, policy=CatchupPolicy())
    assert p.send == tuple(T0 + MONTH - k * SECOND for k in range(9, -1, -1))
    assert p.missed[-1] == Missed(T0 + MONTH - 10 * SECOND, "latest")
    exact = 30 * 86400 - 10
    assert p.missed_estimated and abs(p.missed_total - exact) <= exact // 100
    assert clock.calls < 5000


def test_a_sparse_cron_after_years_is_counted_exactly_by_walking() -> None:
    clock = Walked(clock_for(cron("0 3 * * 1"), name="e", tz=ZoneInfo("America/New_York")))
    p = plan(clock, last=T0, now=T0 + timedelta(days=700), since=T0 + timedelta(days=700), policy=CatchupPolicy("skip"))
    assert (p.missed_total, p.missed_estimated) == (100, False)


@pytest.mark.parametrize(
    ("expr", "days", "mode", "exact_count"),
    [("* * * * *", 4, "all", True), ("*/10 * * * * *", 1, "skip", True),
     ("* 9-17 * * 1-5", 6, "latest", False)],
)
def test_jumping_over_a_long_outage_sends_and_records_exactly_what_walking_would(
    expr: str, days: int, mode: str, exact_count: bool
) -> None:
    clock = clock_for(cron(expr), name="e", tz=ZoneInfo("America/New_York"))
    now = datetime(2026, 3, 9, 15, 0, 30, tzinfo=UTC)  # spans the spring-forward day
    last, since, policy = now - timedelta(days=days), now - 3 * MINUTE, CatchupPolicy(mode, max_catchup=150)
    p = plan(clock, last=last, now=now, since=since, policy=policy)
    send, missed, total, following = _reference_plan(clock, last, now, since, policy)
    assert p.missed_estimated
    assert (p.send, tuple(m.slot for m in p.missed), p.next_due) == (send, missed, following)
    if exact_count:
        assert abs(p.missed_total - total) <= total // 100


# -- ids and milliseconds ---------------------------------------------------------------

def test_slot_id_is_the_same_on_every_node_and_every_run() -> None:
    assert slot_id("lb", "report", T0) == slot_id("lb", "report", T0.astimezone(ZoneInfo("Asia/Tokyo")))
    # A literal: the id must not change between releases, or a rolling upgrade duplicates.
    assert slot_id("lb", "report", T0) == "8fd79c16-78e6-552b-8cdd-bd5863c1d062"


def test_slot_id_differs_by_prefix_entry_and_slot() -> None:
    ids = {slot_id("lb", "report", T0), slot_id("lb2", "report", T0),
           slot_id("lb", "report2", T0), slot_id("lb", "report", T0 + SECOND / 1000)}
    assert len(ids) == 4


@given(st.integers(min_value=0, max_value=2**42))
def test_milliseconds_round_trip(ms: int) -> None:
    assert to_ms(from_ms(ms)) == ms and from_ms(ms).tzinfo is UTC


# -- jitter, solar, other schedules ----------------------------------------------------

def test_jitter_is_deterministic_below_the_bound_and_before_the_next_slot() -> None:
    a, b = every(10, jitter=60, name="x"), every(10, jitter=60, name="x")
    offsets = [a.fire_time(at(k)) - at(k) for k in range(50)]
    assert offsets == [b.fire_time(at(k)) - at(k) for k in range(50)]
    assert all(timedelta(0) <= o < timedelta(seconds=10) for o in offsets)
    assert len(set(offsets)) > 40
    assert offsets != [every(10, jitter=60, name="y").fire_time(at(k)) - at(k) for k in range(50)]


def test_a_negative_jitter_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="'e'.*jitter=-1"):
        every(10, jitter=-1)


def test_relative_intervals_fall_on_multiples_of_the_interval() -> None:
    clock = clock_for(schedule(timedelta(hours=1), relative=True), name="e", tz=UTC)
    assert clock.next_after(at(17)) == at(60) and clock.next_after(at(60)) == at(120)


def test_solar_slots_are_the_exact_event_times_a_day_apart() -> None:
    clock = clock_for(solar("sunrise", 52.52, 13.40), name="sun", tz=UTC)
    first = clock.next_after(datetime(2026, 6, 21, tzinfo=UTC))
    second = clock.next_after(first)
    assert datetime(2026, 6, 21, 2, 40, tzinfo=UTC) < first < datetime(2026, 6, 21, 2, 50, tzinfo=UTC)
    assert timedelta(hours=23, minutes=59) < second - first < timedelta(hours=24, minutes=1)
    assert clock.next_after(first - SECOND) == first and first.microsecond == 0


# Expected slots found without ephem's rise/set search: the sun's altitude (ephem.Sun, no
# refraction; its upper limb for sunrise/sunset) bisected through the event's horizon,
# stepping a minute at a time. Berlin's sunrise and sunset agree with the almanac (04:43
# and 21:33 CEST).
SOLAR_CASES = [
    ("sunrise", 52.52, 13.40, "2026-06-21 00:00", "2026-06-21 02:43:09", "2026-06-22 02:43:23"),
    ("sunset", 52.52, 13.40, "2026-06-21 00:00", "2026-06-21 19:33:15", "2026-06-22 19:33:25"),
    ("solar_noon", 52.52, 13.40, "2026-06-21 00:00", "2026-06-21 11:08:13", "2026-06-22 11:08:26"),
    # No astronomical night in a Berlin summer (Celery 5.4 has this horizon at +18 degrees).
    ("dusk_astronomical", 52.52, 13.40, "2026-06-21 00:00",
     "2026-07-25 23:11:11", "2026-07-26 22:47:08"),
    ("dawn_civil", -33.87, 151.21, "2026-01-01 00:00", "2026-01-01 18:19:17", "2026-01-02 18:20:05"),
    # Tromso's polar night: the first sunrise after it.
    ("sunrise", 69.65, 18.96, "2026-12-10 00:00", "2027-01-15 10:34:38", "2027-01-16 10:16:24"),
]


@pytest.mark.parametrize(("event", "lat", "lon", "start", "first", "second"), SOLAR_CASES)
def test_solar_slots_are_the_events_ephem_finds_whatever_the_celery_version(
        event: str, lat: float, lon: float, start: str, first: str, second: str) -> None:
    clock = clock_for(solar(event, lat, lon), name="sun", tz=UTC)
    slot = clock.next_after(_utc(start)[0])
    assert [slot, clock.next_after(slot)] == _utc(first, second)


class EveryTenMinutes(BaseSchedule):
    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        nxt = last_run_at.replace(second=0, microsecond=0) + timedelta(minutes=10 - last_run_at.minute % 10)
        return nxt - self.now()


def test_any_other_schedule_falls_back_to_its_remaining_estimate_at_t() -> None:
    clock = clock_for(EveryTenMinutes(), name="e", tz=UTC)
    assert clock.next_after(at(3)) == at(10) and clock.next_after(at(10)) == at(20)


def test_a_shared_plan_after_a_run_in_the_second_pass_of_a_repeated_hour_is_its_own() -> None:
    """Entries on one schedule share plans; 01:00 EDT and 01:00 EST are different lasts."""
    tz = ZoneInfo("America/New_York")
    clock = clock_for(cron("0 * * * *"), name="e", tz=tz)
    edt = datetime(2026, 11, 1, 5, 0, tzinfo=UTC).astimezone(tz)
    est = datetime(2026, 11, 1, 6, 0, tzinfo=UTC).astimezone(tz)
    assert (edt.hour, est.hour, est.fold) == (1, 1, 1)
    now = datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
    kw = {"now": now, "since": now - timedelta(hours=3), "policy": CatchupPolicy()}
    assert plan(clock, last=edt, **kw).send == (datetime(2026, 11, 1, 6, 0, tzinfo=UTC),)
    after_est = plan(clock, last=est, **kw)
    assert (after_est.send, after_est.next_due) == ((), datetime(2026, 11, 1, 7, 0, tzinfo=UTC))


# -- properties --------------------------------------------------------------------------

def _utc(*texts: str) -> list[datetime]:
    return [datetime.fromisoformat(t).replace(tzinfo=UTC) for t in texts]


CALENDAR_EDGES = _utc("2024-02-29 00:00", "2025-12-31 23:00", "2028-02-29 12:00", "2027-04-30 22:00")
TRANSITIONS = {
    "America/New_York": _utc("2026-03-08 07:00", "2026-11-01 06:00", "2024-03-10 07:00", "2024-11-03 06:00"),
    "Europe/Berlin": _utc("2026-03-29 01:00", "2026-10-25 01:00", "2024-03-31 01:00", "2024-10-27 01:00"),
    "Australia/Lord_Howe": _utc("2026-10-03 15:30", "2026-04-04 15:00", "2025-10-04 15:30"),
    "UTC": [],
}
ZONES = list(TRANSITIONS)


def _starts(zone: str) -> st.SearchStrategy[datetime]:
    """Mostly a few hours before one of the zone's transitions or a calendar edge."""
    near = st.builds(lambda base, d: base + d, st.sampled_from(TRANSITIONS[zone] + CALENDAR_EDGES),
                     st.timedeltas(timedelta(hours=-7), timedelta(hours=3)))
    anywhere = st.datetimes(datetime(2000, 1, 1), datetime(2040, 1, 1), timezones=st.just(UTC))
    return st.one_of(near, near, anywhere)


zones_and_starts = st.sampled_from(ZONES).flatmap(lambda z: st.tuples(st.just(z), _starts(z)))
five_fields = st.tuples(
    st.sampled_from(["*", "*/7", "0", "5,35", "0-10/5", "59", "30"]),
    st.sampled_from(["*", "2", "1-3", "*/5", "0,12", "23", "1", "1,2"]),
    st.sampled_from(["*"] * 5 + ["1", "29", "31", "15-20"]),
    st.sampled_from(["*"] * 5 + ["2", "*/3", "3,10,11"]),
    st.sampled_from(["*"] * 5 + ["0", "1-5", "6"]),
)


def _fires(expr: str) -> bool:
    try:
        cron(expr)
    except ConfigurationError:  # e.g. "* * 31 2 *": never fires
        return False
    return True


expressions = st.one_of(
    five_fields.map(" ".join),
    st.tuples(st.sampled_from(["0", "*/20", "30", "10,50"]), five_fields).map(
        lambda f: " ".join((f[0], *f[1]))),
).filter(_fires)


def _reference(expr: str, zone: ZoneInfo, start: datetime, end: datetime) -> set[datetime]:
    """Brute force over real time: every instant whose wall time matches, with cron's DST rules."""
    seconds = len(expr.split()) == 6
    fields, _ = croniter.expand(expr, second_at_beginning=seconds)
    sets = [None if f == ["*"] else set(f) for f in fields]
    fixed = sets[HOUR_FIELD] is not None and len(sets[HOUR_FIELD]) < 24
    step = timedelta(seconds=10 if seconds else 60)

    def matches(w: datetime) -> bool:
        minute, hour, dom, month, dow = sets[:5]
        days = [dom is None or w.day in dom, dow is None or (w.weekday() + 1) % 7 in dow]
        day_ok = any(days) if dom is not None and dow is not None else all(days)
        return (day_ok and (month is None or w.month in month) and (hour is None or w.hour in hour)
                and (minute is None or w.minute in minute)
                and (not seconds or sets[5] is None or w.second in sets[5]))

    found, u = set(), start
    while u < end:
        local, before = u.astimezone(zone), (u - step).astimezone(zone)
        naive = local.replace(tzinfo=None)
        if matches(naive) and not (fixed and local.fold):
            found.add(u)
        jump = local.utcoffset() - before.utcoffset()
        if fixed and jump > timedelta(0):
            gap = (naive - jump + k * step for k in range(jump // step))
            if any(matches(w) for w in gap):
                found.add(u)
        u += step
    return found


@settings(max_examples=150, deadline=None)
@given(expr=expressions, zone_start=zones_and_starts)
def test_cron_slots_are_exactly_those_a_brute_force_scan_finds(expr: str, zone_start: tuple) -> None:
    zone, start = zone_start
    tz = ZoneInfo(zone)
    span = timedelta(hours=2) if len(expr.split()) == 6 else timedelta(hours=9)
    begin = start.replace(second=0, microsecond=0)
    clock = clock_for(cron(expr), name="p", tz=tz)
    produced, t = [], begin - timedelta(microseconds=1)
    while (t := clock.next_after(t)) < begin + span:
        produced.append(t)
    assert produced == sorted(_reference(expr, tz, begin, begin + span))


@settings(max_examples=100, deadline=None)
@given(expr=expressions, zone_start=zones_and_starts)
def test_next_after_is_strictly_increasing_and_never_repeats(expr: str, zone_start: tuple) -> None:
    zone, start = zone_start
    clock = clock_for(cron(expr), name="p", tz=ZoneInfo(zone))
    t, seen = start, []
    for _ in range(15):
        nxt = clock.next_after(t)
        assert nxt > t
        seen.append(nxt)
        t = nxt
    assert len(set(seen)) == len(seen)


def _reference_plan(clock: object, last: datetime, now: datetime, since: datetime,
                    policy: CatchupPolicy) -> tuple[tuple, tuple, int, datetime]:
    due, s = [], clock.next_after(last)  # type: ignore[attr-defined]
    while clock.fire_time(s) <= now:  # type: ignore[attr-defined]
        due.append(s)
        s = clock.next_after(s)  # type: ignore[attr-defined]
    missed = [d for d in due if d < since]
    on_time = [d for d in due if d >= since]
    old = [d for d in missed if policy.window is not None and d < now - policy.window]
    eligible = [d for d in missed if d not in old]
    chosen = {"all": eligible[-policy.max_catchup:], "skip": [],
              "latest": eligible[-1:] if not on_time else []}[policy.mode]
    rest = [d for d in missed if d not in chosen]
    return tuple(chosen + on_time), tuple(rest[-MISSED_RECORD_LIMIT:]), len(rest), s


@settings(max_examples=150, deadline=None)
@given(
    seconds=st.sampled_from([1, 7, 60, 3600]),
    jitter=st.sampled_from([None, 0.5, 5, 120]),
    gap=st.integers(0, 400), lead=st.integers(-50, 450),
    mode=st.sampled_from(["latest", "skip", "all"]), max_catchup=st.integers(1, 150),
    window=st.sampled_from([None, 30, 3600]),
)
def test_interval_arithmetic_agrees_with_walking_the_slots(
    seconds: int, jitter: float | None, gap: int, lead: int, mode: str, max_catchup: int, window: int | None
) -> None:
    clock = every(seconds, jitter=jitter)
    step = timedelta(seconds=seconds)
    now, since = T0 + gap * step + step / 3, T0 + lead * step
    policy = CatchupPolicy(mode, timedelta(seconds=window) if window else None, max_catchup)
    p = plan(clock, last=T0, now=now, since=since, policy=policy)
    walked = plan(Walked(clock), last=T0, now=now, since=since, policy=policy)
    assert p == walked
    send, missed, total, following = _reference_plan(clock, T0, now, since, policy)
    assert (p.send, tuple(m.slot for m in p.missed), p.missed_total, p.next_due) == (send, missed, total, following)
