"""``celery worker -B`` on every worker: each slot still runs exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.support.beat import REPO_ROOT, beat_env

pytestmark = pytest.mark.slow

RECORD = "tests.support.beatapp.record"


def start_worker(env: dict, name: str, log_path) -> subprocess.Popen:
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.support.beatapp", "worker", "-B",
         "--scheduler", "celery_leaderbeat.Scheduler", "--pool=solo", "-n", f"{name}@%h",
         "--loglevel=INFO", "-s", str(log_path.with_suffix(".schedule"))],
        cwd=REPO_ROOT, env=full_env, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT,
        start_new_session=True)


def executed(client) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange("executed", 0, -1)]


def wait_for_runs(client, count: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(rows := executed(client)) < count:
        assert time.monotonic() < deadline, f"only {len(rows)} of {count} runs in {timeout}s"
        time.sleep(0.1)
    return rows


def test_two_workers_with_embedded_beat_run_each_slot_once_even_when_one_dies(
        tmp_path, make_redis_server, key_prefix):
    state, broker, results = make_redis_server(), make_redis_server(), make_redis_server()
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule={f"r{i}": {"task": RECORD, "every": 1} for i in range(3)},
                   settings={"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 1,
                             "leaderbeat_standby_poll": 0.5})
    env["LB_RECORD_URL"] = results.url
    client = results.client()
    workers = [start_worker(env, f"w{i}", tmp_path / f"worker-{i}.log") for i in range(2)]
    try:
        wait_for_runs(client, 3 * 4, timeout=60)
        token = state.client().get("{" + key_prefix + "}:leader").decode()
        leader_group = os.getpgid(int(token.split("|")[0].split(":")[-2]))
        leader = next(w for w in workers if w.pid == leader_group)
        os.killpg(leader.pid, signal.SIGKILL)  # the whole worker: its beat child too
        seen = len(executed(client))
        wait_for_runs(client, seen + 3 * 5, timeout=30)
        assert all(w.poll() is None for w in workers if w is not leader)
    finally:
        for worker in workers:
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            worker.wait(10)
    rows = executed(client)
    counts = Counter((r["entry"], r["slot"]) for r in rows)
    assert all(entry and slot for entry, slot in counts), rows[:3]
    assert [pair for pair, n in counts.items() if n > 1] == []
