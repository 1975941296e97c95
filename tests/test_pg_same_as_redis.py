"""The PostgreSQL store answers as the Redis store does (whose Lua scripts are the
specification): the same steps, drawn by hypothesis, run against both (two leaders in
turn and a standby: claims of every op, rescues, definitions marked, generation checks,
sends recorded, pauses, takeovers), and
every answer, typed as the seam's results, and the state at the end are compared.

Not compared: the times a server stamps (a rescue's claim time); a rescue waiting for a
busy leader (decided by the time between two steps: each store's own tests cover it).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import LeaseLostError
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.postgres import lease_sql
from celery_leaderbeat.store.postgres.ledger import PostgresLedger
from celery_leaderbeat.store.postgres.schema import qualified
from celery_leaderbeat.store.postgres.store import PostgresStore, open_store
from celery_leaderbeat.store.redis_store import connect
from celery_leaderbeat.store.types import ClaimItem, Event, Op, Refused, SlotState
from tests.support.postgres import HOST, NO_REDIS, PORT, USER, place_lease, postgres_database
from tests.support.redis_server import RedisServer

NODES = ("n0", "n1", "s0")
ENTRIES = ("a", "b")
OPS = (Op.CLAIM, Op.SKIP, Op.ANCHOR, Op.REANCHOR, Op.RESTORE, Op.ROLLED_BACK, Op.RECOVER)
_apps = itertools.count()

step = st.one_of(
    st.tuples(st.just("lead"), st.sampled_from(OPS), st.sampled_from(ENTRIES),
              st.integers(0, 3), st.sampled_from(["", "f1", "f2"])),
    st.tuples(st.just("rescue"), st.sampled_from([Op.CLAIM, Op.SKIP]),
              st.sampled_from(ENTRIES), st.integers(0, 3), st.integers(-1, 3),
              st.sampled_from(["", "f1", "f2"])),
    st.tuples(st.just("record"), st.sampled_from(["sent", "unsent", "missed"]),
              st.sampled_from(ENTRIES), st.integers(0, 3), st.integers(0, 2)),
    st.tuples(st.just("define"), st.sampled_from(ENTRIES), st.sampled_from(["f1", "f2"])),
    st.tuples(st.just("pause"), st.sampled_from(ENTRIES), st.booleans()),
    st.tuples(st.just("check")),
    st.tuples(st.just("takeover")),
)


@pytest.fixture(scope="module")
def pg_stores() -> Iterator[list[PostgresStore]]:
    with postgres_database("lbpgsame") as name:
        conninfo = f"host={HOST} port={PORT} user={USER} dbname={name}"
        made = [open_store(conninfo, _config("", node, "init")) for node in NODES]
        yield made
        for store in made:
            store.close()


def _config(url: str, node: str, app: str) -> Config:
    return Config.from_values({"redis_url": url or NO_REDIS, "key_prefix": app,
                               "node_id": node, "lease_ttl": 60.0, "rescue_after": 2.0})


class Twin:
    """One store's three nodes: two leaders in turn (n0 first) and a standby."""

    def __init__(self, leases: list[Any], ledgers: list[Any], admin: Any,
                 expire: Any, idle: Any) -> None:
        self.leases, self.ledgers, self.admin = leases, ledgers, admin
        self.expire, self.idle = expire, idle  # the lease lapses; the leader's progress ages
        self.leader = 0
        assert self.leases[0].try_acquire()

    def run(self, action: tuple[Any, ...], base: int) -> Any:
        kind = action[0]
        try:
            return self._run(kind, action, base)
        except LeaseLostError:
            return "lost"

    def _run(self, kind: str, action: tuple[Any, ...], base: int) -> Any:
        lease, ledger = self.leases[self.leader], self.ledgers[self.leader]
        if kind == "lead":
            _, op, entry, k, fp = action
            slot = base + 1000 * k
            token, epoch = lease.credentials()
            return ledger.claim(token, epoch, [ClaimItem(entry, slot, op, slot, None, fp)])
        if kind == "rescue":
            _, op, entry, k, prev, fp = action
            slot = base + 1000 * k
            self.idle()
            item = ClaimItem(entry, slot, op, slot, None if prev < 0 else base + 1000 * prev, fp)
            return self.ledgers[2].rescue([item]).results
        if kind == "record":
            _, event, entry, k, who = action
            return self.ledgers[who].record(0 if who == 2 else (self.leases[who].epoch or 0),
                                            [Event(entry, base + 1000 * k, event)])
        if kind == "define":
            _, entry, fp = action
            token, epoch = lease.credentials()
            defined = ledger.claim(token, epoch, [ClaimItem(entry, 0, Op.DEFINE, 0, None, fp)])
            return [*defined, ledger.mark_definitions(token, epoch)]
        if kind == "check":
            token, epoch = lease.credentials()
            return ledger.check_generation(token, epoch)
        if kind == "pause":
            _, entry, on = action
            if on:
                self.admin.pause(entry, {"note": ""})
                return None
            return self.admin.resume(entry)
        self.expire()
        self.leader = 1 - self.leader
        return self.leases[self.leader].try_acquire()


def _plain(answer: Any, base: int) -> Any:
    if isinstance(answer, list):
        return [_plain(a, base) for a in answer]
    if isinstance(answer, SlotState):
        return (answer.slot_ms - base, answer.epoch, answer.state, answer.node)
    if isinstance(answer, Refused):
        return ("refused", _plain(answer.state, base), answer.reason)
    return answer


def _redis_twin(url: str, app: str) -> tuple[Twin, list[Any]]:
    stores = [connect(_config(url, node, app)) for node in NODES]
    keys = Keys(app)
    client = stores[0].client

    def expire() -> None:
        client.delete(keys.leader)

    def idle() -> None:
        client.delete(keys.progress)

    leases = [LeaseView(s.lease, _config(url, n, app)) for s, n in zip(stores, NODES)]
    twin = Twin(leases, [s.ledger for s in stores], stores[0].admin,
                expire, idle)
    return twin, stores


def _pg_twin(stores: list[PostgresStore], app: str) -> Twin:
    for store in stores:
        store.place.app = app
    conninfo = stores[0].place.pool.conninfo

    def update(text: str) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(qualified(text + " WHERE app = %s", "leaderbeat"), (app,))

    leases = [place_lease(s.place, _config("", n, app)) for s, n in zip(stores, NODES)]
    ledgers = [PostgresLedger(s.place, _config("", n, app)) for s, n in zip(stores, NODES)]
    return Twin(leases, ledgers, stores[0].admin,
                lambda: update("UPDATE {schema}.lease SET expires_at = clock_timestamp()"),
                lambda: update("UPDATE {schema}.lease SET progress_at = NULL"))


def test_the_postgresql_store_answers_every_step_as_the_redis_store(
        shared_redis: RedisServer, pg_stores: list[PostgresStore]) -> None:
    with psycopg.connect(pg_stores[0].place.pool.conninfo) as conn:
        base = lease_sql.server_ms(conn) - 3_600_000  # every slot long due

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(steps=st.lists(step, min_size=1, max_size=25))
    @example(steps=[("lead", Op.CLAIM, "a", 1, ""), ("lead", Op.CLAIM, "a", 1, ""),
                    ("record", "sent", "a", 1, 0), ("lead", Op.CLAIM, "a", 1, "")])
    @example(steps=[("lead", Op.CLAIM, "a", 1, ""), ("takeover",),
                    ("lead", Op.CLAIM, "a", 2, ""), ("lead", Op.RECOVER, "a", 1, ""),
                    ("lead", Op.RECOVER, "a", 1, ""), ("record", "sent", "a", 2, 1)])
    @example(steps=[("lead", Op.ANCHOR, "a", 0, "f1"), ("define", "a", "f1"),
                    ("rescue", Op.CLAIM, "a", 2, 0, "f1"), ("rescue", Op.CLAIM, "a", 2, 0, "f1"),
                    ("rescue", Op.CLAIM, "a", 3, 2, "f2"), ("lead", Op.CLAIM, "a", 2, "f1"),
                    ("takeover",), ("lead", Op.RECOVER, "a", 2, "")])
    @example(steps=[("pause", "a", True), ("lead", Op.CLAIM, "a", 2, "f1"),
                    ("pause", "a", False), ("lead", Op.REANCHOR, "a", 1, "f2"),
                    ("lead", Op.RESTORE, "a", 3, ""), ("lead", Op.SKIP, "a", 3, "")])
    @example(steps=[("lead", Op.CLAIM, "a", 1, ""), ("lead", Op.ROLLED_BACK, "a", 2, ""),
                    ("lead", Op.ROLLED_BACK, "a", 2, ""), ("lead", Op.CLAIM, "a", 2, ""),
                    ("check",), ("takeover",), ("check",), ("define", "a", "f1"),
                    ("rescue", Op.CLAIM, "a", 3, 2, "f1")])
    def same(steps: list[tuple[Any, ...]]) -> None:
        app = f"same{next(_apps)}-{secrets.token_hex(3)}"
        redis_twin, redis_stores = _redis_twin(shared_redis.url, app)
        pg_twin = _pg_twin(pg_stores, app)
        try:
            for n, action in enumerate(steps):
                on_redis = _plain(redis_twin.run(action, base), base)
                on_pg = _plain(pg_twin.run(action, base), base)
                assert on_pg == on_redis, f"step {n} {action}: {on_pg} != redis {on_redis}"
            loads = [{k: _plain(v, base) for k, v in t.ledgers[0].load().items()}
                     for t in (redis_twin, pg_twin)]
            assert loads[1] == loads[0]
            overtaken = [{(e, s - base): _plain(v, base) for (e, s), v in
                          t.ledgers[0].overtaken().items()} for t in (redis_twin, pg_twin)]
            assert overtaken[1] == overtaken[0]
        finally:
            for store in redis_stores:
                store.close()

    same()
