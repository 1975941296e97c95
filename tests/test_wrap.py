"""leaderbeat_base_scheduler: the setting, the wrapping class, and PersistentScheduler wrapped."""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.beat import PersistentScheduler

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.integrations.wrap import WrapMixin
from celery_leaderbeat.scheduler import Scheduler, gate_class, wrap_class
from celery_leaderbeat.timing.clocks import NEVER, BoundedClock, IntervalClock, OnceClock
from celery_leaderbeat.timing.slots import clock_for
from tests.support.beat import NOOP, BeatCluster, Recorder, beat_env, duplicates, slots_by_entry

UTC = timezone.utc
BASE = {"redis_url": "redis://x", "key_prefix": "p", "node_id": "n"}


def problems_of(value) -> list[str]:
    with pytest.raises(ConfigurationError) as caught:
        Config.from_values({**BASE, "base_scheduler": value})
    return caught.value.problems


# -- the setting -------------------------------------------------------------------------

def test_a_base_scheduler_that_cannot_be_imported_is_named_with_the_reason():
    (problem,) = problems_of("no_such_module.schedulers:DatabaseScheduler")
    assert problem.startswith(
        "leaderbeat_base_scheduler='no_such_module.schedulers:DatabaseScheduler' is not importable")
    assert "No module named 'no_such_module'" in problem


def test_a_base_scheduler_that_is_not_a_beat_scheduler_is_refused():
    (problem,) = problems_of("celery.beat:Service")
    assert problem.startswith("leaderbeat_base_scheduler='celery.beat:Service' must name a "
                              "celery.beat.Scheduler subclass")
    (problem,) = problems_of(42)
    assert "leaderbeat_base_scheduler=42 must name a celery.beat.Scheduler subclass" in problem


def test_celery_leaderbeat_itself_cannot_be_its_own_base():
    (problem,) = problems_of("celery_leaderbeat.Scheduler")
    assert "is celery_leaderbeat.Scheduler itself" in problem


def test_a_bad_base_is_reported_with_the_other_bad_settings():
    with pytest.raises(ConfigurationError) as caught:
        Config.from_values({**BASE, "base_scheduler": "celery.beat:Service", "standby_poll": 0})
    assert len(caught.value.problems) == 2


@pytest.mark.parametrize("value", ["celery.beat:PersistentScheduler",
                                   "celery.beat.PersistentScheduler", PersistentScheduler])
def test_the_base_is_a_class_path_in_either_spelling_or_the_class(value):
    assert Config.from_values({**BASE, "base_scheduler": value}).base_scheduler is PersistentScheduler


def test_django_settings_name_the_base_through_the_celery_namespace():
    class Settings:
        CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
        CELERY_LEADERBEAT_BASE_SCHEDULER = "celery.beat:PersistentScheduler"

    app = Celery("proj")
    app.config_from_object(Settings, namespace="CELERY")
    assert Config.from_app(app).base_scheduler is PersistentScheduler


# -- the wrapping class --------------------------------------------------------------------------

def test_the_scheduler_becomes_the_base_wrapped_built_once_per_base(tmp_path):
    app = Celery("proj")
    app.conf.update(broker_url="redis://127.0.0.1:1/0", timezone="UTC",
                    leaderbeat_base_scheduler="celery.beat:PersistentScheduler",
                    beat_schedule={"a": {"task": NOOP, "schedule": "*/5 * * * *"}})
    scheduler = Scheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=True)
    assert type(scheduler) is wrap_class(PersistentScheduler) is gate_class(PersistentScheduler)
    assert type(scheduler).__name__ == "LeaderbeatPersistentScheduler"
    assert isinstance(scheduler, PersistentScheduler) and isinstance(scheduler, WrapMixin)
    assert "base=celery.beat:PersistentScheduler" in scheduler.info
    plain = Celery("proj")
    plain.conf.update(broker_url="redis://127.0.0.1:1/0")
    assert type(Scheduler(app=plain, lazy=True)) is Scheduler


def test_a_standby_never_runs_the_base_tick_nor_writes_its_store(tmp_path, make_redis_server,
                                                                   key_prefix, monkeypatch):
    state = make_redis_server()
    calls: list[str] = []
    monkeypatch.setattr(PersistentScheduler, "tick", lambda self, *a, **k: calls.append("tick"))
    real_sync = PersistentScheduler.sync
    monkeypatch.setattr(PersistentScheduler, "sync",
                        lambda self: (calls.append(f"sync:{self.lb_config.node_id}"),
                                      real_sync(self)))

    def make(node: str) -> Scheduler:
        app = Celery("proj")
        app.conf.update(broker_url=state.url_for(1), leaderbeat_redis_url=state.url,
                        leaderbeat_key_prefix=key_prefix, leaderbeat_node_id=node,
                        leaderbeat_base_scheduler=PersistentScheduler, timezone="UTC",
                        beat_schedule={"a": {"task": NOOP, "schedule": 0.5}})
        return Scheduler(app=app, schedule_filename=str(tmp_path / node))

    leader, standby = make("leader"), make("standby")
    try:
        deadline = time.monotonic() + 10
        while leader.role != "leader" or not Recorder(state.client(db=1)).drain():
            assert time.monotonic() < deadline
            leader.tick()
            time.sleep(0.05)
        for _ in range(3):
            standby.tick()
            standby.sync()
        assert standby.role == "standby"
        leader.sync()
    finally:
        standby.close()
        leader.close()
    assert "tick" not in calls
    assert "sync:standby" not in calls
    assert "sync:leader" in calls


# -- the clocks wrapping adds --------------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_once_clock_has_one_slot_rounded_up_to_the_millisecond():
    clock = OnceClock(T0 + timedelta(microseconds=1500), name="x", jitter=None)
    first = clock.next_after(T0)
    assert first == T0 + timedelta(milliseconds=2)
    assert clock.next_after(first) == NEVER and clock.next_after(NEVER) == NEVER


def test_a_clocked_schedule_has_one_slot_not_one_per_millisecond():
    class clocked:  # django-celery-beat's shape: a clocked_time, remaining_estimate
        clocked_time = T0 + timedelta(seconds=30)

        def remaining_estimate(self, last_run_at):
            return self.clocked_time - last_run_at

    clock = clock_for(clocked(), name="c", tz=UTC)
    assert clock.next_after(T0) == T0 + timedelta(seconds=30)
    assert clock.next_after(T0 + timedelta(seconds=30)) == NEVER


def test_a_bounded_interval_starts_at_its_start_and_stops_before_its_end():
    inner = IntervalClock(timedelta(seconds=10), relative=False, name="i", jitter=None)
    clock = BoundedClock(inner, start=T0 + timedelta(seconds=25), end=T0 + timedelta(seconds=50),
                         name="i", jitter=None)
    walked, t = [], T0
    while (t := clock.next_after(t)) < NEVER:
        walked.append((t - T0).total_seconds())
    assert walked == [25, 35, 45]


def test_a_bounded_crontab_fires_at_its_first_time_at_or_after_start():
    from celery.schedules import crontab

    clock = BoundedClock(clock_for(crontab(minute="*/15"), name="c", tz=UTC),
                         start=T0 + timedelta(minutes=20), end=None, name="c", jitter=None)
    assert clock.next_after(T0) == T0 + timedelta(minutes=30)
    assert clock.next_after(T0 + timedelta(minutes=30)) == T0 + timedelta(minutes=45)


# -- PersistentScheduler wrapped, in real beats ----------------------------------------------

@pytest.mark.slow
def test_three_wrapped_persistent_schedulers_send_no_slot_twice_across_a_leader_kill(
        tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    schedule = {f"e{i}": {"task": NOOP, "every": 1} for i in range(3)}
    env = beat_env(tmp_path, broker_url=broker.url_for(0), redis_url=state.url,
                   prefix=key_prefix, schedule=schedule,
                   settings={"leaderbeat_base_scheduler": "celery.beat:PersistentScheduler"})
    recorder, client = Recorder(broker.client()), state.client()
    with BeatCluster(3, env, tmp_path) as cluster:
        recorder.wait_for(6, timeout=20)
        token = client.get("{" + key_prefix + "}:leader").decode()
        pid = int(token.split("|")[0].split(":")[-2])
        killed_at = time.monotonic()
        next(b for b in cluster if b.pid == pid).kill()
        while (now := client.get("{" + key_prefix + "}:leader")) in (None, token.encode()):
            recorder.drain()
            assert time.monotonic() - killed_at < 15, "no new leader"
            time.sleep(0.02)
        takeover = time.monotonic() - killed_at
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            recorder.drain()
            time.sleep(0.02)
        logs = cluster.logs()
    messages = recorder.messages
    assert now is not None
    print(f"\nPersistentScheduler wrapped: {len(messages)} messages, "
          f"{len(duplicates(messages))} duplicates, new leader {takeover:.2f} s after SIGKILL")
    assert duplicates(messages) == []
    assert "base=celery.beat:PersistentScheduler" in logs
    shelves = {p.name.split(".")[0] for p in tmp_path.glob("beat-*.schedule*")}
    assert shelves == {"beat-0", "beat-1", "beat-2"}  # one shelve file each
    for entry, slots in slots_by_entry(messages).items():
        times = sorted(datetime.fromisoformat(s) for s in slots)
        gaps = [(a, b) for a, b in itertools.pairwise(times)
                if b - a != timedelta(seconds=1)]
        assert gaps == [], f"{entry} missed or repeated a slot across the kill"


# -- django-celery-beat rows as slots (no database needed) --------------------------------------

def test_cron_strings_become_crontab_rows_only_when_a_crontab_means_the_same():
    pytest.importorskip("django_celery_beat")
    from zoneinfo import ZoneInfo

    from celery_leaderbeat.integrations.django import as_crontab
    from celery_leaderbeat.timing.schedules import cron

    berlin = ZoneInfo("Europe/Berlin")
    row = as_crontab("r", cron("*/15 9-17 * * mon-fri"), berlin)
    assert (row._orig_minute, row._orig_hour, row._orig_day_of_week) == ("*/15", "9-17", "mon-fri")
    assert row.tz is berlin
    assert as_crontab("s", cron("0 9 * * 1-7"), berlin).day_of_week == set(range(7))
    assert as_crontab("d", cron("@daily", tz="UTC"), berlin).tz == ZoneInfo("UTC")
    for expr, why in [("*/10 * * * * *", "seconds field"), ("H 3 * * *", "uses H"),
                      ("0 12 13 * 5", "both day fields are restricted")]:
        with pytest.raises(ConfigurationError) as caught:
            as_crontab("bad", cron(expr, name="bad"), berlin)
        (problem,) = caught.value.problems
        assert problem.startswith(f"beat_schedule entry 'bad': cron string {expr!r} cannot be "
                                  "stored as a django-celery-beat crontab row")
        assert why in problem


def test_a_crontab_row_keeps_its_own_time_zone_and_a_one_off_has_one_slot_after_its_save():
    pytest.importorskip("django_celery_beat")
    from zoneinfo import ZoneInfo

    from django_celery_beat.tzcrontab import TzAwareCrontab

    from celery_leaderbeat.integrations.django import Bounded

    nine = TzAwareCrontab(minute="0", hour="9", tz=ZoneInfo("Asia/Tokyo"))
    clock = Bounded(nine, tz=nine.tz, start=None, end=None, once=False,
                    origin=None).leaderbeat_clock(name="r", tz=UTC, jitter=None)
    assert clock.next_after(T0 - timedelta(hours=1)) == T0  # 09:00 in Tokyo, not in UTC
    every = timedelta(seconds=2)
    saved = T0 + timedelta(milliseconds=250)
    once = Bounded(__import__("celery").schedules.schedule(every), tz=None, start=None, end=None,
                   once=True, origin=saved)
    clock = once.leaderbeat_clock(name="o", tz=UTC, jitter=None)
    first = clock.next_after(T0)
    assert first == saved + every  # the same on every node, whenever a leader first sees it
    assert clock.next_after(first - timedelta(milliseconds=1)) == first  # its anchor
    assert clock.next_after(first) == NEVER


def test_a_saved_row_restarts_at_its_next_slot_and_an_interval_keeps_its_phase():
    pytest.importorskip("django_celery_beat")
    from celery.schedules import crontab, schedule

    from celery_leaderbeat.integrations.django import Bounded

    last = T0  # the last slot stored for the row, before it was disabled
    saved = T0 + timedelta(seconds=95)  # re-enabled then
    row = Bounded(schedule(timedelta(seconds=60)), tz=None, start=None, end=None, once=False,
                  origin=None, restart=saved)
    clock = row.leaderbeat_clock(name="r", tz=UTC, jitter=None)
    # T0 + 60 fell while it was disabled: not replayed; T0 + 120 is on the same grid
    assert clock.next_after(last) == T0 + timedelta(seconds=120)
    assert clock.next_after(T0 + timedelta(seconds=120)) == T0 + timedelta(seconds=180)
    minutely = Bounded(crontab(), tz=None, start=None, end=None, once=False, origin=None,
                       restart=saved).leaderbeat_clock(name="c", tz=UTC, jitter=None)
    assert minutely.next_after(last) == T0 + timedelta(seconds=120)
    # a save with nothing pending changes nothing
    assert clock.next_after(T0 + timedelta(seconds=100)) == T0 + timedelta(seconds=160)
