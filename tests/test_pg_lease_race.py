"""Two nodes' acquires of one PostgreSQL lease row at the same moment.

The acquire is one statement: an ``INSERT .. ON CONFLICT DO UPDATE`` and a ``SELECT`` of
the row. When another node's acquire commits while this one waits on the row, the
``ON CONFLICT`` sees the new row (and refuses it: it is held) but the ``SELECT`` reads the
statement's snapshot, taken before that commit: it sees no holder. Such an answer is a
refusal by the node that just took the lease, never a loss of state (which holds every
standby back, and says the database went back in time). Seen first at the start of
three real beats, whose standby warned that the database "holds older state".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from celery_leaderbeat.store.postgres.store import PostgresStore, open_store
from celery_leaderbeat.store.records import LOSS, Acquired
from tests.support.postgres import HOST, PORT, USER, pg_config, postgres_database


@pytest.fixture
def conninfo() -> Iterator[str]:
    with postgres_database("lbrace") as name:
        yield f"host={HOST} port={PORT} user={USER} dbname={name}"


@pytest.fixture
def store(conninfo: str) -> Iterator[PostgresStore]:
    opened = open_store(conninfo, pg_config(key_prefix="app", node_id="n2"))
    try:
        yield opened
    finally:
        opened.close()


def acquire_while_another_commits(store: PostgresStore, conninfo: str, statement: str,
                                  ) -> Acquired:
    """``store`` acquires while another session holds ``statement``'s write to the row
    uncommitted; that session commits once the acquire waits on it."""
    answers: list[Any] = []
    with psycopg.connect(conninfo) as other, psycopg.connect(conninfo, autocommit=True) as watch:
        other.execute(statement)
        waiter = threading.Thread(target=lambda: answers.append(store.lease.acquire(0, 0)))
        waiter.start()
        deadline = time.monotonic() + 10
        while not watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]:
            assert time.monotonic() < deadline and waiter.is_alive(), answers
            time.sleep(0.005)
        other.commit()
        waiter.join(10)
    assert len(answers) == 1, "the acquire did not answer"
    return answers[0]


def test_an_acquire_that_met_another_nodes_new_row_is_refused_by_its_holder_not_a_loss(
        store: PostgresStore, conninfo: str) -> None:
    answer = acquire_while_another_commits(
        store, conninfo, "INSERT INTO leaderbeat.lease (app, holder, epoch, expires_at) "
                         "VALUES ('app', 'n1', 1, clock_timestamp() + interval '10 s')")
    assert not answer.acquired
    assert answer.pttl != LOSS, "a lease taken a moment ago is not a loss of state"
    assert answer.holder == "n1|1" and 0 < answer.pttl <= 10_000


def test_an_acquire_that_met_another_nodes_takeover_is_refused_by_its_holder_not_a_loss(
        store: PostgresStore, conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:  # a lease that expired
        conn.execute("INSERT INTO leaderbeat.lease (app, holder, epoch, expires_at) "
                     "VALUES ('app', 'n0', 4, clock_timestamp() - interval '1 s')")
    answer = acquire_while_another_commits(
        store, conninfo, "UPDATE leaderbeat.lease SET holder = 'n1', epoch = 5, "
                         "expires_at = clock_timestamp() + interval '10 s' WHERE app = 'app'")
    assert not answer.acquired
    assert answer.pttl != LOSS, "a lease taken over a moment ago is not a loss of state"
    assert answer.holder == "n1|5" and 0 < answer.pttl <= 10_000
