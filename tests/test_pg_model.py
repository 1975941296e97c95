"""A model of three nodes on one PostgreSQL store (hypothesis' stateful testing): each step
acquires, lets the lease lapse, claims as a leader, rescues as a standby, records sends,
or fails a node's next store call before the server ran it or after it committed (the
node then asks again once). A leader's grant comes only while it holds the lease under
that epoch; after every step: no slot was granted to two claimants, each grant is the
one the database holds, and each entry's stored slot is its newest grant.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import LeaseLostError, RolledBackError
from celery_leaderbeat.store.base import STORE_ERRORS as ERRORS
from celery_leaderbeat.store.calls import Boundary
from celery_leaderbeat.store.postgres import lease_sql
from celery_leaderbeat.store.postgres.ledger import PostgresLedger
from celery_leaderbeat.store.postgres.pool import ERRORS as PG_ERRORS
from celery_leaderbeat.store.postgres.pool import store_error
from celery_leaderbeat.store.postgres.schema import qualified
from celery_leaderbeat.store.postgres.store import PostgresStore, open_store
from celery_leaderbeat.store.types import ClaimItem, Code, Event, Op
from tests.support.postgres import HOST, PORT, USER, pg_config, place_lease, postgres_database

NODES = ("n0", "n1", "n2")
ENTRIES = ("a", "b")
_apps = itertools.count()


@pytest.fixture(scope="module")
def stores() -> Iterator[list[PostgresStore]]:
    with postgres_database("lbpgmodel") as name:
        conninfo = f"host={HOST} port={PORT} user={USER} dbname={name}"
        made = [open_store(conninfo, _config(node, "init")) for node in NODES]
        yield made
        for store in made:
            store.close()


def _config(node: str, app: str) -> Config:
    return pg_config(key_prefix=app, node_id=node, lease_ttl=30.0, rescue_after=2.0)


class Fault:
    """Fails a node's next store call once, before it is sent or after it committed."""

    def __init__(self) -> None:
        self.when = ""

    def __call__(self, site: str, when: str) -> None:
        if self.when == when:
            self.when = ""
            raise psycopg.OperationalError(f"fault: {site} {when}")


class Nodes(RuleBasedStateMachine):
    """Three nodes of one app (a fresh app per example, on the module's pools)."""

    stores: ClassVar[list[PostgresStore]] = []

    @initialize()
    def start(self) -> None:
        app = f"model{next(_apps)}"
        self.faults = [Fault() for _ in NODES]
        self.leases: list[Any] = []
        self.ledgers: list[Any] = []
        for store, node, fault in zip(self.stores, NODES, self.faults):
            store.place.app, store.place.fault = app, fault
            self.leases.append(place_lease(store.place, _config(node, app)))
            self.ledgers.append(Boundary(PostgresLedger(store.place, _config(node, app)),
                                         "ledger", errors=PG_ERRORS, translate=store_error))
        self.app = app
        with psycopg.connect(self.stores[0].place.pool.conninfo) as conn:
            self.base = lease_sql.server_ms(conn) - 3_600_000  # every slot long due
        #: (entry, slot) -> who was told it was granted: "node@epoch" or "node@rescue"
        self.granted: dict[tuple[str, int], set[str]] = {}
        self.sent: dict[int, list[Event]] = {i: [] for i in range(len(NODES))}

    def _twice(self, call: Any) -> Any:
        """A store call, asked again once if it failed; None if it failed twice."""
        for _ in range(2):
            try:
                return call()
            except ERRORS:
                continue
        return None

    @rule(node=st.integers(0, 2))
    def acquire(self, node: int) -> None:
        self._twice(self.leases[node].try_acquire)

    @rule()
    def lapse(self) -> None:
        """The leader's ttl passes (it is paused, or dead)."""
        with psycopg.connect(self.stores[0].place.pool.conninfo, autocommit=True) as conn:
            conn.execute(qualified("UPDATE {schema}.lease SET expires_at = clock_timestamp()"
                                   " - interval '1 s' WHERE app = %s", "leaderbeat"), (self.app,))

    @rule(node=st.integers(0, 2), when=st.sampled_from(["before", "after"]))
    def fail_next_call(self, node: int, when: str) -> None:
        self.faults[node].when = when

    def _planned(self, node: int, entry: str) -> tuple[int, int]:
        """The node's view: the stored slot of ``entry`` and the next one it plans."""
        stored = (self._twice(lambda: self.ledgers[node].load([entry])) or {}).get(entry)
        prev = stored.slot_ms if stored else self.base
        return prev, prev + 1000

    @rule(node=st.integers(0, 2), entry=st.sampled_from(ENTRIES))
    def claim(self, node: int, entry: str) -> None:
        lease, ledger = self.leases[node], self.ledgers[node]
        if lease.token is None or lease.epoch is None:
            return
        _, slot = self._planned(node, entry)
        item = ClaimItem(entry, slot, Op.CLAIM, slot)
        token, epoch = lease.token, lease.epoch
        try:
            answers = self._twice(lambda: ledger.claim(token, epoch, [item],
                                                       self.sent[node]))
        except (LeaseLostError, RolledBackError):
            return
        if answers is not None:
            self.sent[node] = []
            if answers == [Code.GRANTED]:
                self._told(entry, slot, f"{NODES[node]}@{epoch}")
                self.sent[node].append(Event(entry, slot, "sent"))
                # granted only to the lease's holder, under its epoch, while it is valid
                with psycopg.connect(self.stores[0].place.pool.conninfo) as conn:
                    held = lease_sql.current_holder(conn, "leaderbeat", self.app)
                assert held[:2] == (lease.holder_id, epoch), f"granted to {token}, held {held}"

    @rule(node=st.integers(0, 2), entry=st.sampled_from(ENTRIES))
    def rescue(self, node: int, entry: str) -> None:
        prev, slot = self._planned(node, entry)
        if prev == self.base:
            return  # no state yet: nothing to rescue from
        item = ClaimItem(entry, slot, Op.CLAIM, slot, prev)
        try:
            claimed = self._twice(lambda: self.ledgers[node].rescue([item]))
        except RolledBackError:
            return
        if claimed is not None and claimed.results == [Code.GRANTED]:
            self._told(entry, slot, f"{NODES[node]}@rescue")
            self.sent[node].append(Event(entry, slot, "sent"))

    @rule(node=st.integers(0, 2))
    def record(self, node: int) -> None:
        if self.sent[node]:
            try:
                done = self._twice(lambda: self.ledgers[node].record(0, self.sent[node]))
            except RolledBackError:
                return
            if done is not None:
                self.sent[node] = []

    def _told(self, entry: str, slot: int, who: str) -> None:
        self.granted.setdefault((entry, slot), set()).add(who)

    @invariant()
    def no_slot_granted_twice_and_each_grant_as_told(self) -> None:
        if not hasattr(self, "app"):
            return
        with psycopg.connect(self.stores[0].place.pool.conninfo) as conn:
            rows = conn.execute(qualified(
                "SELECT entry, slot_ms, epoch, node FROM {schema}.grants WHERE app = %s",
                "leaderbeat"), (self.app,)).fetchall()
            slots = conn.execute(qualified(
                "SELECT entry, slot_ms FROM {schema}.slots WHERE app = %s", "leaderbeat"),
                (self.app,)).fetchall()
        grants = {(e, int(s)): (int(ep), n) for e, s, ep, n in rows}
        for key, who in self.granted.items():
            assert len(who) == 1, f"{key} granted to {who}"
            node, _, epoch = next(iter(who)).partition("@")
            assert grants[key] == ((0, node) if epoch == "rescue" else (int(epoch), ""))
        newest: dict[str, int] = {}
        for entry, slot in grants:
            newest[entry] = max(newest.get(entry, 0), slot)
        assert {e: int(s) for e, s in slots} == newest

    def teardown(self) -> None:
        for store in self.stores:
            store.place.fault = None


def test_three_nodes_with_faults_never_grant_a_slot_twice(stores: list[PostgresStore]) -> None:
    Nodes.stores = stores
    run_state_machine_as_test(Nodes, settings=settings(
        max_examples=40, stateful_step_count=25, deadline=None,
        suppress_health_check=list(HealthCheck)))
