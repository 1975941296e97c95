"""django-celery-beat on SQLite, its beats embedded in two ``celery worker -B``.

The database base in an embedded beat (a forked child of the worker, with the
database thread started in it), and several beats sharing one SQLite file: every
slot once, across the loss of the leading worker, and the run counts written.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.support.beat import REPO_ROOT, Recorder, duplicates

pytestmark = pytest.mark.slow

pytest.importorskip("django_celery_beat", reason="needs the django extra")

from tests.support.djangosite.testing import SETTINGS, follow, leader_pid, slots

APP = "tests.support.djangosite"
SETUP = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from tests.support.djangosite.testing import add, every
add("a", interval=every(1), queue="beatq")
add("b", interval=every(2), queue="beatq")
"""


def run_python(env: dict, code: str) -> None:
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=full_env, check=True,
                   timeout=120)


def start_worker(env: dict, name: str, log_path) -> subprocess.Popen:
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", APP, "worker", "-B", "--pool=solo",
         "-n", f"{name}@%h", "--loglevel=INFO", "-s", str(log_path.with_suffix(".schedule"))],
        cwd=REPO_ROOT, env=full_env, stdout=open(log_path, "ab"),
        stderr=subprocess.STDOUT, start_new_session=True)


def test_two_workers_with_embedded_beats_on_one_sqlite_file_send_each_slot_once(
        tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    database = tmp_path / "site.sqlite3"
    env = {"LB_SQLITE": str(database), "DJANGO_SETTINGS_MODULE": SETTINGS,
           "LB_BROKER_URL": broker.url_for(0), "LB_REDIS_URL": state.url, "LB_PREFIX": key_prefix,
           # a 3 s lease instead of 10 s: the takeover after the kill costs CI 7 s less
           "LB_SETTINGS": '{"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 1}'}
    run_python(env, SETUP)
    recorder, client = Recorder(broker.client(), queue="beatq"), state.client()
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    workers = [start_worker(env, f"w{i}", logs[i]) for i in range(2)]
    try:
        recorder.wait_for(6, timeout=60)
        pid = leader_pid(client, key_prefix)
        leader = next(w for w in workers if w.pid == os.getpgid(pid))
        os.killpg(leader.pid, signal.SIGKILL)  # the whole worker, its beat child too
        killed_at = time.time()
        follow(recorder, 10)
        survivor = next(w for w in workers if w is not leader)
        os.killpg(survivor.pid, signal.SIGTERM)  # warm shutdown: the beat writes its counts
        survivor.wait(30)
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait(10)
    text = "".join(p.read_text(errors="replace") for p in logs)
    messages = recorder.drain_all()
    a = slots(messages, "a")
    with sqlite3.connect(database) as conn:
        (count,) = conn.execute("SELECT total_run_count FROM django_celery_beat_periodictask "
                                "WHERE name = 'a'").fetchone()
    print(f"\nSQLite, 2 x worker -B: {len(messages)} messages, 'a' {len(a)} slots, "
          f"total_run_count {count}")
    assert duplicates(messages) == [], text[-3000:]
    assert "database is locked" not in text, text[-3000:]
    assert [s for s in a if s.timestamp() > killed_at + 5], text[-3000:]  # the survivor leads
    # counted by both workers' beats: every run after the kill (the survivor wrote its
    # counts as it stopped) and earlier ones; the killed one's last pass may be lost
    after_kill = [s for s in a if s.timestamp() > killed_at]
    assert len(after_kill) < count <= len(a), text[-3000:]
