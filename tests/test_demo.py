"""The failover demo, run as a user runs it: ``python -m celery_leaderbeat.demo``.

Each test starts the demo as a real subprocess (it starts its own Redis, worker
and beats) and checks what it promises: the scenario runs, no slot runs twice,
and no process it started outlives it, also when it is interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO = [sys.executable, "-m", "celery_leaderbeat.demo", "--quick", "--json"]


def assert_all_gone(pids: list[int]) -> None:
    """Every pid is gone: signal 0 finds no such process."""
    assert pids, "the demo reported no pid it started"
    left = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        left.append(pid)
    assert left == [], f"processes the demo started are still running: {left}"


def run_demo(directory: Path, timeout: float = 120, *args: str,
             **env: str) -> subprocess.CompletedProcess[str]:
    """Run the quick demo to its end; on a timeout, stop it the way a user would (SIGTERM).

    SIGKILL would leave the demo's children running (each has its own session), so it
    only comes after the demo has had time to clean up.
    """
    demo = start_demo(directory, subprocess.PIPE, *args, **env)
    try:
        stdout, stderr = demo.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        demo.terminate()
        try:
            stdout, stderr = demo.communicate(timeout=30)
        finally:
            demo.kill()
        pytest.fail(f"the demo did not finish within {timeout} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess([*DEMO, *args], demo.returncode, stdout, stderr)


def start_demo(directory: Path, stderr: Any, *args: str, **more: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p), **more)
    return subprocess.Popen([*DEMO, *args], cwd=directory, env=env, stdout=subprocess.PIPE,
                            stderr=stderr, text=True)


def last_json_line(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "the demo printed nothing on stdout"
    return json.loads(lines[-1])


@pytest.mark.xdist_group("heavy")  # CPU-heavy: never beside another heavy test
def test_quick_demo_fails_over_twice_without_a_duplicate_and_leaves_nothing_behind(
        tmp_path: Path) -> None:
    done = run_demo(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = last_json_line(done.stdout)
    assert summary["duplicates"] == 0, summary["duplicate_slots"]
    assert summary["executed"] > 0
    assert [f["signal"] for f in summary["failovers"]] == ["SIGKILL", "SIGTERM"]
    for failover in summary["failovers"]:
        assert failover["new_leader_beat"] not in (None, failover["beat"]), failover
        assert failover["first_send_by_another_beat_after_s"] is not None, failover
    assert summary["left_running"] == []
    assert_all_gone(summary["pids"])
    assert not Path(summary["temp_dir"]).exists(), "the temporary directory was not removed"


@pytest.mark.xdist_group("heavy")
def test_quick_demo_on_postgresql_fails_over_twice_without_a_duplicate_and_leaves_nothing(
        tmp_path: Path) -> None:
    from celery_leaderbeat.demo.postgres import find_bindir
    from celery_leaderbeat.demo.procs import DemoError

    try:
        find_bindir()
    except DemoError as exc:
        pytest.skip(str(exc))
    # the filesystem transport: the broker a machine without RabbitMQ (or Redis) gets
    done = run_demo(tmp_path, 150, "--store", "postgres",
                    LEADERBEAT_DEMO_BROKER="filesystem://")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = last_json_line(done.stdout)
    assert summary["store"] == "postgres" and "filesystem transport" in summary["broker"]
    assert "postgres /" in done.stderr and "redis-server" not in done.stderr
    assert summary["duplicates"] == 0, summary["duplicate_slots"]
    assert summary["executed"] > 0
    assert [f["signal"] for f in summary["failovers"]] == ["SIGKILL", "SIGTERM"]
    for failover in summary["failovers"]:
        assert failover["new_leader_beat"] not in (None, failover["beat"]), failover
        assert failover["first_send_by_another_beat_after_s"] is not None, failover
    assert summary["left_running"] == []
    assert len(summary["pids"]) == 5  # postgres, the worker, three beats
    assert_all_gone(summary["pids"])
    assert not Path(summary["temp_dir"]).exists(), "the cluster's directory was not removed"


def test_the_postgresql_demo_without_server_binaries_exits_2_saying_what_to_install(
        tmp_path: Path) -> None:
    done = run_demo(tmp_path, 60, "--store", "postgres",
                    LEADERBEAT_PG_BINDIR=str(tmp_path / "no-such-bin"))
    assert done.returncode == 2, (done.stdout, done.stderr[-3000:])
    summary = last_json_line(done.stdout)
    assert "apt-get install postgresql" in summary["error"]
    assert "LEADERBEAT_PG_BINDIR" in summary["error"]
    assert summary["pids"] == [] and summary["left_running"] == []


def test_sigint_stops_the_demo_promptly_and_leaves_no_process(tmp_path: Path) -> None:
    log = tmp_path / "demo.stderr"
    with open(log, "wb") as err:
        demo = start_demo(tmp_path, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while "elected leader" not in log.read_text(errors="replace"):
            assert demo.poll() is None, f"the demo exited early:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no leader elected:\n{log.read_text()}"
            time.sleep(0.1)
        time.sleep(2)  # a few seconds in: tasks are running
        sent = time.monotonic()
        demo.send_signal(signal.SIGINT)
        stdout, _ = demo.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if demo.poll() is None:  # SIGINT did not work: SIGTERM, then no mercy
            demo.terminate()
            try:
                demo.wait(30)
            finally:
                demo.kill()
    assert demo.returncode == 128 + signal.SIGINT
    assert took < 10, f"the demo took {took:.1f} s to stop after SIGINT"
    summary = last_json_line(stdout)
    assert summary["interrupted"] == "SIGINT"
    assert len(summary["pids"]) == 5  # redis, the worker, three beats
    assert_all_gone(summary["pids"])
    assert not Path(summary["temp_dir"]).exists(), "the temporary directory was not removed"
