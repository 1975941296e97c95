"""What any store must do (``celery_leaderbeat.store.base``), run against each store.

Run against the Redis store, the in-memory store (the reference implementation) and the
PostgreSQL store (a database of the test's own); another store adds itself to
``STORES`` and :func:`backend`, and must pass every test here unchanged. The tests use only the
protocols: no key, no Redis command.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pytest

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import LeaseLostError, RolledBackError
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.base import (
    DetectsLoss,
    GuardRun,
    LossDetection,
    Store,
    loss_detection,
    one_step_client,
)
from celery_leaderbeat.store.entry_store import EntryExists, EntryUnknown
from celery_leaderbeat.store.events import RELEASED, REQUEST
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.memory import MemoryStore
from celery_leaderbeat.store.memory_state import MemoryState
from celery_leaderbeat.store.redis_store import redis_store
from celery_leaderbeat.store.types import (
    BackfillReason,
    BackfillRefused,
    ClaimItem,
    Code,
    Event,
    Op,
    Refused,
    SlotStatus,
)

#: every store; a new one adds its name here and a branch to :func:`backend`
STORES = ["redis", "memory", "postgres"]


class Seen:
    """What one node sees of a store: the store's parts, and its lease through the node's
    own view of it (``lease``; the store's own part is ``store.lease``)."""

    def __init__(self, store: Store, config: Config) -> None:
        self.store = store
        self.lease = LeaseView(store.lease, config)

    @property
    def loss(self) -> LossDetection:
        """The store's loss detection, an optional capability: the tests of its members
        are skipped for a store that does not declare it."""
        detection = loss_detection(self.store)
        if detection is None:
            pytest.skip("the store does not detect losses of writes")
        return detection

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class Backend:
    """One store under test: what a node sees of it per node id, and the store's clock."""

    def __init__(self, make: Callable[[str], tuple[Store, Config]],
                 now_ms: Callable[[], int]) -> None:
        self._make = make
        self.now_ms = now_ms

    def make(self, node: str) -> Seen:
        return Seen(*self._make(node))


@pytest.fixture(params=STORES)
def backend(request: pytest.FixtureRequest, key_prefix: str) -> Any:
    if request.param == "redis":
        client = request.getfixturevalue("redis_client")

        def make(node: str) -> tuple[Store, Config]:
            config = Config.from_values({"redis_url": "redis://x", "key_prefix": key_prefix,
                                         "node_id": node})
            return redis_store(client, Keys(key_prefix), config), config

        def now_ms() -> int:
            seconds, micros = client.time()
            return int(seconds) * 1000 + int(micros) // 1000

        return Backend(make, now_ms)
    if request.param == "memory":
        state = MemoryState()

        def make_memory(node: str) -> tuple[Store, Config]:
            config = Config.from_values({"redis_url": "memory://", "key_prefix": key_prefix,
                                         "node_id": node})
            return MemoryStore(state, config, key_prefix), config

        return Backend(make_memory, state.now_ms)
    if request.param == "postgres":
        return _postgres_backend(request, key_prefix)
    raise AssertionError(request.param)


def _postgres_backend(request: pytest.FixtureRequest, key_prefix: str) -> Backend:
    """Each node a store on its own pool, in a database of this test's own."""
    pytest.importorskip("psycopg")
    from celery_leaderbeat.store.postgres import lease_sql
    from celery_leaderbeat.store.postgres.pool import connection
    from celery_leaderbeat.store.postgres.store import open_store
    from tests.support.postgres import HOST, PORT, USER, pg_config, postgres_database

    held = ExitStack()
    request.addfinalizer(held.close)
    name = held.enter_context(postgres_database("lbcontract"))
    conninfo = f"host={HOST} port={PORT} user={USER} dbname={name}"
    stores: list[Any] = []

    def make(node: str) -> tuple[Store, Config]:
        config = pg_config(key_prefix=key_prefix, node_id=node)
        store = open_store(conninfo, config)
        if not stores:
            held.callback(lambda: [made.close() for made in stores])
        stores.append(store)
        return store, config  # type: ignore[return-value]

    def now_ms() -> int:
        if not stores:
            make("clock")
        with connection(stores[0].place.pool) as conn:
            return lease_sql.server_ms(conn)

    return Backend(make, now_ms)


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
    assert a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.CLAIM)]) == [Code.GRANTED]
    skip = a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.SKIP)])
    assert isinstance(skip[0], Refused)
    assert (skip[0].state.slot_ms, skip[0].state.state) == (1000, SlotStatus.CLAIMED)
    earlier = a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 500, Op.CLAIM)])
    assert isinstance(earlier[0], Refused)
    assert earlier[0].state.slot_ms == 1000
    with pytest.raises(LeaseLostError):
        b.ledger.claim("not-the-token", 99, [ClaimItem("e", 2000, Op.CLAIM)])
    assert a.ledger.load()["e"].slot_ms == 1000


def test_recovering_a_claim_the_store_no_longer_holds_answers_unknown(backend):
    """A leader recovers an unconfirmed claim it was told of; the store lost it (a loss
    of writes) or never had it: nothing is granted and the answer says the slot is
    unknown, on every store alike."""
    a = backend.make("a")
    assert a.lease.try_acquire()
    assert a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.RECOVER, 1000)]) \
        == [Code.UNKNOWN]
    assert "e" not in a.ledger.load()


def test_a_rescue_is_granted_once_and_only_for_an_entry_whose_phase_is_known(backend):
    leader, s1, s2 = backend.make("leader"), backend.make("s1"), backend.make("s2")
    assert leader.lease.try_acquire()
    leader.ledger.claim(*leader.lease.credentials(), [ClaimItem("e", 1000, Op.ANCHOR)])
    slot = backend.now_ms() - 3000  # past its fire time by more than rescue_after (2 s)
    assert s1.ledger.rescue([ClaimItem("new", slot, Op.CLAIM, slot)]).results == [Code.UNKNOWN]
    assert s1.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot)]).results == [Code.GRANTED]
    refused = s2.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot)]).results[0]
    assert isinstance(refused, Refused) and refused.state.node == "s1"


def test_no_rescue_until_the_newest_leader_marked_the_definitions(backend):
    a, b, s = backend.make("a"), backend.make("b"), backend.make("s")
    assert a.lease.try_acquire()
    a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.ANCHOR)])
    a.ledger.mark_definitions(*a.lease.credentials())
    assert a.lease.release()
    assert b.lease.try_acquire()
    slot = backend.now_ms() - 3000  # past its fire time by more than rescue_after (2 s)
    assert s.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot)]).results == [Code.EARLY]
    b.ledger.mark_definitions(*b.lease.credentials())
    assert s.ledger.rescue([ClaimItem("e", slot, Op.CLAIM, slot)]).results == [Code.GRANTED]


def test_checking_the_generation_is_fenced_by_the_lease(backend):
    a = backend.make("a")
    assert a.lease.try_acquire()
    token, epoch = a.lease.credentials()
    a.loss.check_generation(token, epoch)  # still leads, nothing lost: no answer
    assert a.lease.release()
    with pytest.raises(LeaseLostError):
        a.loss.check_generation(token, epoch)
    with pytest.raises(LeaseLostError):
        a.ledger.mark_definitions(token, epoch)

def test_a_sent_record_marks_the_slot_sent_and_joins_the_history(backend):
    a = backend.make("a")
    assert a.lease.try_acquire()
    a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.CLAIM)])
    assert a.ledger.record(a.lease.epoch, [Event("e", 1000, "sent")]) == 1
    assert a.ledger.load()["e"].state == SlotStatus.SENT
    assert ("sent", "e") in [(h["event"], h.get("entry")) for h in a.ledger.history()]


def test_written_past_its_length_and_tidied_the_history_keeps_about_its_length(backend):
    a = backend.make("a")
    length = 10_000  # leaderbeat_history_length's default, which every node here has
    for write in range(250):  # more writes than a store may leave its prune owed for
        a.ledger.record(1, [Event(f"e{i}", write, "missed") for i in range(100)])
    a.ledger.tidy()
    # exact on PostgreSQL and in memory; Redis trims whole stream nodes (MAXLEN ~)
    assert length <= len(a.ledger.history(2 * length)) <= length * 1.02
    assert a.ledger.history(1)[0]["slot"] == "249"  # the newest kept


def test_loss_reports_give_each_entry_the_newest_slot_any_node_reported(backend):
    a, b = backend.make("a"), backend.make("b")
    assert a.loss.lost_reports() == {}
    a.loss.observe_generation(10)
    a.loss.observe_generation(5)  # the store went back: a loss this node saw
    assert a.loss.loss_seen is True
    a.loss.report_lost({"e": 5000, "f": 1000})
    assert a.loss.loss_seen is False  # reported: said once per loss
    b.loss.report_lost({"e": 3000, "g": 7000})
    assert b.loss.lost_reports() == {"e": 5000, "f": 1000, "g": 7000}


def test_a_store_answering_an_older_generation_than_a_node_saw_is_a_loss_seen_once(backend):
    b = backend.make("b")
    seen = 10
    assert b.loss.generation == 0  # none seen yet
    b.loss.observe_generation(seen)
    assert b.loss.generation == seen and b.loss.loss_seen is False
    b.loss.observe_generation(seen - 2)  # the store went back (lost writes)
    assert b.loss.loss_seen is True and b.loss.generation == seen  # the highest seen
    b.loss.report_lost({})
    b.loss.observe_generation(seen - 1)  # climbing again after the same loss
    assert b.loss.loss_seen is False
    b.loss.observe_generation(seen - 3)  # lower again: another loss
    assert b.loss.loss_seen is True


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


def _events(subscription: Any, want: int) -> list[str]:
    """Up to ``want`` events, each waited for (a store may answer None early)."""
    got: list[str] = []
    for _ in range(50):
        if len(got) == want:
            break
        message = subscription.next(0.1)
        if message is not None:
            got.append(message)
    return got


def _listening(store: Store, subscription: Any) -> list[str]:
    """Publish a probe until ``subscription`` hears it (a subscription may take a moment
    to reach the store); what it heard before the probe."""
    before: list[str] = []
    for _ in range(50):
        store.events.publish("probe")
        while (message := subscription.next(0.1)) is not None:
            if message == "probe":
                while subscription.next(0.1) == "probe":  # the probes still on their way
                    pass
                return before
            before.append(message)
    raise AssertionError("the subscription never heard a probe")


def test_a_subscriber_hears_what_is_published_after_it_subscribed(backend):
    a, b = backend.make("a"), backend.make("b")
    a.events.publish(REQUEST)  # nobody listens yet: lost, as a hint may be
    subscription = b.events.subscribe()
    assert _listening(a, subscription) == []
    a.events.publish(REQUEST)
    assert _events(subscription, 1) == [REQUEST]


def test_a_change_of_a_runtime_entry_wakes_no_subscriber(backend):
    """Standbys look at the entries' version on wakes they make anyway; a wake per save
    would cost one as much as taking every change in. A save, an edit, a one-off's finish
    and a delete publish nothing: the probe published after them (the channel works) is
    the first thing the subscriber hears."""
    a, b = backend.make("a"), backend.make("b")
    subscription = b.events.subscribe()
    _listening(a, subscription)
    a.entries.save("e", fingerprint="f1", timing="t", enabled=True, definition="{}")
    a.entries.save("e", fingerprint="f2", timing="t", enabled=True, definition="{}")
    assert a.entries.finish("e", "f2", 1_000)
    assert a.entries.delete("e")
    assert _listening(a, subscription) == []  # nothing came before the probe


def test_a_released_lease_wakes_the_subscribers(backend):
    a, b = backend.make("a"), backend.make("b")
    subscription = b.events.subscribe()
    _listening(a, subscription)
    assert a.lease.try_acquire()
    assert a.lease.release()
    assert _events(subscription, 1) == [RELEASED]


def test_each_request_is_taken_once_in_order_and_wakes_the_leader(backend):
    cli, leader, other = backend.make("cli"), backend.make("leader"), backend.make("other")
    subscription = leader.events.subscribe()
    _listening(cli, subscription)
    cli.requests.push('{"n": 1}')
    cli.requests.push('{"n": 2}')
    assert _events(subscription, 2) == [REQUEST, REQUEST]
    assert leader.requests.pop(1) == ['{"n": 1}']
    assert leader.requests.pop() == ['{"n": 2}']
    assert other.requests.pop() == []


def test_requests_put_back_are_taken_next_in_their_order(backend):
    cli, leader = backend.make("cli"), backend.make("leader")
    for n in (1, 2, 3):
        cli.requests.push(f'{{"n": {n}}}')
    taken = leader.requests.pop()
    cli.requests.push('{"n": 4}')
    leader.requests.requeue(taken[1:])
    assert leader.requests.pop() == ['{"n": 2}', '{"n": 3}', '{"n": 4}']


def test_a_backfilled_slot_is_marked_once_ever(backend):
    a, b = backend.make("a"), backend.make("b")
    assert a.requests.mark_backfilled("e", 1000, "r1")
    assert not b.requests.mark_backfilled("e", 1000, "r2")
    assert a.requests.mark_backfilled("e|x", 2000, "r3")  # another entry, whatever its name
    assert b.requests.backfilled("e") == {1000}


def test_an_entry_saved_is_read_by_change_and_a_repeated_save_changes_nothing(backend):
    a, b = backend.make("a"), backend.make("b")
    start = b.entries.changes(-1)
    first = a.entries.save("e", fingerprint="f1", timing="t1", enabled=True, definition="{}")
    again = a.entries.save("e", fingerprint="f1", timing="t1", enabled=True, definition="{}")
    assert first.changed and not again.changed and again.version == first.version
    changed = b.entries.changes(start.version)
    assert list(changed.saved) == ["e"] and changed.version == first.version
    assert b.entries.changes(changed.version).saved == {}
    assert b.entries.get("e") is not None and b.entries.names() == ["e"]


def test_an_entry_create_and_update_refuse_what_they_cannot_do(backend):
    a = backend.make("a")
    a.entries.save("e", fingerprint="f", timing="t", enabled=True, definition="{}", how="create")
    with pytest.raises(EntryExists):
        a.entries.save("e", fingerprint="g", timing="t", enabled=True, definition="{}",
                       how="create")
    with pytest.raises(EntryUnknown):
        a.entries.save("x", fingerprint="g", timing="t", enabled=True, definition="{}",
                       how="update")


def test_a_removed_entry_is_read_as_removed_and_a_finished_one_as_disabled(backend):
    a, b = backend.make("a"), backend.make("b")
    for name in ("gone", "once"):
        a.entries.save(name, fingerprint="f", timing="t", enabled=True, definition="{}")
    seen = b.entries.changes(-1).version
    assert a.entries.delete("gone") and not a.entries.delete("gone")
    assert not a.entries.finish("once", "another definition", 5000)
    assert a.entries.finish("once", "f", 5000)
    changed = b.entries.changes(seen)
    assert changed.removed == ["gone"] and not changed.saved["once"].enabled
    assert changed.saved["once"].ran_ms == 5000 and sorted(b.entries.all()) == ["once"]


def _run(task_id: str, worker: str, overlap: str = "allow") -> GuardRun:
    return GuardRun(task_id, "e", 1000, 1, overlap, worker)


def test_a_guarded_slot_runs_once_while_alive_and_never_after_it_finished(backend):
    w1, w2 = backend.make("w1").guard, backend.make("w2").guard
    decision, why, token = w1.start(_run("t1", "w1"))
    assert (decision, why) == ("run", "") and token > 0
    decision, why, _ = w2.start(_run("t1", "w2"))
    assert decision == "duplicate" and "w1" in why
    assert tuple(w2.runs(["t1", "t2"])["t1"]) == ("started", "w1", True)
    assert w1.finish(_run("t1", "w1"), token, "ok")
    assert w2.start(_run("t1", "w2"))[0] == "duplicate"
    assert w2.runs(["t1"])["t1"].state == "finished"


def test_an_entry_with_overlap_skip_does_not_start_while_another_run_is_alive(backend):
    guard = backend.make("w").guard
    decision, _, token = guard.start(_run("t1", "w1", "skip"))
    assert decision == "run"
    assert guard.start(_run("t2", "w2", "skip"))[:2] == ("overlap", "t1")
    guard.finish(_run("t1", "w1", "skip"), token, "ok")
    assert guard.start(_run("t2", "w2", "skip"))[0] == "run"


def test_each_retry_of_a_slot_is_a_run_of_its_own_started_once(backend):
    w1, w2 = backend.make("w1").guard, backend.make("w2").guard
    first = GuardRun("t1", "e", 1000, 1, "allow", "w1")
    retry = GuardRun("t1", "e", 1000, 1, "allow", "w1", retry=1)
    decision, _, token = w1.start(first)
    assert decision == "run"
    assert w1.finish(first, token, "retrying")
    decision, _, retry_token = w1.start(retry)
    assert decision == "run" and retry_token > token
    assert w2.start(GuardRun("t1", "e", 1000, 1, "allow", "w2", retry=1))[0] == "duplicate"


def test_a_run_superseded_by_a_later_start_can_neither_renew_nor_finish_it(backend):
    w1, w2 = backend.make("w1").guard, backend.make("w2").guard
    run = _run("t1", "w1")
    _, _, first = w1.start(run)
    w2.start(_run("t1", "w2"))  # still alive: a duplicate, nothing changes
    assert w1.renew(run, first)
    # the first run's token is no longer the one the record holds: as after its
    # liveness lapsed and another delivery started the slot again under a new token
    assert not w1.renew(run, first + 10**15) and not w1.finish(run, first - 1, "ok")
    assert w2.runs(["t1"])["t1"].state == "started"
    assert w1.finish(run, first, "ok")


def test_a_step_down_releases_only_the_lease_held_under_that_token(backend):
    a, cli = backend.make("a"), backend.make("cli")
    assert a.lease.try_acquire()
    token = a.lease.token
    assert token is not None
    assert not cli.admin.step_down(token + "0", "step-down (test)")
    assert cli.admin.step_down(token, "step-down (test)")
    assert cli.lease.holder()[0] is None
    with pytest.raises(LeaseLostError):
        a.lease.renew(token)


def test_a_pause_is_kept_until_resumed(backend):
    cli = backend.make("cli")
    assert cli.admin.where  # named in the CLI's messages
    cli.admin.pause("e", {"note": "maintenance"})
    assert cli.admin.paused() == {"e": {"note": "maintenance"}}
    assert cli.admin.resume("e") and not cli.admin.resume("e")
    assert cli.admin.paused() == {}


def test_the_history_is_read_whole_oldest_first_and_followed_from_an_id(backend):
    a = backend.make("a")
    a.admin.note({"event": "paused", "entry": "e"})
    a.admin.note({"event": "resumed", "entry": "e"})
    rows = a.admin.all_history()
    assert [r["event"] for r in rows] == ["paused", "resumed"]
    assert [r["id"] for r in a.ledger.history(1)] == [rows[-1]["id"]]
    last, newer = a.admin.follow(rows[0]["id"], block_ms=100)
    assert [r["event"] for r in newer] == ["resumed"] and last == rows[-1]["id"]
    assert a.admin.follow(last, block_ms=10) == (last, [])
    now, nothing = a.admin.follow(None, block_ms=10)  # from now: what comes next
    assert nothing == []
    a.admin.note({"event": "paused", "entry": "f"})
    assert [(r["event"], r["entry"]) for r in a.admin.follow(now, block_ms=100)[1]] == [
        ("paused", "f")]
    assert all(r["at"].isdigit() for r in a.admin.all_history())


def test_reset_forgets_the_state_and_keeps_the_run_time_entries(backend):
    a = backend.make("a")
    assert a.lease.try_acquire()
    a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.CLAIM)])
    a.ledger.register_node("leader", {})
    a.admin.pause("e", {})
    a.entries.save("dyn", fingerprint="f", timing="t", enabled=True, definition="{}")
    assert a.admin.reset() > 0
    assert a.lease.holder()[0] is None and a.ledger.load() == {}
    assert a.ledger.nodes() == {} and a.admin.paused() == {} and a.admin.all_history() == []
    assert list(a.entries.all()) == ["dyn"]


def test_forgotten_nodes_leave_the_registry(backend):
    a, b = backend.make("a"), backend.make("b")
    a.ledger.register_node("leader", {})
    b.ledger.register_node("standby", {})
    a.admin.forget_nodes(["b"])
    assert list(a.ledger.nodes()) == ["a"]


def test_the_store_answers_a_ping_and_finds_nothing_wrong_with_a_safe_server(backend):
    a = backend.make("a")
    a.ping()
    assert a.warnings() == []  # the test server evicts nothing (noeviction)


def test_a_backfill_is_granted_once_per_slot_and_refused_with_its_reason(backend):
    a = backend.make("a")
    assert a.lease.try_acquire()
    token, epoch = a.lease.credentials()
    a.ledger.claim(token, epoch, [ClaimItem("e", 10_000, Op.CLAIM)])
    a.ledger.record(epoch, [Event("e", 10_000, "sent")])
    a.ledger.claim(token, epoch, [ClaimItem("e", 50_000, Op.CLAIM)])
    answers = a.ledger.backfill(token, epoch, "e", [10_000, 30_000, 90_000], "r1")
    assert answers == [BackfillRefused(BackfillReason.SENT), Code.GRANTED,
                       BackfillRefused(BackfillReason.LATER)]
    assert a.ledger.backfill(token, epoch, "e", [30_000], "r1") == [Code.GRANTED]  # again
    assert a.ledger.backfill(token, epoch, "e", [30_000], "r2") == [
        BackfillRefused(BackfillReason.BACKFILLED)]


def test_a_leader_starting_again_after_a_loss_sets_when_and_no_backfill_reaches_before(backend):
    a = backend.make("a")
    assert a.loss.lost_at() is None
    assert a.lease.try_acquire()
    token, epoch = a.lease.credentials()
    a.ledger.claim(token, epoch, [ClaimItem("e", 10_000, Op.CLAIM)])
    a.loss.reset_generation(epoch)
    a.ledger.claim(token, epoch, [ClaimItem("e", 50_000, Op.SKIP)])
    lost_at = a.loss.lost_at()
    assert lost_at is not None and abs(lost_at - backend.now_ms()) < 60_000
    assert a.ledger.backfill(token, epoch, "e", [30_000], "r1") == [BackfillRefused(BackfillReason.LOST)]


def test_a_leaders_start_past_a_loss_is_its_own_terms_and_no_later_term_takes_it(backend):
    """A leader told of a loss asks to start again past it, then loses its lease before
    a claim carried that: when it leads again, its claims find the loss still reported
    (it must re-anchor knowing of it), not lift the generation blindly."""
    a, b = backend.make("a"), backend.make("b")
    assert a.lease.try_acquire()
    token, epoch = a.lease.credentials()
    a.ledger.claim(token, epoch, [ClaimItem("e", 10_000, Op.CLAIM)])
    b.loss.observe_generation(a.loss.generation + 10)  # b saw writes the store lost
    b.loss.report_lost({"e": 10_000})  # and says so
    with pytest.raises(RolledBackError):
        a.ledger.claim(token, epoch, [ClaimItem("e", 20_000, Op.CLAIM)])
    a.loss.reset_generation(epoch)
    assert a.lease.release()  # stepped down before its next claim
    assert a.lease.try_acquire()
    token, later = a.lease.credentials()
    assert later > epoch
    with pytest.raises(RolledBackError):
        a.ledger.claim(token, later, [ClaimItem("e", 20_000, Op.CLAIM)])
    a.loss.reset_generation(later)  # this term starts again past the loss: it is dealt with
    assert a.ledger.claim(token, later, [ClaimItem("e", 20_000, Op.CLAIM)]) == [Code.GRANTED]


def test_definitions_written_are_read_beside_the_slots(backend):
    a = backend.make("a")
    assert a.lease.try_acquire()
    a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.ANCHOR, fingerprint="f1")])
    a.ledger.write_definitions({"g": "f2"})
    slots, definitions = a.ledger.load_with_definitions(["e", "g", "x"])
    assert list(slots) == ["e"] and definitions == {"e": "f1", "g": "f2"}
    assert a.ledger.load_with_definitions([]) == ({}, {})


def test_an_unconfirmed_claim_a_newer_leader_replaces_is_kept_until_forgotten(backend):
    a, b = backend.make("a"), backend.make("b")
    assert a.lease.try_acquire()
    a.ledger.claim(*a.lease.credentials(), [ClaimItem("e", 1000, Op.CLAIM)])
    assert a.lease.release()
    assert b.lease.try_acquire()
    b.ledger.claim(*b.lease.credentials(), [ClaimItem("e", 2000, Op.CLAIM)])
    overtaken = b.ledger.overtaken()
    assert list(overtaken) == [("e", 1000)] and overtaken["e", 1000].state == "c"
    b.ledger.forget_overtaken([("e", 1000)])
    assert b.ledger.overtaken() == {}


def test_a_waiting_slot_is_handed_the_turn_when_the_run_before_it_ends(backend):
    guard = backend.make("w").guard
    first = GuardRun("t1", "e", 1000, 1, "buffer_one", "w1")
    second = GuardRun("t2", "e", 2000, 1, "buffer_one", "w2", message="m2")
    decision, _, token = guard.start(first)
    assert decision == "run"
    assert guard.start(second)[:2] == ("wait", "t1")
    assert guard.sweep() == []  # the run before it is alive: nobody is handed the turn
    assert guard.end(first, token, "ok") == (True, "m2")
    handed = GuardRun("t2", "e", 2000, 1, "buffer_one", "w2", handed_over=True)
    assert guard.start(handed)[0] == "run"
    assert guard.release(handed, "terminated") == ""
    assert guard.runs(["t2"])["t2"].state == "finished"
    counted = guard.decisions()
    assert counted[("e", "buffer_one", "buffered")] == 1
    assert counted[("e", "buffer_one", "started_after_wait")] == 1


def test_the_store_clock_is_read_for_requests_and_for_the_skew(backend):
    a = backend.make("a")
    assert abs(a.requests.now_ms() - backend.now_ms()) < 60_000
    assert abs(a.lease.measure_skew()) < 60


def test_a_node_that_saw_a_higher_epoch_is_given_a_higher_one(backend):
    a = backend.make("a")
    a.lease.observe_epoch(50)
    assert a.lease.highest_epoch == 50
    assert a.lease.try_acquire()
    assert a.lease.epoch is not None and a.lease.epoch > 50 and a.lease.losses.led_last


def test_a_held_lease_is_held_until_marked_lost(backend):
    a = backend.make("a")
    assert not a.lease.is_held() and a.lease.remaining() == 0.0
    assert a.lease.try_acquire() and a.lease.is_held() and not a.lease.lost
    assert 0 < a.lease.remaining() <= a.lease.ttl_ms / 1000
    a.lease.mark_lost()
    assert a.lease.lost and not a.lease.is_held()


def test_the_heartbeat_keeps_the_lease_until_stopped(backend):
    a = backend.make("a")
    assert a.lease.try_acquire()
    a.lease.start_heartbeat(time.monotonic)
    assert a.lease.heartbeat_stopped() is None
    a.lease.stop_heartbeat()
    assert a.lease.heartbeat_stopped() is None  # stopped on purpose: nothing to report
    a.lease.renew()
    assert a.lease.is_held()


def test_the_stores_here_detect_losses_of_writes(backend):
    a = backend.make("a")
    assert loss_detection(a.store) is not None


def test_a_store_that_cannot_enqueue_in_one_step_says_so_and_closes(backend):
    a = backend.make("a")
    client = one_step_client(a.store)
    assert client is None or callable(getattr(client, "lpush", None))
    a.close()


#: members of the loss detection that are this node's own view of the losses it saw, not
#: questions to the store (the roles read them: roles/loss.py)
NODE_SIDE = {("LossDetection", "loss_reported"), ("LossDetection", "below")}

_PARTS = {"lease": "LeaseStore", "ledger": "SlotStore", "events": "Events",
          "requests": "RequestQueue", "entries": "EntryDefinitions", "guard": "GuardStore",
          "admin": "ClusterAdmin"}


def _members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n in vars(protocol) if not n.startswith("_")}
    return names


class _Recording:
    """A part of a store that notes each member the suite reads, calls or writes."""

    def __init__(self, part: Any, protocol: str, seen: set[tuple[str, str]]) -> None:
        object.__setattr__(self, "_part", part)
        object.__setattr__(self, "_protocol", protocol)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name: str) -> Any:
        self._seen.add((self._protocol, name))
        value = getattr(self._part, name)
        if name == "subscribe":
            return lambda: _Recording(value(), "Subscription", self._seen)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._seen.add((self._protocol, name))
        setattr(self._part, name, value)


def test_the_suite_exercises_every_member_of_the_seam(key_prefix):
    from celery_leaderbeat.store import base

    seen: set[tuple[str, str]] = set()
    protocols = {name: getattr(base, name) for name in
                 ("LeaseStore", "SlotStore", "Subscription", "Events", "RequestQueue",
                  "EntryDefinitions", "GuardStore", "ClusterAdmin", "Store", "LossDetection",
                  "DetectsLoss")}
    for test in [f for name, f in globals().items() if name.startswith("test_")
                 and f is not test_the_suite_exercises_every_member_of_the_seam]:
        state = MemoryState()

        def make(node: str, state: MemoryState = state) -> tuple[Any, Config]:
            config = Config.from_values({"redis_url": "memory://", "key_prefix": key_prefix,
                                         "node_id": node})
            store = MemoryStore(state, config, key_prefix)
            recording = _Recording(store, "Store", seen)
            for attr, protocol in _PARTS.items():
                object.__setattr__(recording, attr, _Recording(getattr(store, attr), protocol,
                                                               seen))
            if isinstance(store, DetectsLoss):  # the optional capability's members
                object.__setattr__(recording, "loss", _Recording(store.loss, "LossDetection",
                                                                 seen))
            return recording, config

        test(Backend(make, state.now_ms))
    seen |= {("Store", attr) for attr in _PARTS} | {("DetectsLoss", "loss")}
    every = {(name, member) for name, protocol in protocols.items()
             for member in _members(protocol)}
    assert every - seen - NODE_SIDE == set()
    assert NODE_SIDE <= every
