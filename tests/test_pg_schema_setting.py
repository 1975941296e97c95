"""``leaderbeat_store_schema``: the PostgreSQL schema the store lives in, named by the site.

Two clusters of beats in two schemas of one database do not see each other; ``init-store``
creates the schema the setting (or ``--schema``) names; a name PostgreSQL would not take
unquoted is refused naming the setting, the value and the rule; a refusal by PostgreSQL
names PostgreSQL. Against the PostgreSQL at 127.0.0.1:5432, a database of each test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.store.open import open_store
from celery_leaderbeat.store.types import ClaimItem, Code, Op
from tests.support.beat import NOOP, REPO_ROOT, BeatProcess, beat_env
from tests.support.postgres import _connect, node_lease, postgres_database

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def database() -> Iterator[str]:
    with postgres_database("lbschema") as name:
        yield name


def url_of(name: str, user: str = "postgres") -> str:
    return f"postgresql://{user}@127.0.0.1:5432/{name}?connect_timeout=3"


def config_of(url: str, **more: Any) -> Config:
    return Config.from_values({"store_url": url, "key_prefix": "same", "node_id": "n1",
                               **more})


def tables_in(name: str, schema: str) -> set[str]:
    with _connect(name) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s",
                            (schema,)).fetchall()
    return {row[0] for row in rows}


# -- the setting ----------------------------------------------------------------------------

def test_the_schema_is_leaderbeat_unless_set():
    assert config_of("postgresql://u@db/x").store_schema == "leaderbeat"
    assert config_of("postgresql://u@db/x", store_schema="lb_two").store_schema == "lb_two"


@pytest.mark.parametrize("bad", ["Leaderbeat", "1st", "lb-two", "lb two", "lb.two", "",
                                 "select", "user", "pg_lb", "x" * 64, 7])
def test_a_name_that_is_not_an_unquoted_identifier_names_the_setting_value_and_rule(bad):
    with pytest.raises(ConfigurationError) as raised:
        config_of("postgresql://u@db/x", store_schema=bad)
    text = str(raised.value)
    assert f"leaderbeat_store_schema={bad!r} " in text
    assert "unquoted PostgreSQL identifier" in text and "at most 63" in text


def test_names_postgresql_takes_unquoted_are_accepted():
    for good in ("lb", "_lb", "lb_2", "lb$x", "x" * 63, "selected"):
        assert config_of("postgresql://u@db/x", store_schema=good).store_schema == good


def test_django_names_it_celery_leaderbeat_store_schema():
    from celery import Celery

    class DjangoSettings:
        CELERY_LEADERBEAT_STORE_URL = "postgresql://u@db/x"
        CELERY_LEADERBEAT_STORE_SCHEMA = "site_beat"

    app = Celery("wire", broker="amqp://guest@localhost//")
    app.config_from_object(DjangoSettings, namespace="CELERY")
    assert Config.from_app(app).store_schema == "site_beat"


# -- two schemas, two clusters ----------------------------------------------------------------

def test_two_schemas_of_one_database_hold_two_leases_and_two_claims_of_one_slot(database):
    url = url_of(database)
    one, two = config_of(url, store_schema="lb_one"), config_of(url, store_schema="lb_two")
    stores = [open_store(one), open_store(two)]
    try:
        leases = [node_lease(store, config) for store, config in zip(stores, (one, two))]
        assert [lease.try_acquire() for lease in leases] == [True, True], \
            "the same app in another schema is another cluster: each leads its own"
        slot = int(time.time() * 1000) - 1000
        for lease, store in zip(leases, stores):
            token, epoch = lease.credentials()
            granted = store.ledger.claim(token, epoch, [ClaimItem("e", slot, Op.CLAIM, slot)], [])
            assert granted == [Code.GRANTED]
        with _connect(database) as conn:
            for schema in ("lb_one", "lb_two"):
                rows = conn.execute(psycopg.sql.SQL(
                    "SELECT app, entry, slot_ms FROM {}.grants").format(
                        psycopg.sql.Identifier(schema))).fetchall()
                assert rows == [("same", "e", slot)]
        assert "leaderbeat" not in {s for s in _schemas(database)}, "the default is untouched"
    finally:
        for store in stores:
            store.close()


def _schemas(name: str) -> set[str]:
    with _connect(name) as conn:
        return {row[0] for row in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


@pytest.mark.slow
def test_two_beats_of_one_app_in_two_schemas_both_lead(tmp_path, database):
    beats = []
    try:
        for schema in ("lb_east", "lb_west"):
            (tmp_path / schema).mkdir()
            env = beat_env(tmp_path / schema, broker_url="memory://", prefix="same",
                           schedule={"tick": {"task": NOOP, "every": 1}},
                           settings={"leaderbeat_store_url": url_of(database),
                                     "leaderbeat_store_schema": schema})
            beats.append(BeatProcess(env=env, log_path=tmp_path / schema / "beat.log"))
        for beat in beats:
            beat.wait_for_log(r"elected", timeout=60)
        with _connect(database) as conn:
            for schema in ("lb_east", "lb_west"):
                held = conn.execute(psycopg.sql.SQL(
                    "SELECT count(*) FROM {}.lease WHERE app = 'same' AND holder IS NOT NULL"
                ).format(psycopg.sql.Identifier(schema))).fetchone()
                assert held == (1,), schema
    finally:
        for beat in beats:
            beat.close()


# -- init-store -------------------------------------------------------------------------------

def _cli(settings: dict[str, Any], *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "LB_BROKER_URL": "memory://",
           "LB_PREFIX": "same", "LB_SETTINGS": json.dumps(settings)}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.support.beatapp",
                           "leaderbeat", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_init_store_creates_the_schema_the_setting_names(database):
    done = _cli({"leaderbeat_store_url": url_of(database),
                 "leaderbeat_store_schema": "from_setting"}, "init-store", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"] == "from_setting"
    assert {"lease", "slots", "grants", "schema_version"} <= tables_in(database, "from_setting")
    assert tables_in(database, "leaderbeat") == set()


def test_init_store_schema_option_wins_over_the_setting(database):
    settings = {"leaderbeat_store_url": url_of(database),
                "leaderbeat_store_schema": "from_setting"}
    done = _cli(settings, "init-store", "--schema", "from_option")
    assert done.returncode == 0, done.stderr
    assert "schema 'from_option': applied migration(s)" in done.stdout
    assert "lease" in tables_in(database, "from_option")
    assert tables_in(database, "from_setting") == set()


def test_init_store_refuses_a_bad_schema_option_before_connecting():
    done = _cli({"leaderbeat_store_url": "postgresql://postgres@127.0.0.1:1/x"},
                "init-store", "--schema", "Bad-Name")
    assert done.returncode == 64, (done.stdout, done.stderr)
    assert "--schema='Bad-Name' must be a valid unquoted PostgreSQL identifier" in done.stderr


def test_init_store_refuses_a_bad_schema_setting():
    done = _cli({"leaderbeat_store_url": "postgresql://postgres@127.0.0.1:1/x",
                 "leaderbeat_store_schema": "pg_mine"}, "init-store")
    assert done.returncode == 78, (done.stdout, done.stderr)
    assert "leaderbeat_store_schema='pg_mine' must be" in done.stderr


# -- a refusal names the store that refused ---------------------------------------------------

@pytest.mark.slow
def test_a_role_without_usage_on_the_schema_stops_beat_naming_postgresql(tmp_path, database):
    role = f"lb_nobody_{database}"
    schema = "lb_guarded"
    store = open_store(config_of(url_of(database), store_schema=schema))  # creates it
    store.close()
    with _connect() as conn:
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(psycopg.sql.Identifier(role)))
    try:
        with _connect(database) as conn:  # may read the version, and nothing else
            conn.execute(psycopg.sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                psycopg.sql.Identifier(schema), psycopg.sql.Identifier(role)))
            conn.execute(psycopg.sql.SQL("GRANT SELECT ON {}.schema_version TO {}").format(
                psycopg.sql.Identifier(schema), psycopg.sql.Identifier(role)))
        env = beat_env(tmp_path, broker_url="memory://", prefix="same",
                       schedule={"tick": {"task": NOOP, "every": 1}},
                       settings={"leaderbeat_store_url": url_of(database, role),
                                 "leaderbeat_store_schema": schema})
        with BeatProcess(env=env, log_path=tmp_path / "beat.log") as beat:
            status = beat.wait_exit(timeout=60)
            log = beat.log_text()
        assert status != 0, log
        assert "PostgresAuthError: PostgreSQL at" in log, log
        assert f"USAGE on the schema '{schema}' (leaderbeat_store_schema)" in log
        assert "RedisAuthError" not in log and "Redis at" not in log
    finally:
        with _connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            conn.execute(psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(
                psycopg.sql.Identifier(role)))


# -- the worker guard and the run-time entries open the named schema -------------------------

def test_the_worker_guard_and_the_run_time_entries_open_the_named_schema(database):
    from celery import Celery

    from celery_leaderbeat.integrations.guard import Guard
    from celery_leaderbeat.store import dynamic

    app = Celery("wire", broker="amqp://guest@127.0.0.1//")
    app.conf.leaderbeat_store_url = url_of(database)
    app.conf.leaderbeat_store_schema = "lb_workers"
    app.conf.leaderbeat_key_prefix = "same"
    guard = Guard(app)
    guard.store()
    assert guard._store is not None
    try:
        assert guard._store.place.schema == "lb_workers"
    finally:
        guard._store.close()
    entries = dynamic._store(app)
    assert getattr(entries, "_part", entries).place.schema == "lb_workers"
    assert {"guard_runs", "entries"} <= tables_in(database, "lb_workers")
    assert tables_in(database, "leaderbeat") == set()
