"""What any store must do (``celery_leaderbeat.store.base``), run against each store.

Only the Redis store exists; a second one (PostgreSQL, say) adds itself to
``STORES`` and must pass every test here unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import LeaseLostError
from celery_leaderbeat.store.base import Store, redis_store
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.ledger import ClaimItem, Event, Op

STORES = ["redis"]


class Backend:
    """One store under test: a Store per node, and the store's own clock."""

    def __init__(self, make: Callable[[str], Store], now_ms: Callable[[], int]) -> None:
        self.make = make
        self.now_ms = now_ms


@pytest.fixture(params=STORES)
def backend(request: pytest.FixtureRequest, key_prefix: str) -> Any:
    if request.param == "redis":
        client = request.getfixturevalue("redis_client")

        def make(node: str) -> Store:
            config = Config.from_values({"redis_url": "redis://x", "key_prefix": key_prefix,
                                         "node_id": node})
            return redis_store(client, Keys(key_prefix), config)

        def now_ms() -> int:
            seconds, micros = client.time()
            return int(seconds) * 1000 + int(micros) // 1000

        return Backend(make, now_ms)
    raise AssertionError(request.param)


def test_one_node_holds_the_lease_and_a_second_is_refused(backend):
    a, b = backend.make("a"), backend.make("b")
    assert a.lease.try_acquire()
    assert not b.lease.try_acquire()
    token, remaining_ms = b.lease.holder()
    assert token == a.lease.token and 0 < remaining_ms <= a.lease.ttl_ms


def test_a_released_lease_goes_to_the_next_node_under_a_higher_epoch(backend):
    a, b = backend.make("a"), backend.make("b")
    assert a.lease.try_acquire()
    first = a.lease.epoch
    assert a.lease.release()
    assert b.lease.try_acquire()
    assert b.lease.epoch is not None and first is not None and b.lease.epoch > first


def test_a_lease_taken_over_cannot_be_renewed_by_its_old_holder(backend):
    a, b = backend.make("a"), backend.make("b")
    assert a.lease.try_acquire()
    a.lease.release()
    assert b.lease.try_acquire()
    with pytest.raises(LeaseLostError):
        a.lease.renew(a.lease.token)


def test_a_claimed_slot_stays_claimed_and_only_the_lease_holder_claims(backend):
    a, b = backend.make("a"), backend.make("b")
    assert a.lease.try_acquire()
    assert a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.CLAIM)]) == [None]
    skip = a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.SKIP)])
    assert skip[0] is not None and not isinstance(skip[0], str)
    assert (skip[0].slot_ms, skip[0].state) == (1000, "c")
    earlier = a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 500, Op.CLAIM)])
    assert earlier[0] is not None and not isinstance(earlier[0], str)
    assert earlier[0].slot_ms == 1000
    with pytest.raises(LeaseLostError):
        b.ledger.claim("not-the-token", 99, [ClaimItem("e", 2000, Op.CLAIM)])
    assert a.ledger.load()["e"].slot_ms == 1000


def test_a_rescue_is_granted_once_and_only_for_an_entry_whose_phase_is_known(backend):
    leader, s1, s2 = backend.make("leader"), backend.make("s1"), backend.make("s2")
    assert leader.lease.try_acquire()
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", 1000, Op.ANCHOR)])
    slot = backend.now_ms() - 3000  # past its fire time by more than rescue_after (2 s)
    assert s1.ledger.rescue([ClaimItem("new", slot, Op.CLAIM, slot)]).results == ["unknown"]
    assert s1.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot)]).results == [None]
    refused = s2.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot)]).results[0]
    assert refused is not None and not isinstance(refused, str) and refused.node == "s1"


def test_a_sent_record_marks_the_slot_sent_and_joins_the_history(backend):
    a = backend.make("a")
    assert a.lease.try_acquire()
    a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.CLAIM)])
    assert a.ledger.record(a.lease.epoch, [Event("e", 1000, "sent")]) == 1
    assert a.ledger.load()["e"].state == "s"
    assert ("sent", "e") in [(h["event"], h.get("entry")) for h in a.ledger.history()]


def test_prune_forgets_entries_no_longer_scheduled_once_they_are_old(backend):
    a = backend.make("a")
    assert a.lease.try_acquire()
    now, day = backend.now_ms(), 86_400_000
    a.ledger.claim(*a.lease.credentials(), [ClaimItem("kept", now - 40 * day, Op.ANCHOR),
                                            ClaimItem("gone", now - 40 * day, Op.ANCHOR),
                                            ClaimItem("recent", now - day, Op.ANCHOR)])
    a.ledger.prune(["kept"], keep_ms=30 * day, node_keep_s=3600)
    assert sorted(a.ledger.load()) == ["kept", "recent"]


def test_the_node_registry_keeps_a_registered_node_until_it_unregisters(backend):
    a = backend.make("a")
    a.ledger.register_node("standby", {"host": "h"})
    assert a.ledger.nodes()["a"]["role"] == "standby"
    a.ledger.unregister_node()
    assert "a" not in a.ledger.nodes()
