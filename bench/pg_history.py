"""Simulated hours of a leader's claims: do the PostgreSQL store's tables, and the Redis
store's keys, stay bounded?

    python bench/pg_history.py [--entries 2000 --every 5 --hours 24 --sample-minutes 30]
                               [--stores postgresql,redis]

A synthetic clock, no beat: round r claims every entry's slot ``start + r * every`` in
chunks of 100, each claim carrying the previous chunk's ``sent`` events, as a leader's
claims do, as fast as the store answers. The slots start ``--hours`` in the past, so
none lies ahead of the server's clock. The store's own prune runs as in a leader (the
ledger's ``tidy()`` after each round, as the beat's loop calls it between passes: a prune
every 200 writes). One thing runs on the server's clock, which the synthetic
clock cannot move: the PostgreSQL store keeps its grants (one row per slot granted) for
``GRANTS_KEEP_SECONDS`` by the server's time. So the bench also calls that prune, at the
ledger's pace (every 200 claims), with the keep translated to the real seconds since the
round that lies ``GRANTS_KEEP_SECONDS`` before the current one in simulated time: what
the leader's prune would drop at that simulated moment.

Every ``--sample-minutes`` of simulated time, a sample: PostgreSQL, the rows and
``pg_total_relation_size`` of each of the store's tables and the database's size;
Redis, the history stream's length, the slot hash's fields, the keys and
``used_memory``. Each store runs on a server of the bench's own (bench/pg_rig.py).
The defaults are long: on a 2-core machine PostgreSQL answered 20 to 50 claims a second,
so 24 hours at 2,000 entries take hours of real time; ``--hours 3`` shows the bound.
Rows are appended as JSON lines to bench/results/pg_history.jsonl; the summary row
per store says whether every table stopped growing. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pg_rig import durable_cluster, load, versions

from celery_leaderbeat.config import Config
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.postgres import state_sql
from celery_leaderbeat.store.postgres.ledger import GRANTS_KEEP_SECONDS, KEEP_SECONDS
from celery_leaderbeat.store.postgres.store import open_store as open_postgres
from celery_leaderbeat.store.redis_store import connect as connect_redis
from celery_leaderbeat.store.types import ClaimItem, Code, Event, Op
from tests.support.redis_server import RedisServer

RESULTS = Path(__file__).resolve().parent / "results"
CHUNK = 100  # the leader's chunk (roles/batch.py)
PRUNE_EVERY = 200  # the ledger's prune pace, in writes
TABLES = ("slots", "grants", "history", "overtaken", "definitions", "nodes", "lease")


def save(row: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "pg_history.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


class SimClock:
    """Simulated time of each round against the real time it ran at."""

    def __init__(self) -> None:
        self.sim: list[float] = []
        self.real: list[float] = []

    def mark(self, sim_s: float) -> None:
        self.sim.append(sim_s)
        self.real.append(time.time())

    def real_keep(self, keep_sim_s: float) -> float:
        """Real seconds since the round ``keep_sim_s`` simulated seconds before the last."""
        if not self.sim:
            return keep_sim_s
        i = bisect_right(self.sim, self.sim[-1] - keep_sim_s) - 1
        return keep_sim_s if i < 0 else max(0.0, time.time() - self.real[i])


def drive(store: Any, config: Config, n: int, every: float, hours: float,
          sample: Callable[[float], None], every_claims: Callable[[int], None]) -> float:
    """The rounds of a leader's claims over ``hours`` of simulated time; ``sample(sim_s)``
    at each ``--sample-minutes`` boundary, ``every_claims(claims)`` after each claim.
    Returns the real seconds the rounds took."""
    lease = LeaseView(store.lease, config)
    assert lease.try_acquire(), "the lease is free on a fresh server"
    token, epoch = lease.credentials()
    names = [f"e{i:05d}" for i in range(n)]
    start_ms = int((time.time() - hours * 3600 - 60) * 1000)
    rounds, claims = int(hours * 3600 / every), 0
    sent: list[Event] = []
    began = time.time()
    for r in range(rounds + 1):
        slot = start_ms + int(r * every * 1000)
        sample(r * every)
        if r == rounds:
            break
        for i in range(0, n, CHUNK):
            chunk = names[i:i + CHUNK]
            answers = store.ledger.claim(token, epoch,
                                         [ClaimItem(e, slot, Op.CLAIM, slot) for e in chunk],
                                         sent)
            if any(a != Code.GRANTED for a in answers):
                raise RuntimeError(f"round {r}: a claim was refused: {answers[:2]}")
            sent = [Event(e, slot, "sent") for e in chunk]
            claims += 1
            every_claims(claims)
        store.ledger.tidy()  # as the beat's loop between passes: the owed prune
        if r % 20 == 0:
            lease.renew()
    store.ledger.record(epoch, sent)
    return time.time() - began


def _config(prefix: str, redis_url: str = "redis://unused.invalid") -> Config:
    return Config.from_values({"redis_url": redis_url, "key_prefix": prefix,
                               "node_id": "bench", "lease_ttl": 60.0})


def one(conn: psycopg.Connection[Any], sql: str) -> tuple[Any, ...]:
    """The row of a query that answers one (an aggregate, a SELECT without FROM)."""
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row


def pg_sample(conn: psycopg.Connection[Any], sim_s: float, real_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {"sim_h": round(sim_s / 3600, 3), "real_s": round(real_s, 1)}
    for table in TABLES:
        count, size = one(conn, f"SELECT count(*), pg_total_relation_size('leaderbeat.{table}') "
                                f"FROM leaderbeat.{table}")
        row[table] = {"rows": count, "mib": round(size / 2**20, 2)}
    row["database_mib"] = round(
        one(conn, "SELECT pg_database_size(current_database())")[0] / 2**20, 1)
    row["load"] = load()
    return row


@contextmanager
def postgres_run(config: Config) -> Iterator[tuple[Any, psycopg.Connection[Any]]]:
    with durable_cluster() as cluster:
        store = open_postgres(cluster.conninfo, config)
        try:
            with psycopg.connect(cluster.conninfo, autocommit=True) as conn:
                yield store, conn
        finally:
            store.close()


def postgres(n: int, every: float, hours: float, sample_min: float) -> dict[str, Any]:
    config = _config("bench")
    clock, rows = SimClock(), []
    with postgres_run(config) as (store, conn):
        t0 = time.time()

        def sample(sim_s: float) -> None:
            clock.mark(sim_s)
            if sim_s % (sample_min * 60) < every:
                rows.append({"store": "postgresql", **pg_sample(conn, sim_s, time.time() - t0)})
                save({"scenario": "history", **rows[-1]})

        def prune(claims: int) -> None:
            if claims % PRUNE_EVERY == 0:
                store.place.run(state_sql.prune_history, keep=config.history_length,
                                max_age_s=KEEP_SECONDS,
                                grants_keep_s=clock.real_keep(GRANTS_KEEP_SECONDS))

        real = drive(store, config, n, every, hours, sample, prune)
    return summary("postgresql", rows, n, every, hours, real)


def redis_sample(client: Any, keys: Keys, sim_s: float, real_s: float) -> dict[str, Any]:
    return {"store": "redis", "sim_h": round(sim_s / 3600, 3), "real_s": round(real_s, 1),
            "history_xlen": client.xlen(keys.history), "slots_hlen": client.hlen(keys.slots),
            "keys": client.dbsize(),
            "used_memory_mib": round(client.info("memory")["used_memory"] / 2**20, 2),
            "load": load()}


def redis(n: int, every: float, hours: float, sample_min: float) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with RedisServer() as server:
        config = _config("bench", server.url)
        store, client, keys = connect_redis(config), server.client(), Keys("bench")
        t0 = time.time()

        def sample(sim_s: float) -> None:
            if sim_s % (sample_min * 60) < every:
                rows.append(redis_sample(client, keys, sim_s, time.time() - t0))
                save({"scenario": "history", **rows[-1]})

        real = drive(store, config, n, every, hours, sample, lambda claims: None)
    return summary("redis", rows, n, every, hours, real)


def _sizes(row: dict[str, Any]) -> dict[str, float]:
    if row["store"] == "redis":
        return {k: row[k] for k in ("history_xlen", "slots_hlen", "keys", "used_memory_mib")}
    return {f"{t}.{k}": row[t][k] for t in TABLES for k in ("rows", "mib")}


def summary(kind: str, rows: list[dict[str, Any]], n: int, every: float, hours: float,
            real: float) -> dict[str, Any]:
    """Per measure: its value at the last sample, its highest, and its highest over the
    second half of the run against the first half's (bounded: no higher)."""
    half = [r for r in rows if r["sim_h"] <= hours / 2]
    late = [r for r in rows if r["sim_h"] > hours / 2]
    measures = _sizes(rows[-1])
    out: dict[str, Any] = {}
    for key in measures:
        first = max(_sizes(r)[key] for r in half)
        second = max((_sizes(r)[key] for r in late), default=first)
        out[key] = {"last": measures[key], "max_first_half": first, "max_second_half": second,
                    "grew_in_second_half_pct": round(100 * (second - first) / first, 1)
                    if first else None}
    return {"store": kind, "summary": True, "entries": n, "every": every, "hours": hours,
            "claims_per_s": round(n / 100 * hours * 3600 / every / real, 1),
            "real_s": round(real, 1), "measures": out, "load": load()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--sample-minutes", type=float, default=30.0)
    parser.add_argument("--stores", default="postgresql,redis")
    args = parser.parse_args()
    save({"scenario": "env", **versions()})
    for kind in args.stores.split(","):
        run = postgres if kind == "postgresql" else redis
        save({"scenario": "history", **run(args.entries, args.every, args.hours,
                                           args.sample_minutes)})


if __name__ == "__main__":
    main()
