"""What users' tooling relies on: the per-send log line, Celery's beat_* settings, versions."""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_leaderbeat import config as config_module
from celery_leaderbeat.config import Config, celery_version_notes
from celery_leaderbeat.entries import split_entries
from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.timing.slots import clock_for, plan
from tests.support.beat import NOOP

UTC = timezone.utc


def app_with(**settings) -> Celery:
    app = Celery("proj")
    app.conf.update({"broker_url": "redis://127.0.0.1:1/0", "timezone": "UTC", **settings})
    return app


@pytest.fixture(autouse=True)
def fresh_notes():
    config_module._SAID.clear()  # each test sees its start-up warnings as a new process would
    yield
    config_module._SAID.clear()


def sends_said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celery_leaderbeat.sends"]


def test_every_send_is_logged_at_info_in_stock_beats_words_with_its_slot(
        make_redis_server, key_prefix, caplog):
    state, broker = make_redis_server(), make_redis_server()
    app = app_with(broker_url=broker.url, leaderbeat_redis_url=state.url,
                   leaderbeat_key_prefix=key_prefix,
                   beat_schedule={"report": {"task": NOOP, "schedule": 0.5}})
    scheduler = Scheduler(app=app)
    try:
        with caplog.at_level(logging.INFO, logger="celery_leaderbeat"):
            deadline = time.monotonic() + 10
            while len(sends_said(caplog)) < 2 and time.monotonic() < deadline:
                time.sleep(min(scheduler.tick(), 0.2))
    finally:
        scheduler.close()
    said = sends_said(caplog)
    assert len(said) >= 2, said
    prefix = f"Scheduler: Sending due task report ({NOOP}) for slot "
    assert said[0].startswith(prefix), said[0]
    slot = datetime.fromisoformat(said[0][len(prefix):])
    assert slot.tzinfo is not None and slot.microsecond % 1000 == 0
    summary = [r.getMessage() for r in caplog.records if "sent 1 slot(s)" in r.getMessage()]
    assert summary, "the per-tick summary stays"


def test_a_send_at_epoch_zero_the_standby_rescue_says_it_is_a_rescue(
        make_redis_server, key_prefix, caplog):
    state, broker = make_redis_server(), make_redis_server()
    app = app_with(broker_url=broker.url, leaderbeat_redis_url=state.url,
                   leaderbeat_key_prefix=key_prefix,
                   beat_schedule={"report": {"task": NOOP, "schedule": 60.0}})
    scheduler = Scheduler(app=app)
    slot = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    try:
        with caplog.at_level(logging.INFO, logger="celery_leaderbeat.sends"):
            assert scheduler.send_slot("report", slot, 0)
            assert scheduler.send_slot("report", slot, 3, "trigger-id-1")
    finally:
        scheduler.close()
    rescue, requested = sends_said(caplog)
    assert rescue.startswith(f"Scheduler: Sending due task report ({NOOP}) for slot "
                             "2026-12-01T06:00:00+00:00 (rescue")
    assert requested.endswith("(requested, task id trigger-id-1)")


def test_the_sends_logger_can_be_quieted_alone(make_redis_server, key_prefix, caplog):
    state, broker = make_redis_server(), make_redis_server()
    app = app_with(broker_url=broker.url, leaderbeat_redis_url=state.url,
                   leaderbeat_key_prefix=key_prefix,
                   beat_schedule={"report": {"task": NOOP, "schedule": 60.0}})
    scheduler = Scheduler(app=app)
    sends = logging.getLogger("celery_leaderbeat.sends")
    sends.setLevel(logging.WARNING)
    try:
        with caplog.at_level(logging.INFO, logger="celery_leaderbeat"):
            assert scheduler.send_slot("report", datetime(2026, 12, 1, 6, tzinfo=UTC), 1)
    finally:
        sends.setLevel(logging.NOTSET)
        scheduler.close()
    assert sends_said(caplog) == []


def schedule(**extra):
    return {"daily": {"task": NOOP, "schedule": crontab(minute=0), **extra},
            "cronstr": {"task": NOOP, "schedule": "0 * * * *"},
            "every": {"task": NOOP, "schedule": 60.0}}


def test_beat_cron_starting_deadline_is_the_catch_up_window_of_crontab_entries_only():
    config = Config.from_app(app_with(beat_cron_starting_deadline=300))
    _, options = split_entries(schedule(), config)
    assert options["daily"].policy.window == timedelta(seconds=300)
    assert options["cronstr"].policy.window == timedelta(seconds=300)
    assert options["every"].policy.window is None
    assert config.notes == ()


def test_an_entrys_own_catchup_window_wins_over_beat_cron_starting_deadline():
    config = Config.from_app(app_with(beat_cron_starting_deadline=300))
    _, options = split_entries(schedule(leaderbeat={"catchup_window": 7200}), config)
    assert options["daily"].policy.window == timedelta(seconds=7200)


@pytest.mark.parametrize(("deadline", "sent"), [(900, True), (300, False)])
def test_a_missed_crontab_slot_older_than_the_deadline_is_not_sent_as_in_celery(deadline, sent):
    config = Config.from_app(app_with(beat_cron_starting_deadline=deadline))
    entries, options = split_entries(schedule(), config)
    clock = clock_for(entries["daily"]["schedule"], name="daily", tz=UTC, jitter=None)
    now = datetime(2026, 12, 1, 6, 10, tzinfo=UTC)  # 06:00 was missed 10 minutes ago
    decided = plan(clock, last=datetime(2026, 12, 1, 3, 0, tzinfo=UTC), now=now, since=now,
                   policy=options["daily"].policy)
    assert (datetime(2026, 12, 1, 6, 0, tzinfo=UTC) in decided.send) is sent


def test_beat_cron_starting_deadline_beside_leaderbeat_catchup_window_is_named_once(caplog):
    config = Config.from_app(app_with(beat_cron_starting_deadline=300,
                                      leaderbeat_catchup_window=3600))
    with caplog.at_level(logging.WARNING, logger="celery_leaderbeat"):
        _, options = split_entries(schedule(), config)
        split_entries(schedule(), Config.from_app(app_with(beat_cron_starting_deadline=300,
                                                           leaderbeat_catchup_window=3600)))
    said = [r.getMessage() for r in caplog.records if "beat_cron_starting_deadline" in
            r.getMessage()]
    assert len(said) == 1
    assert "leaderbeat_catchup_window=3600" in said[0] and "=300" in said[0]
    assert options["daily"].policy.window == timedelta(seconds=3600)


@pytest.mark.parametrize("value", [-5, 0, "soon", True])
def test_a_bad_beat_cron_starting_deadline_is_refused_naming_it(value):
    with pytest.raises(ConfigurationError, match=r"beat_cron_starting_deadline=.* must be a "
                                                 r"number of seconds > 0"):
        Config.from_app(app_with(beat_cron_starting_deadline=value))


def test_beat_sync_every_and_schedule_filename_are_warned_about_when_nothing_uses_them():
    notes = Config.from_app(app_with(beat_sync_every=10,
                                     beat_schedule_filename="/var/lib/beat.db")).notes
    assert any(n.startswith("beat_sync_every=10 has no effect") for n in notes), notes
    assert any(n.startswith("beat_schedule_filename='/var/lib/beat.db' has no effect")
               for n in notes), notes


def test_beat_sync_every_and_schedule_filename_are_used_by_a_persistent_base_scheduler():
    notes = Config.from_app(app_with(
        beat_sync_every=10, beat_schedule_filename="/var/lib/beat.db",
        leaderbeat_base_scheduler="celery.beat:PersistentScheduler")).notes
    assert notes == ()


def test_a_celery_newer_than_the_tested_one_is_said_at_start_up_and_a_tested_one_is_not():
    newer = celery_version_notes("5.8.0")
    assert len(newer) == 1 and "Celery 5.8.0 is newer" in newer[0] and "(5.7.x)" in newer[0]
    assert celery_version_notes("5.7.3") == [] and celery_version_notes("5.4.0") == []


def test_a_trigger_through_the_python_api_is_sent_by_the_leader_under_the_documented_id(
        make_redis_server, key_prefix):
    from celery_leaderbeat.ops.cluster import Cluster
    from celery_leaderbeat.roles.requests import trigger_task_id
    from tests.support.beat import Recorder

    state, broker = make_redis_server(), make_redis_server()
    app = app_with(broker_url=broker.url, leaderbeat_redis_url=state.url,
                   leaderbeat_key_prefix=key_prefix,
                   beat_schedule={"report": {"task": NOOP, "schedule": 3600.0}})
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        deadline = time.monotonic() + 10
        while scheduler.leading is None and time.monotonic() < deadline:
            time.sleep(min(scheduler.tick(), 0.1))
        cluster = Cluster(app)
        request = cluster.trigger("report", note="docs/api.md")
        expected = trigger_task_id(cluster.config.key_prefix, "report", request.id)
        while time.monotonic() < deadline and expected not in {
                m.id for m in recorder.drain_all()}:
            time.sleep(min(scheduler.tick(), 0.1))
    finally:
        scheduler.close()
    assert expected in {m.id for m in recorder.messages}
    events = [row["event"] for row in cluster.history(50, entry="report")]
    assert "triggered" in events


ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"shared/|issue [0-9]|\(#[0-9]+\)|DESIGN\.md|CELERY_NOTES|STYLE\.md|§|"
                     r"farm-studio")


def test_shipped_text_refers_only_to_files_in_the_repository_and_no_issue_numbers():
    docs = [path for path in sorted((ROOT / "docs").rglob("*"))
            if path.suffix in (".md", ".py") and "_build" not in path.parts]
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *docs, ROOT / "docs" / "build",
             *sorted((ROOT / "celery_leaderbeat").rglob("*.py")),
             *sorted((ROOT / "celery_leaderbeat").rglob("*.lua"))]
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for path in files if path.exists()
            for n, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert hits == []


def test_docs_architecture_names_every_redis_key_the_code_builds():
    from celery_leaderbeat.store.keys import Keys

    keys = Keys("p")
    names = [getattr(keys, n) for n in ("leader", "epoch", "slots", "overtaken", "definitions",
                                        "progress", "generation", "paused", "requests",
                                        "backfilled", "lost", "nodes",
                                        "history", "events", "entries", "entries_meta",
                                        "entries_changed", "entries_removed", "guard_fence")]
    names += [keys.run("<run id>"), keys.alive("<run id>"), keys.overlap("<entry>")]
    names += [keys.overlap_held("<entry>"), keys.waiting("<entry>"), keys.waiting_messages("<entry>"), keys.waiting_entries, keys.overlap_decisions]
    built = {n for n, v in vars(Keys).items() if isinstance(v, property) and n != "tag"}
    built |= {n for n, v in vars(Keys).items() if callable(v) and not n.startswith("_")}
    assert len(names) == len(built), sorted(built)  # a new key is added to this test too
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert [n for n in names if f"`{n}`" not in text] == []
