"""The leader's agenda, pure: loading entries from stored slots, what is due, what to claim."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from zoneinfo import ZoneInfo

from celery.schedules import crontab, schedule
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_leaderbeat import cron
from celery_leaderbeat.entries import EntryOptions
from celery_leaderbeat.roles.agenda import (
    Agenda,
    Known,
    Reading,
    Tracked,
    Unsent,
    adopt_refused_anchors,
    load,
    margin_slots,
)
from celery_leaderbeat.roles.batch import chunks, missed_events
from celery_leaderbeat.store.types import ClaimItem, Code, Op, Refused, SlotState, SlotStatus
from celery_leaderbeat.timing.policy import CatchupPolicy
from celery_leaderbeat.timing.slots import clock_for, from_ms, plan, to_ms

UTC = timezone.utc
T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
LATEST = EntryOptions(policy=CatchupPolicy("latest"), jitter=None, tz=None)


def every(seconds: float) -> SimpleNamespace:
    """A beat entry as the agenda sees it: only its schedule matters."""
    return SimpleNamespace(schedule=schedule(timedelta(seconds=seconds)))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stored(seconds: float, epoch: int = 1, state: SlotStatus = SlotStatus.SENT) -> SlotState:
    return SlotState(to_ms(at(seconds)), epoch, state)


def claimed(due) -> list[list[tuple[str, datetime, str]]]:
    """The claims of a batch, chunk by chunk, as (entry, slot, op)."""
    return [[(t.name, slot, op) for t, slot, op, _ in chunk] for chunk in chunks(due)]


def load_at(now: datetime, entries: dict, states: dict | None = None, *, epoch: int = 2,
            options: dict | None = None):
    return load(entries, states or {}, start=now,
                reading=Reading(tz=UTC, options=options or {}, default=LATEST),
                known=Known(epoch=epoch))


def test_an_entry_with_no_stored_slot_is_anchored_at_now_and_fires_one_interval_later():
    loaded = load_at(T0, {"a": every(10)})
    assert loaded.anchors == [ClaimItem("a", to_ms(T0), Op.ANCHOR)]
    assert loaded.tracked["a"].last == T0
    assert loaded.tracked["a"].next_fire == at(10)
    assert loaded.unsent == []


def test_an_entry_with_a_stored_slot_continues_from_it_without_an_anchor():
    loaded = load_at(at(100), {"a": every(10)}, {"a": stored(30)})
    assert loaded.anchors == []
    assert loaded.tracked["a"].last == at(30)
    assert loaded.tracked["a"].next_fire == at(40)


def test_claimed_and_unsent_slots_of_an_earlier_epoch_are_unsent_only_claimed_ones_unreported():
    entries = {n: every(10) for n in ("claimed", "reported", "sent", "skipped", "mine")}
    states = {"claimed": stored(10, 1, SlotStatus.CLAIMED),
              "reported": stored(20, 1, SlotStatus.UNSENT),
              "sent": stored(30, 1, SlotStatus.SENT),
              "skipped": stored(40, 1, SlotStatus.SKIPPED),
              "mine": stored(50, 2, SlotStatus.CLAIMED)}
    loaded = load_at(at(60), entries, states, epoch=2)
    assert loaded.unsent == [Unsent("claimed", at(10), True), Unsent("reported", at(20), False)]


def test_an_entry_uses_its_own_options_and_the_others_the_default():
    own = EntryOptions(policy=CatchupPolicy("all", max_catchup=3), jitter=None, tz=None)
    loaded = load_at(T0, {"a": every(10), "b": every(10)}, options={"a": own})
    assert loaded.tracked["a"].options is own
    assert loaded.tracked["b"].options is LATEST


def test_a_refused_anchor_starts_the_entry_from_the_slot_that_refused_it():
    loaded = load_at(at(100), {"a": every(10), "b": every(10)})
    adopt_refused_anchors(loaded, [Refused(stored(95), "already claimed"), Code.GRANTED])
    assert (loaded.tracked["a"].last, loaded.tracked["a"].next_fire) == (at(95), at(105))
    assert (loaded.tracked["b"].last, loaded.tracked["b"].next_fire) == (at(100), at(110))


def test_pop_due_takes_only_the_due_entries_with_their_plan_until_pushed_back():
    loaded = load_at(T0, {"fast": every(10), "slow": every(60)})
    agenda = Agenda(loaded.tracked)
    assert agenda.earliest() == at(10).timestamp()
    assert agenda.pop_due(at(9), since=T0) == []
    due = agenda.pop_due(at(25), since=T0)
    assert [(t.name, p.send) for t, p in due] == [("fast", (at(10), at(20)))]
    assert agenda.earliest() == at(60).timestamp(), "a popped entry stays off until pushed"
    assert agenda.pop_due(at(25), since=T0) == []
    tracked, p = due[0]
    tracked.advance(p.last)
    agenda.push(tracked)
    assert agenda.earliest() == at(30).timestamp()


def test_upcoming_names_each_entry_due_by_a_time_with_its_slot_earliest_first():
    """What a leader frames ahead of a burst: the entries due by then and no other, a
    re-pushed entry once (its stale heap item skipped), a jittered entry by its slot."""
    entries = {f"e{s}": every(s) for s in (50, 10, 40, 30, 20, 60, 70)}
    jittered = {"j": EntryOptions(policy=CatchupPolicy("latest"), jitter=5.0, tz=None)}
    loaded = load_at(T0, {**entries, "j": every(20)}, options=jittered)
    agenda = Agenda(loaded.tracked)
    assert agenda.upcoming(at(9).timestamp()) == []
    upcoming = agenda.upcoming(at(40).timestamp())
    assert [name for name, _ in upcoming if name != "j"] == ["e10", "e20", "e30", "e40"]
    assert [slot for name, slot in upcoming if name != "j"] == [at(10), at(20), at(30), at(40)]
    fire = loaded.tracked["j"].next_fire
    assert at(20) < fire < at(25), "the jittered entry fires after its slot"
    assert ("j", at(20)) in upcoming, "named by its slot, not its fire time"
    [(tracked, plan_)] = agenda.pop_due(at(10), since=T0)
    tracked.advance(plan_.last)
    agenda.push(tracked)  # e10 now due at 20; its item for 10 is stale
    agenda.push(tracked)  # pushed twice: two items, one entry
    assert [n for n, _ in agenda.upcoming(at(25).timestamp())].count("e10") == 1
    assert ("e10", at(20)) in agenda.upcoming(at(25).timestamp())


def test_the_wait_runs_to_the_next_real_fire_time_past_the_items_of_changed_or_dropped_entries():
    """An entry tracked afresh (a run-time edit) or dropped leaves its old heap item behind;
    the loop's wait and the earliest fire time look past it: a storm of edits would
    otherwise wake a standby once per edit at a time nothing is due."""
    loaded = load_at(T0, {"a": every(10), "b": every(30), "c": every(60)})
    agenda = Agenda(loaded.tracked)
    assert agenda.earliest() == at(10).timestamp()
    moved = load_at(at(5), {"a": every(40)}).tracked["a"]  # edited: next due at 45
    agenda.add(moved)
    agenda.drop("b")
    assert agenda.earliest() == at(45).timestamp()
    assert agenda.delay(at(5).timestamp(), limit=300.0) == 40.0
    assert [(t.name, p.send) for t, p in agenda.pop_due(at(50), since=T0)] == \
        [("a", (at(45),))]


def test_slots_due_before_since_were_missed_and_follow_the_entry_policy():
    agenda = Agenda(load_at(T0, {"a": every(10)}).tracked)
    [(tracked, p)] = agenda.pop_due(at(45), since=at(42))
    assert p.send == (at(40),), "latest: only the newest missed slot"
    assert [m.slot for m in p.missed] == [at(10), at(20), at(30)]
    assert tracked.last == T0, "popping plans; it does not advance the entry"


def test_the_delay_runs_to_the_next_fire_time_never_negative_never_past_the_limit():
    agenda = Agenda(load_at(T0, {"a": every(10)}).tracked)
    assert agenda.delay(at(4).timestamp(), limit=300.0) == 6.0
    assert agenda.delay(at(4).timestamp(), limit=5.0) == 5.0
    assert agenda.delay(at(12).timestamp(), limit=300.0) == 0.0
    assert Agenda().delay(T0.timestamp(), limit=300.0) == 300.0
    assert Agenda().earliest() is None


def test_each_slot_to_send_is_claimed_and_newer_missed_slots_are_skipped_past():
    agenda = Agenda(load_at(T0, {"a": every(10)}).tracked)
    sent_latest = agenda.pop_due(at(45), since=at(42))
    assert claimed(sent_latest) == [[("a", at(40), Op.CLAIM)]]

    skipping = EntryOptions(policy=CatchupPolicy("skip"), jitter=None, tz=None)
    agenda = Agenda(load_at(T0, {"a": every(10)}, options={"a": skipping}).tracked)
    sent_none = agenda.pop_due(at(45), since=at(42))
    assert claimed(sent_none) == [[("a", at(40), Op.SKIP)]]


def test_an_entry_with_nothing_new_to_skip_claims_only_what_it_sends_one_slot_per_chunk():
    agenda = Agenda(load_at(T0, {"a": every(10), "b": every(10)}).tracked)
    on_time = agenda.pop_due(at(25), since=T0)
    # two slots of one entry never share a claim: a claim overwrites the entry's last slot
    assert claimed(on_time) == [[("a", at(10), Op.CLAIM), ("b", at(10), Op.CLAIM)],
                                [("a", at(20), Op.CLAIM), ("b", at(20), Op.CLAIM)]]


def test_a_batch_is_claimed_in_chunks_of_at_most_one_hundred():
    entries = {f"e{i}": every(10) for i in range(250)}
    due = Agenda(load_at(T0, entries).tracked).pop_due(at(10), since=T0)
    assert [len(chunk) for chunk in claimed(due)] == [100, 100, 50]


class FailsAfter:
    """A user's own schedule: every 10 s, until it raises for times after ``limit``."""

    def __init__(self, limit: datetime) -> None:
        self.limit = limit

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        if last_run_at >= self.limit:
            raise RuntimeError("ephemeris tables missing")
        return timedelta(seconds=10)


def test_an_entry_whose_schedule_raises_is_set_aside_and_the_others_stay_due():
    bad = SimpleNamespace(schedule=FailsAfter(limit=at(15)))
    agenda = Agenda(load_at(T0, {"a": every(10), "bad": bad}).tracked)
    first = agenda.pop_due(at(10), since=T0)
    assert sorted(t.name for t, _ in first) == ["a", "bad"]
    for tracked, p in first:
        tracked.advance(p.last)
    agenda.push_all(first)

    due = agenda.pop_due(at(35), since=T0)  # "bad" raises past 15 s; "a" goes on
    assert [t.name for t, _ in due] == ["a"]
    [(name, why)] = agenda.take_broken()
    assert name == "bad" and "ephemeris tables missing" in why
    assert agenda.take_broken() == []  # reported once
    assert agenda.pop_due(at(35), since=T0) == []  # set aside, not due again at once


def test_missed_events_list_each_recorded_slot_and_count_the_older_ones():
    agenda = Agenda(load_at(T0, {"a": every(1)}).tracked)
    [(tracked, p)] = agenda.pop_due(at(500), since=at(500))
    events = missed_events(tracked, p)
    listed = [e for e in events if "older slots" not in e.detail]
    assert len(listed) == len(p.missed)
    assert all(e.event == "missed" and e.detail == "latest" for e in listed)
    [count] = [e for e in events if "older slots" in e.detail]
    assert count.detail == f"{p.missed_total - len(p.missed)} older slots not listed"
    assert count.slot_ms == to_ms(p.last)


def test_an_entry_whose_clock_cannot_be_built_is_left_out_and_the_others_load():
    loaded = load_at(T0, {"a": every(10), "bad": SimpleNamespace(schedule="not a schedule")})
    assert sorted(loaded.tracked) == ["a"]


def test_margin_slots_count_an_interval_back_from_its_anchor_the_anchor_included():
    clock = clock_for(schedule(timedelta(seconds=1.5)), name="e", tz=UTC, jitter=None)
    anchor = T0 + timedelta(seconds=5)
    listed, older = margin_slots(clock, T0, anchor)
    assert listed == [anchor - timedelta(seconds=1.5) * k for k in (3, 2, 1, 0)]
    assert older == 0
    assert margin_slots(clock, anchor + timedelta(seconds=1), anchor) == ([], 0)


def test_margin_slots_of_a_cron_are_its_own_and_older_ones_are_counted():
    clock = clock_for(crontab(), name="e", tz=UTC, jitter=None)  # every minute
    listed, older = margin_slots(clock, T0 - timedelta(minutes=150), T0)
    assert len(listed) == 100 and listed[-1] == T0 and older == 51
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(listed))


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["interval", "relative", "jittered", "cron-berlin", "crontab-ny",
                             "cron-seconds"]),
       last=st.integers(0, 400 * 86_400), ahead=st.integers(0, 3 * 86_400),
       behind=st.integers(0, 3 * 86_400), mode=st.sampled_from(["latest", "skip", "all"]),
       beyond=st.integers(-5_000, 5_000))
def test_an_entry_advanced_past_its_plan_fires_next_where_its_clock_says(
        kind: str, last: int, ahead: int, behind: int, mode: str, beyond: int) -> None:
    """A look advances each settled entry to its plan's last slot and takes the plan's next
    fire time, which the entries sharing the plan share, instead of asking each clock
    again: it must be the time the clock gives after that slot, on every kind of clock
    (a zone's transitions among them: the year from T0 covers two of each). A slot
    settled in the store beyond the plan (``beyond`` ms from its last) is advanced to."""
    schedules = {
        "interval": (schedule(timedelta(seconds=7)), None),
        "relative": (schedule(timedelta(minutes=5), relative=True), None),
        "jittered": (schedule(timedelta(seconds=90)), 30.0),
        "cron-berlin": (cron("30 1-3 * * *", tz="Europe/Berlin"), None),
        "crontab-ny": (crontab(minute="*/15", hour="0-3"), None),
        "cron-seconds": (cron("*/20 * * * * *"), None),
    }
    sched, jitter = schedules[kind]
    zone = ZoneInfo("America/New_York")
    clock = clock_for(sched, name="e", tz=zone, jitter=jitter)
    start = clock.next_after(T0 + timedelta(seconds=last))
    now = start + timedelta(seconds=ahead)
    options = EntryOptions(policy=CatchupPolicy(mode), jitter=jitter, tz=zone)
    planned, asked = (Tracked("e", clock, options, start) for _ in range(2))
    p = plan(clock, last=start, now=now, since=now - timedelta(seconds=behind),
             policy=options.policy)
    planned.advance_past(p)
    asked.advance(p.last)
    assert (planned.last, planned.next_fire) == (asked.last, asked.next_fire)
    assert planned.next_fire > now  # past every due slot
    settled, from_store = to_ms(p.last) + beyond, Tracked("e", clock, options, start)
    from_store.advance_past(p, settled)
    asked.advance(max(from_ms(settled), p.last))
    assert (from_store.last, from_store.next_fire) == (asked.last, asked.next_fire)
