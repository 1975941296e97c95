"""A 100-slot chunk claim on the PostgreSQL store: p50 / p99 / worst of one call.

    python bench/pg_claim.py [--chunk 100] [--rounds 500] [--prepare] [--host 127.0.0.1]

Each round is what a leader sends in a burst: one claim of ``--chunk`` slots (one per
entry, each entry's next slot), carrying the previous chunk's ``sent`` events, as the
leader's next claim does. A database of its own is created and dropped afterwards.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celery_leaderbeat.config import Config
from celery_leaderbeat.roles.lease import LeaseView
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
    args = parser.parse_args()
    server = f"host={args.host} port={args.port} user={args.user}"
    name = f"lb_bench_{secrets.token_hex(4)}"
    with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        print(run(f"{server} dbname={name}", args.chunk, args.rounds, args.warmup,
                  5 if args.prepare else None))
    finally:
        with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(conninfo: str, chunk: int, rounds: int, warmup: int,
        prepare_threshold: int | None = None) -> str:
    # Config wants a Redis URL; the PostgreSQL store never opens it
    config = Config.from_values({"redis_url": "redis://unused.invalid", "key_prefix": "bench",
                                 "node_id": "bench", "lease_ttl": 60.0})
    store = open_store(conninfo, config, prepare_threshold=prepare_threshold)
    lease, ledger = LeaseView(store.lease, config), store.ledger
    assert lease.try_acquire()
    token, epoch = lease.credentials()
    names = [f"entry-{i:04d}" for i in range(chunk)]
    start = int(time.time() * 1000) - (rounds + warmup + 10) * 1000
    sent: list[Event] = []
    took = []
    for r in range(rounds + warmup):
        slot = start + r * 1000
        items = [ClaimItem(n, slot, Op.CLAIM, slot) for n in names]
        began = time.perf_counter()
        answers = ledger.claim(token, epoch, items, sent)
        took.append(time.perf_counter() - began)
        assert answers == [Code.GRANTED] * chunk, answers[:3]
        sent = [Event(n, slot, "sent") for n in names]
    store.close()
    ms = sorted(t * 1000 for t in took[warmup:])
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    prepared = "prepared statements" if prepare_threshold is not None else "no prepared statements"
    return (f"{chunk}-slot claim (+{chunk} sent events), {rounds} rounds, {prepared}: "
            f"p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms, worst {ms[-1]:.2f} ms")


if __name__ == "__main__":
    main()
