"""Slot claims against a real Redis and the in-memory store: monotonic, fenced, recorded."""

from __future__ import annotations

import re

import pytest
import redis

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import LeaseLostError, RolledBackError, ScriptError
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.errors import StoreRefused
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.lease import Lease
from celery_leaderbeat.store.ledger import Ledger, decode
from celery_leaderbeat.store.memory import MemoryStore
from celery_leaderbeat.store.memory_state import MemoryState
from celery_leaderbeat.store.scripts import Scripts
from celery_leaderbeat.store.types import (
    BackfillReason,
    BackfillRefused,
    ClaimItem,
    Code,
    Event,
    Op,
    Refused,
    SlotState,
    SlotStatus,
)


@pytest.fixture
def redis_parts(redis_client, key_prefix):
    def make(node: str):
        config = Config.from_values({"redis_url": "redis://x", "key_prefix": key_prefix,
                                     "node_id": node})
        scripts = Scripts(redis_client)
        keys = Keys(key_prefix)
        return LeaseView(Lease(redis_client, scripts, keys, config), config), Ledger(redis_client, scripts, keys, config)
    return make


@pytest.fixture(params=["redis", "memory"])
def parts(request, key_prefix):
    """A node's lease and ledger on Redis, or on one in-memory store."""
    if request.param == "redis":
        return request.getfixturevalue("redis_parts")
    state = MemoryState()

    def make(node: str):
        config = Config.from_values({"redis_url": "memory://", "key_prefix": key_prefix,
                                     "node_id": node})
        store = MemoryStore(state, config, key_prefix)
        return LeaseView(store.lease, config), store.ledger
    return make


def test_a_slot_is_granted_once_and_a_skip_of_it_is_refused_after(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    assert ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.CLAIM)]) == [Code.GRANTED]
    refused = ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.SKIP)])
    assert refused == [Refused(SlotState(1000, lease.epoch, SlotStatus.CLAIMED),
                              f"already claimed by the leader of epoch {lease.epoch}")]


def test_claims_are_monotonic_per_entry(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    items = [ClaimItem("e", 2000, Op.CLAIM), ClaimItem("e", 1000, Op.CLAIM), ClaimItem("f", 500, Op.CLAIM)]
    results = ledger.claim(lease.token, lease.epoch, items)
    assert results[0] is Code.GRANTED and results[2] is Code.GRANTED
    assert isinstance(results[1], Refused) and results[1].state.slot_ms == 2000


def test_a_node_that_lost_the_lease_is_granted_nothing(redis_parts, redis_client, key_prefix):
    parts = redis_parts  # it moves Redis's own keys
    old, old_ledger = parts("old")
    new, _ = parts("new")
    assert old.try_acquire()
    redis_client.delete(Keys(key_prefix).leader)
    assert new.try_acquire()
    with pytest.raises(LeaseLostError, match="new"):
        old_ledger.claim(old.token, old.epoch, [ClaimItem("e", 1000, Op.CLAIM)])
    assert old_ledger.load() == {}


def test_an_anchor_is_written_only_when_the_entry_has_no_state(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    assert ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.ANCHOR)]) == [Code.GRANTED]
    again = ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 5000, Op.ANCHOR)])
    assert isinstance(again[0], Refused)
    assert (again[0].state.slot_ms, again[0].state.state) == (1000, SlotStatus.ANCHOR)
    assert ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1001, Op.CLAIM)]) == [Code.GRANTED]


def test_sent_marks_only_the_current_slot_and_writes_history(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.CLAIM)])
    assert ledger.record(lease.epoch, [Event("e", 999, "sent"), Event("e", 1000, "sent")]) == 1
    assert ledger.load()["e"].state == SlotStatus.SENT
    events = [(h["event"], h.get("entry")) for h in ledger.history()]
    assert ("sent", "e") in events and events[0] == ("elected", None)


def test_a_skip_advances_the_last_slot_without_a_claim(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    assert ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 3000, Op.SKIP)]) == [Code.GRANTED]
    state = ledger.load()["e"]
    assert (state.slot_ms, state.state, state.epoch) == (3000, SlotStatus.SKIPPED, lease.epoch)
    assert ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 2000, Op.CLAIM)])[0] is not Code.GRANTED


def test_a_claim_renews_the_lease(redis_parts, redis_client, key_prefix):
    parts = redis_parts  # it moves Redis's own keys
    lease, ledger = parts("a")
    assert lease.try_acquire()
    redis_client.pexpire(Keys(key_prefix).leader, 100)
    ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1, Op.CLAIM)])
    assert redis_client.pttl(Keys(key_prefix).leader) > 1000


def test_thousands_of_claims_in_one_call_are_chunked_and_all_granted(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    items = [ClaimItem(f"e{i}", 1000, Op.CLAIM) for i in range(4500)]
    assert ledger.claim(lease.token, lease.epoch, items) == [Code.GRANTED] * 4500
    assert len(ledger.load()) == 4500


def test_the_states_of_named_entries_are_read_whatever_the_names_and_however_many(parts):
    """What a standby's look reads: thousands of names in one call (Redis answers them a
    thousand at a time), names of any characters, names with no state left out."""
    lease, ledger = parts("a")
    assert lease.try_acquire()
    odd = ["e|1", "ünïcödé ✓", "two\nlines", 'a "quote"', "back\\slash", "/", "[1]", "{}", ""]
    names = odd + [f"e{i}" for i in range(2500)]
    items = [ClaimItem(name, 1000 + i, Op.CLAIM) for i, name in enumerate(names)]
    assert ledger.claim(lease.token, lease.epoch, items) == [Code.GRANTED] * len(items)
    asked = [*names[::-1], "no state", "neither"]
    loaded = ledger.load(asked)
    assert list(loaded) == [n for n in asked if n in names], "in the order asked"
    assert loaded == {n: s for n, s in ledger.load().items() if n in asked}
    assert loaded["ünïcödé ✓"] == SlotState(1001, lease.epoch, SlotStatus.CLAIMED)
    assert ledger.load(["no state"]) == {} and ledger.load([]) == {}


def _replicated_parts(client, prefix: str, min_replicas: int, **timing):
    """A lease and a ledger with ``min_replicas``; the default timing bounds WAIT at 250 ms."""
    settings = {"lease_ttl": 3, "renew_interval": 1, **timing}
    config = Config.from_values({"redis_url": "redis://x", "key_prefix": prefix, "node_id": "a",
                                 "min_replicas": min_replicas, **settings})
    scripts = Scripts(client)
    keys = Keys(prefix)
    return LeaseView(Lease(client, scripts, keys, config), config), Ledger(client, scripts, keys, config)


def test_with_min_replicas_a_claim_returns_once_a_replica_has_it(make_redis_server, key_prefix):
    import time

    master = make_redis_server("--repl-diskless-sync-delay", "0")
    replica = make_redis_server("--replicaof", "127.0.0.1", str(master.port),
                                "--repl-diskless-sync-delay", "0")
    deadline = time.monotonic() + 10
    # A freshly synced replica is counted by WAIT only once it has acknowledged an
    # offset (up to a second after the sync): wait until it acknowledges writes.
    probe = master.client()
    while not (probe.set("probe", "1") and probe.execute_command("WAIT", 1, 100) == 1):
        assert time.monotonic() < deadline, "replica never acknowledged a write"
    # WAIT bounded at 2 s, not 250 ms: the replica's acknowledgement must come whatever
    # else the machine runs (a test beside a suite, at a lower priority, missed 250 ms)
    lease, ledger = _replicated_parts(master.client(), key_prefix, 1, lease_ttl=12,
                                      renew_interval=4, store_timeout=4)
    assert lease.try_acquire()
    assert ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.CLAIM)]) == [Code.GRANTED]
    assert replica.client().hget(Keys(key_prefix).slots, "e") is not None


def test_with_min_replicas_and_no_replica_a_claim_is_refused_quickly(make_redis_server, key_prefix):
    from celery_leaderbeat.errors import NotReplicatedError

    lease, ledger = _replicated_parts(make_redis_server().client(), key_prefix, 1)
    assert lease.try_acquire()
    with pytest.raises(NotReplicatedError, match="no replica acknowledged"):
        ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.CLAIM)])


def test_with_default_settings_and_no_replica_wait_answers_before_the_socket_times_out(
        make_redis_server, key_prefix):
    """WAIT's timeout once equalled the socket timeout: beat said "Redis unreachable"."""
    from celery_leaderbeat.errors import NotReplicatedError
    from celery_leaderbeat.store.connection import make_client

    server = make_redis_server()
    config = Config.from_values({"redis_url": server.url, "key_prefix": key_prefix,
                                 "node_id": "a", "min_replicas": 1})
    client = make_client(server.url, {}, config.store_timeout)
    scripts, keys = Scripts(client), Keys(key_prefix)
    lease, ledger = LeaseView(Lease(client, scripts, keys, config), config), Ledger(client, scripts, keys, config)
    assert lease.try_acquire()
    with pytest.raises(NotReplicatedError, match="0 of leaderbeat_min_replicas=1"):
        ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.CLAIM)])


def test_min_replicas_is_refused_with_redis_cluster():
    from celery_leaderbeat.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="not supported with Redis Cluster"):
        Config.from_values({"redis_url": "redis+cluster://h:7000", "key_prefix": "p",
                            "node_id": "a", "min_replicas": 1})


def test_a_retried_claim_whose_reply_was_lost_is_granted_again_not_refused(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    item = ClaimItem("e", 1000, Op.CLAIM)
    assert ledger.claim(lease.token, lease.epoch, [item]) == [Code.GRANTED]
    # the same call again, as redis-py's retry sends it when the first reply is lost
    assert ledger.claim(lease.token, lease.epoch, [item]) == [Code.GRANTED]
    assert ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 999, Op.CLAIM)])[0] is not Code.GRANTED


def test_the_same_slot_claimed_under_an_older_epoch_is_refused(redis_parts, redis_client, key_prefix):
    parts = redis_parts  # it moves Redis's own keys
    old, old_ledger = parts("a")
    assert old.try_acquire()
    old_ledger.claim(old.token, old.epoch, [ClaimItem("e", 1000, Op.CLAIM)])
    redis_client.delete(Keys(key_prefix).leader)
    new, new_ledger = parts("b")
    assert new.try_acquire()
    refused = new_ledger.claim(new.token, new.epoch, [ClaimItem("e", 1000, Op.CLAIM)])
    assert isinstance(refused[0], Refused) and refused[0].state.epoch == old.epoch


def test_an_unsent_event_marks_a_claimed_slot_reported_but_not_a_newer_one(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.CLAIM)])
    ledger.record(lease.epoch, [Event("e", 1000, "unsent", "lease expired")])
    assert ledger.load()["e"].state == SlotStatus.UNSENT
    ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 2000, Op.CLAIM)])
    ledger.record(lease.epoch, [Event("e", 1000, "unsent", "late")])
    assert ledger.load()["e"].state == SlotStatus.CLAIMED


def _slot_scripts() -> dict[str, str]:
    from importlib import resources

    from celery_leaderbeat.store.scripts import PIECES, SLOT_SCRIPTS
    lua = resources.files("celery_leaderbeat.store").joinpath("lua")
    names = {*SLOT_SCRIPTS, "prelude", *(piece for used in PIECES.values() for piece in used)}
    return {name: lua.joinpath(f"{name}.lua").read_text() for name in sorted(names)}


def test_each_slot_script_gets_the_prelude_pieces_it_calls_and_no_other():
    from celery_leaderbeat.store.scripts import PIECES, SLOT_SCRIPTS
    texts = _slot_scripts()
    pieces = {piece for used in PIECES.values() for piece in used}
    defined = {piece: re.findall(r"^local function (\w+)", texts[piece], re.MULTILINE)
               for piece in pieces}
    calls = {(name, piece) for name in SLOT_SCRIPTS for piece in pieces
             if any(re.search(rf"\b{f}\(", texts[name]) for f in defined[piece])}
    assert calls == {(name, piece) for name, used in PIECES.items() for piece in used}


def test_every_code_a_slot_script_names_is_in_the_python_enums():
    tables = {"CODE": {c.name for c in Code}, "REASON": {r.name for r in BackfillReason},
              "STATUS": {s.name for s in SlotStatus}}
    named = {(table, name) for text in _slot_scripts().values()
             for table, name in re.findall(r"\b(CODE|REASON|STATUS)\.(\w+)", text)}
    assert {table for table, _ in named} == set(tables)
    assert {(t, n) for t, n in named if n not in tables[t]} == set()


def test_no_slot_script_answers_an_item_with_a_bare_number():
    """Per-item answers come from the code tables (a bare 0 meant four things once)."""
    for name, text in _slot_scripts().items():
        assert re.findall(r"\bresult\s*=\s*-?\d|\breturn\s+-?\d", text) == [], name


def test_a_code_a_script_reads_that_is_not_in_a_table_is_an_error_in_the_script(redis_client):
    from celery_leaderbeat.store.scripts import code_tables
    script = redis_client.register_script(code_tables() + "\nreturn CODE.NO_SUCH_CODE")
    with pytest.raises(redis.ResponseError, match="no such code: NO_SUCH_CODE"):
        script()


def test_an_answer_this_version_does_not_understand_names_the_script_the_code_and_the_item():
    item = ClaimItem("e", 1000, Op.CLAIM)
    assert decode("lead", [item], [1, 0, 0, 7, 1]) == [Code.GRANTED]
    with pytest.raises(ScriptError, match=r"lead\.lua answered 99 for claim of 'e' at 1000"):
        decode("lead", [item], [1, 0, 0, 7, 99])
    with pytest.raises(ScriptError, match=r"rescue\.lua answered None"):
        decode("rescue", [item], [1, 0, 0, 7, None])
    with pytest.raises(ScriptError, match=r"backfill\.lua answered b'soon'"):
        decode("backfill", [item], [1, 0, 0, 7, b"soon"])
    with pytest.raises(ScriptError, match="2 results for 1 items"):
        decode("lead", [item], [1, 0, 0, 7, 1, 1])


def test_a_rolled_back_entry_starts_again_past_its_slot_as_skipped(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    assert Op.ROLLED_BACK != Op.SKIP
    assert ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 3000, Op.ROLLED_BACK)]) == [
        Code.GRANTED]
    assert ledger.load()["e"].state == SlotStatus.SKIPPED


def test_a_backfill_refusal_is_a_reason_and_a_rescue_of_an_unknown_op_an_error(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 3000, Op.CLAIM)])
    assert ledger.backfill(lease.token, lease.epoch, "e", [4000], "r1") == [
        BackfillRefused(BackfillReason.LATER)]
    with pytest.raises((redis.ResponseError, StoreRefused),
                       match="rescue.lua: op anchor is not a rescue"):
        ledger.rescue([ClaimItem("e", 4000, Op.ANCHOR)])


def test_the_generation_check_says_when_redis_lost_writes_or_another_node_leads(parts):
    lease, ledger = parts("a")
    assert lease.try_acquire()
    ledger.claim(lease.token, lease.epoch, [ClaimItem("e", 1000, Op.CLAIM)])
    ledger.check_generation(lease.token, lease.epoch)  # nothing lost, still leading
    with pytest.raises(LeaseLostError, match="check refused"):
        ledger.check_generation("someone|9", 9)
    ledger.generation += 10  # this node saw writes Redis no longer has
    with pytest.raises(RolledBackError):
        ledger.check_generation(lease.token, lease.epoch)
