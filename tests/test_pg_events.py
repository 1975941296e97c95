"""The PostgreSQL store's events (NOTIFY / LISTEN, polling without them), the requests
queue, and a schema migrated from an older version."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import psycopg
import pytest

from celery_leaderbeat.store.postgres.events import PostgresEvents
from celery_leaderbeat.store.postgres.place import Place
from celery_leaderbeat.store.postgres.requests import PostgresRequests
from celery_leaderbeat.store.postgres.schema import (
    ensure_schema,
    latest_version,
    migrations,
    qualified,
    schema_version,
)
from celery_leaderbeat.store.postgres.store import open_store
from tests.support.pg_cluster import pg_cluster
from tests.support.postgres import HOST, PORT, USER, node_lease, pg_config, postgres_database


@pytest.fixture
def conninfo() -> Iterator[str]:
    with postgres_database("lbpgev") as name:
        yield f"host={HOST} port={PORT} user={USER} dbname={name}"


@pytest.fixture
def place(conninfo: str) -> Iterator[Place]:
    store = open_store(conninfo, pg_config(key_prefix="app", node_id="n1"))
    yield store.place
    store.place.pool.close()


def test_a_schema_at_an_older_version_is_migrated_to_the_latest(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "leaderbeat"')
        conn.execute('CREATE TABLE "leaderbeat".schema_version (version integer PRIMARY KEY,'
                     ' applied_at timestamptz NOT NULL DEFAULT clock_timestamp())')
        conn.execute(qualified(migrations()[0][1], "leaderbeat"))
        conn.execute('INSERT INTO "leaderbeat".schema_version (version) VALUES (1)')
        assert schema_version(conn) == 1
        assert ensure_schema(conn) == [v for v, _ in migrations()[1:]]
        assert schema_version(conn) == latest_version() >= 2


def test_a_released_lease_wakes_a_subscriber(conninfo: str) -> None:
    config = pg_config(key_prefix="app", node_id="n1")
    store = open_store(conninfo, config)
    lease = node_lease(store, config)
    try:
        subscription = PostgresEvents(lease.place).subscribe()
        assert subscription.next(0.1) is None
        assert lease.try_acquire()
        assert lease.release()
        assert subscription.next(10) == "released"
        subscription.close()
    finally:
        lease.place.pool.close()


def test_each_app_hears_only_its_own_events(conninfo: str, place: Place) -> None:
    other = Place(place.pool, place.schema, "other")
    mine = PostgresEvents(place).subscribe()
    PostgresEvents(other).publish("released")
    PostgresEvents(place).publish("request")
    assert mine.next(10) == "request"
    mine.close()


def test_a_subscription_on_the_server_itself_keeps_listening_and_hears(
        place: Place, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        subscription = PostgresEvents(place).subscribe()
    try:
        assert subscription.listen and "hears nothing" not in caplog.text
        PostgresEvents(place).publish("released")
        assert subscription.next(5.0) == "released"
    finally:
        subscription.close()


def test_without_listen_a_subscription_waits_and_answers_none(place: Place) -> None:
    subscription = PostgresEvents(place, listen=False).subscribe()
    PostgresEvents(place).publish("released")
    assert subscription.next(0.2) is None


def test_a_subscription_listens_again_after_the_server_restarted() -> None:
    with pg_cluster() as cluster:
        config = pg_config(key_prefix="app", node_id="n1")
        store = open_store(cluster.conninfo, config)
        lease = node_lease(store, config)
        try:
            events = PostgresEvents(lease.place)
            subscription = events.subscribe()
            cluster.restart()
            assert subscription.next(1) is None  # the connection broke: a poll finds it
            heard = None
            for _ in range(20):  # listening again; publish until heard (a hint may be lost)
                try:
                    events.publish("request")
                except psycopg.OperationalError:
                    continue
                heard = subscription.next(0.5)
                if heard:
                    break
            assert heard == "request"
            subscription.close()
        finally:
            lease.place.pool.close()


def test_requests_are_taken_once_oldest_first_and_put_back_first_in_line(place: Place) -> None:
    queue = PostgresRequests(place)
    for i in range(6):
        queue.push(f"r{i}")
    assert queue.pop(2) == ["r0", "r1"]
    queue.requeue(["r0", "r1"])
    assert queue.pop(3) == ["r0", "r1", "r2"]
    assert queue.pop() == ["r3", "r4", "r5"]
    assert queue.pop() == []
    assert queue.now_ms() > 1_600_000_000_000


def test_two_leaders_popping_at_once_never_take_one_request_twice(place: Place) -> None:
    queue = PostgresRequests(place)
    for i in range(200):
        queue.push(f"r{i}")
    taken: list[list[str]] = [[], []]
    barrier = threading.Barrier(2)

    def take(mine: list[str]) -> None:
        barrier.wait()
        while got := queue.pop(7):
            mine.extend(got)

    threads = [threading.Thread(target=take, args=(t,)) for t in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = taken[0] + taken[1]
    assert sorted(everything) == sorted(f"r{i}" for i in range(200))


def test_a_slot_is_backfilled_once_ever(place: Place) -> None:
    queue = PostgresRequests(place)
    assert queue.mark_backfilled("e", 1000, "req-1")
    assert not queue.mark_backfilled("e", 1000, "req-2")
    assert queue.mark_backfilled("e", 2000, "req-2")
    assert queue.backfilled("e") == {1000, 2000}
    assert queue.backfilled("other") == set()


def test_a_pushed_request_wakes_the_leader(place: Place) -> None:
    subscription = PostgresEvents(place).subscribe()
    PostgresRequests(place).push('{"kind": "trigger"}')
    assert subscription.next(10) == "request"
    subscription.close()
