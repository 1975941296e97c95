"""The PostgreSQL store against a real server: its schema, the lease, claims and rescues.

Each test gets a database of its own on the server at 127.0.0.1:5432
(``tests/support/postgres.py``); the test that restarts the server starts a cluster of
its own (``tests/support/pg_cluster.py``).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from celery_leaderbeat.errors import (
    ConfigurationError,
    LeaseLostError,
    RolledBackError,
    StoreError,
    StoreUnreachable,
)
from celery_leaderbeat.roles.lease import Heartbeat, LeaseView
from celery_leaderbeat.store.postgres import (
    claims_sql,
    entries_sql,
    lease_sql,
    rules,
    state_sql,
)
from celery_leaderbeat.store.postgres.ledger import PRUNE_EVERY, PRUNE_OVERDUE, PostgresLedger
from celery_leaderbeat.store.postgres.schema import (
    ensure_schema,
    latest_version,
    migrations,
    qualified,
    schema_version,
)
from celery_leaderbeat.store.postgres.store import open_store
from celery_leaderbeat.store.types import ClaimItem, Code, Event, Op, Refused, SlotState
from tests.support.pg_cluster import pg_cluster
from tests.support.postgres import HOST, PORT, USER, node_lease, pg_config, postgres_database

SCHEMA = "leaderbeat"


@pytest.fixture
def conninfo() -> Iterator[str]:
    with postgres_database("lbpg") as name:
        yield f"host={HOST} port={PORT} user={USER} dbname={name}"


Node = tuple[LeaseView, PostgresLedger]


@pytest.fixture
def make_node(conninfo: str) -> Iterator[Callable[..., Node]]:
    """``make_node(node_id, **config)``: a lease and a ledger of app ``app`` on their own pool."""
    made: list[Node] = []

    def make(node_id: str, app: str = "app", **settings: Any) -> Node:
        config = pg_config(key_prefix=app, node_id=node_id, **settings)
        store = open_store(conninfo, config)
        node = (node_lease(store, config), store.ledger)
        made.append(node)
        return node

    yield make
    for lease, _ in made:
        lease.place.pool.close()


def sql(conninfo: str, text: str, **params: Any) -> list[Any]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute(qualified(text, SCHEMA), params)
        return cur.fetchall() if cur.description else []


def expire(conninfo: str, app: str = "app") -> None:
    """The lease of ``app`` lapses now (as its ttl would)."""
    sql(conninfo, "UPDATE {schema}.lease SET expires_at = clock_timestamp() - interval '1 s'"
                  " WHERE app = %(app)s", app=app)


def server_ms(conninfo: str) -> int:
    with psycopg.connect(conninfo) as conn:
        return lease_sql.server_ms(conn)


# --- the schema -------------------------------------------------------------------------

def test_ensure_schema_creates_every_table_once_and_records_its_version(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        assert schema_version(conn) == 0
        assert ensure_schema(conn) == [v for v, _ in migrations()]
        assert ensure_schema(conn) == []
        assert schema_version(conn) == latest_version()
    tables = {r[0] for r in sql(conninfo, "SELECT tablename FROM pg_tables"
                                          " WHERE schemaname = %(s)s", s=SCHEMA)}
    assert {"lease", "slots", "grants", "history", "schema_version"} <= tables


def test_nodes_starting_at_once_migrate_the_schema_once(conninfo: str) -> None:
    applied: list[list[int]] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            barrier.wait()
            applied.append(ensure_schema(conn, "racing"))

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(applied, key=len) == [[], [], [], [v for v, _ in migrations()]]


def test_a_schema_newer_than_the_code_is_refused_with_its_version(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        ensure_schema(conn, "other")
        conn.execute('INSERT INTO "other".schema_version (version) VALUES (9999)')
        with pytest.raises(ConfigurationError, match="version 9999, newer"):
            ensure_schema(conn, "other")


def test_two_apps_in_one_schema_each_have_their_own_lease(make_node: Callable[..., Node]
                                                          ) -> None:
    a, _ = make_node("n1", app="one")
    b, _ = make_node("n2", app="two")
    assert a.try_acquire() and b.try_acquire()
    assert a.epoch == 1 and b.epoch == 1


# --- the lease --------------------------------------------------------------------------

def test_two_nodes_racing_for_the_lease_exactly_one_wins(make_node: Callable[..., Node],
                                                         conninfo: str) -> None:
    nodes = [make_node(f"n{i}")[0] for i in range(4)]
    for round_ in range(10):
        barrier = threading.Barrier(len(nodes))
        won: list[LeaseView] = []

        def race(lease: LeaseView, barrier: threading.Barrier,
                 won: list[LeaseView]) -> None:
            barrier.wait()
            if lease.try_acquire():
                won.append(lease)

        threads = [threading.Thread(target=race, args=(n, barrier, won)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(won) == 1, f"round {round_}: {len(won)} winners"
        assert won[0].epoch == round_ + 1
        expire(conninfo)


def test_renew_after_expiry_is_refused_and_the_lease_is_lost(make_node: Callable[..., Node],
                                                               conninfo: str) -> None:
    lease, _ = make_node("n1")
    assert lease.try_acquire()
    lease.renew()
    expire(conninfo)
    with pytest.raises(LeaseLostError, match="held by nobody"):
        lease.renew()
    assert lease.lost and not lease.is_held()


def test_a_taken_over_lease_cannot_be_renewed_nor_released_by_the_old_holder(
        make_node: Callable[..., Node], conninfo: str) -> None:
    old, _ = make_node("n1")
    new, _ = make_node("n2")
    assert old.try_acquire()
    expire(conninfo)
    assert new.try_acquire() and new.epoch == 2
    with pytest.raises(LeaseLostError):
        old.renew()
    old.token, old.epoch = f"{old.holder_id}|1", 1
    assert not old.release()
    assert new.holder()[0] == new.token


def test_the_same_node_id_in_two_processes_takes_over_under_a_higher_epoch(
        make_node: Callable[..., Node]) -> None:
    # The seam's token is ``<node_id>|<epoch>`` on every store: a second process with the
    # same node id is the same holder (as on Redis), and taking the lease again lifts the
    # epoch, so the first process's token is fenced off rather than shared.
    first, _ = make_node("same")
    second, _ = make_node("same")
    assert first.try_acquire()
    assert second.try_acquire() and second.epoch == (first.epoch or 0) + 1
    with pytest.raises(LeaseLostError):
        first.renew()


def test_release_frees_the_lease_and_the_next_epoch_is_higher(make_node: Callable[..., Node]
                                                              ) -> None:
    a, _ = make_node("n1")
    b, _ = make_node("n2")
    assert a.try_acquire()
    assert not b.try_acquire()
    assert b.highest_epoch == 1
    assert a.release()
    assert a.holder()[0] is None
    assert b.try_acquire() and b.epoch == 2


def test_holder_reports_the_token_and_its_remaining_ttl(make_node: Callable[..., Node]) -> None:
    lease, _ = make_node("n1", lease_ttl=30.0)
    assert lease.try_acquire()
    token, remaining = lease.holder()
    assert token == lease.token
    assert 20_000 < remaining <= 30_000


def test_an_epoch_is_never_below_one_the_node_has_seen(make_node: Callable[..., Node],
                                                        conninfo: str) -> None:
    lease, _ = make_node("n1")
    lease.highest_epoch = 41  # the server lost the lease row (an older backup restored)
    assert lease.try_acquire() and lease.epoch == 42
    sql(conninfo, "UPDATE {schema}.lease SET epoch = 7")  # an older row came back
    other, _ = make_node("n2")
    other.highest_epoch = 42
    assert other.try_acquire() and other.epoch == 43


def test_clock_skew_is_measured_against_the_servers_clock(make_node: Callable[..., Node]
                                                          ) -> None:
    lease, _ = make_node("n1")
    assert abs(lease.measure_skew()) < 5
    lease.wall = lambda: time.time() + 120
    assert 115 < lease.measure_skew() < 125
    lease.try_acquire()
    assert lease.clock_skew is not None and 115 < lease.clock_skew < 125


# --- claims -----------------------------------------------------------------------------

def lead(make_node: Callable[..., Node], node_id: str = "n1", **settings: Any
         ) -> tuple[LeaseView, PostgresLedger]:
    lease, ledger = make_node(node_id, **settings)
    assert lease.try_acquire()
    return lease, ledger


def claim(lease: LeaseView, ledger: PostgresLedger, *items: ClaimItem,
          events: tuple[Event, ...] = ()) -> list[Any]:
    token, epoch = lease.credentials()
    return ledger.claim(token, epoch, list(items), list(events))


def test_a_slot_is_granted_once_and_an_older_one_refused(make_node: Callable[..., Node],
                                                         conninfo: str) -> None:
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)
    assert claim(lease, ledger, ClaimItem("e", now - 1000, Op.CLAIM, now - 1000)) == [Code.GRANTED]
    older = claim(lease, ledger, ClaimItem("e", now - 2000, Op.CLAIM, now - 2000))
    assert older == [Refused.by(SlotState(now - 1000, 1, "c"), now - 2000)]
    assert ledger.load() == {"e": SlotState(now - 1000, 1, "c")}


def test_sent_events_mark_the_slot_and_a_retry_of_it_answers_enqueued(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)
    item = ClaimItem("e", now, Op.CLAIM, now)
    assert claim(lease, ledger, item) == [Code.GRANTED]
    assert claim(lease, ledger, item) == [Code.GRANTED]  # asked again, not sent: granted again
    assert ledger.record(1, [Event("e", now, "sent")]) == 1
    assert claim(lease, ledger, item) == [Code.ENQUEUED]
    assert [h["event"] for h in ledger.history()] == ["elected", "sent"]


def test_a_slot_ahead_of_the_servers_clock_answers_early(make_node: Callable[..., Node],
                                                         conninfo: str) -> None:
    lease, ledger = lead(make_node, max_clock_skew=1.0)
    ahead = server_ms(conninfo) + 60_000
    assert claim(lease, ledger, ClaimItem("e", ahead, Op.CLAIM, ahead)) == [Code.EARLY]
    assert ledger.load() == {}


def test_a_paused_entrys_slot_is_skipped_past(make_node: Callable[..., Node],
                                               conninfo: str) -> None:
    lease, ledger = lead(make_node)
    state_sql.pause(psycopg.connect(conninfo, autocommit=True), SCHEMA, "app", "e", {"note": ""})
    now = server_ms(conninfo)
    assert claim(lease, ledger, ClaimItem("e", now, Op.CLAIM, now)) == [Code.PAUSED]
    assert ledger.load()["e"].state == "k"


def test_a_claim_under_an_old_epoch_is_refused_after_a_takeover(
        make_node: Callable[..., Node], conninfo: str) -> None:
    old, old_ledger = lead(make_node, "n1")
    expire(conninfo)
    new, _ = lead(make_node, "n2")
    now = server_ms(conninfo)
    with pytest.raises(LeaseLostError, match=f"held by {new.holder_id}"):
        claim(old, old_ledger, ClaimItem("e", now, Op.CLAIM, now),
              events=(Event("d", now - 5000, "missed"),))
    assert old_ledger.load() == {}
    # the events were written all the same: they say what already happened
    assert [h["event"] for h in old_ledger.history()][-1] == "missed"


def test_a_claim_while_a_takeover_is_in_flight_is_refused(
        make_node: Callable[..., Node], conninfo: str) -> None:
    """The takeover's transaction holds the lease row, not committed yet: the old
    leader's chunk is refused all the same (its lease lapsed), before or after it."""
    old, ledger = lead(make_node, "n1")
    expire(conninfo)
    now = server_ms(conninfo)
    answers: list[Any] = []
    with psycopg.connect(conninfo) as takeover:
        with takeover.transaction():
            got = lease_sql.acquire(takeover, SCHEMA, "app", holder="n2/x", node="n2",
                                    ttl_ms=10_000, seen_epoch=0)
            assert got.epoch == 2

            def old_leader_claims() -> None:
                try:
                    answers.append(claim(old, ledger, ClaimItem("e", now, Op.CLAIM, now)))
                except LeaseLostError as exc:
                    answers.append(exc)

            chunk = threading.Thread(target=old_leader_claims)
            chunk.start()
            chunk.join(0.5)
        chunk.join(30)
    assert len(answers) == 1 and isinstance(answers[0], LeaseLostError)
    assert ledger.load() == {}


def test_a_takeover_waiting_behind_a_chunk_finds_the_lease_renewed(
        make_node: Callable[..., Node], conninfo: str) -> None:
    """A chunk's transaction renews and holds the lease row; a takeover that finds the
    committed lease lapsed meanwhile waits for the row, then finds it renewed."""
    lease, _ = lead(make_node, "n1")
    token, epoch = lease.credentials()
    other, _ = make_node("n2", store_timeout=30.0)  # waits that long
    taken: list[bool] = []
    sql(conninfo, "UPDATE {schema}.lease SET expires_at = clock_timestamp() + interval '0.4 s'")
    with psycopg.connect(conninfo) as chunk:
        with chunk.transaction():
            chunk.execute(qualified(  # the fence of a chunk, as claims_sql runs it
                "UPDATE {schema}.lease SET expires_at = clock_timestamp() + interval '30 s'"
                " WHERE app = 'app' AND holder = %s AND epoch = %s"
                " AND expires_at > clock_timestamp()", SCHEMA),
                (token.rpartition("|")[0], epoch))
            time.sleep(0.6)  # the lease as committed has lapsed by now
            thief = threading.Thread(target=lambda: taken.append(other.try_acquire()))
            thief.start()
            thief.join(0.5)
            assert thief.is_alive(), "the takeover must wait for the lease row"
        thief.join(30)
    assert taken == [False]
    assert lease.holder()[0] == token


def test_a_claim_whose_commit_reply_was_lost_is_answered_granted_when_retried(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)
    item = ClaimItem("e", now, Op.CLAIM, now)
    real_run = ledger.place.run
    calls = []

    def reply_lost(call: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(real_run(call, *args, **kwargs))  # committed on the server
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    ledger.place = _Swapped(ledger.place, reply_lost)  # type: ignore[assignment]
    with pytest.raises(StoreUnreachable):
        claim(lease, ledger, item)
    ledger.place = ledger.place.inner  # type: ignore[attr-defined]
    assert calls and ledger.load() == {"e": SlotState(now, 1, "c")}
    assert claim(lease, ledger, item) == [Code.GRANTED]
    # another claimant after a takeover is refused that slot, whatever the slots row says
    expire(conninfo)
    new, new_ledger = lead(make_node, "n2")
    sql(conninfo, "DELETE FROM {schema}.slots")  # the last-slot row lost
    assert claim(new, new_ledger, item) == [Refused.by(SlotState(now, 1, "c"), now)]


class _Swapped:
    """A place whose ``run`` is replaced (a fault at the store call)."""

    def __init__(self, inner: Any, run: Callable[..., Any]) -> None:
        self.inner, self.run = inner, run

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_claim_that_failed_before_the_server_ran_it_is_granted_when_retried(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)

    def never_sent(call: Any, *args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("connection refused")

    inner = ledger.place
    ledger.place = _Swapped(inner, never_sent)  # type: ignore[assignment]
    with pytest.raises(StoreUnreachable):
        claim(lease, ledger, ClaimItem("e", now, Op.CLAIM, now))
    ledger.place = inner
    assert ledger.load() == {}
    assert claim(lease, ledger, ClaimItem("e", now, Op.CLAIM, now)) == [Code.GRANTED]


# --- rescue -----------------------------------------------------------------------------

def test_a_rescue_is_refused_before_rescue_after_and_granted_once_after(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node, rescue_after=2.0)
    now = server_ms(conninfo)
    first = now - 60_000
    anchor = ClaimItem("e", first, Op.ANCHOR, first, fingerprint="f1")
    assert claim(lease, ledger, anchor) == [Code.GRANTED]
    _, standby = make_node("s1", rescue_after=2.0)
    _, other = make_node("s2", rescue_after=2.0)
    recent = now - 500
    early = standby.rescue([ClaimItem("e", recent, Op.CLAIM, recent, first, "f1")])
    assert early.results == [Code.EARLY]
    late = now - 3000
    item = ClaimItem("e", late, Op.CLAIM, late, first, "f1")
    assert standby.rescue([item]).results == [Code.GRANTED]
    assert standby.rescue([item]).results == [Code.GRANTED]  # its own claim asked again
    refused = other.rescue([item]).results
    assert refused == [Refused(ledger.load()["e"], "already claimed by standby s1 (rescue)")]
    assert ledger.load()["e"].node == "s1"


def test_a_rescue_waits_while_the_leader_is_busy_claiming(make_node: Callable[..., Node],
                                                          conninfo: str) -> None:
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)
    assert claim(lease, ledger, ClaimItem("e", now - 60_000, Op.ANCHOR, now - 60_000),
                 ClaimItem("b", now - 100, Op.CLAIM, now - 100)) == [Code.GRANTED] * 2
    _, standby = make_node("s1")
    late = now - 5000
    got = standby.rescue([ClaimItem("e", late, Op.CLAIM, late, now - 60_000)])
    assert got.results == [Code.EARLY]


def test_a_rescuer_whose_definition_differs_from_the_leaders_is_refused(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)
    first = now - 60_000
    claim(lease, ledger, ClaimItem("e", first, Op.ANCHOR, first, fingerprint="f1"))
    _, standby = make_node("s1")
    late = now - 5000
    got = standby.rescue([ClaimItem("e", late, Op.CLAIM, late, first, "f2")])
    assert got.results == [Code.DIFFERS]


def test_a_rescue_waits_until_the_newest_leader_defined_its_entries(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)
    first = now - 60_000
    claim(lease, ledger, ClaimItem("e", first, Op.ANCHOR, first, fingerprint="f1"),
          ClaimItem("", 0, Op.DEFINE, 0))
    expire(conninfo)
    lead(make_node, "n2")  # elected, has not defined yet
    _, standby = make_node("s1")
    late = now - 5000
    late_item = ClaimItem("e", late, Op.CLAIM, late, first, "f1")
    assert standby.rescue([late_item]).results == [Code.EARLY]


# --- the server restarted ---------------------------------------------------------------

def test_after_a_server_restart_the_next_call_succeeds_at_once_on_a_fresh_connection(
        ) -> None:
    """The restart ended every idle session with a message found on the socket before a
    call takes the connection: no call meets a broken one, nor waits for a dead one's
    replacement (psycopg_pool's own check sleeps about a second, then two, after each
    connection it finds dead: the renewal took 1 s or more that way)."""
    with pg_cluster() as cluster:
        config = pg_config(key_prefix="app", node_id="n1")
        store = open_store(cluster.conninfo, config)
        lease = node_lease(store, config)
        try:
            assert lease.try_acquire()
            cluster.restart()
            started = time.monotonic()
            lease.renew()
            assert time.monotonic() - started < 0.9  # generous: a connect takes milliseconds
            assert lease.holder()[0] == lease.token
        finally:
            lease.place.pool.close()


def test_after_the_server_was_killed_and_started_again_the_lease_carries_on() -> None:
    with pg_cluster() as cluster:
        config = pg_config(key_prefix="app", node_id="n1", lease_ttl=30.0)
        store = open_store(cluster.conninfo, config)
        lease, ledger = node_lease(store, config), store.ledger
        try:
            assert lease.try_acquire()
            token, epoch = lease.credentials()
            cluster.kill()
            with pytest.raises(StoreUnreachable):
                ledger.claim(token, epoch, [ClaimItem("e", 1000, Op.CLAIM, 1000)])
            cluster.start()  # the failed call checked the pool: no broken connection is left
            again = ClaimItem("e", 1000, Op.CLAIM, 1000)
            assert ledger.claim(token, epoch, [again]) == [Code.GRANTED]
        finally:
            lease.place.pool.close()


# --- what the beats keep beside the claims ---------------------------------------------

def test_the_history_is_pruned_to_its_count_and_its_age(make_node: Callable[..., Node],
                                                         conninfo: str) -> None:
    _, ledger = make_node("n1", history_length=100)  # the least the setting takes
    ledger.record(1, [Event("e", i, "missed") for i in range(120)])
    ledger.prune([], keep_ms=0, node_keep_s=3600)
    assert [h["slot"] for h in ledger.history(200)] == [str(i) for i in range(20, 120)]
    sql(conninfo, "UPDATE {schema}.history SET at = at - interval '30 days'")
    ledger.prune([], keep_ms=0, node_keep_s=3600)
    assert ledger.history(200) == []


def test_no_write_prunes_the_history_tidy_does_and_a_ledger_nobody_tidies_prunes_when_overdue(
        make_node: Callable[..., Node]) -> None:
    _, ledger = make_node("n1", history_length=100)

    def write(count: int) -> int:
        for i in range(count):
            ledger.record(1, [Event("e", i, "missed")])
        return len(ledger.history(10_000))

    assert write(PRUNE_EVERY + 50) == PRUNE_EVERY + 50  # owed, not done inside a write
    ledger.tidy()
    assert len(ledger.history(10_000)) == 100
    assert write(PRUNE_EVERY - 1) == 100 + PRUNE_EVERY - 1
    ledger.tidy()  # fewer than PRUNE_EVERY writes since: nothing owed yet
    assert len(ledger.history(10_000)) == 100 + PRUNE_EVERY - 1
    # PRUNE_EVERY - 1 writes since the last prune: the write that makes them
    # PRUNE_OVERDUE prunes at once, and is the last of the history's newest 100
    assert write(PRUNE_OVERDUE - (PRUNE_EVERY - 1) - 1) == 100 + PRUNE_OVERDUE - 1
    assert write(1) == 100


def test_prune_forgets_unscheduled_entries_but_never_an_unconfirmed_claim(
        make_node: Callable[..., Node]) -> None:
    lease, ledger = lead(make_node)
    claim(lease, ledger, ClaimItem("kept", 100, Op.CLAIM, 100),
          ClaimItem("sent", 100, Op.CLAIM, 100), ClaimItem("unconfirmed", 100, Op.CLAIM, 100),
          ClaimItem("scheduled", 100, Op.CLAIM, 100))
    ledger.record(1, [Event("sent", 100, "sent"), Event("scheduled", 100, "sent")])
    ledger.register_node("standby", {"host": "h"})
    assert ledger.prune(["scheduled", "kept"], keep_ms=1000, node_keep_s=3600) == [1, 0, 0]
    assert sorted(ledger.load()) == ["kept", "scheduled", "unconfirmed"]
    assert list(ledger.nodes()) == ["n1"]


def test_a_slot_claimed_unconfirmed_and_overtaken_by_the_next_leader_can_be_recovered(
        make_node: Callable[..., Node], conninfo: str) -> None:
    old, old_ledger = lead(make_node, "n1")
    claim(old, old_ledger, ClaimItem("e", 1000, Op.CLAIM, 1000))
    expire(conninfo)
    new, ledger = lead(make_node, "n2", lease_ttl=10.0)
    assert claim(new, ledger, ClaimItem("e", 2000, Op.CLAIM, 2000)) == [Code.GRANTED]
    assert ledger.overtaken() == {("e", 1000): SlotState(1000, 1, "c")}
    assert claim(new, ledger, ClaimItem("e", 1000, Op.RECOVER, 1000)) == [Code.GRANTED]
    assert ledger.overtaken() == {}
    assert ledger.load()["e"] == SlotState(2000, 2, "c")


# --- the database going back to older state ---------------------------------------------

def test_a_claim_against_older_state_than_the_node_saw_is_refused_and_writes_nothing(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    claim(lease, ledger, ClaimItem("e", 1000, Op.CLAIM, 1000))
    claim(lease, ledger, ClaimItem("e", 2000, Op.CLAIM, 2000))
    assert ledger.generation == 2
    # what a promoted replica that lacked the last commits answers: an older generation
    sql(conninfo, "UPDATE {schema}.lease SET generation = 1")
    sql(conninfo, "UPDATE {schema}.slots SET slot_ms = 1000")
    with pytest.raises(RolledBackError, match="generation 1 < 2") as caught:
        claim(lease, ledger, ClaimItem("e", 2000, Op.CLAIM, 2000),
              events=(Event("e", 1000, "sent"),))
    assert caught.value.generation == 1 and ledger.loss_seen and ledger.below
    assert ledger.load()["e"] == SlotState(1000, 1, "c")  # not marked sent: nothing written
    with pytest.raises(RolledBackError):
        ledger.record(1, [Event("e", 1000, "sent")])
    _, standby = make_node("s1")
    standby.generation = 2
    with pytest.raises(RolledBackError):
        standby.rescue([ClaimItem("e", 2000, Op.CLAIM, 2000, 1000)])
    # the leader starts again past the loss: its next claim lifts the generation above
    ledger.reset_generation(lease.epoch)
    assert claim(lease, ledger, ClaimItem("e", 3000, Op.CLAIM, 3000)) == [Code.GRANTED]
    assert ledger.generation == 3 and not ledger.below


def test_an_acquire_attempt_tells_the_node_the_generation(make_node: Callable[..., Node]
                                                          ) -> None:
    lease, ledger = lead(make_node)
    claim(lease, ledger, ClaimItem("e", 1000, Op.CLAIM, 1000))
    other, other_ledger = make_node("n2")
    other.losses.detection = other_ledger
    assert not other.try_acquire()
    assert other_ledger.generation == 1


def test_the_server_identity_is_its_system_identifier_and_timeline(conninfo: str) -> None:
    with psycopg.connect(conninfo) as conn:
        system, timeline = lease_sql.server_identity(conn)
    assert system > 0 and timeline >= 1



# --- a claim stalled in its transaction --------------------------------------------------

def test_a_rescue_behind_a_stalled_claim_fails_within_its_bound_instead_of_waiting(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    claim(lease, ledger, ClaimItem("e", 1000, Op.ANCHOR, 1000))
    _, standby = make_node("s1", store_timeout=0.3)
    with psycopg.connect(conninfo) as stalled, stalled.transaction():
        stalled.execute(qualified("SELECT 1 FROM {schema}.lease FOR UPDATE", SCHEMA))
        with pytest.raises(StoreUnreachable) as rescue:
            standby.rescue([ClaimItem("e", 2000, Op.CLAIM, 2000, 1000)])
        other, _ = make_node("n2", store_timeout=0.3)
        with pytest.raises(StoreUnreachable) as acquire:
            other.try_acquire()
    for caught in (rescue, acquire):
        assert isinstance(caught.value.__cause__, psycopg.errors.LockNotAvailable)


# the default call timeout is 1.67 s (a 10 s ttl), the redis_options one below 30 s: a
# wait that ends within a second is the 0.3 s bound
@pytest.mark.parametrize("settings", [
    {"store_timeout": 0.3},
    {"redis_options": {"socket_timeout": 0.3}},
    {"store_timeout": 0.3, "redis_options": {"socket_timeout": 30.0}},
], ids=["store_timeout", "redis_options-while-store_timeout-unset", "store_timeout-over-redis_options"])
def test_a_takeover_behind_a_held_lease_row_waits_the_store_timeout(
        make_node: Callable[..., Node], conninfo: str, settings: dict[str, Any]) -> None:
    lead(make_node)
    other, _ = make_node("n2", **settings)
    assert other.place.pool.timeout == 0.3  # the wait for a pooled connection
    with psycopg.connect(conninfo) as holder, holder.transaction():
        holder.execute(qualified("SELECT 1 FROM {schema}.lease FOR UPDATE", SCHEMA))
        started = time.monotonic()
        with pytest.raises(StoreUnreachable) as waited:
            other.try_acquire()
        took = time.monotonic() - started
    assert isinstance(waited.value.__cause__, psycopg.errors.LockNotAvailable)
    assert 0.25 <= took < 1.0, took


def test_a_claim_stalled_between_its_round_trips_is_ended_by_the_server(
        make_node: Callable[..., Node], conninfo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lease, ledger = lead(make_node, store_timeout=0.3)
    decide = rules.decide

    def stalled(chunk: Any, item: Any) -> Any:
        time.sleep(1.5)  # past the transaction's idle bound (300 ms)
        return decide(chunk, item)

    monkeypatch.setattr(rules, "decide", stalled)
    with pytest.raises(StoreUnreachable):
        claim(lease, ledger, ClaimItem("e", 1000, Op.CLAIM, 1000))
    monkeypatch.setattr(rules, "decide", decide)
    with psycopg.connect(conninfo) as conn:  # the lease row is free again
        conn.execute(qualified("SELECT 1 FROM {schema}.lease FOR UPDATE NOWAIT", SCHEMA))
    assert ledger.load() == {}
    assert claim(lease, ledger, ClaimItem("e", 1000, Op.CLAIM, 1000)) == [Code.GRANTED]


@contextmanager
def stopped_mid_pipeline(conninfo: str) -> Iterator[int]:
    """A session that updated the lease row in a pipeline and stopped before its sync, as
    a beat frozen mid-claim leaves it (the server waits for the rest: active, not idle in
    transaction); its backend's process id."""
    conn = psycopg.connect(conninfo, autocommit=True)
    pipeline, transaction = conn.pipeline(), conn.transaction()
    pipeline.__enter__()
    transaction.__enter__()
    conn.execute(qualified("UPDATE {schema}.lease SET progress_at = progress_at", SCHEMA))
    try:
        with psycopg.connect(conninfo, autocommit=True) as watch:
            deadline = time.monotonic() + 10
            while not watch.execute("SELECT count(*) FROM pg_locks WHERE locktype = "
                                    "'transactionid' AND pid = %s", (conn.info.backend_pid,)
                                    ).fetchone()[0]:
                assert time.monotonic() < deadline, "the update never reached the server"
                time.sleep(0.01)
        yield conn.info.backend_pid
    finally:
        conn.pgconn.finish()  # no sync, no rollback: the session may be gone already


def session_alive(conninfo: str, pid: int) -> bool:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return bool(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                 (pid,)).fetchone()[0])


def test_a_session_stopped_mid_pipeline_on_the_lease_row_is_ended_past_a_ttl_and_a_standby_leads(
        make_node: Callable[..., Node], conninfo: str) -> None:
    # a ttl of 2 s so that the test waits out one ttl (the lease's), not ten seconds
    settings = {"lease_ttl": 2, "store_timeout": 0.3}
    lead(make_node, **settings)
    standby, _ = make_node("n2", **settings)
    with stopped_mid_pipeline(conninfo) as pid:
        stopped_at = time.monotonic()
        with pytest.raises(StoreUnreachable) as waited:  # held for less than a ttl: kept
            standby.try_acquire()
        assert isinstance(waited.value.__cause__, psycopg.errors.LockNotAvailable)
        assert session_alive(conninfo, pid)
        time.sleep(max(0.0, 2.2 - (time.monotonic() - stopped_at)))
        assert standby.try_acquire(), "the standby did not take the lease past the stalled session"
        assert not session_alive(conninfo, pid)


def test_a_leader_renews_past_a_session_stalled_on_the_lease_row_for_half_a_ttl(
        make_node: Callable[..., Node], conninfo: str) -> None:
    # a ttl of 4 s: the session is ended past 2 s, the lease still held
    lease, _ = lead(make_node, lease_ttl=4, store_timeout=0.3)
    token, _ = lease.credentials()
    with stopped_mid_pipeline(conninfo) as pid:
        stopped_at = time.monotonic()
        with pytest.raises(StoreUnreachable) as waited:  # bounded, not waiting for ever
            lease.store.renew(token)
        assert isinstance(waited.value.__cause__, psycopg.errors.LockNotAvailable)
        assert session_alive(conninfo, pid), "a session younger than half the ttl is kept"
        time.sleep(max(0.0, 2.2 - (time.monotonic() - stopped_at)))
        assert lease.store.renew(token).renewed
        assert not session_alive(conninfo, pid)


@contextmanager
def role_of_the_schema(conninfo: str) -> Iterator[tuple[str, str]]:
    """A login role (not a superuser) granted what the docs list for the schema: its name
    and a connection string of it. Dropped afterwards with what it was granted."""
    role = f"lbrole_{secrets.token_hex(4)}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        for grant in (f"GRANT USAGE ON SCHEMA {SCHEMA} TO {role}",
                      f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {SCHEMA} TO {role}",
                      f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {SCHEMA} TO {role}"):
            conn.execute(grant)
    try:
        yield role, conninfo.replace(f"user={USER}", f"user={role}")
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize("sees", [False, True], ids=["unseen", "seen"])
def test_a_role_that_may_not_end_a_stalled_session_says_which_grant_it_lacks(
        make_node: Callable[..., Node], conninfo: str, sees: bool) -> None:
    """Without pg_read_all_stats another role's session hides since when it holds the row;
    with it, a superuser's session still may not be ended by this role."""
    # a ttl of 2 s so that the test waits out one ttl (the lease's), not ten seconds
    lead(make_node, lease_ttl=2, store_timeout=0.3)
    config = pg_config(key_prefix="app", node_id="n2", lease_ttl=2, store_timeout=0.3)
    with role_of_the_schema(conninfo) as (role, limited), \
            stopped_mid_pipeline(conninfo) as pid:
        stopped_at = time.monotonic()
        if sees:
            sql(conninfo, f"GRANT pg_read_all_stats TO {role}")
        store = open_store(limited, config, create=False, listen=False)
        try:
            time.sleep(max(0.0, 1.2 - (time.monotonic() - stopped_at)))
            with pytest.raises(StoreError, match="grant the beats' role pg_read_all_stats and "
                                                 "pg_signal_backend") as refused:
                store.lease.acquire(0, 0)
            said = "may not end it" if sees else "may not see since when"
            assert said in str(refused.value) and str(pid) in str(refused.value)
        finally:
            store.close()
        assert session_alive(conninfo, pid), "a session of a superuser is not this role's to end"


def test_a_prune_waiting_on_the_grants_leaves_the_lease_row_free(
        make_node: Callable[..., Node], conninfo: str) -> None:
    """The grants' delete may be long; while it runs (here: waits on a grant another
    session locked) nobody's renewal or takeover waits on the lease row."""
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)
    claim(lease, ledger, ClaimItem("e", now - 1000, Op.CLAIM, now - 1000))
    claim(lease, ledger, ClaimItem("e", now, Op.CLAIM, now),
          events=(Event("e", now - 1000, "sent"),))  # history rows for the prune to drop
    done: list[int] = []
    with psycopg.connect(conninfo) as holding, psycopg.connect(conninfo, autocommit=True) as watch:
        holding.execute(qualified("SELECT 1 FROM {schema}.grants FOR UPDATE", SCHEMA))
        pruning = threading.Thread(target=lambda: done.append(ledger.place.run(
            state_sql.prune_history, keep=0, max_age_s=0.0, grants_keep_s=0.0)))
        pruning.start()
        deadline = time.monotonic() + 10
        while not watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]:
            assert time.monotonic() < deadline and pruning.is_alive(), "the prune never waited"
            time.sleep(0.005)
        watch.execute(qualified("SELECT 1 FROM {schema}.lease FOR UPDATE NOWAIT", SCHEMA))
        holding.rollback()
        pruning.join(10)
    assert done and done[0] >= 1, "the history was pruned once the grants were"
    assert sql(conninfo, "SELECT count(*) FROM {schema}.grants") == [(0,)]


def test_a_loss_one_node_saw_stops_every_nodes_claims_until_a_leader_starts_again(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    claim(lease, ledger, ClaimItem("e", 1000, Op.CLAIM, 1000))
    claim(lease, ledger, ClaimItem("e", 2000, Op.CLAIM, 2000))
    sql(conninfo, "UPDATE {schema}.lease SET generation = 1")  # the database went back
    _, standby = make_node("s1")  # a new process: it has seen nothing
    with pytest.raises(RolledBackError):
        claim(lease, ledger, ClaimItem("e", 3000, Op.CLAIM, 3000))  # the leader sees it
    with pytest.raises(RolledBackError, match="a node found the database lost writes"):
        standby.rescue([ClaimItem("e", 3000, Op.CLAIM, 3000, 2000)])
    assert standby.loss_reported
    assert standby.record(0, [Event("e", 2000, "unsent")]) == 0  # history still written
    ledger.reset_generation(lease.epoch)
    assert claim(lease, ledger, ClaimItem("e", 3000, Op.CLAIM, 3000)) == [Code.GRANTED]
    assert standby.rescue([ClaimItem("e", 3000, Op.CLAIM, 3000, 3000)]).results != []


def test_a_node_reports_the_slots_it_knew_settled_before_a_loss(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    claim(lease, ledger, ClaimItem("e", 1000, Op.CLAIM, 1000))
    _, a = make_node("s1")
    _, b = make_node("s2")
    a.generation = b.generation = 5
    a.loss_seen = True
    a.report_lost({"e": 1000, "f": 7000})
    b.report_lost({"e": 2000})
    assert not a.loss_seen
    assert ledger.lost_reports() == {"e": 2000, "f": 7000}
    with pytest.raises(RolledBackError, match="a node found"):
        claim(lease, ledger, ClaimItem("e", 3000, Op.CLAIM, 3000))
    sql(conninfo, "UPDATE {schema}.lost_reports SET expires_at = clock_timestamp()"
                  " WHERE node = 's2'")
    assert ledger.lost_reports() == {"e": 1000, "f": 7000}


def test_grants_are_kept_an_hour_or_the_catchup_window_when_longer(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    claim(lease, ledger, *[ClaimItem(f"e{i}", 1000, Op.CLAIM, 1000) for i in range(3)])
    sql(conninfo, "UPDATE {schema}.grants SET granted_at = clock_timestamp() - interval '2 h'"
                  " WHERE entry <> 'e0'")
    ledger.prune(["e0", "e1", "e2"], keep_ms=0, node_keep_s=3600)
    assert [r[0] for r in sql(conninfo, "SELECT entry FROM {schema}.grants")] == ["e0"]
    _, patient = make_node("n2", catchup_window=3 * 3600.0)
    sql(conninfo, "UPDATE {schema}.grants SET granted_at = clock_timestamp() - interval '2 h'")
    patient.prune(["e0"], keep_ms=0, node_keep_s=3600)
    assert len(sql(conninfo, "SELECT entry FROM {schema}.grants")) == 1


def test_the_heartbeat_keeps_the_lease_past_its_ttl_and_stops_when_told(
        make_node: Callable[..., Node]) -> None:
    lease, _ = make_node("n1", lease_ttl=1.0, renew_interval=0.2)
    assert lease.try_acquire()
    # the heartbeat is the roles' thread (the store offers renew)
    beat = Heartbeat(cast(Any, lease), time.monotonic)  # the main loop always back on time
    beat.start()
    time.sleep(2.5)
    assert lease.holder()[0] == lease.token and lease.is_held()
    assert beat.is_alive() and beat.stopped_because is None
    beat.stop()


def test_a_lease_the_database_lost_while_it_was_valid_is_told_apart_from_a_takeover(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, _ = make_node("n1", lease_ttl=30.0)
    assert lease.try_acquire()
    sql(conninfo, "UPDATE {schema}.lease SET holder = NULL")  # an older copy came back
    with pytest.raises(LeaseLostError):
        lease.renew()
    assert lease.losses.vanished_while_held
    other, _ = make_node("n2", lease_ttl=30.0)
    assert other.try_acquire()
    sql(conninfo, "UPDATE {schema}.lease SET expires_at = clock_timestamp()")
    third, _ = make_node("n3", lease_ttl=30.0)
    assert third.try_acquire()
    with pytest.raises(LeaseLostError):
        other.renew()
    assert not other.losses.vanished_while_held


def test_a_leader_starting_again_after_a_loss_still_does_when_its_first_claim_failed(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    claim(lease, ledger, ClaimItem("e", 1000, Op.CLAIM, 1000))
    claim(lease, ledger, ClaimItem("e", 2000, Op.CLAIM, 2000))
    sql(conninfo, "UPDATE {schema}.lease SET generation = 1")
    with pytest.raises(RolledBackError):
        claim(lease, ledger, ClaimItem("e", 3000, Op.CLAIM, 3000))
    ledger.reset_generation(lease.epoch)
    failing = ["claim"]

    def fail_once(site: str, when: str) -> None:
        if when == "before" and site in failing:
            failing.remove(site)
            raise psycopg.OperationalError("connection refused")

    ledger.place.fault = fail_once
    with pytest.raises(StoreUnreachable):
        claim(lease, ledger, ClaimItem("e", 3000, Op.CLAIM, 3000))
    assert claim(lease, ledger, ClaimItem("e", 3000, Op.CLAIM, 3000)) == [Code.GRANTED]


def test_a_leader_and_a_standby_claiming_the_same_entries_at_once_never_deadlock(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node, lease_ttl=60.0)
    names = [f"e{i}" for i in range(20)]
    base = server_ms(conninfo) - 3_600_000
    claim(lease, ledger, *[ClaimItem(n, base, Op.ANCHOR, base) for n in names])
    _, standby = make_node("s1")
    errors: list[Exception] = []
    done = threading.Event()

    def rescuer() -> None:
        while not done.is_set():
            try:
                standby.rescue([ClaimItem(n, base + 1, Op.CLAIM, base + 1, base) for n in names])
            except psycopg.Error as exc:
                errors.append(exc)

    thread = threading.Thread(target=rescuer)
    thread.start()
    try:
        for k in range(1, 80):
            slot = base + 1000 * k
            sent = [Event(n, slot - 1000, "sent") for n in names]
            try:
                claim(lease, ledger, *[ClaimItem(n, slot, Op.CLAIM, slot) for n in names],
                      events=tuple(sent))
            except psycopg.Error as exc:
                errors.append(exc)
    finally:
        done.set()
        thread.join(30)
    assert not [e for e in errors if isinstance(e, psycopg.errors.DeadlockDetected)]


# --- what makes a chunk's claim cheap -----------------------------------------------------

def test_a_slot_another_claimant_was_granted_meanwhile_rolls_the_whole_chunk_back(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    now = server_ms(conninfo)
    claim(lease, ledger, *[ClaimItem(n, now - 2000, Op.CLAIM, now - 2000) for n in "ef"])
    before = ledger.load()
    slot = now - 1000
    # another claimant's grant of e's slot: not committed yet when the chunk reads the
    # grants, committed while the chunk's own grant waits on it
    other = psycopg.connect(conninfo)
    other.execute(qualified("INSERT INTO {schema}.grants (app, entry, slot_ms, epoch, node)"
                            " VALUES ('app', 'e', %s, 99, 'intruder')", SCHEMA), (slot,))

    def commit_once_the_chunk_waits() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not sql(
                conninfo, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                          " AND wait_event_type = 'Lock'"):
            time.sleep(0.01)
        other.commit()

    committer = threading.Thread(target=commit_once_the_chunk_waits)
    committer.start()
    try:
        with pytest.raises(claims_sql.GrantConflict, match="of 2 slots, 1 were granted"):
            claim(lease, ledger, *[ClaimItem(n, slot, Op.CLAIM, slot) for n in "ef"],
                  events=(Event("d", slot, "missed"),))
    finally:
        committer.join(30)
        other.close()
    assert ledger.load() == before  # f's grant, the slots and the event: none written
    assert "missed" not in [h["event"] for h in ledger.history()]
    again = claim(lease, ledger, *[ClaimItem(n, slot, Op.CLAIM, slot) for n in "ef"])
    assert again == [Refused.by(before["e"], slot), Code.GRANTED]


def test_entry_names_an_array_literal_must_quote_are_claimed_and_recorded_as_given(
        make_node: Callable[..., Node], conninfo: str) -> None:
    lease, ledger = lead(make_node)
    names = ["a,b", 'say "hi"', "back\\slash", "{braced}", "NULL", " spaced ", "ünï", "it's"]
    now = server_ms(conninfo)
    first = [ClaimItem(n, now - 1000, Op.CLAIM, now - 1000, fingerprint=n) for n in names]
    assert claim(lease, ledger, *first) == [Code.GRANTED] * len(names)
    sent = tuple(Event(n, now - 1000, "sent", detail=n) for n in names)
    assert claim(lease, ledger, *[ClaimItem(n, now, Op.CLAIM, now) for n in names],
                 events=sent) == [Code.GRANTED] * len(names)
    assert ledger.record(1, [Event(n, now, "sent") for n in names]) == len(names)
    assert ledger.load() == {n: SlotState(now, 1, "s") for n in names}
    assert ledger.load_with_definitions()[1] == {n: n for n in names}
    assert [(h["entry"], h["detail"]) for h in ledger.history()
            if h.get("slot") == str(now - 1000)
            ] == [(n, n) for n in names]


def test_a_chunks_claim_takes_two_round_trips_to_the_server(
        make_node: Callable[..., Node], conninfo: str, tmp_path: Path) -> None:
    lease, _ = lead(make_node)
    token, epoch = lease.credentials()
    fence = claims_sql.Fence(token.rpartition("|")[0], epoch, 10_000)
    now = server_ms(conninfo)
    items = [ClaimItem(f"e{i}", now - 1000, Op.CLAIM, now - 1000) for i in range(10)]
    events = claims_sql.Events([f"e{i}" for i in range(10)], [now - 2000] * 10,
                               ["sent"] * 10, [""] * 10)
    trace = tmp_path / "trace"
    with psycopg.connect(conninfo, autocommit=True) as conn, open(trace, "w") as out:
        conn.pgconn.trace(out.fileno())
        got = claims_sql.claim(conn, SCHEMA, "app", "n1", fence,
                               claims_sql.Limits(wait_ms=1000), events, items)
        conn.pgconn.untrace()
    assert got.answers == [Code.GRANTED] * 10
    assert round_trips(trace) == 2


def round_trips(trace: Path) -> int:
    """How many times the client sent and then waited for the server's answer: each run of
    messages from the client (``F``) that follows the server's (``B``) or starts the
    trace. A transaction's ``BEGIN`` and ``COMMIT`` count (simple queries, no ``Sync``);
    statements pipelined in one flush count once."""
    trips, last = 0, "B"
    for line in trace.read_text().splitlines():
        side = line.split("\t")[1:2]  # a message's continuation lines have none
        if side:
            trips += side == ["F"] and last == "B"
            last = side[0]
    return trips


def test_the_lease_is_taken_renewed_and_released_in_one_round_trip_each(
        make_node: Callable[..., Node], conninfo: str, tmp_path: Path) -> None:
    make_node("n1")  # the schema
    row = {"holder": "n1/1", "node": "n1", "ttl_ms": 10_000, "wait_ms": 1000}
    counted = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for step, call, args in (
                ("acquire", lease_sql.acquire, {**row, "seen_epoch": 0}),
                ("renew", lease_sql.renew, {"holder": "n1/1", "epoch": 1, "ttl_ms": 10_000,
                                            "wait_ms": 1000}),
                ("release", lease_sql.release, {"holder": "n1/1", "epoch": 1, "node": "n1",
                                                "reason": "done", "channel": "c",
                                                "ttl_ms": 10_000, "wait_ms": 1000})):
            trace = tmp_path / step
            with open(trace, "w") as out:
                conn.pgconn.trace(out.fileno())
                answer = call(conn, SCHEMA, "app", **args)
                conn.pgconn.untrace()
            held = answer.epoch == 1 if step == "acquire" else answer not in (None, False)
            counted.append((step, round_trips(trace), held))
    assert counted == [("acquire", 1, True), ("renew", 1, True), ("release", 1, True)]


def test_asking_what_changed_takes_one_round_trip_when_nothing_did_and_two_when_it_did(
        make_node: Callable[..., Node], conninfo: str, tmp_path: Path) -> None:
    """Every beat asks every quarter second: the usual answer, "nothing", is one
    statement; a change is read by one more, one snapshot with what changed."""
    make_node("n1")  # the schema
    counted = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        _, version, _ = entries_sql.save(conn, SCHEMA, "app", entries_sql.Save(
            "e", "upsert", "fp", "t", True, '{"task": "t"}'))
        for seen in (version, version - 1):
            trace = tmp_path / f"seen-{seen}"
            with open(trace, "w") as out:
                conn.pgconn.trace(out.fileno())
                answer = entries_sql.changes(conn, SCHEMA, "app", seen)
                conn.pgconn.untrace()
            counted.append((seen, round_trips(trace), answer[0], [r.name for r in answer[2]]))
    assert counted == [(version, 1, version, []), (version - 1, 2, version, ["e"])]


def test_a_record_takes_two_round_trips_and_against_older_state_writes_nothing(
        make_node: Callable[..., Node], conninfo: str, tmp_path: Path) -> None:
    _, ledger = lead(make_node)
    first = claims_sql.Events(["e"], [1000], ["missed"], [""])
    later = claims_sql.Events(["f"], [2000], ["missed"], [""])
    trace = tmp_path / "trace"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        with open(trace, "w") as out:
            conn.pgconn.trace(out.fileno())
            _, generation = claims_sql.record(conn, SCHEMA, "app", "n1", 1, first)
            conn.pgconn.untrace()
        with pytest.raises(claims_sql.OlderState):
            claims_sql.record(conn, SCHEMA, "app", "n1", 1, later,
                              seen_generation=generation + 5)
    assert round_trips(trace) == 2
    assert [(h["event"], h.get("entry")) for h in ledger.history() if h["event"] == "missed"
            ] == [("missed", "e")]


def test_a_schema_with_claims_at_the_previous_version_migrates_and_its_grants_still_refuse(
        make_node: Callable[..., Node], conninfo: str) -> None:
    *older, (latest, _) = migrations()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(qualified("CREATE SCHEMA {schema}", SCHEMA))
        conn.execute(qualified("CREATE TABLE {schema}.schema_version (version integer"
                               " PRIMARY KEY, applied_at timestamptz NOT NULL"
                               " DEFAULT clock_timestamp())", SCHEMA))
        for version, text in older:
            conn.execute(qualified(text, SCHEMA))
            conn.execute(qualified("INSERT INTO {schema}.schema_version VALUES (%s)", SCHEMA),
                         (version,))
        # what a leader of the previous version left: a claimed slot, and the next slot
        # granted (its claim's commit reply lost)
        conn.execute(qualified("INSERT INTO {schema}.slots (app, entry, slot_ms, epoch, state)"
                               " VALUES ('app', 'e', 1000, 7, 'c')", SCHEMA))
        conn.execute(qualified("INSERT INTO {schema}.grants (app, entry, slot_ms, epoch)"
                               " VALUES ('app', 'e', 2000, 7)", SCHEMA))
        assert schema_version(conn, SCHEMA) == latest - 1
        assert ensure_schema(conn, SCHEMA) == [latest]
    lease, ledger = lead(make_node)  # epoch 1: no lease row was left
    answers = claim(lease, ledger, ClaimItem("e", 2000, Op.CLAIM, 2000),
                    ClaimItem("f", 2000, Op.CLAIM, 2000))
    assert answers == [Refused.by(SlotState(1000, 7, "c"), 2000), Code.GRANTED]
    assert ledger.load() == {"e": SlotState(1000, 7, "c"), "f": SlotState(2000, 1, "c")}
