"""The PostgreSQL store's CLI calls: step down, pauses, notes, following the history,
forgetting nodes, reset."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from celery_leaderbeat.store.postgres.store import PostgresStore, open_store
from celery_leaderbeat.store.types import ClaimItem, Op
from tests.support.postgres import (
    HOST,
    PORT,
    USER,
    pg_config,
    postgres_database,
    with_node_lease,
)


@pytest.fixture
def store() -> Iterator[PostgresStore]:
    with postgres_database("lbpgadm") as name:
        config = pg_config(key_prefix="app", node_id="n1")
        made = with_node_lease(open_store(f"host={HOST} port={PORT} user={USER} dbname={name}",
                                          config), config)
        yield made
        made.close()


def test_step_down_releases_only_the_lease_of_that_token(store: PostgresStore) -> None:
    store.ping()
    assert store.lease.try_acquire()
    token, epoch = store.lease.credentials()
    stale = f"{store.lease.holder_id}|{epoch - 1}"
    assert not store.admin.step_down(stale, "step-down")
    assert store.admin.step_down(token, "step-down")
    assert store.lease.holder()[0] is None
    released = store.admin.all_history()[-1]
    assert released["event"] == "released" and released["detail"] == "step-down"
    assert released["node"] == "n1"


def test_a_paused_entry_is_listed_with_its_record_until_resumed(store: PostgresStore) -> None:
    store.admin.pause("e", {"note": "maintenance", "by": "ops"})
    assert store.admin.paused() == {"e": {"note": "maintenance", "by": "ops"}}
    assert store.admin.resume("e")
    assert not store.admin.resume("e")
    assert store.admin.paused() == {}


def test_a_note_keeps_every_field(store: PostgresStore) -> None:
    store.admin.note({"event": "paused", "entry": "e", "by": "ops@host", "note": "why"})
    row = store.admin.all_history()[-1]
    assert {k: row[k] for k in ("event", "entry", "by", "note")} == {
        "event": "paused", "entry": "e", "by": "ops@host", "note": "why"}


def test_follow_answers_the_events_written_after_the_last_id_it_gave(
        store: PostgresStore) -> None:
    store.admin.note({"event": "before"})
    last, rows = store.admin.follow(None, block_ms=0)
    assert rows == []
    later = threading.Timer(0.2, store.admin.note, args=({"event": "after"},))
    later.start()
    last, rows = store.admin.follow(last, block_ms=10_000)
    later.join()
    assert [r["event"] for r in rows] == ["after"]
    assert store.admin.follow(last, block_ms=0) == (last, [])


def test_forget_nodes_removes_only_those(store: PostgresStore) -> None:
    store.ledger.register_node("standby", {"host": "a"})
    assert set(store.ledger.nodes()) == {"n1"}
    store.admin.forget_nodes(["other"])
    assert set(store.ledger.nodes()) == {"n1"}
    store.admin.forget_nodes(["n1"])
    assert store.ledger.nodes() == {}


def test_reset_deletes_the_apps_state(store: PostgresStore) -> None:
    assert store.lease.try_acquire()
    token, epoch = store.lease.credentials()
    store.ledger.claim(token, epoch, [ClaimItem("e", 1000, Op.CLAIM, 1000, fingerprint="f")])
    store.requests.push("{}")
    assert store.admin.reset() >= 5  # lease, slot, grant, fingerprint, request, history
    assert store.ledger.load() == {} and store.requests.pop() == []
    assert store.lease.holder()[0] is None
    assert store.ledger.load_with_definitions() == ({}, {})
