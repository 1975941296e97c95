"""What a user or a probe meets at ``celery leaderbeat``: exit codes, messages, output.

In-process through click's CliRunner against a real Redis server; the exit codes that
matter to a probe also through a real ``celery -A ... leaderbeat`` process
(:mod:`tests.test_cli_process`).
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_leaderbeat import __version__
from celery_leaderbeat.config import Config
from celery_leaderbeat.ops.cli import leaderbeat
from celery_leaderbeat.ops.cli_types import Moment
from celery_leaderbeat.ops.cluster import Cluster
from celery_leaderbeat.store.keys import Keys
from tests.support.redis_binary import free_port as unused_port

TASK = "proj.tasks.report"
#: a time printed with a fraction of a second
FRACTION = re.compile(r"\d\d:\d\d:\d\d[.,]\d")


@pytest.fixture
def app(shared_redis, key_prefix):
    app = Celery("proj")
    app.conf.update(leaderbeat_redis_url=shared_redis.url, leaderbeat_key_prefix=key_prefix,
                    beat_schedule={"nightly": {"task": TASK, "schedule": 3600},
                                   "minutely": {"task": TASK, "schedule": "* * * * *"}},
                    timezone="UTC")
    return app


@pytest.fixture
def free_port() -> int:
    """A local port nothing listens on: connections to it are refused."""
    return unused_port()


@pytest.fixture
def run(app):
    def run(*args: str, no_color: bool = False, color: bool = False):
        return CliRunner().invoke(leaderbeat, list(args), color=color,
                                  obj=SimpleNamespace(app=app, no_color=no_color),
                                  catch_exceptions=False)
    return run


# -- usage errors: 64, never a "Redis unreachable" ----------------------------------------


def test_a_bad_option_value_is_a_usage_error_64_naming_the_option(run):
    negative = run("history", "-n", "-3")
    assert negative.exit_code == 64, negative.output
    assert "-n" in negative.output and "-3" in negative.output
    assert "unreachable" not in negative.output
    assert run("nope-command").exit_code == 64
    mars = run("add", "x", TASK, "60", "--tz", "Mars/Olympus")
    assert mars.exit_code == 64
    assert "--tz" in mars.output and "'Mars/Olympus' is not an IANA time zone" in mars.output
    catchup = run("add", "x", TASK, "60", "--catchup", "sometimes")
    assert catchup.exit_code == 64 and "--catchup" in catchup.output
    assert "'latest'" in catchup.output and "'skip'" in catchup.output
    assert run("backfill", "nightly", "--from", "yesterday", "--to", "now").exit_code == 64
    assert run("backfill", "nightly", "--from", "2026-01-01T00:00Z", "--to",
               "2026-01-02T00:00Z", "--max", "0").exit_code == 64
    assert run("step-down", "--wait", "-1").exit_code == 64
    assert run("add", "x", TASK, "0").exit_code == 64


def test_a_mistyped_command_gets_a_did_you_mean(run):
    typo = run("histroy")
    assert typo.exit_code == 64 and "Did you mean 'history'?" in typo.output


def test_backfill_refuses_a_from_later_than_its_to(run):
    done = run("backfill", "nightly", "--from", "2026-12-02T00:00:00Z",
               "--to", "2026-12-01T00:00:00Z", "--yes")
    assert done.exit_code == 64, done.output
    assert "--from 2026-12-02T00:00:00+00:00 is after --to 2026-12-01T00:00:00+00:00" in \
        done.output


@pytest.mark.parametrize(("text", "through", "expected"), [
    ("2026-12-01T04:00:00Z", False, datetime(2026, 12, 1, 4, tzinfo=timezone.utc)),
    ("2026-12-01T05:00+0100", False, datetime(2026, 12, 1, 4, tzinfo=timezone.utc)),
    ("2026-12-01 04:00", False, datetime(2026, 12, 1, 4, tzinfo=timezone.utc)),
    ("2026-12-01T04:00:00.25Z", False,
     datetime(2026, 12, 1, 4, 0, 0, 250_000, timezone.utc)),
    # the end of a range given to the second covers that whole second
    ("2026-12-01T04:00:00Z", True, datetime(2026, 12, 1, 4, 0, 0, 999_999, timezone.utc)),
    ("2026-12-01T04:00:00.250Z", True, datetime(2026, 12, 1, 4, 0, 0, 250_000, timezone.utc)),
])
def test_the_datetime_option_takes_z_offsets_and_fractions(text, through, expected):
    assert Moment(through=through).convert(text, None, None) == expected


def test_add_and_edit_take_an_overlap_policy_or_its_kubernetes_alias(run, app):
    from celery_leaderbeat import Entry

    assert run("add", "x", TASK, "60", "--overlap", "Forbid").exit_code == 0
    assert Entry.get(app, "x").leaderbeat["overlap"] == "skip"
    assert run("edit", "x", "--overlap", "buffer_all").exit_code == 0
    assert Entry.get(app, "x").leaderbeat["overlap"] == "buffer_all"
    bad = run("edit", "x", "--overlap", "sometimes")
    assert bad.exit_code == 64 and "--overlap" in bad.output and "sometimes" in bad.output
    assert Entry.get(app, "x").leaderbeat["overlap"] == "buffer_all"


def test_edit_with_nothing_to_change_is_a_usage_error(run):
    assert run("add", "x", TASK, "60").exit_code == 0
    done = run("edit", "x")
    assert done.exit_code == 64 and "nothing to change" in done.output
    assert "--schedule" in done.output and "--queue" in done.output


def test_a_missing_yes_is_a_usage_error(run):
    done = run("reset")
    assert done.exit_code == 64 and "--yes" in done.output


# -- data errors: 65, with the nearest names ----------------------------------------------


def test_an_unknown_entry_is_65_with_a_did_you_mean(run):
    done = run("pause", "nightlly")
    assert done.exit_code == 65, done.output
    assert "no entry 'nightlly'" in done.output and "did you mean 'nightly'?" in done.output
    assert run("add", "report-42", TASK, "60").exit_code == 0
    runtime = run("enable", "reprot-42")
    assert runtime.exit_code == 65
    assert "among the runtime entries" in runtime.output
    assert "did you mean 'report-42'?" in runtime.output


def test_a_beat_schedule_name_given_to_a_runtime_command_says_what_it_is(run):
    done = run("disable", "nightly")
    assert done.exit_code == 65
    assert "it is a beat_schedule entry" in done.output


def test_backfill_of_a_runtime_entry_says_it_is_a_runtime_entry(run):
    assert run("add", "dyn", TASK, "60").exit_code == 0
    done = run("backfill", "dyn", "--from", "2026-01-01T00:00Z", "--to", "2026-01-01T01:00Z")
    assert done.exit_code == 65, done.output
    assert "'dyn' is a runtime entry" in done.output
    assert "beat_schedule" in done.output


# -- configuration: 78, with the nearest setting -----------------------------------------


def test_a_mistyped_setting_is_78_with_a_did_you_mean_not_every_name(app, run):
    app.conf.leaderbeat_lease_tll = 10
    done = run("status")
    assert done.exit_code == 78, done.output
    assert "leaderbeat_lease_tll is not a setting" in done.output
    assert "did you mean 'leaderbeat_lease_ttl'?" in done.output
    assert "leaderbeat_history_length" not in done.output


# -- unavailable: 69 ----------------------------------------------------------------------


def test_an_unreachable_store_is_69(app, run, free_port):
    app.conf.leaderbeat_redis_url = f"redis://127.0.0.1:{free_port}/0"
    for args in (["health"], ["status"], ["pause", "nightly"]):
        done = run(*args)
        assert done.exit_code == 69, (args, done.output)
        assert "Redis unreachable" in done.output


# -- --json: errors as JSON too ------------------------------------------------------------


def test_json_errors_are_json_on_stdout_with_the_exit_code(app, run, free_port):
    unknown = run("pause", "nope", "--json")
    assert unknown.exit_code == 65
    error = json.loads(unknown.stdout)["error"]
    assert error["code"] == 65 and error["kind"] == "data" and "'nope'" in error["message"]
    usage = run("history", "-n", "0", "--json")
    assert usage.exit_code == 64
    assert json.loads(usage.stdout)["error"]["kind"] == "usage"
    app.conf.leaderbeat_redis_url = f"redis://127.0.0.1:{free_port}/0"
    down = run("health", "--json")
    assert down.exit_code == 69
    assert json.loads(down.stdout)["error"]["kind"] == "unavailable"


# -- what a user reads --------------------------------------------------------------------


def test_version_says_the_package_version(run):
    done = run("--version")
    assert done.exit_code == 0 and done.output.strip() == f"celery-leaderbeat {__version__}"


def test_help_documents_the_exit_codes(run):
    done = run("--help")
    for code in ("64  usage", "65  data", "69  unavailable", "78  configuration"):
        assert code in done.output
    assert "Exit codes:" in run("health", "--help").output


def test_tables_fit_long_names_and_show_whole_seconds(app, run):
    long_name = "a-rather-long-runtime-entry-name-for-reports-of-customer-42"
    assert run("add", long_name, TASK, "*/5 * * * *").exit_code == 0
    assert run("pause", "nightly", "--note", "deploy").exit_code == 0
    lines = run("status").output.splitlines()
    header = next(line for line in lines if line.startswith("entry"))
    row = next(line for line in lines if line.startswith(long_name))
    # every column starts where its header does, however long the name
    assert row.index("dynamic") == header.index("source")
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert nightly.index("static") == header.index("source")
    assert not FRACTION.search(run("status").output)
    history = run("history").output
    assert "paused" in history and not FRACTION.search(history), history
    listed = run("entries").output.splitlines()
    assert listed[1].startswith(long_name + "  ")


def test_trigger_says_plainly_when_no_leader_holds_the_lease(run):
    done = run("trigger", "nightly")
    assert done.exit_code == 0, done.output
    assert "no beat holds the lease now: the request waits in the queue until a leader " \
           "takes it" in done.output
    assert "within a second" not in done.output
    assert json.loads(run("trigger", "nightly", "--json").output)["leader"] is None


def test_backfill_says_plainly_when_no_leader_holds_the_lease(run):
    assert run("pause", "nightly").exit_code == 0  # a history event: the horizon is now
    start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=2)
    done = run("backfill", "minutely", "--from", start.isoformat().replace("+00:00", "Z"),
               "--to", (start + timedelta(minutes=3)).isoformat(), "--yes", "--json")
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert data["leader"] is None and len(data["to_send"]) == 3
    plain = run("backfill", "minutely", "--from", start.isoformat(), "--to",
                (start + timedelta(minutes=3)).isoformat(), "--yes")
    assert "waits in the queue until a leader takes it" in plain.output


def test_no_color_is_honoured(run):
    coloured = run("pause", "nope", color=True)
    assert "\x1b[" in coloured.output
    plain = run("pause", "nope", color=True, no_color=True)
    assert "\x1b[" not in plain.output and plain.output.startswith("leaderbeat: ")
    assert "\x1b[" not in run("status", color=True, no_color=True).output


# -- reading never deletes ------------------------------------------------------------------


def test_nodes_only_reads_a_long_gone_node_stays_in_the_registry(app, run):
    config = Config.from_app(app)
    client = Cluster(app).store.client
    old = {"host": "h", "pid": 1, "role": "standby", "last_seen": time.time() - 7200}
    client.hset(Keys(config.key_prefix).nodes, "old-node", json.dumps(old))
    rows = json.loads(run("nodes", "--json").output)
    assert [(r["node"], r["gone"]) for r in rows] == [("old-node", True)]
    assert client.hexists(Keys(config.key_prefix).nodes, "old-node")
