"""The worker guard on PostgreSQL in a prefork worker: every pool child runs guarded tasks.

A process forked while another of its threads holds a lock inherits the lock held, with
no thread left to release it. A PostgreSQL pool runs threads (its workers and scheduler),
and a store call holds libpq's and OpenSSL's locks while it connects: were either in the
worker's main process when the pool forks a child, that child could hang on its first
guarded task, holding the message it took. So the main process's store has no threads
of its own, and a fork waits for its call in flight.

In-process: the guard of a worker's main process on a real PostgreSQL store. Processes:
real ``celery worker`` processes (prefork, concurrency 4, a new child after each task)
restarted several times on a RabbitMQ queue of the test's own and a PostgreSQL database
of its own; a Redis of the test's own records which process ran what.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from celery import Celery

from celery_leaderbeat.integrations import guard as guard_module
from celery_leaderbeat.integrations.guard import SWEEP_INTERVAL, Guard
from tests.support.beat import beat_env
from tests.support.postgres import HOST, NO_REDIS, PORT, USER, postgres_database
from tests.support.rabbitmq import AMQP_URL, require_rabbitmq
from tests.support.worker import WorkerProcess, executed
from tests.test_guard import publish_slot

FENCED = "tests.support.beatapp.fenced"
CONCURRENCY = 4
GENERATIONS = 3
ROUNDS = 2
#: how long a generation's tasks may take to run, once its worker is ready
RUN_WITHIN = 12.0


@pytest.fixture
def store_url() -> Iterator[str]:
    with postgres_database("lbpgfork") as name:
        yield f"postgresql://{USER}@{HOST}:{PORT}/{name}"


@pytest.fixture
def queue() -> Iterator[str]:
    import kombu

    name = f"lbpgfork-{secrets.token_hex(4)}"
    yield name
    with kombu.Connection(require_rabbitmq()) as conn:
        kombu.Queue(name, channel=conn.default_channel).delete()


def guard_on(store_url: str) -> Guard:
    app = Celery(f"pgfork-{secrets.token_hex(3)}", set_as_current=False)
    app.conf.update(leaderbeat_store_url=store_url, leaderbeat_redis_url=NO_REDIS,
                    leaderbeat_key_prefix=f"pgfork-{secrets.token_hex(3)}")
    return Guard(app)


def test_the_sweep_of_a_workers_main_process_starts_no_thread(store_url):
    guard = guard_on(store_url)
    before = set(threading.enumerate())
    for _ in range(3):
        guard.sweep()
    started = [t.name for t in set(threading.enumerate()) - before]
    assert started == [], f"the main process's store started threads: {started}"
    assert guard.main_call(lambda store: store.runs(["none"])) == {}


def test_the_main_process_store_after_its_session_was_ended_answers_on_a_new_one(store_url):
    guard = guard_on(store_url)
    guard.sweep()
    dbname = store_url.rsplit("/", 1)[1]
    with psycopg.connect(store_url, autocommit=True) as admin:
        ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                              " WHERE datname = %s AND pid <> pg_backend_pid()",
                              (dbname,)).fetchone()
        assert ended == (1,), "the main process's one session"
        deadline = time.monotonic() + 10  # until the ended session said goodbye and left
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                            " AND pid <> pg_backend_pid()", (dbname,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the terminated session did not end"
            time.sleep(0.05)
    # the server's goodbye waits on the idle connection's socket: the next call finds it
    # and answers on a new connection, with no call failing
    guard.sweep()
    assert guard.main_call(lambda store: store.runs(["none"])) == {}


def fork_during(guard: Guard, seconds: float) -> tuple[float, float]:
    """Fork while a main-process store call of ``seconds`` runs: (fork done, call done)."""
    entered, ended = threading.Event(), []

    def slow(store):
        entered.set()
        time.sleep(seconds)
        out = store.sweep()
        ended.append(time.monotonic())
        return out

    call = threading.Thread(target=guard.main_call, args=(slow,))
    call.start()
    assert entered.wait(10)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    forked = time.monotonic()
    os.waitpid(pid, 0)
    call.join(10)
    assert ended, "the call ended"
    return forked, ended[0]


def test_a_fork_waits_for_the_main_process_store_call_in_flight(store_url):
    guard = guard_on(store_url)
    guard.sweep()  # the store open, the fork gate hooked
    forked, ended = fork_during(guard, 0.5)
    assert forked >= ended, "the child was forked while the call was in flight"


def test_a_fork_waits_for_a_call_in_flight_no_longer_than_fork_wait(store_url, monkeypatch):
    monkeypatch.setattr(guard_module, "FORK_WAIT", 0.2)
    guard = guard_on(store_url)
    guard.sweep()
    started = time.monotonic()
    forked, ended = fork_during(guard, 3.0)
    assert forked < ended, "the fork went on while the call still ran"
    assert forked - started < 2.5


def test_a_slot_started_with_postgresql_unreachable_runs_and_the_log_names_postgresql(caplog):
    guard = guard_on(f"postgresql://{USER}@{HOST}:1/none")
    request = SimpleNamespace(id="t1", retries=0, headers={
        "leaderbeat_entry": "e", "leaderbeat_slot": "2026-12-01T09:00:00+00:00"})
    with caplog.at_level(logging.WARNING, logger="celery_leaderbeat.integrations.guard"):
        out = guard.call(SimpleNamespace(request=request), lambda: 42, (), {})
    assert out == 42
    assert "leaderbeat guard: PostgreSQL unreachable (" in caplog.text, caplog.text
    assert "Redis" not in caplog.text


def _ran(rows: list[dict], ids: set[str]) -> list[dict]:
    return [r for r in rows if r["id"] in ids and r["phase"] == "end"]


def worker_env(tmp_path, results, key_prefix: str, store_url: str) -> dict[str, str]:
    """A guarded worker on PostgreSQL that replaces each pool child after one task, so
    children are forked while the main process's store is open and its sweeps run."""
    env = beat_env(tmp_path, broker_url=AMQP_URL, redis_url=NO_REDIS, prefix=key_prefix,
                   schedule={}, settings={"leaderbeat_guard": True,
                                          "leaderbeat_store_url": store_url,
                                          "worker_prefetch_multiplier": 1,
                                          "worker_max_tasks_per_child": 1})
    env["LB_RECORD_URL"] = results.url
    return env


def thread_names(pid: int) -> list[str]:
    """The Python threads of process ``pid``, by name (py-spy reads them from outside)."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        missing = f"py-spy is not installed next to {sys.executable} (pip install py-spy)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}: .ci/run installs it")
        pytest.skip(missing)
    dump = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True,
                          text=True, timeout=60, check=True).stdout
    return re.findall(r'^Thread \S+ \(\w+\): "(.*)"$', dump, re.MULTILINE)


@pytest.mark.slow
@pytest.mark.xdist_group("heavy")
def test_a_guarded_workers_main_process_runs_no_thread_of_a_connection_pool(
        tmp_path, make_redis_server, key_prefix, store_url, queue):
    require_rabbitmq()
    results = make_redis_server()
    env = worker_env(tmp_path, results, key_prefix, store_url)
    slot = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    with WorkerProcess(env, tmp_path / "worker.log", concurrency=CONCURRENCY,
                       extra_args=["-Q", queue]) as worker:
        worker.wait_ready()
        assert len(_round(env, results, key_prefix, queue, slot)) == CONCURRENCY
        time.sleep(2 * SWEEP_INTERVAL)  # sweeps ran on the main process's store
        names = thread_names(worker.proc.pid)
    assert "leaderbeat-guard-sweep" in names, names
    pooled = [n for n in names if n.startswith(("leaderbeat-worker", "leaderbeat-scheduler"))]
    assert pooled == [], f"a pool's threads in the process that forks: {names}"


@pytest.mark.slow
@pytest.mark.xdist_group("heavy")
def test_every_pool_child_of_every_restarted_worker_runs_a_guarded_task(
        tmp_path, make_redis_server, key_prefix, store_url, queue):
    require_rabbitmq()
    results = make_redis_server()
    env = worker_env(tmp_path, results, key_prefix, store_url)
    first = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    stuck: list[str] = []
    children: set[int] = set()
    for generation in range(GENERATIONS):
        log = tmp_path / f"worker-{generation}.log"
        with WorkerProcess(env, log, name=f"g{generation}", concurrency=CONCURRENCY,
                           extra_args=["-Q", queue]) as worker:
            worker.wait_ready()
            for round_ in range(ROUNDS):
                slot = first + timedelta(minutes=generation * ROUNDS + round_)
                ran = _round(env, results, key_prefix, queue, slot)
                children |= {r["pid"] for r in ran}
                if len(ran) < CONCURRENCY:
                    stuck.append(f"generation {generation} round {round_}: {len(ran)} of "
                                 f"{CONCURRENCY} ran\n{worker.log_text()[-2000:]}")
                    break
    print(f"{GENERATIONS} workers, {len(children)} pool children ran a guarded task; "
          f"{len(stuck)} stuck")
    assert not stuck, "\n".join(stuck)
    assert len(children) == GENERATIONS * ROUNDS * CONCURRENCY


def _round(env, results, key_prefix: str, queue: str, slot: datetime) -> list[dict]:
    """One task per pool child (each outlasts the publishing of the rest); those that ran."""
    ids = {publish_slot(env, FENCED, f"e{n}", slot, key_prefix, queue=queue,
                        kwargs={"seconds": 2.0})
           for n in range(CONCURRENCY)}
    deadline = time.monotonic() + RUN_WITHIN
    while len(_ran(executed(results.client()), ids)) < CONCURRENCY \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    ran = _ran(executed(results.client()), ids)
    assert all(r["token"] for r in ran), "every task ran guarded (a fencing token)"
    return ran
