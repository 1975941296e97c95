"""A 100-slot chunk claim on the PostgreSQL store: p50 / p99 / worst of one call.

    python bench/pg_claim.py [--chunk 100] [--rounds 500] [--prepare] [--attribute]
                             [--host 127.0.0.1]

Each round is what a leader sends in a burst: one claim of ``--chunk`` slots (one per
entry, each entry's next slot), carrying the previous chunk's ``sent`` events, as the
leader's next claim does. A database of its own is created and dropped afterwards.

Between rounds, untimed, the ledger's ``tidy()``, as a leader's loop calls it between
passes: it prunes the history every 200 writes, outside any claim call.

``--attribute``: also say which rounds' claim call ran the history's prune itself (only
when overdue: 1,000 writes with no ``tidy()``) and which wrote into a new WAL segment (a new cluster
creates each 16 MB segment, zero-filled, as its WAL reaches it), and the figures of the
other rounds. It reads the WAL position on a connection of its own before and after each
round, outside the timed call.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celery_leaderbeat.config import Config
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.postgres.ledger import PostgresLedger
from celery_leaderbeat.store.postgres.store import open_store
from celery_leaderbeat.store.types import ClaimItem, Code, Event, Op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5432)
    parser.add_argument("--user", default="postgres")
    parser.add_argument("--prepare", action="store_true",
                        help="server-side prepared statements (psycopg's prepare_threshold=5)")
    parser.add_argument("--attribute", action="store_true",
                        help="which rounds pruned the history or opened a WAL segment")
    args = parser.parse_args()
    server = f"host={args.host} port={args.port} user={args.user}"
    name = f"lb_bench_{secrets.token_hex(4)}"
    with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        print(run(f"{server} dbname={name}", args.chunk, args.rounds, args.warmup,
                  5 if args.prepare else None, attribute=args.attribute))
    finally:
        with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(conninfo: str, chunk: int, rounds: int, warmup: int,
        prepare_threshold: int | None = None, *, attribute: bool = False) -> str:
    # Config wants a Redis URL; the PostgreSQL store never opens it
    config = Config.from_values({"redis_url": "redis://unused.invalid", "key_prefix": "bench",
                                 "node_id": "bench", "lease_ttl": 60.0})
    store = open_store(conninfo, config, prepare_threshold=prepare_threshold)
    # the store's boundary passes reads of the ledger's own attributes through (_tidied)
    lease, ledger = LeaseView(store.lease, config), cast(PostgresLedger, store.ledger)
    assert lease.try_acquire()
    token, epoch = lease.credentials()
    names = [f"entry-{i:04d}" for i in range(chunk)]
    start = int(time.time() * 1000) - (rounds + warmup + 10) * 1000
    segment = _wal_segment(conninfo) if attribute else None
    sent: list[Event] = []
    took: list[tuple[float, bool, bool]] = []  # (s, pruned, new WAL segment)
    for r in range(rounds + warmup):
        slot = start + r * 1000
        items = [ClaimItem(n, slot, Op.CLAIM, slot) for n in names]
        tidied, before = ledger._tidied, segment() if segment else ""
        began = time.perf_counter()
        answers = ledger.claim(token, epoch, items, sent)
        spent = time.perf_counter() - began
        pruned = ledger._tidied != tidied  # the claim call itself pruned (overdue)
        took.append((spent, pruned, segment is not None and segment() != before))
        ledger.tidy()  # as a leader's loop does between passes: not timed
        assert answers == [Code.GRANTED] * chunk, answers[:3]
        sent = [Event(n, slot, "sent") for n in names]
    store.close()
    prepared = "prepared statements" if prepare_threshold is not None else "no prepared statements"
    text = (f"{chunk}-slot claim (+{chunk} sent events), {rounds} rounds, {prepared}: "
            + _figures([t for t, _, _ in took[warmup:]]))
    if attribute:
        measured = took[warmup:]
        other = [t for t, pruned, new in measured if not pruned and not new]
        text += (f"; {sum(p for _, p, _ in measured)} rounds pruned the history, "
                 f"{sum(n for _, _, n in measured)} opened a WAL segment, the other "
                 f"{len(other)}: " + _figures(other))
    return text


def _figures(seconds: list[float]) -> str:
    ms = sorted(t * 1000 for t in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (f"p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms, "
            f"worst {ms[-1]:.2f} ms")


def _wal_segment(conninfo: str) -> Callable[[], str]:
    """The name of the WAL segment the server writes into now (on a connection of its own)."""
    conn = psycopg.connect(conninfo, autocommit=True)

    def segment() -> str:
        row = conn.execute("SELECT pg_walfile_name(pg_current_wal_insert_lsn())").fetchone()
        assert row is not None  # a SELECT without FROM answers one row
        return str(row[0])

    return segment


if __name__ == "__main__":
    main()
