"""A streaming replica promoted after the primary died: with asynchronous replication it
can lack committed claims. The store sees it (the generation went back) and refuses to
write on that older state, as the Redis store does when Redis lost writes."""

from __future__ import annotations

import time

import psycopg
import pytest

from celery_leaderbeat.errors import RolledBackError, StoreUnreachable
from celery_leaderbeat.store.postgres import lease_sql
from celery_leaderbeat.store.postgres.store import open_store
from celery_leaderbeat.store.types import ClaimItem, Code, Op, SlotState
from tests.support.pg_cluster import Cluster, pg_cluster
from tests.support.postgres import node_lease, pg_config
from tests.support.proxy import TcpProxy


def _caught_up(primary: Cluster, replica: Cluster) -> None:
    with psycopg.connect(primary.conninfo, autocommit=True) as conn:
        target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    deadline = time.monotonic() + 60
    with psycopg.connect(replica.conninfo, autocommit=True) as conn:
        while time.monotonic() < deadline:
            done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                (str(target),)).fetchone()[0]
            if done:
                return
            time.sleep(0.05)
    pytest.fail("the replica did not catch up within 60 s")


def _cut_replication(replica: Cluster) -> None:
    """The replica stops receiving (as a lagging one would lack the newest commits)."""
    with psycopg.connect(replica.conninfo, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()[0]:
            if time.monotonic() > deadline:
                pytest.fail("the replica kept receiving")
            time.sleep(0.05)


def test_a_promoted_async_replica_that_lacks_claims_is_refused_until_the_leader_resets(
        ) -> None:
    with pg_cluster() as primary, pg_cluster(standby_of=primary) as replica:
        proxy = TcpProxy("127.0.0.1", primary.port)  # the address the nodes know (a VIP)
        conninfo = f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres"
        config = pg_config(key_prefix="app", node_id="n1", lease_ttl=30.0)
        store = open_store(conninfo, config)
        lease, ledger = node_lease(store, config), store.ledger
        try:
            assert any("asynchronously" in w for w in store.warnings())
            assert any("fsync=off" in w for w in store.warnings())  # the tests' own clusters
            assert lease.try_acquire()
            token, epoch = lease.credentials()
            assert ledger.claim(token, epoch, [ClaimItem("e", 1000, Op.CLAIM, 1000)]) == [Code.GRANTED]
            _caught_up(primary, replica)
            _cut_replication(replica)
            assert ledger.claim(token, epoch, [ClaimItem("e", 2000, Op.CLAIM, 2000)]) == [Code.GRANTED]
            with psycopg.connect(primary.conninfo) as conn:
                before = lease_sql.server_identity(conn)
            primary.kill()
            replica.promote()
            proxy.target = ("127.0.0.1", replica.port)
            proxy.drop_connections()
            with pytest.raises((RolledBackError, StoreUnreachable)):
                ledger.claim(token, epoch, [ClaimItem("e", 2000, Op.CLAIM, 2000)])
            with pytest.raises(RolledBackError, match="older state"):
                ledger.claim(token, epoch, [ClaimItem("e", 2000, Op.CLAIM, 2000)])
            assert ledger.load()["e"] == SlotState(1000, 1, "c")  # the claim of 2000 is lost
            with psycopg.connect(replica.conninfo) as conn:
                after = lease_sql.server_identity(conn)
            assert after[0] == before[0] and after[1] > before[1]  # the same data, a new timeline
            ledger.reset_generation(epoch)
            assert ledger.claim(token, epoch, [ClaimItem("e", 3000, Op.CLAIM, 3000)]) == [Code.GRANTED]
        finally:
            lease.place.pool.close()
            proxy.close()


def test_a_replica_promoted_under_synchronous_replication_has_every_claim() -> None:
    """No claim lost and no loss reported after the failover. (On a fast local link an
    asynchronous replica usually has them too: what only synchronous replication promises
    is that a granted claim's commit returned after the replica had it.)"""
    with pg_cluster() as primary, pg_cluster(standby_of=primary) as replica:
        with psycopg.connect(primary.conninfo, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (*)'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while not conn.execute("SELECT count(*) FROM pg_stat_replication"
                                   " WHERE sync_state = 'quorum'").fetchone()[0]:
                assert time.monotonic() < deadline, "the replica never became synchronous"
                time.sleep(0.05)
        proxy = TcpProxy("127.0.0.1", primary.port)
        conninfo = f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres"
        config = pg_config(key_prefix="app", node_id="n1", lease_ttl=30.0)
        store = open_store(conninfo, config)
        lease, ledger = node_lease(store, config), store.ledger
        try:
            assert not any("asynchronously" in w for w in store.warnings())
            assert lease.try_acquire()
            token, epoch = lease.credentials()
            for slot in range(1000, 21000, 1000):
                assert ledger.claim(token, epoch, [ClaimItem("e", slot, Op.CLAIM, slot)]) == [Code.GRANTED]
            primary.kill()
            replica.promote()
            proxy.target = ("127.0.0.1", replica.port)
            proxy.drop_connections()
            last = ClaimItem("e", 20000, Op.CLAIM, 20000)
            answers = None
            for _ in range(3):  # the first call may meet the dropped connection
                try:
                    answers = ledger.claim(token, epoch, [last])
                    break
                except StoreUnreachable:
                    continue
            assert answers == [Code.GRANTED]  # its own claim asked again: nothing lost, no loss seen
            assert ledger.load()["e"] == SlotState(20000, 1, "c") and not ledger.loss_seen
        finally:
            lease.place.pool.close()
            proxy.close()
