"""The PostgreSQL store behind PgBouncer in transaction mode (Debian's ``pgbouncer``):
each transaction may reach another server session, so the store uses no prepared
statement and no session state, and its events are polled (``listen=False``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from celery_leaderbeat.store.postgres.store import PostgresStore, open_store
from celery_leaderbeat.store.types import ClaimItem, Code, Event, Op
from tests.support.pg_cluster import pgbouncer
from tests.support.postgres import HOST, PORT, USER, pg_config, postgres_database, with_node_lease


@pytest.fixture
def bounced() -> Iterator[str]:
    with postgres_database("lbpgb") as name, pgbouncer(PORT, HOST) as port:
        yield f"host=127.0.0.1 port={port} user={USER} dbname={name}"


def _store(conninfo: str, node: str) -> PostgresStore:
    config = pg_config(key_prefix="app", node_id=node)
    return with_node_lease(open_store(conninfo, config, listen=False), config)


def test_the_lease_claims_and_requests_work_behind_a_transaction_pooler(bounced: str) -> None:
    leader, standby = _store(bounced, "n1"), _store(bounced, "s1")
    try:
        assert leader.lease.try_acquire() and not standby.lease.try_acquire()
        token, epoch = leader.lease.credentials()
        for round_ in range(30):  # enough statements to be prepared, were that on
            slot = 1000 * (round_ + 1)
            items = [ClaimItem(f"e{i}", slot, Op.CLAIM, slot) for i in range(20)]
            sent = [Event(f"e{i}", slot - 1000, "sent") for i in range(20)] if round_ else []
            assert leader.ledger.claim(token, epoch, items, sent) == [Code.GRANTED] * 20
            leader.lease.renew()
        assert standby.ledger.rescue([ClaimItem("e0", 1000, Op.CLAIM, 1000, 0)]).results[0]
        standby.requests.push("r1")
        assert leader.requests.pop() == ["r1"]
        assert leader.lease.release()
        assert standby.lease.try_acquire()
        assert standby.events.subscribe().next(0.1) is None  # polled: no LISTEN
    finally:
        leader.close()
        standby.close()


def test_nodes_racing_behind_a_transaction_pooler_get_one_lease(bounced: str) -> None:
    stores = [_store(bounced, f"n{i}") for i in range(4)]
    try:
        won: list[str] = []
        barrier = threading.Barrier(len(stores))

        def race(store: PostgresStore) -> None:
            barrier.wait()
            if store.lease.try_acquire():
                won.append(store.lease.config.node_id)

        threads = [threading.Thread(target=race, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(won) == 1
    finally:
        for store in stores:
            store.close()


def test_a_subscription_behind_a_transaction_pooler_finds_listen_deaf_and_polls(
        bounced: str, caplog: pytest.LogCaptureFixture) -> None:
    config = pg_config(key_prefix="app", node_id="n1")
    store = open_store(bounced, config)  # LISTEN on, as a beat opens it
    try:
        with caplog.at_level(logging.WARNING):
            subscription = store.events.subscribe()
        assert not subscription.listen
        assert "LISTEN hears nothing on this connection" in caplog.text
        assert subscription.next(0.1) is None
    finally:
        store.close()
