"""``import-redbeat`` against a real RedBeat beat that ran for a while, then leaderbeat on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from celery import Celery
from celery.schedules import crontab, schedule
from click.testing import CliRunner

from celery_leaderbeat import Entry
from celery_leaderbeat.ops.cli import leaderbeat
from celery_leaderbeat.scheduler import LEADER, Scheduler
from tests.support.beat import Recorder
from tests.test_scheduler import make_app

pytestmark = pytest.mark.slow
# a real RedBeat beat needs celery-redbeat (the bench extra; .ci/run installs it): without
# it this is skipped, and fails under CI=true
if os.environ.get("CI") == "true":
    import redbeat
else:
    redbeat = pytest.importorskip("redbeat")

REDBEAT_APP = textwrap.dedent("""
    import os
    from celery import Celery

    app = Celery("rb", broker=os.environ["RB_BROKER"])
    app.conf.update(redbeat_redis_url=os.environ["RB_REDIS"], timezone="UTC",
                    redbeat_key_prefix=os.environ["RB_PREFIX"])
""")


def redbeat_app(state_url: str, broker_url: str, prefix: str) -> Celery:
    app = Celery("rb", broker=broker_url)
    app.conf.update(redbeat_redis_url=state_url, redbeat_key_prefix=prefix, timezone="UTC")
    return app


def test_import_keeps_redbeats_phase_and_nothing_runs_twice_across_the_switch(
        tmp_path, make_redis_server, key_prefix):
    RedBeatSchedulerEntry = redbeat.RedBeatSchedulerEntry

    state, broker = make_redis_server(), make_redis_server()
    rb_prefix = f"rb-{key_prefix}:"
    rb = redbeat_app(state.url, broker.url, rb_prefix)
    RedBeatSchedulerEntry("every2", "proj.every2", schedule(timedelta(seconds=2)), app=rb,
                          kwargs={"k": 1}).save()
    RedBeatSchedulerEntry("hourly", "proj.hourly", crontab(minute="7"), app=rb).save()
    RedBeatSchedulerEntry("off", "proj.off", schedule(timedelta(seconds=5)), app=rb,
                          enabled=False).save()
    (tmp_path / "rbapp.py").write_text(REDBEAT_APP)
    # a Django test module imported earlier in this process may have set
    # DJANGO_SETTINGS_MODULE (tests.support.djangosite): RedBeat's app is not Django's
    inherited = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env = {**inherited, "PYTHONPATH": str(tmp_path), "RB_BROKER": broker.url,
           "RB_REDIS": state.url, "RB_PREFIX": rb_prefix}
    log = open(tmp_path / "redbeat.log", "w")  # noqa: SIM115 - closed below
    beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "rbapp", "beat", "-S",
                             "redbeat.RedBeatScheduler", "--loglevel", "INFO"],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    recorder = Recorder(broker.client())
    try:
        recorder.wait_for(3, timeout=30, task="proj.every2")  # RedBeat ran it three times
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(30)
        log.close()
    redbeat_runs = len(recorder.drain_all())
    last_run = RedBeatSchedulerEntry.from_key(f"{rb_prefix}every2", app=rb).last_run_at

    app = make_app(state.url, broker.url, key_prefix, {})
    app.conf.update(redbeat_redis_url=state.url, redbeat_key_prefix=rb_prefix)
    runner = CliRunner()
    dry = runner.invoke(leaderbeat, ["import-redbeat"], obj=SimpleNamespace(app=app))
    assert dry.exit_code == 0, dry.output
    assert "import  every2: proj.every2 every 2s; phase from last run" in dry.output
    assert "import  off: proj.off every 5s (disabled)" in dry.output
    assert "skip    celery.backend_cleanup: Celery's own entry" in dry.output
    assert "3 of 4 entries would be imported" in dry.output
    assert Entry.all(app) == []  # without --yes nothing is written

    done = runner.invoke(leaderbeat, ["import-redbeat", "--yes", "--json"],
                         obj=SimpleNamespace(app=app))
    assert json.loads(done.output)["imported"] == 3
    entries = {e.name: e for e in Entry.all(app)}
    assert entries["every2"].anchor == last_run.replace(
        microsecond=last_run.microsecond // 1000 * 1000)
    assert entries["every2"].kwargs == {"k": 1}
    assert entries["hourly"].schedule == crontab(minute="7")
    assert entries["off"].enabled is False
    again = runner.invoke(leaderbeat, ["import-redbeat", "--yes", "--json"],
                          obj=SimpleNamespace(app=app))
    assert json.loads(again.output)["already"] == 3  # a second import changes nothing

    scheduler = Scheduler(app=app)
    try:
        deadline = time.monotonic() + 20
        while len(recorder.drain_all()) < redbeat_runs + 2:
            assert time.monotonic() < deadline, "leaderbeat sent too little"
            time.sleep(min(scheduler.tick(), 0.05))
        assert scheduler.role == LEADER
    finally:
        scheduler.close()
    ours = [m for m in recorder.messages[redbeat_runs:] if m.task == "proj.every2"]
    anchor = entries["every2"].anchor
    from datetime import datetime

    slots = [datetime.fromisoformat(m.slot) for m in ours]
    assert slots and all(s > anchor for s in slots), "a slot RedBeat ran was sent again"
    assert all((s - anchor) % timedelta(seconds=2) == timedelta(0) for s in slots), \
        "leaderbeat did not keep RedBeat's phase"
    assert not [m for m in recorder.messages[redbeat_runs:] if m.task == "proj.off"]
