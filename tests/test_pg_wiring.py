"""Choosing the PostgreSQL store by URL, and what opens it: the settings, ``init-store``,
the CLI's ``status`` and ``nodes``, Django's ``"django"``, the heartbeat through an outage.

Against the PostgreSQL at 127.0.0.1:5432, a database of each test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from celery_leaderbeat.config import Config, is_postgres_store
from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.roles.lease import Heartbeat
from celery_leaderbeat.store.base import STORE_UNREACHABLE
from celery_leaderbeat.store.open import django_conninfo, open_store
from celery_leaderbeat.store.postgres.pool import store_error
from tests.support.beat import NOOP, REPO_ROOT, BeatProcess, beat_env
from tests.support.postgres import _connect, node_lease, postgres_database

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database("lbwire") as name:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}?connect_timeout=3"


def config_of(url: str, prefix: str = "wire", **more) -> Config:
    return Config.from_values({"store_url": url, "key_prefix": prefix, "node_id": "n1", **more})


# -- the settings ----------------------------------------------------------------------------

def test_a_postgresql_url_needs_no_redis_url():
    for scheme in ("postgresql", "postgres"):
        config = config_of(f"{scheme}://u@db/x")
        assert is_postgres_store(config) and config.redis_url == ""


def test_a_redis_store_url_is_the_redis_url_too():
    config = config_of("redis://h:6379/3")
    assert not is_postgres_store(config)
    assert config.redis_url == config.store_url == "redis://h:6379/3"


def test_without_a_store_url_the_store_is_the_redis_of_redis_url():
    config = Config.from_values({"redis_url": "redis://h/1", "key_prefix": "p", "node_id": "n"})
    assert config.store_url == "redis://h/1" and not is_postgres_store(config)


def test_a_bad_store_url_names_the_setting_the_value_and_the_rule():
    with pytest.raises(ConfigurationError) as raised:
        config_of("mysql://db/x")
    text = str(raised.value)
    assert "leaderbeat_store_url='mysql://db/x'" in text
    assert "postgresql://" in text and "redis://" in text and "'django'" in text


def test_no_store_at_all_says_how_to_choose_postgresql():
    with pytest.raises(ConfigurationError) as raised:
        Config.from_values({"key_prefix": "p", "node_id": "n"})
    assert "leaderbeat_store_url" in str(raised.value)


def test_from_app_reads_the_store_url_and_leaves_an_amqp_broker_alone():
    from celery import Celery

    app = Celery("wire", broker="amqp://guest@localhost//")
    app.conf.leaderbeat_store_url = "postgresql://u@db/x"
    config = Config.from_app(app)
    assert config.store_url == "postgresql://u@db/x" and config.redis_url == ""


# -- opening it ------------------------------------------------------------------------------

def test_open_store_opens_postgresql_and_creates_the_schema(pg_url):
    store = open_store(config_of(pg_url))
    try:
        assert type(store).__name__ == "PostgresStore"
        assert store.client is None, "no claim-and-enqueue in one step on PostgreSQL"
        store.ping()
        lease = node_lease(store, config_of(pg_url))
        assert lease.try_acquire()
        assert lease.holder()[0] is not None
        lease.release()
    finally:
        store.close()


def test_a_role_that_may_not_create_the_schema_is_told_to_run_init_store(pg_url):
    name = pg_url.rsplit("/", 1)[1].split("?")[0]
    role = f"lb_reader_{name}"
    with _connect() as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'REVOKE CREATE ON DATABASE "{name}" FROM PUBLIC')
    try:
        with _connect(name) as conn:
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        url = pg_url.replace("postgres@", f"{role}@")
        with pytest.raises(ConfigurationError) as raised:
            open_store(config_of(url))
        assert "init-store" in str(raised.value)
        # once a migration role ran init-store, the same role opens it
        env = _cli_env(pg_url, "wire")
        done = _cli(env, "init-store", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["applied"]
        with _connect(name) as conn:
            conn.execute(f'GRANT USAGE ON SCHEMA leaderbeat TO "{role}"')
            conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA '
                         f'leaderbeat TO "{role}"')
            conn.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA leaderbeat TO "{role}"')
        store = open_store(config_of(url))
        try:
            store.ping()
        finally:
            store.close()
    finally:
        with _connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_django_takes_the_connection_parameters_of_the_default_database():
    databases = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": "site", "USER": "app",
        "PASSWORD": "s3cret", "HOST": "db.example", "PORT": "6432",
        "OPTIONS": {"sslmode": "require", "isolation_level": 1}}}
    conninfo = django_conninfo(databases=databases)
    parsed = psycopg.conninfo.conninfo_to_dict(conninfo)
    assert parsed == {"dbname": "site", "user": "app", "password": "s3cret",
                      "host": "db.example", "port": "6432", "sslmode": "require"}


def test_django_on_another_database_engine_is_refused_with_what_to_set():
    with pytest.raises(ConfigurationError) as raised:
        django_conninfo(databases={"default": {"ENGINE": "django.db.backends.sqlite3"}})
    assert "leaderbeat_store_url='django'" in str(raised.value)
    assert "sqlite3" in str(raised.value)


# -- the heartbeat through an outage -------------------------------------------------------

class _Failing:
    """A lease whose renewals fail with PostgreSQL's connection error a few times."""

    token, epoch = "node|1", 1
    config = Config.from_values({"store_url": "postgresql://x", "key_prefix": "p",
                                 "node_id": "n", "lease_ttl": 3.0, "renew_interval": 0.1})

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.renewed = 0
        self.done = threading.Event()

    def renew(self, token: str) -> None:
        if self.failures:
            self.failures -= 1
            # what the PostgreSQL store's boundary makes of a lost connection
            lost = psycopg.OperationalError("server closed the connection unexpectedly")
            raise store_error(lost) from lost
        self.renewed += 1
        if self.renewed >= 2:
            self.done.set()

    def on_renew(self, seconds) -> None:
        pass

    def remaining(self) -> float:
        return 5.0


def test_a_postgresql_error_in_the_heartbeat_is_retried_not_the_end_of_it():
    assert isinstance(store_error(psycopg.OperationalError("x")), STORE_UNREACHABLE)
    lease = _Failing(failures=3)
    heartbeat = Heartbeat(lease, time.monotonic)  # type: ignore[arg-type]
    heartbeat.start()
    try:
        assert lease.done.wait(20), "the heartbeat ended at the first PostgreSQL error"
    finally:
        heartbeat.stop()
    assert heartbeat.stopped_because is None


def test_a_ping_on_a_store_with_no_threads_waits_its_own_short_time_for_the_call_before(
        pg_url):
    """A forking process's store (one connection, no threads): a ping waits at most its
    own 0.5 s for the call in flight, not the store's timeout (8 s here)."""
    from celery_leaderbeat.store.base import STORE_ERRORS

    store = open_store(config_of(pg_url, store_timeout=8), threads=False)
    in_flight, done = threading.Event(), threading.Event()

    def a_long_call() -> None:
        with store.place.pool.connection():
            in_flight.set()
            done.wait(20)

    caller = threading.Thread(target=a_long_call)
    caller.start()
    try:
        assert in_flight.wait(10)
        started = time.monotonic()
        with pytest.raises(STORE_ERRORS):
            store.ping()
        waited = time.monotonic() - started
    finally:
        done.set()
        caller.join(10)
    store.ping()  # the connection is free again: it answers
    store.close()
    assert waited < 4.0, f"the ping waited {waited:.1f} s (the store's timeout is 8 s)"


# -- the CLI ---------------------------------------------------------------------------------

def _cli_env(url: str, prefix: str) -> dict[str, str]:
    return {"LB_BROKER_URL": "memory://", "LB_PREFIX": prefix,
            "LB_SETTINGS": json.dumps({"leaderbeat_store_url": url})}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.support.beatapp",
                           "leaderbeat", *args], cwd=REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_init_store_creates_the_schema_then_has_nothing_to_do(pg_url):
    env = _cli_env(pg_url, "wire")
    first = _cli(env, "init-store", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["applied"]
    again = _cli(env, "init-store")
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_init_store_against_an_unreachable_server_exits_unavailable():
    env = _cli_env("postgresql://postgres@127.0.0.1:1/x?connect_timeout=1", "wire")
    done = _cli(env, "init-store")
    assert done.returncode == 69, (done.stdout, done.stderr)
    assert "PostgreSQL unreachable" in done.stderr


def test_status_and_nodes_read_a_postgresql_store(tmp_path, pg_url, key_prefix):
    env = beat_env(tmp_path, broker_url="memory://", prefix=key_prefix,
                   schedule={"tick": {"task": NOOP, "every": 1}},
                   settings={"leaderbeat_store_url": pg_url})
    with BeatProcess(env=env, log_path=tmp_path / "beat.log") as beat:
        beat.wait_for_log(r"elected|leader", timeout=60)
        deadline = time.monotonic() + 60
        while True:
            status = _cli(env, "status", "--json")
            data = json.loads(status.stdout) if status.returncode == 0 else {}
            if data.get("leader") and any(e.get("last_slot") for e in data.get("entries", [])):
                break
            assert time.monotonic() < deadline, (status.stdout, status.stderr, beat.log_text())
            time.sleep(0.5)
        plain = _cli(env, "status")
        nodes = _cli(env, "nodes", "--json")
    assert plain.returncode == 0 and plain.stdout.startswith("store   postgresql://"), plain
    assert [row["role"] for row in json.loads(nodes.stdout)] == ["leader"], nodes.stdout


# -- the worker guard and the run-time entries open the same store -------------------------

def test_the_worker_guard_and_the_run_time_entries_reach_postgresql(pg_url):
    from celery import Celery

    from celery_leaderbeat.integrations.guard import Guard
    from celery_leaderbeat.store import dynamic

    app = Celery("wire", broker="amqp://guest@127.0.0.1//")
    app.conf.leaderbeat_store_url = pg_url
    app.conf.leaderbeat_key_prefix = "wire-guard"
    guard = Guard(app)
    part = guard.store()
    assert type(getattr(part, "_part", part)).__module__.endswith("postgres.guard")
    assert guard._store is not None
    guard._store.close()
    entries = dynamic._store(app)
    assert type(getattr(entries, "_part", entries)).__module__.endswith("postgres.entries")


def test_the_beat_loop_prunes_the_history_between_passes_not_inside_a_claim(
        pg_url, key_prefix, monkeypatch):
    from celery import Celery

    from celery_leaderbeat.scheduler import Scheduler
    from celery_leaderbeat.store.postgres import ledger as pg_ledger
    from tests.support.beat import NOOP

    # a prune owed after every write, never made by a write itself: only the loop's
    # tidy() prunes, and then the history holds its 100 rows and at most the pass after
    monkeypatch.setattr(pg_ledger, "PRUNE_EVERY", 1)
    monkeypatch.setattr(pg_ledger, "PRUNE_OVERDUE", 10**9)
    app = Celery("proj")
    # kombu's memory transport keeps its queues for the process: a queue of our own
    app.conf.update(broker_url="memory://", task_default_queue=f"q-{key_prefix}",
                    timezone="UTC", leaderbeat_store_url=pg_url,
                    leaderbeat_key_prefix=key_prefix, leaderbeat_history_length=100,
                    beat_schedule={f"e{i}": {"task": NOOP, "schedule": 0.5} for i in range(60)})
    scheduler = Scheduler(app=app)
    written = 0
    try:
        deadline = time.monotonic() + 30
        while written < 400 and time.monotonic() < deadline:
            time.sleep(min(scheduler.tick(), 0.5))
            with _connect(pg_url.rsplit("/", 1)[1].split("?")[0]) as conn:
                written = conn.execute("SELECT coalesce(max(id), 0) FROM leaderbeat.history"
                                       ).fetchone()[0]
    finally:
        scheduler.close()
    with _connect(pg_url.rsplit("/", 1)[1].split("?")[0]) as conn:
        kept = conn.execute("SELECT count(*) FROM leaderbeat.history WHERE app = %s",
                            (key_prefix,)).fetchone()[0]
    assert written >= 400, f"only {written} history rows written in 30 s"
    assert kept <= 100 + 2 * 60, f"{kept} of {written} history rows kept"
