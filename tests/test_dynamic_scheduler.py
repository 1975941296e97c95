"""Running schedulers (in-process, real Redis) follow entries changed through the API."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from itertools import pairwise

import pytest

from celery_leaderbeat import Entry
from celery_leaderbeat.roles.dynamic_schedule import STANDBY_EVERY
from celery_leaderbeat.scheduler import LEADER, STANDBY, Scheduler
from celery_leaderbeat.store.keys import Keys
from tests.support.beat import NOOP, Recorder, duplicates
from tests.test_scheduler import make_app, ticking_in_a_thread


@pytest.fixture
def servers(make_redis_server):
    return make_redis_server(), make_redis_server()


def run(schedulers, seconds: float, until=None) -> None:
    """Tick every scheduler as their beats would, for ``seconds`` (or until ``until()``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        delay = min(s.tick() for s in schedulers)
        if until is not None and until():
            return
        time.sleep(min(delay, 0.05))
    assert until is None, "condition not reached"


def leader_and_standby(servers, key_prefix):
    """Two beats of one static hourly entry, the first elected: (apps, leader, standby).
    Both are closed here if the election fails; the caller closes them otherwise."""
    state, broker = servers
    apps = [make_app(state.url, broker.url, key_prefix,
                     {"static": {"task": NOOP, "schedule": 3600}}) for _ in range(2)]
    first, second = (Scheduler(app=app) for app in apps)
    try:
        run([first, second], 10, until=lambda: first.role == LEADER)
    except BaseException:
        first.close()
        second.close()
        raise
    return apps, first, second


def by_entry(messages, name):
    return [m for m in messages if m.entry == name]


def test_leader_and_standby_both_follow_a_save_within_a_second(servers, key_prefix):
    state, broker = servers
    apps = [make_app(state.url, broker.url, key_prefix, {"static": {"task": NOOP,
                                                                    "schedule": 3600}})
            for _ in range(2)]
    first, second = (Scheduler(app=app) for app in apps)
    try:
        run([first, second], 10, until=lambda: first.role == LEADER)
        run([first, second], 0.5)
        saved_at = time.monotonic()
        Entry("dyn", NOOP, 60).save(apps[0])
        run([first, second], 2, until=lambda: "dyn" in first.schedule and "dyn" in second.schedule)
        seen_after = time.monotonic() - saved_at
        assert seen_after < 1.0
        assert second.role == STANDBY
        assert first.schedule["dyn"].leaderbeat_source == "dynamic"
        assert first.schedule["dyn"].leaderbeat_fingerprint == \
            second.schedule["dyn"].leaderbeat_fingerprint
        assert "dyn" in first.leading.tracked
    finally:
        first.close()
        second.close()


def test_a_leader_sends_a_dynamic_entry_sends_its_edit_and_nothing_once_removed(
        servers, key_prefix):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {})
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        run([scheduler], 10, until=lambda: scheduler.role == LEADER)
        Entry("dyn", NOOP, 0.5, kwargs={"v": 1}).save(app)
        run([scheduler], 10, until=lambda: len(by_entry(recorder.drain_all(), "dyn")) >= 2)
        Entry("dyn", NOOP, 0.5, kwargs={"v": 2}).save(app)
        run([scheduler], 10, until=lambda: any(
            m.kwargs == {"v": 2} for m in by_entry(recorder.drain_all(), "dyn")))
        Entry("dyn", NOOP, 0.5).delete(app)
        run([scheduler], 10, until=lambda: "dyn" not in scheduler.schedule)
        recorder.drain()
        removed_seen = len(recorder.messages)
        run([scheduler], 1.5)
    finally:
        scheduler.close()
    assert len(recorder.drain_all()) == removed_seen, "a removed entry was sent"
    sent = by_entry(recorder.messages, "dyn")
    kwargs = [m.kwargs["v"] for m in sent]
    assert kwargs == sorted(kwargs), "an old definition was sent after the new one"
    assert duplicates(recorder.messages) == []


def test_a_changed_interval_counts_from_the_change(servers, key_prefix):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {})
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        run([scheduler], 10, until=lambda: scheduler.role == LEADER)
        Entry("dyn", NOOP, 0.4).save(app)
        run([scheduler], 10, until=lambda: len(by_entry(recorder.drain_all(), "dyn")) >= 1)
        Entry("dyn", NOOP, 1.3).save(app)
        anchor = Entry.get(app, "dyn").anchor
        run([scheduler], 10, until=lambda: any(
            datetime.fromisoformat(m.slot) > anchor for m in by_entry(recorder.drain_all(),
                                                                      "dyn")))
    finally:
        scheduler.close()
    after = [datetime.fromisoformat(m.slot) for m in by_entry(recorder.messages, "dyn")
             if datetime.fromisoformat(m.slot) > anchor]
    # the leader starts a changed definition again when it reads it (within a poll of
    # the save) plus its margin for unknown state (leaderbeat_max_clock_skew, 0.5 s here)
    margin = timedelta(seconds=scheduler.lb_config.standby_poll + 0.5 + 0.1)
    every = timedelta(seconds=1.3)
    assert anchor + every <= after[0] <= anchor + every + margin
    assert all(b - a == every for a, b in pairwise(after))


def test_an_entry_enabled_again_starts_at_its_next_slot_without_catching_up(servers, key_prefix):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {})
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        run([scheduler], 10, until=lambda: scheduler.role == LEADER)
        Entry("dyn", NOOP, 0.3, catchup="all").save(app)
        run([scheduler], 10, until=lambda: len(by_entry(recorder.drain_all(), "dyn")) >= 1)
        Entry("dyn", NOOP, 0.3, catchup="all", enabled=False).save(app)
        run([scheduler], 10, until=lambda: "dyn" not in scheduler.schedule)
        run([scheduler], 1.5)  # five slots pass while it is off
        recorder.drain()
        off = len(by_entry(recorder.messages, "dyn"))
        Entry("dyn", NOOP, 0.3, catchup="all").save(app)
        enabled_at = Entry.get(app, "dyn").anchor
        run([scheduler], 10, until=lambda: len(by_entry(recorder.drain_all(), "dyn")) > off)
    finally:
        scheduler.close()
    resumed = [datetime.fromisoformat(m.slot) for m in by_entry(recorder.messages, "dyn")[off:]]
    # nothing of the time it was off: its next slot after the change is read (within a
    # poll, plus the leader's margin for a definition it starts again, 0.5 s here)
    every = timedelta(seconds=0.3)
    margin = timedelta(seconds=scheduler.lb_config.standby_poll + 0.5 + 0.1)
    assert enabled_at + every <= resumed[0] <= enabled_at + every + margin


def test_a_one_off_entry_runs_once_then_is_recorded_and_disabled(servers, key_prefix):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {})
    first, second = Scheduler(app=app), Scheduler(app=app)
    recorder = Recorder(broker.client())
    at = (datetime.now(timezone.utc) + timedelta(seconds=1.5)).replace(microsecond=250_000)
    try:
        run([first, second], 10, until=lambda: first.role == LEADER)
        Entry("once", NOOP, at=at, kwargs={"n": 1}).save(app)
        run([first, second], 10, until=lambda: not Entry.get(app, "once").enabled)
        run([first, second], 1.0)
    finally:
        first.close()
        second.close()
    sent = by_entry(recorder.drain_all(), "once")
    assert len(sent) == 1 and datetime.fromisoformat(sent[0].slot) == at
    stored = Entry.get(app, "once")
    assert stored.ran_at == datetime.fromisoformat(sent[0].slot)
    assert "once" not in first.schedule and "once" not in second.schedule


def test_a_one_off_entry_whose_time_is_past_follows_the_catch_up_policy(servers, key_prefix):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {})
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    past = datetime.now(timezone.utc) - timedelta(minutes=5)
    try:
        run([scheduler], 10, until=lambda: scheduler.role == LEADER)
        Entry("late", NOOP, at=past, catchup="latest").save(app)
        Entry("dropped", NOOP, at=past, catchup="skip").save(app)
        run([scheduler], 10, until=lambda: not Entry.get(app, "late").enabled)
        run([scheduler], 1.0)
    finally:
        scheduler.close()
    sent = recorder.drain_all()
    assert len(by_entry(sent, "late")) == 1
    assert by_entry(sent, "dropped") == []


def test_an_entry_stored_under_a_static_name_is_ignored_and_the_static_one_kept(
        servers, key_prefix, caplog):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {"static": {"task": NOOP,
                                                                  "schedule": 3600}})
    other = make_app(state.url, broker.url, key_prefix, {})  # an app that lacks it
    Entry("static", "some.other.task", 5).save(other)
    scheduler = Scheduler(app=app)
    try:
        run([scheduler], 10, until=lambda: scheduler.role == LEADER)
        run([scheduler], 0.5)
    finally:
        scheduler.close()
    assert scheduler.schedule["static"].task == NOOP
    assert not hasattr(scheduler.schedule["static"], "leaderbeat_source")
    assert "dynamic entry 'static' is ignored" in caplog.text
    assert state.client().exists(Keys(key_prefix).entries)


def test_a_save_among_many_entries_is_taken_in_by_name_not_by_reading_every_entry(
        servers, key_prefix):
    state, broker = servers
    static = {f"s{i}": {"task": NOOP, "schedule": 3600} for i in range(300)}
    apps = [make_app(state.url, broker.url, key_prefix, static) for _ in range(2)]
    first, second = (Scheduler(app=app) for app in apps)
    try:
        run([first, second], 10, until=lambda: first.role == LEADER)
        run([first, second], 0.5)
        reads: list[object] = []
        for s in (first, second):
            for attr in ("load", "load_with_definitions"):
                real = getattr(s.ledger, attr)

                def spy(names=None, _real=real):
                    reads.append(names)
                    return _real(names)
                setattr(s.ledger, attr, spy)
        Entry("dyn", NOOP, 60).save(apps[0])
        run([first, second], 3, until=lambda: "dyn" in first.leading.tracked
            and "dyn" in second.schedule)
        run([first, second], 0.3)
        assert reads and None not in reads, "a full read of every entry's state"
        assert all(list(names) == ["dyn"] for names in reads)
        Entry.get(apps[0], "dyn").delete(apps[0])
        run([first, second], 3, until=lambda: "dyn" not in first.leading.tracked)
        assert None not in reads
    finally:
        first.close()
        second.close()


def test_a_storm_of_saves_wakes_no_standby_and_it_still_follows_the_last_within_a_second(
        servers, key_prefix):
    """40 saves a second for 3 s. A standby needs a definition only to rescue a slot,
    ``rescue_after`` (2 s) after its time, and a wake costs it about as much as taking a
    change in: no save publishes anything, and the standby looks at the changes at each
    try for the lease, ``STANDBY_EVERY`` apart (its ``standby_poll`` is Celery's and
    leaderbeat's default, 1 s): it reads nothing from the events channel, ticks once
    per try (its one static entry is hourly: no rescue wakes it), and the last save is in
    its schedule within a second. Celery's and leaderbeat's defaults but for the lease
    (3 s, as in this module; its ``standby_poll`` of 0.2 s is set back to the default)."""
    state, broker = servers
    apps = [make_app(state.url, broker.url, key_prefix,
                     {"static": {"task": NOOP, "schedule": 3600}}) for _ in range(2)]
    for app in apps:
        app.conf.leaderbeat_standby_poll = 1.0
    first, second = (Scheduler(app=app) for app in apps)
    saves: list[tuple[int, float]] = []

    def storm() -> None:
        for k in range(120):  # 40 saves a second for 3 s
            Entry("dyn", NOOP, 60, args=[k]).save(apps[0])
            saves.append((k, time.monotonic()))
            time.sleep(0.025)

    try:
        run([first, second], 10, until=lambda: first.role == LEADER)
        subscription = second._standby._pubsub  # made at its first wait
        read = subscription.next
        heard: list[str] = []
        waits = 0

        def reading(timeout: float) -> str | None:
            nonlocal waits
            waits += 1
            data = read(timeout)
            if data is not None:
                heard.append(data)
            return data

        subscription.next = reading
        with ticking_in_a_thread(first):
            saver = threading.Thread(target=storm)
            saver.start()
            ticks = 0
            while saver.is_alive():
                second.tick()
                ticks += 1
            last, saved_at = saves[-1]
            while list(getattr(second.schedule.get("dyn"), "args", ())) != [last]:
                assert time.monotonic() - saved_at < 1.0, "the last save not followed within 1 s"
                second.tick()
        seconds = saved_at - saves[0][1]
        assert second._standby._pubsub is subscription and waits >= ticks, \
            "the standby waited on another subscription than the one watched"
        assert heard == [], f"the standby read {len(heard)} events in a storm of saves"
        # one tick per try for the lease, with room for the ticks around the storm's ends
        assert ticks <= seconds / STANDBY_EVERY + 2, f"{ticks} ticks in {seconds:.1f} s"
        assert second.role == STANDBY
    finally:
        first.close()
        second.close()


def test_a_standby_takes_a_released_lease_at_once_whenever_its_next_try_was_due(
        servers, key_prefix):
    """A standby tries for the lease every ``STANDBY_EVERY`` (it follows run-time entries)
    and at once when the leader publishes 'released'. Its next routine try is put a minute
    off here, so that only the release can make it lead within a second."""
    apps, first, second = leader_and_standby(servers, key_prefix)
    try:
        Entry("dyn", NOOP, 60).save(apps[0])
        run([second], 3, until=lambda: "dyn" in second.schedule)
        second._standby._next_attempt = time.monotonic() + 60
        first.close()  # releases the lease and publishes 'released'
        released = time.monotonic()
        while second.role != LEADER:
            assert time.monotonic() - released < 1.0, "the released lease not taken"
            second.tick()
    finally:
        first.close()
        second.close()


def test_a_standby_elected_between_two_looks_starts_from_the_change_saved_before(
        servers, key_prefix):
    """A standby looks at the run-time entries only every ``STANDBY_EVERY``; elected
    between two looks, it must not lead with the definition it read before: it looks
    once more as it is elected, so the edit saved just before is in its schedule from
    its first tick as leader. Here its next look is put a minute off, so that only the
    look at the election can bring the edit."""
    apps, first, second = leader_and_standby(servers, key_prefix)
    try:
        with ticking_in_a_thread(first):
            Entry("dyn", NOOP, 60, args=["before"]).save(apps[0])
            run([second], 3, until=lambda: "dyn" in second.schedule)
            second._dynamic.refresh(force=True, every=60.0)
            Entry("dyn", NOOP, 60, args=["edited"]).save(apps[0])
        first.close()  # releases the lease and publishes 'released'
        run([second], 5, until=lambda: second.role == LEADER)
        assert list(second.schedule["dyn"].args) == ["edited"]
    finally:
        first.close()
        second.close()


def test_a_standbys_looks_at_the_changes_are_at_most_standby_every_apart_whatever_wakes_it(
        servers, key_prefix):
    """A standby's looks ride on its tries for the lease, but other wakes come between:
    its rescue looks at 40 static entries jittered over each second (each due at an
    instant of its own, claimed by the healthy leader, read by the standby). Over 6 s,
    the looks at the run-time entries are never more than ``STANDBY_EVERY`` apart (with
    0.3 s for the tick around a look on a loaded machine), so a change is in force on it
    within about a second, and not one per wake: no more than one per
    ``STANDBY_EVERY``, and fewer than its ticks."""
    state, broker = servers
    schedule = {f"s{i}": {"task": NOOP, "schedule": 1, "options": {"leaderbeat": {"jitter": 0.9}}}
                for i in range(40)}
    apps = [make_app(state.url, broker.url, key_prefix, schedule) for _ in range(2)]
    for app in apps:
        app.conf.leaderbeat_standby_poll = 1.0  # the default (this module's apps poll faster)
    first, second = (Scheduler(app=app) for app in apps)
    try:
        run([first, second], 10, until=lambda: first.role == LEADER)
        changes = second._dynamic.store.changes
        looks: list[float] = []

        def looking(seen: int):
            looks.append(time.monotonic())
            return changes(seen)

        second._dynamic.store.changes = looking
        with ticking_in_a_thread(first):
            ticks = 0
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                second.tick()
                ticks += 1
        gaps = [b - a for a, b in pairwise(looks)]
        assert len(looks) >= 5, f"{len(looks)} looks in 6 s"
        assert max(gaps) <= STANDBY_EVERY + 0.3, f"looks {max(gaps):.3f} s apart"
        assert min(gaps) >= STANDBY_EVERY - 0.05, f"looks {min(gaps):.3f} s apart"
        assert ticks > len(looks), f"{ticks} ticks, {len(looks)} looks: no rescue woke it"
        assert second.role == STANDBY
    finally:
        first.close()
        second.close()


def test_an_edit_prepares_the_edited_entrys_message_and_leaves_the_others_alone(
        redis_server, key_prefix):
    """Idle-time preparation after a change looks at the entries it touched, not the whole
    schedule again: a storm of edits must not cost a walk over every entry at every tick."""
    app = make_app(redis_server.url_for(0), redis_server.url_for(0), key_prefix, {})
    for i in range(200):
        Entry(f"d{i}", NOOP, 3600, args=[i]).save(app)
    scheduler = Scheduler(app=app)
    try:
        run([scheduler], 10, until=lambda: scheduler.role == LEADER
            and len(scheduler.schedule) > 200 and scheduler._warmed is not None)
        messages = scheduler._enqueuer.messages
        looked_at: list[str] = []
        part = messages._part
        messages._part = lambda entry, overlap: (looked_at.append(entry.name),
                                                 part(entry, overlap))[1]
        Entry("d7", NOOP, 3600, args=["edited"]).save(app)
        run([scheduler], 5, until=lambda: list(scheduler.schedule["d7"].args) == ["edited"]
            and scheduler._warmed == (scheduler._schedule_version,
                                      scheduler.lease.credentials()[1]))
        assert looked_at == ["d7"]
        assert messages._parts["d7"].ready and messages._parts["d7"].args == ["edited"]
    finally:
        scheduler.close()
