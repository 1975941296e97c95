"""The PostgreSQL store: its parts on one pool, and what about the server's settings puts
the guarantees at risk.

``leaderbeat_store_url`` chooses it (``store/open.py``); tests and benchmarks build it
on a connection string with :func:`open_store`. Each adapter takes a connection from the pool, runs one function of
the ``*_sql`` modules, and turns its answer into the seam's types.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from ...config import Config
from ..base import (
    ClusterAdmin,
    EntryDefinitions,
    Events,
    GuardStore,
    LeaseStore,
    LossDetection,
    RequestQueue,
    SlotStore,
)
from ..calls import PARTS, store_call, through_boundary
from .admin import PostgresAdmin
from .entries import PostgresEntries
from .events import PostgresEvents
from .guard import PostgresGuard
from .lease import PostgresLease
from .ledger import PostgresLedger
from .place import Place
from .pool import ERRORS, connection, make_pool, store_error
from .requests import PostgresRequests
from .schema import ensure_schema

#: seconds a ping waits for a connection: the pool's own idle one comes at once, a new one
#: to a server that answers within well under this
PING_WAIT = 0.5

#: server settings that put the guarantees at risk: (query, bad answer, what to say)
_RISKS = (
    ("SELECT current_setting('fsync')", "off",
     "fsync=off: a server crash can lose committed claims (and corrupt the database)"),
    ("SELECT current_setting('synchronous_commit')", "off",
     ("synchronous_commit=off: a server crash can lose the last committed claims; set it "
      "to on for the role leaderbeat connects as")),
    (("SELECT CASE WHEN current_setting('synchronous_standby_names') = ''"
      " AND EXISTS (SELECT 1 FROM pg_stat_replication) THEN 'async' END"), "async",
     ("replicas stream from this server asynchronously: one promoted after a failover can "
      "lack committed claims (seen and refused, then re-anchored: slots around the "
      "failover may be missed or recorded unsent); set synchronous_standby_names = "
      "'ANY 1 (*)' so that none is lost")),
)


class PostgresStore:
    """One app's store on one pool: the lease, the slots, the events, the requests, the
    run-time entries, the CLI's calls and the worker guard's records."""

    client: Any = None  #: no claim-and-enqueue in one step: the broker is not the store

    def __init__(self, place: Place, config: Config, *, listen: bool = True) -> None:
        self.place = place
        events = PostgresEvents(place, listen=listen)
        self.lease: LeaseStore = PostgresLease(place, config)
        ledger = PostgresLedger(place, config)
        self.ledger: SlotStore = ledger
        self.loss: LossDetection = ledger  # it detects losses of writes
        self.events: Events = events
        self.requests: RequestQueue = PostgresRequests(place)
        self.admin: ClusterAdmin = PostgresAdmin(place, config.history_length)
        self.entries: EntryDefinitions = PostgresEntries(place)
        self.guard: GuardStore = PostgresGuard(place, config)

        through_boundary(self, PARTS, errors=ERRORS, translate=store_error)
        self.loss = cast(LossDetection, self.ledger)  # behind the boundary: ``ledger.*``

    def ping(self) -> None:
        """Raise a store error unless the server answers. While the pool has no connection
        to give (the server away) it waits :data:`PING_WAIT` for one, not a call's timeout:
        a leader sending through an outage pings between sends."""
        with store_call("store.ping"), _translated(), \
                connection(self.place.pool, min(PING_WAIT, self.place.pool.timeout)) as conn:
            conn.execute("SELECT 1")

    def warnings(self) -> list[str]:
        """What about the server's settings puts the guarantees at risk."""
        out = []
        with store_call("store.warnings"), _translated(), \
                connection(self.place.pool) as conn:
            for query, bad, say in _RISKS:
                row = conn.execute(query).fetchone()
                if row is not None and row[0] == bad:
                    out.append(say)
        return out

    def close(self) -> None:
        self.place.pool.close()


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except ERRORS as exc:
        raise store_error(exc) from exc


def open_store(conninfo: str, config: Config, *, schema: str | None = None,
               create: bool = True, listen: bool = True, threads: bool = True,
               **connection_options: Any) -> PostgresStore:
    """The store of ``config``'s app (its key prefix) on one new pool, in ``schema``
    (``config.store_schema`` unless given); the schema created or migrated first unless
    ``create`` is False. ``listen=False``: the events are not
    listened for (behind a transaction-mode pooler). ``connection_options`` go to every
    connection (``prepare_threshold=5``: server-side prepared statements, where no
    transaction-mode pooler older than PgBouncer 1.21 sits in between). ``threads=False``:
    on one connection with no threads (``pool.OneConnection``), for a process that forks."""
    pool = make_pool(conninfo, timeout=config.store_timeout, threads=threads,
                     **connection_options)
    place = Place(pool, schema or config.store_schema, config.key_prefix)
    if create:
        with connection(pool) as conn:
            ensure_schema(conn, place.schema)
    return PostgresStore(place, config, listen=listen)
