"""The harness of :mod:`tests.faults.sim` on the PostgreSQL store: every node on a pool
of its own, in a database of the test's, on the virtual clock.

Time: the store takes every lease, claim and skew decision on the server's clock, and
each of its statements reads that clock as an unqualified ``clock_timestamp()`` (the
column defaults of its tables too). Every connection the harness makes (the nodes', the
CLI's, its own) puts the schema :data:`VIRTUAL` ahead of ``pg_catalog`` on its
``search_path``, and that schema holds a ``clock_timestamp()`` of its own that answers
the virtual time, kept in the one-row table ``clock`` (set at every advance of the
:class:`FakeClock`). So the store's SQL runs as it is, and the server's time *is* the
virtual one: every ttl and expiry runs in virtual time, with no skew at all. The store's
schema is created on such a connection, so its column defaults name the virtual clock.
:func:`server_time_uses` is what a test checks to know that nothing escapes it.

Faults: every SQL transaction of a store call passes :meth:`Place.run`, the store's one
way to the server; the harness builds each node's store on a :class:`SeamedPlace`,
whose ``run`` goes through the :class:`Seam` labelled ``SQL[<sql function>] <store
call><role call>``. So do ``store.ping``/``store.warnings`` (``SQL[ping] ...``) and the
events' subscription (``LISTEN events.subscribe<...``, ``LISTEN subscription.next<...``).
A planned fault: ``before``: nothing reached the server; ``after``: the transaction
committed and its reply was lost; ``delay``/``late``: as on Redis (the node frozen past
the ttl before it is sent, or after it ran); ``drop``: every server session of the node
is terminated (``pg_terminate_backend``), then the call runs: on a pool connection the
server closed, so it fails, and the pool replaces its connections; ``repeat``: the
transaction runs twice (a retry after a lost reply). A fault raises what the driver
raises for a lost connection (``psycopg.OperationalError``), which the store turns into
its own error as for any other.

Reading the subscription is made deterministic: before each read the harness runs
``SELECT 1`` on the listening connection, and the server delivers every notification
committed before it ahead of its answer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

from celery_leaderbeat.config import Config
from celery_leaderbeat.store.calls import ROLE_SITE, STORE_SITE
from celery_leaderbeat.store.errors import StoreUnreachable
from celery_leaderbeat.store.postgres import lease_sql, state_sql
from celery_leaderbeat.store.postgres.events import PostgresSubscription
from celery_leaderbeat.store.postgres.place import Place
from celery_leaderbeat.store.postgres.pool import ERRORS, connection, make_pool
from celery_leaderbeat.store.postgres.schema import DEFAULT_SCHEMA, ensure_schema
from celery_leaderbeat.store.postgres.store import PostgresStore
from tests.support.postgres import HOST, NO_REDIS, PORT, USER

from .model_world import SCHEDULE, World
from .seam import InjectedFault, Seam, _caller_outside_the_store
from .sim import Sim

#: the test's schema ahead of ``pg_catalog``: its ``clock_timestamp()`` is the virtual clock
VIRTUAL = "leaderbeat_virtual"
#: where a snapshot of the store's tables is kept (the model's "restored from a snapshot")
SNAPSHOT = "leaderbeat_snapshot"
#: every session the harness opens is named ``lbsim-<node>``; its own is this one
ADMIN_NAME = "lbsim-admin"

_VIRTUAL_CLOCK = f"""
CREATE SCHEMA IF NOT EXISTS {VIRTUAL};
CREATE TABLE IF NOT EXISTS {VIRTUAL}.clock (at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION {VIRTUAL}.clock_timestamp() RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$ SELECT at FROM {VIRTUAL}.clock $$;
"""

#: the server's clocks besides ``clock_timestamp()``: none may appear in the store's SQL
OTHER_CLOCKS = re.compile(
    r"\bnow\s*\(\s*\)|current_timestamp|current_time\b|current_date|localtime|"
    r"statement_timestamp|transaction_timestamp|timeofday|'now'|pg_catalog\.clock_timestamp",
    re.IGNORECASE)


def server_time_uses() -> dict[str, list[str]]:
    """Every use of another server clock than an unqualified ``clock_timestamp()`` in the
    PostgreSQL store's code and migrations: file -> the lines (empty: none)."""
    found: dict[str, list[str]] = {}
    folder = Path(str(resources.files("celery_leaderbeat.store.postgres")))
    for path in sorted([*folder.glob("*.py"), *folder.glob("migrations/*.sql")]):
        lines = [line.strip() for line in path.read_text().splitlines()
                 if OTHER_CLOCKS.search(line)]
        if lines:
            found[str(path.relative_to(folder))] = lines
    return found


def conninfo(dbname: str, name: str) -> str:
    """A libpq connection string to ``dbname`` whose session reads the virtual clock."""
    return (f"host={HOST} port={PORT} user={USER} dbname={dbname} application_name={name} "
            f"options='-c search_path={VIRTUAL},pg_catalog'")


def store_url(dbname: str, name: str) -> str:
    """:func:`conninfo` as the ``postgresql://`` URL a Config takes (the CLI's store)."""
    options = quote(f"-c search_path={VIRTUAL},pg_catalog", safe="")
    return (f"postgresql://{USER}@{HOST}:{PORT}/{dbname}?application_name={name}"
            f"&options={options}")


@dataclass(frozen=True)
class PostgresDatabase:
    """A database of the test's (see ``tests.support.postgres.postgres_database``)."""

    name: str


class PgAdmin:
    """The test's own session: the virtual clock, emptying the store, ending sessions,
    snapshots, and reads for the checks. Never through the seam."""

    def __init__(self, dbname: str) -> None:
        self.conn = psycopg.connect(conninfo(dbname, ADMIN_NAME), autocommit=True)
        self.conn.execute(_VIRTUAL_CLOCK)
        self.schema = DEFAULT_SCHEMA
        self._store_made = False  # the store's tables exist (made by a node's first store)

    def set_clock(self, seconds: float) -> None:
        # at every advance of the clock: one statement (one round trip) once the row is there
        moved = self.conn.execute(f"UPDATE {VIRTUAL}.clock SET at = to_timestamp(%s)",
                                  (seconds,))
        if moved.rowcount == 0:
            self.conn.execute(f"INSERT INTO {VIRTUAL}.clock VALUES (to_timestamp(%s))",
                              (seconds,))

    def _tables(self, schema: str) -> list[str]:
        rows = self.conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename <> "
            "'schema_version' ORDER BY tablename", (schema,)).fetchall()
        return [row[0] for row in rows]

    def _sequences(self, schema: str) -> list[str]:
        rows = self.conn.execute("SELECT sequencename FROM pg_sequences WHERE schemaname = %s"
                                 " ORDER BY sequencename", (schema,)).fetchall()
        return [row[0] for row in rows]

    def empty(self) -> None:
        """Every row of the store gone, its sequences back to their start (the schema
        stays: a database restored from a backup taken just after ``init-store``).

        Rows deleted, not truncated: the tables hold a few rows, and a ``TRUNCATE`` (new
        files for every table) cost about 80 ms here, at every restart of the model's."""
        statements = [sql.SQL("DELETE FROM {}").format(sql.Identifier(self.schema, table))
                      for table in self._tables(self.schema)]
        statements += [sql.SQL("ALTER SEQUENCE {} RESTART").format(
            sql.Identifier(self.schema, seq)) for seq in self._sequences(self.schema)]
        if statements:  # one round trip, one transaction
            self.conn.execute(sql.SQL("; ").join(statements))

    def end_sessions(self, name: str | None = None) -> None:
        """Terminate the sessions of the node ``name`` (None: every node's and the CLI's),
        waiting until each is gone.

        Each is signalled at once and then waited for together: ``pg_terminate_backend``
        with a timeout waits for one session after another, 100 ms at a time."""
        like = "lbsim-%" if name is None else f"lbsim-{name}"
        sessions = ("FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name LIKE %s AND application_name <> %s")
        self.conn.execute(f"SELECT pg_terminate_backend(pid) {sessions}", (like, ADMIN_NAME))
        deadline = time.monotonic() + 5
        while self.conn.execute(f"SELECT count(*) {sessions}",
                                (like, ADMIN_NAME)).fetchone()[0]:
            assert time.monotonic() < deadline, f"sessions {like} still there after 5 s"
            time.sleep(0.002)

    def take_snapshot(self) -> None:
        """The store's tables and sequences as they are now, kept in :data:`SNAPSHOT`."""
        with self.conn.transaction():
            self.conn.execute(f"DROP SCHEMA IF EXISTS {SNAPSHOT} CASCADE")
            self.conn.execute(f"CREATE SCHEMA {SNAPSHOT}")
            for table in self._tables(self.schema):
                self.conn.execute(sql.SQL("CREATE TABLE {} AS SELECT * FROM {}").format(
                    sql.Identifier(SNAPSHOT, table), sql.Identifier(self.schema, table)))
            self.conn.execute(f"CREATE TABLE {SNAPSHOT}.sequences (name text, value bigint,"
                              " called boolean)")
            for seq in self._sequences(self.schema):
                self.conn.execute(sql.SQL(
                    "INSERT INTO {}.sequences SELECT %s, last_value, is_called FROM {}").format(
                    sql.Identifier(SNAPSHOT), sql.Identifier(self.schema, seq)), (seq,))

    def restore_snapshot(self) -> None:
        """The store's tables and sequences put back as :meth:`take_snapshot` kept them."""
        with self.conn.transaction():
            self.empty()
            for table in self._tables(SNAPSHOT):
                if table != "sequences":
                    self.conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(
                        sql.Identifier(self.schema, table), sql.Identifier(SNAPSHOT, table)))
            for seq, value, called in self.conn.execute(
                    f"SELECT name, value, called FROM {SNAPSHOT}.sequences").fetchall():
                self.conn.execute("SELECT setval(%s, %s, %s)",
                                  (f'"{self.schema}"."{seq}"', value, called))

    def _store_exists(self) -> bool:
        """The store's tables are there (looked up until they are: the harness empties
        them and puts rows back, never drops them; read at every step of the model)."""
        self._store_made = self._store_made or bool(self._tables(self.schema))
        return self._store_made

    def history(self, app: str) -> list[dict[str, str]]:
        if not self._store_exists():
            return []
        return state_sql.history(self.conn, self.schema, app, 10_000_000)

    def leader(self, app: str) -> str | None:
        if not self._store_exists():
            return None
        return lease_sql.current_holder(self.conn, self.schema, app)[0]

    def close(self) -> None:
        self.conn.close()


class SeamedPlace(Place):
    """A node's :class:`Place`: each SQL transaction through the seam."""

    seam: Seam
    node_id: str

    def run(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        label = f"SQL[{getattr(call, '__name__', 'call')}] {_sites()}"
        return _through(self.seam, self.node_id, label,
                        lambda: Place.run(self, call, *args, **kwargs))


class SyncedSubscription(PostgresSubscription):
    """A node's subscription: each read through the seam, and synced (see the module)."""

    seam: Seam
    node_id: str

    def next(self, timeout: float) -> str | None:
        return _through(self.seam, self.node_id, f"LISTEN {_sites()}",  # type: ignore[no-any-return]
                        self._synced)

    def _synced(self) -> str | None:
        if self._conn is not None and not self._pending:
            try:
                self._conn.execute("SELECT 1")  # what was notified before is read with it
            except ERRORS:
                self.close()  # as a read on a broken connection does: opened again next
                return None
        return super().next(0.0)


def _sites() -> str:
    return f"{STORE_SITE.get() or '?'}<{ROLE_SITE.get() or _caller_outside_the_store()}"


def _through(seam: Seam, node_id: str, label: str, run: Callable[[], Any]) -> Any:
    try:
        return seam.intercept(node_id, label, run)
    except InjectedFault as exc:
        raise psycopg.OperationalError(str(exc)) from exc


def seamed_store(seam: Seam, node_id: str, dbname: str, config: Config) -> PostgresStore:
    """The store ``store.postgres.store.open_store`` makes, on a :class:`SeamedPlace`
    (the schema created or migrated first, outside the seam)."""
    pool = make_pool(conninfo(dbname, f"lbsim-{node_id}"), timeout=config.store_timeout)
    with connection(pool) as conn:
        ensure_schema(conn, DEFAULT_SCHEMA)
    place = SeamedPlace(pool, DEFAULT_SCHEMA, config.key_prefix)
    place.seam, place.node_id = seam, node_id
    store = PostgresStore(place, config)
    events = store.events._part  # type: ignore[attr-defined]

    def subscribe() -> SyncedSubscription:
        def listen() -> SyncedSubscription:
            sub = SyncedSubscription(pool.conninfo, events.channel,
                                     connect_timeout=pool.timeout)
            sub.seam, sub.node_id = seam, node_id
            store.subscriptions.append(sub)  # type: ignore[attr-defined]
            return sub

        return _through(seam, node_id, f"LISTEN {_sites()}", listen)  # type: ignore[no-any-return]

    store.subscriptions = []  # type: ignore[attr-defined]
    events.subscribe = subscribe
    for name in ("ping", "warnings"):
        member = getattr(store, name)
        setattr(store, name, _seamed_member(seam, node_id, name, member))
    return store


def _seamed_member(seam: Seam, node_id: str, name: str,
                   member: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        label = f"SQL[{name}] store.{name}<{ROLE_SITE.get() or _caller_outside_the_store()}"
        try:
            return seam.intercept(node_id, label, member)
        except InjectedFault as exc:
            raise StoreUnreachable(str(exc)) from exc

    return call


def close_store(store: PostgresStore) -> None:
    """A process's end: its subscriptions' connections and its pool closed."""
    for sub in getattr(store, "subscriptions", ()):
        sub.close()
    store.close()


@dataclass
class PostgresSim(Sim):
    """:class:`Sim` with every node on a pool of its own in one database of the test's,
    whose server clock is the virtual one. ``redis_url`` is the database's name."""

    def __post_init__(self) -> None:
        self.dbname = self.redis_url
        self.redis_url = NO_REDIS  # a Config wants one; nothing opens it
        self.stores: dict[str, list[PostgresStore]] = {}
        super().__post_init__()

    def _admin(self) -> Any:
        admin = PgAdmin(self.dbname)
        admin.set_clock(self.clock.time())
        self.clock.listeners.append(lambda seconds: admin.set_clock(self.clock.time()))
        admin.empty()
        self.seam.on_drop = admin.end_sessions
        return admin

    def app(self, node_id: str) -> Any:
        app = super().app(node_id)
        app.conf.leaderbeat_store_url = store_url(self.dbname, f"lbsim-{node_id}")
        return app

    def _connect(self, config: Config) -> Any:
        assert self._building is not None, "a store made outside Sim.start"
        return self._open(self._building, config)

    def _connect_guard(self, config: Config) -> Any:
        return self._open("guard", config)

    def _open(self, node_id: str, config: Config) -> PostgresStore:
        store = seamed_store(self.seam, node_id, self.dbname, config)
        self.stores.setdefault(node_id, []).append(store)
        return store

    def _close_stores(self, node_id: str) -> None:
        for store in self.stores.pop(node_id, []):
            close_store(store)

    def crash(self, node_id: str) -> None:
        try:
            super().crash(node_id)
        finally:
            self._close_stores(node_id)

    def stop(self, node_id: str) -> None:
        try:
            super().stop(node_id)
        finally:
            self._close_stores(node_id)

    @classmethod
    def on(cls, database: PostgresDatabase, prefix: str,
           schedule: Mapping[str, Mapping[str, Any]], **kw: Any) -> PostgresSim:
        return cls(database.name, prefix, schedule, **kw)

    def history(self) -> list[dict[str, str]]:
        """The history as the database has it now (kept in :attr:`last_history`: a test
        reads it once the sim is closed)."""
        self.last_history: list[dict[str, str]] = self.admin.history(self.prefix)
        return self.last_history

    def close(self) -> None:
        try:
            super().close()
        finally:
            for node_id in list(self.stores):
                self._close_stores(node_id)


class PostgresWorld(World):
    """The model's world on PostgreSQL: "Redis restarts" are the database losing its rows
    (emptied, or put back from a snapshot), every node's session ended with it."""

    def __init__(self, database: PostgresDatabase) -> None:
        self.database = database
        super().__init__(None)

    def _sim(self) -> Sim:
        return PostgresSim.on(self.database, "model", SCHEDULE)

    @property
    def admin(self) -> PgAdmin:
        return self.sim.admin  # type: ignore[no-any-return]

    def _note_leader(self) -> None:
        holder = self.admin.leader(self.sim.prefix)
        if holder:
            self.last_leader = holder

    def redis_restarts_empty(self) -> None:
        self._loss()
        self.collect_history()
        self.admin.empty()
        self.admin.end_sessions()

    def take_snapshot(self) -> None:
        self.admin.take_snapshot()
        self.snapshot = (self.sim.clock.time(), [])

    def restore_snapshot(self) -> None:
        assert self.snapshot is not None
        self._loss()
        self.collect_history()
        self.admin.restore_snapshot()
        self.admin.end_sessions()

    def collect_history(self) -> None:
        # a restore puts the row ids back: an event is known by its content, not its id
        for row in self.admin.history(self.sim.prefix):
            key = "|".join(f"{k}={v}" for k, v in sorted(row.items())).encode()
            self.events.setdefault(key, {k: v for k, v in row.items() if k != "id"})

