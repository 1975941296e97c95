"""A fault at every store call of a leader's and a standby's run on PostgreSQL: the call
fails before the server ran it, or its reply is lost after it committed. The caller asks
again once; whatever the fault, no slot is granted to two claimants, every grant a node
was told of is the one the database holds, and the run ends where a run without faults
ends (a lost release excepted: the lease then waits out its ttl).

The fault site is :meth:`Place.run` (every store call passes there, by its name)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from celery_leaderbeat.errors import LeaseLostError
from celery_leaderbeat.store.base import STORE_ERRORS as ERRORS
from celery_leaderbeat.store.postgres import lease_sql
from celery_leaderbeat.store.postgres.schema import qualified
from celery_leaderbeat.store.postgres.store import PostgresStore, open_store
from celery_leaderbeat.store.types import ClaimItem, Code, Event, Op, Refused
from tests.support.postgres import HOST, PORT, USER, pg_config, postgres_database, with_node_lease

ENTRIES = ("a", "b")
#: the steps whose answers a retry may change (see the test)
ANCHOR, RELEASE = 1, 7


@pytest.fixture(scope="module")
def conninfo() -> Iterator[str]:
    with postgres_database("lbpgfault") as name:
        yield f"host={HOST} port={PORT} user={USER} dbname={name}"


@dataclass
class Faults:
    """Fails the ``at``-th store call (counting from 0), ``when`` before or after it."""

    at: int = -1
    when: str = ""
    calls: list[str] = field(default_factory=list)
    fired: str = ""

    def __call__(self, site: str, when: str) -> None:
        if when == "before":
            self.calls.append(site)
        if len(self.calls) - 1 == self.at and when == self.when and not self.fired:
            self.fired = f"{site}/{when}"
            raise psycopg.OperationalError(f"fault: {site} {when}")


@dataclass
class Run:
    """What one run of the scenario saw: each grant a node was told of, the end state."""

    granted: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    answers: list[Any] = field(default_factory=list)
    slots: dict[str, Any] = field(default_factory=dict)
    grants: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)


def scenario(conninfo: str, app: str, faults: Faults) -> Run:
    config = {"key_prefix": app, "lease_ttl": 30.0, "rescue_after": 2.0}
    leader = with_node_lease(open_store(conninfo, node := pg_config(node_id="n1", **config)),
                             node)
    standby = with_node_lease(open_store(conninfo, other := pg_config(node_id="s1", **config)),
                              other)
    leader.place.fault = standby.place.fault = faults
    run = Run()
    try:
        with psycopg.connect(conninfo) as conn:
            now = lease_sql.server_ms(conn)
        for step in _steps(leader, standby, now, run):
            run.answers.append(_twice(step))
        leader.place.fault = standby.place.fault = None
        run.slots = {k: (v.slot_ms, v.state) for k, v in leader.ledger.load().items()}
        run.grants = _grants(conninfo, app)
    finally:
        leader.close()
        standby.close()
    return run


def _twice(step: Callable[[], Any]) -> Any:
    """The step, asked again once if the store failed (as a node retries)."""
    try:
        return step()
    except ERRORS:
        try:
            return step()
        except (LeaseLostError, *ERRORS) as exc:
            return type(exc).__name__
    except LeaseLostError as exc:
        return type(exc).__name__


def _steps(leader: PostgresStore, standby: PostgresStore, now: int,
           run: Run) -> list[Callable[[], Any]]:
    first, s1, s2, s3 = now - 60_000, now - 20_000, now - 10_000, now - 5_000

    def claim(store: PostgresStore, slot: int, op: str = Op.CLAIM,
              events: tuple[Event, ...] = ()) -> Any:
        token, epoch = store.lease.credentials()
        items = [ClaimItem(e, slot, op, slot, fingerprint="f") for e in ENTRIES]
        answers = store.ledger.claim(token, epoch, items, list(events))
        _note(run, f"{store.lease.config.node_id}@{epoch}", items, answers)
        return answers

    def rescue() -> Any:
        items = [ClaimItem(e, s2, Op.CLAIM, s2, s1, "f") for e in ENTRIES]
        answers = standby.ledger.rescue(items).results
        _note(run, "s1@rescue", items, answers)
        return answers

    def sent(slot: int) -> tuple[Event, ...]:
        return tuple(Event(e, slot, "sent") for e in ENTRIES)

    return [
        leader.lease.try_acquire,
        lambda: claim(leader, first, Op.ANCHOR),
        lambda: claim(leader, s1),
        lambda: claim(leader, s2, events=sent(s1)),
        rescue,
        lambda: leader.ledger.record(leader.lease.credentials()[1], sent(s2)),
        leader.lease.renew,
        leader.lease.release,
        standby.lease.try_acquire,
        lambda: claim(standby, s3),
    ]


def _note(run: Run, who: str, items: list[ClaimItem], answers: list[Any]) -> None:
    for item, answer in zip(items, answers):
        if item.op == Op.CLAIM and answer is Code.GRANTED:
            run.granted.setdefault((item.name, item.slot_ms), set()).add(who)


def _grants(conninfo: str, app: str) -> dict[tuple[str, int], tuple[int, str]]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(qualified(
            "SELECT entry, slot_ms, epoch, node FROM {schema}.grants WHERE app = %s",
            "leaderbeat"), (app,)).fetchall()
    return {(e, int(s)): (int(ep), n) for e, s, ep, n in rows}


def _answers(run: Run) -> list[Any]:
    """Each step's answer, a refusing slot state by its state and claimant."""
    def plain(answer: Any) -> Any:
        if isinstance(answer, list):
            return [plain(a) for a in answer]
        if isinstance(answer, Refused):  # epochs: an acquire asked again takes a new one
            return ("refused by", answer.state.state, answer.state.node)
        return answer
    return [plain(a) for a in run.answers]


def _relative(run: Run) -> tuple[Any, ...]:
    """The end state with slot times made relative (each run has its own clock)."""
    base = min(slot for slot, _ in run.slots.values()) if run.slots else 0
    return tuple(sorted((k, slot - base, state) for k, (slot, state) in run.slots.items()))


def test_a_fault_at_any_store_call_never_grants_a_slot_twice(conninfo: str) -> None:
    baseline = scenario(conninfo, "baseline", Faults())
    assert baseline.answers[-1] == [Code.GRANTED] * 2  # the standby led and claimed at the end
    sites = Faults()
    scenario(conninfo, "count", sites)
    swept = 0
    for at in range(len(sites.calls)):
        for when in ("before", "after"):
            faults = Faults(at, when)
            run = scenario(conninfo, f"f{at}{when}", faults)
            case = f"fault {faults.fired}"
            assert faults.fired, f"{case}: nothing fired at call {at}"
            swept += 1
            for slot, who in run.granted.items():
                assert len(who) == 1, f"{case}: {slot} granted to {who}"
                node, _, epoch = next(iter(who)).partition("@")
                told = (0, node) if epoch == "rescue" else (int(epoch), "")
                assert run.grants[slot] == told, f"{case}: {slot} is {run.grants[slot]}, told {who}"
            if faults.fired != "release/before":
                # a call asked again after its reply was lost answers as the first did; not
                # the anchor (asked again, it answers the anchor it wrote, as on Redis) nor
                # the release (asked again, the node holds no lease any more: False)
                mine, theirs = _answers(run), _answers(baseline)
                for skipped in (RELEASE, ANCHOR):
                    del mine[skipped], theirs[skipped]
                assert mine == theirs, case
                assert _relative(run) == _relative(baseline), case
    assert swept == 2 * len(sites.calls) >= 20
