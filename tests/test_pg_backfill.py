"""A backfill through the PostgreSQL store's claim: granted only for a slot the schedule
passed unsent, once ever, and refused with its reason otherwise (backfill.lua's rules)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from celery_leaderbeat.store.postgres import lease_sql, state_sql
from celery_leaderbeat.store.postgres.schema import qualified
from celery_leaderbeat.store.postgres.store import PostgresStore, open_store
from celery_leaderbeat.store.types import (
    BackfillReason,
    BackfillRefused,
    ClaimItem,
    ClaimResult,
    Code,
    Event,
    Op,
)
from tests.support.postgres import HOST, PORT, USER, pg_config, postgres_database, with_node_lease


@pytest.fixture
def conninfo() -> Iterator[str]:
    with postgres_database("lbpgbf") as name:
        yield f"host={HOST} port={PORT} user={USER} dbname={name}"


def sql(conninfo: str, text: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(qualified(text, "leaderbeat"))


@pytest.fixture
def store(conninfo: str) -> Iterator[PostgresStore]:
    config = pg_config(key_prefix="app", node_id="n1", history_length=1000)
    made = with_node_lease(open_store(conninfo, config), config)
    yield made
    made.close()


def _three_slots(store: PostgresStore, conninfo: str) -> tuple[int, int, int]:
    """Slots a, b, c of entry e claimed in turn; a and c sent, b never confirmed; the
    history reaching back an hour."""
    assert store.lease.try_acquire()
    sql(conninfo, "UPDATE {schema}.history SET at = at - interval '1 hour'")
    with psycopg.connect(conninfo) as conn:
        now = lease_sql.server_ms(conn)
    a, b, c = now - 30_000, now - 20_000, now - 10_000
    token, epoch = store.lease.credentials()
    for slot in (a, b, c):
        item = ClaimItem("e", slot, Op.CLAIM, slot)
        assert store.ledger.claim(token, epoch, [item]) == [Code.GRANTED]
    store.ledger.record(epoch, [Event("e", a, "sent"), Event("e", c, "sent")])
    return a, b, c


def backfill(store: PostgresStore, *slots: int, request: str = "req-1") -> list[ClaimResult]:
    token, epoch = store.lease.credentials()
    return store.ledger.backfill(token, epoch, "e", list(slots), request)


def test_a_slot_passed_unsent_is_backfilled_once_and_the_others_say_why_not(
        store: PostgresStore, conninfo: str) -> None:
    a, b, c = _three_slots(store, conninfo)
    assert backfill(store, a, b, c) == [BackfillRefused(BackfillReason.SENT), Code.GRANTED,
                                        BackfillRefused(BackfillReason.LATER)]
    assert backfill(store, b) == [Code.GRANTED]  # the same request asking again (reply lost)
    assert backfill(store, b, request="req-2") == [BackfillRefused(BackfillReason.BACKFILLED)]
    assert store.requests.backfilled("e") == {b}
    assert store.ledger.load()["e"].slot_ms == c  # the stored slot stays


def test_a_backfill_is_refused_where_the_history_no_longer_reaches(
        store: PostgresStore, conninfo: str) -> None:
    _, b, _ = _three_slots(store, conninfo)
    assert backfill(store, b, request="probe") == [Code.GRANTED]  # reachable, so far
    sql(conninfo, "DELETE FROM {schema}.backfilled")
    store.admin.note({"event": "later"})
    store.ledger.place.run(state_sql.prune_history, keep=1, max_age_s=3600)
    assert backfill(store, b) == [BackfillRefused(BackfillReason.HORIZON)]


def test_a_backfill_is_refused_below_the_floor_a_loss_of_writes_set(
        store: PostgresStore, conninfo: str) -> None:
    _, b, c = _three_slots(store, conninfo)
    assert store.ledger.lost_at() is None
    # a leader starting again after a loss of writes
    store.ledger.reset_generation(store.lease.epoch)
    token, epoch = store.lease.credentials()
    store.ledger.claim(token, epoch, [ClaimItem("e", c, Op.ANCHOR, c)])
    assert store.ledger.lost_at() is not None
    assert backfill(store, b) == [BackfillRefused(BackfillReason.LOST)]


def test_a_slot_claimed_unconfirmed_by_an_earlier_leader_is_not_backfilled(
        store: PostgresStore, conninfo: str) -> None:
    _, b, c = _three_slots(store, conninfo)
    sql(conninfo, "UPDATE {schema}.lease SET expires_at = clock_timestamp()")
    config = pg_config(key_prefix="app", node_id="n2")
    newer = with_node_lease(open_store(conninfo, config), config)
    try:
        assert newer.lease.try_acquire()
        token, epoch = newer.lease.credentials()
        later = c + 5000
        sql(conninfo, f"UPDATE {{schema}}.slots SET state = 'c', slot_ms = {b}")
        item = ClaimItem("e", later, Op.CLAIM, later)
        assert newer.ledger.claim(token, epoch, [item]) == [Code.GRANTED]
        assert ("e", b) in newer.ledger.overtaken()
        assert newer.ledger.backfill(token, epoch, "e", [b], "req-9") == [
            BackfillRefused(BackfillReason.UNCONFIRMED)]
    finally:
        newer.close()
