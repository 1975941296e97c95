"""The run-time entries on PostgreSQL (entries.lua's rules): versioned saves, read by
change, a first slot state for an enabled entry, removals remembered up to a cap."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from celery_leaderbeat.errors import EntryExists, EntryNotFound
from celery_leaderbeat.store.entry_store import Saved
from celery_leaderbeat.store.postgres import entries_sql
from celery_leaderbeat.store.postgres.store import PostgresStore, open_store
from celery_leaderbeat.store.types import SlotState
from tests.support.postgres import HOST, PORT, USER, pg_config, postgres_database


@pytest.fixture
def store() -> Iterator[PostgresStore]:
    with postgres_database("lbpgent") as name:
        made = open_store(f"host={HOST} port={PORT} user={USER} dbname={name}",
                          pg_config(key_prefix="app", node_id="n1"))
        yield made
        made.close()


def save(store: PostgresStore, name: str, fp: str = "f1", timing: str = "t1",
         enabled: bool = True, **kw: Any) -> Saved:
    return store.entries.save(name, fingerprint=fp, timing=timing, enabled=enabled,
                              definition=f'{{"name": "{name}", "fp": "{fp}"}}', **kw)


def test_a_save_is_versioned_and_an_unchanged_one_changes_nothing(store: PostgresStore) -> None:
    first = save(store, "e")
    assert first.changed and first.version == 1 and first.anchor_ms % 1000 == 0
    again = save(store, "e")
    assert (again.changed, again.version, again.anchor_ms) == (False, 1, first.anchor_ms)
    other = save(store, "e", fp="f2")  # same timing: the anchor (the phase) is kept
    assert other.changed and other.version == 2 and other.anchor_ms == first.anchor_ms
    stored = store.entries.get("e")
    assert stored is not None and stored.fingerprint == "f2" and stored.version == 2
    assert store.entries.names() == ["e"]


def test_create_refuses_an_existing_entry_and_update_an_unknown_one(store: PostgresStore) -> None:
    save(store, "e", how="create")
    with pytest.raises(EntryExists):
        save(store, "e", how="create")
    with pytest.raises(EntryNotFound):
        save(store, "x", how="update")
    assert store.entries.names() == ["e"]


def test_an_enabled_entry_gets_its_first_slot_state_with_its_save(store: PostgresStore) -> None:
    saved = save(store, "e", anchor_ms=5000)
    assert saved.anchor_ms == 5000 and store.entries.get("e").kept  # type: ignore[union-attr]
    save(store, "once", first_ms=3999, anchor_ms=9000)
    save(store, "off", enabled=False)
    assert store.ledger.load() == {"e": SlotState(5000, 0, "a"), "once": SlotState(3999, 0, "a")}


def test_changes_since_a_version_are_the_saves_and_removals_after_it(
        store: PostgresStore) -> None:
    save(store, "a")
    save(store, "b")
    seen = store.entries.changes(-1)
    assert seen.full and set(seen.saved) == {"a", "b"} and seen.version == 2
    save(store, "a", fp="f2")
    assert store.entries.delete("b") and not store.entries.delete("b")
    later = store.entries.changes(seen.version)
    assert not later.full and set(later.saved) == {"a"} and later.removed == ["b"]
    assert store.entries.changes(later.version).saved == {}


def test_a_node_behind_the_removals_kept_reads_every_entry(
        store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entries_sql, "REMOVED_CAP", 2)
    for name in "abcd":
        save(store, name)
    for name in "abc":
        store.entries.delete(name)
    behind = store.entries.changes(4)
    assert behind.full and set(behind.saved) == {"d"}


def test_a_node_ahead_of_the_stores_version_reads_every_entry_and_removals_come_in_order(
        store: PostgresStore) -> None:
    """A store restored from an older snapshot is behind what a node saw: that node reads
    every entry again. Removals come in the order they were made, whatever their names."""
    for name in "abcd":
        save(store, name)
    ahead = store.entries.changes(9)
    assert ahead.full and set(ahead.saved) == {"a", "b", "c", "d"} and ahead.version == 4
    assert list(ahead.removed) == []
    for name in "dab":
        store.entries.delete(name)
    later = store.entries.changes(4)
    assert not later.full and later.saved == {} and list(later.removed) == ["d", "a", "b"]


def test_finish_disables_a_one_off_once_and_only_for_its_definition(store: PostgresStore) -> None:
    save(store, "once")
    assert not store.entries.finish("once", "other", 7000)
    assert store.entries.finish("once", "f1", 7000)
    assert not store.entries.finish("once", "f1", 7000)
    stored = store.entries.get("once")
    assert stored is not None and not stored.enabled and stored.ran_ms == 7000


def test_saves_at_once_each_get_a_version_of_their_own(store: PostgresStore) -> None:
    versions: list[int] = []
    barrier = threading.Barrier(4)

    def write(i: int) -> None:
        barrier.wait()
        for j in range(10):
            versions.append(save(store, f"e{i}-{j}").version)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(versions) == list(range(1, 41))
