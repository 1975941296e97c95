"""``celery leaderbeat status | nodes | history | health`` against a real beat and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest

from celery_leaderbeat.timing.slots import slot_id
from tests.support.beat import NOOP, REPO_ROOT, BeatProcess, Recorder, beat_env

pytestmark = pytest.mark.slow


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.support.beatapp",
                           "leaderbeat", *args], cwd=REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_cli_reports_leader_entries_nodes_history_and_health(
        tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule={"tick": {"task": NOOP, "every": 1},
                             "cron2": {"task": NOOP, "cron": "*/2 * * * * *"}},
                   settings={"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 1})
    no_leader = cli(env, "health")
    assert no_leader.returncode == 1 and "NO LEADER" in no_leader.stdout
    with BeatProcess(env=env, log_path=tmp_path / "beat.log") as beat:
        Recorder(broker.client()).wait_for(3, timeout=20)
        health = cli(env, "health", "--json")
        assert health.returncode == 0, health.stderr
        leader = json.loads(health.stdout)["leader"]
        assert leader["node"].split(":")[-2] == str(beat.pid) and leader["epoch"] == 1

        status = json.loads(cli(env, "status", "--json").stdout)
        rows = {row["entry"]: row for row in status["entries"]}
        # celery.backend_cleanup is installed as stock beat does (result_expires is set)
        assert set(rows) == {"tick", "cron2", "celery.backend_cleanup"}
        tick = rows["tick"]
        last = datetime.fromisoformat(tick["last_slot"])
        assert tick["task_id"] == slot_id(key_prefix, "tick", last)
        assert datetime.fromisoformat(tick["next_due"]) > last
        assert "leader" in cli(env, "status").stdout

        nodes = json.loads(cli(env, "nodes", "--json").stdout)
        assert [(n["role"], n["pid"]) for n in nodes] == [("leader", beat.pid)]
        assert abs(nodes[0]["clock_skew"]) < 1.0

        events = [row["event"] for row in json.loads(cli(env, "history", "--json").stdout)]
        assert events[0] == "elected" and "sent" in events
        plain = cli(env, "history", "-n", "200").stdout
        assert "elected" in plain and "tick" in plain
        assert beat.term() == 0
    assert cli(env, "health").returncode == 1, "a released lease leaves no leader"
    state.kill()
    down = cli(env, "health")
    assert down.returncode == 69 and "unreachable" in down.stderr
