"""``celery leaderbeat entries | add | edit | remove | enable | disable`` in-process, real Redis."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_leaderbeat import Entry
from celery_leaderbeat.ops.cli import leaderbeat

TASK = "proj.tasks.report"


@pytest.fixture
def app(shared_redis, key_prefix):
    app = Celery("proj")
    app.conf.update(leaderbeat_redis_url=shared_redis.url, leaderbeat_key_prefix=key_prefix,
                    beat_schedule={"nightly": {"task": TASK, "schedule": 3600}}, timezone="UTC")
    return app


@pytest.fixture
def run(app):
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(leaderbeat, list(args), obj=SimpleNamespace(app=app),
                             catch_exceptions=False)
    return run


def test_add_edit_disable_enable_remove_round_trip_through_the_store(app, run):
    added = run("add", "report-42", TASK, "*/5 * * * *", "--kwargs", '{"customer": 42}',
                "--queue", "reports", "--tz", "Europe/Berlin", "--catchup", "all")
    assert added.exit_code == 0, added.output
    assert "added report-42" in added.output and "cron '*/5 * * * *'" in added.output
    entry = Entry.get(app, "report-42")
    assert entry.kwargs == {"customer": 42} and entry.options == {"queue": "reports"}
    assert entry.leaderbeat == {"catchup": "all", "tz": "Europe/Berlin"}

    edited = run("edit", "report-42", "--schedule", "90", "--args", "[1, 2]")
    assert edited.exit_code == 0 and "changed report-42" in edited.output
    entry = Entry.get(app, "report-42")
    assert (entry.schedule.total_seconds(), entry.args, entry.kwargs) == (90, [1, 2],
                                                                          {"customer": 42})
    assert "unchanged" in run("edit", "report-42", "--args", "[1, 2]").output

    assert run("disable", "report-42").exit_code == 0
    assert Entry.get(app, "report-42").enabled is False
    listed = json.loads(run("entries", "--json").output)
    assert [(r["entry"], r["enabled"], r["schedule"]) for r in listed] == [
        ("report-42", False, "every 90s")]
    assert run("enable", "report-42").exit_code == 0
    assert Entry.get(app, "report-42").enabled is True

    assert run("remove", "report-42").output == "removed report-42\n"
    assert Entry.all(app) == []


def test_a_one_off_entry_is_added_with_at(app, run):
    result = run("add", "once", TASK, "--at", "2030-01-05T09:00:00+01:00")
    assert result.exit_code == 0, result.output
    assert "once at 2030-01-05T09:00:00+01:00" in result.output
    assert Entry.get(app, "once").at == datetime(2030, 1, 5, 8, tzinfo=timezone.utc)
    assert run("add", "naive", TASK, "--at", "2030-01-05T09:00").exit_code == 64
    assert run("add", "both", TASK, "60", "--at", "2030-01-05T09:00+00:00").exit_code == 64
    zulu = run("add", "zulu", TASK, "--at", "2030-01-05T08:00:00.250Z")
    assert zulu.exit_code == 0, zulu.output
    assert Entry.get(app, "zulu").at == datetime(2030, 1, 5, 8, 0, 0, 250_000, timezone.utc)


def test_errors_are_one_line_with_the_usual_exit_codes(app, run):
    bad = run("add", "bad", TASK, "61 * * * *")
    assert bad.exit_code == 65 and "entry 'bad'" in bad.output and "61" in bad.output
    assert Entry.get(app, "bad") is None
    static = run("add", "nightly", TASK, "60")
    assert static.exit_code == 65 and "static beat_schedule entry" in static.output
    assert run("add", "x", TASK, "60").exit_code == 0
    exists = run("add", "x", TASK, "30")
    assert exists.exit_code == 65 and "runtime entry 'x' exists" in exists.output
    for command in ("enable", "remove", "disable"):
        unknown = run(command, "nope")
        assert unknown.exit_code == 65, unknown.output
        assert "no entry 'nope' among the runtime entries" in unknown.output
    unknown = run("edit", "nope", "--queue", "q")
    assert unknown.exit_code == 65 and "no entry 'nope'" in unknown.output
    assert run("add", "y", TASK, "60", "--kwargs", "[1]").exit_code == 64


def test_status_shows_where_each_entry_comes_from(app, run):
    run("add", "dyn", TASK, "60")
    run("add", "off", TASK, "60")
    run("disable", "off")
    rows = {r["entry"]: r for r in json.loads(run("status", "--json").output)["entries"]}
    assert rows["nightly"]["source"] == "static"
    assert rows["dyn"]["source"] == "dynamic" and rows["dyn"]["next_due"]
    # disabled and never ran: its first slot state (its anchor) only, no run
    assert rows["off"]["source"] == "dynamic (disabled)" and rows["off"]["task_id"] is None
    assert rows["off"]["state"] == rows["dyn"]["state"] != "sent"
    plain = run("status").output
    assert "dyn" in plain and "dynamic" in plain and "static" in plain


def test_reset_keeps_the_entries_defined_at_run_time(app, run):
    run("add", "dyn", TASK, "60")
    assert run("reset", "--yes").exit_code == 0
    assert [e.name for e in Entry.all(app)] == ["dyn"]
