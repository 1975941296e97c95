"""The PostgreSQL store's claim rules, item by item, without a server (``rules.decide``):
the cases ``lead.lua`` and ``rescue.lua`` decide that the store tests do not reach one by one."""

from __future__ import annotations

from celery_leaderbeat.store.postgres.rules import Chunk, Row, decide
from celery_leaderbeat.store.types import ClaimItem, Code, Op, SlotStatus

NOW = 1_000_000


def leader(**known: object) -> Chunk:
    return Chunk(lead=True, epoch=5, node="n1", now_ms=NOW, ahead_ms=3000,
                 recover_age_ms=10_000, **known)  # type: ignore[arg-type]


def standby(**known: object) -> Chunk:
    return Chunk(lead=False, epoch=0, node="s1", now_ms=NOW,
                 rescue_after_ms=2000, **known)  # type: ignore[arg-type]


def test_anchor_writes_only_where_the_entry_has_no_state() -> None:
    chunk = leader(slots={"old": Row(10, 1, SlotStatus.SENT)})
    assert decide(chunk, ClaimItem("new", 500, Op.ANCHOR, 500)) is Code.GRANTED
    assert decide(chunk, ClaimItem("old", 500, Op.ANCHOR, 500)) == Row(10, 1, SlotStatus.SENT)
    assert chunk.written == {"new": Row(500, 5, SlotStatus.ANCHOR)}


def test_reanchor_never_moves_a_slot_backwards_and_is_a_no_op_for_the_same_definition() -> None:
    chunk = leader(slots={"e": Row(900, 4, SlotStatus.SENT)}, definitions={"e": "f1"})
    same = ClaimItem("e", 800, Op.REANCHOR, 800, fingerprint="f1")
    assert decide(chunk, same) == Row(900, 4, SlotStatus.SENT)
    assert decide(chunk, ClaimItem("e", 800, Op.REANCHOR, 800, fingerprint="f2")) is Code.GRANTED
    assert chunk.written["e"] == Row(900, 5, SlotStatus.ANCHOR)
    assert chunk.defined == {"e": "f2"}


def test_a_claim_overtaking_another_claimants_unconfirmed_slot_keeps_it_for_the_report() -> None:
    chunk = leader(slots={"e": Row(700, 4, SlotStatus.CLAIMED)})
    assert decide(chunk, ClaimItem("e", 800, Op.CLAIM, 800)) is Code.GRANTED
    assert chunk.overtaken_added == {("e", 700): Row(700, 4, SlotStatus.CLAIMED)}
    own = leader(slots={"e": Row(700, 5, SlotStatus.CLAIMED)})
    assert decide(own, ClaimItem("e", 800, Op.CLAIM, 800)) is Code.GRANTED
    assert own.overtaken_added == {}


def test_a_slot_granted_before_to_another_claimant_is_refused_even_past_the_stored_slot() -> None:
    chunk = leader(slots={"e": Row(700, 4, SlotStatus.SENT)}, grants={("e", 800): Row(800, 3, SlotStatus.CLAIMED)})
    assert decide(chunk, ClaimItem("e", 800, Op.CLAIM, 800)) == Row(700, 4, SlotStatus.SENT)
    assert chunk.written == {} and chunk.new_grants == {}


def test_recover_takes_an_old_claim_over_but_waits_for_a_young_standby_claim() -> None:
    old = leader(slots={"e": Row(700, 4, SlotStatus.UNSENT)})
    assert decide(old, ClaimItem("e", 700, Op.RECOVER, 700)) is Code.GRANTED
    assert old.written["e"] == Row(700, 5, SlotStatus.CLAIMED) and ("e", 700) in old.recovered
    young = leader(slots={"e": Row(700, 0, SlotStatus.CLAIMED, "s1", NOW - 1000)})
    assert decide(young, ClaimItem("e", 700, Op.RECOVER, 700)) == Code.EARLY
    aged = leader(slots={"e": Row(700, 0, SlotStatus.CLAIMED, "s1", NOW - 20_000)})
    assert decide(aged, ClaimItem("e", 700, Op.RECOVER, 700)) is Code.GRANTED


def test_recover_of_an_overtaken_slot_leaves_the_newer_stored_slot() -> None:
    chunk = leader(slots={"e": Row(800, 5, SlotStatus.CLAIMED)}, overtaken={("e", 700): Row(700, 4, SlotStatus.CLAIMED)})
    assert decide(chunk, ClaimItem("e", 700, Op.RECOVER, 700)) is Code.GRANTED
    assert chunk.written == {} and chunk.overtaken_dropped == {("e", 700)}
    assert chunk.new_grants == {("e", 700): Row(700, 5, SlotStatus.CLAIMED)}


def test_a_rescue_needs_state_a_matching_previous_slot_and_the_time_past_rescue_after() -> None:
    item = ClaimItem("e", NOW - 3000, Op.CLAIM, NOW - 3000, prev_ms=100)
    assert decide(standby(), item) == Code.UNKNOWN
    assert decide(standby(slots={"e": Row(50, 2, SlotStatus.SENT)}), item) == Row(50, 2, SlotStatus.SENT)
    assert decide(standby(slots={"e": Row(100, 2, SlotStatus.SENT)}, leader_busy=True), item) == Code.EARLY
    early = ClaimItem("e", NOW - 1000, Op.CLAIM, NOW - 1000, prev_ms=100)
    assert decide(standby(slots={"e": Row(100, 2, SlotStatus.SENT)}), early) == Code.EARLY
    chunk = standby(slots={"e": Row(100, 2, SlotStatus.SENT)})
    assert decide(chunk, item) is Code.GRANTED
    assert chunk.written["e"] == Row(NOW - 3000, 0, SlotStatus.CLAIMED, "s1", NOW)


def test_a_rescue_takes_no_other_op_than_claim_and_skip() -> None:
    chunk = standby(slots={"e": Row(100, 2, SlotStatus.SENT)})
    assert decide(chunk, ClaimItem("e", 200, Op.ANCHOR, 200)) == Code.UNKNOWN
    assert decide(chunk, ClaimItem("e", NOW - 5000, Op.SKIP, NOW - 5000)) is Code.GRANTED
    assert chunk.written["e"].state is SlotStatus.SKIPPED


def test_define_marks_the_leaders_epoch() -> None:
    chunk = leader()
    assert decide(chunk, ClaimItem("", 0, Op.DEFINE, 0)) is Code.GRANTED
    assert decide(chunk, ClaimItem("e", 0, Op.DEFINE, 0, fingerprint="f")) is Code.GRANTED
    assert chunk.defined_epoch == 5 and chunk.defined == {"e": "f"}


def test_rolled_back_starts_again_past_the_slot_stored_skipped() -> None:
    chunk = leader(slots={"e": Row(700, 4, SlotStatus.SENT)})
    assert decide(chunk, ClaimItem("e", 800, Op.ROLLED_BACK, 800)) is Code.GRANTED
    assert chunk.written["e"] == Row(800, 5, SlotStatus.SKIPPED)
    assert decide(chunk, ClaimItem("e", 800, Op.ROLLED_BACK, 800)) is Code.GRANTED  # a retry


def test_a_claim_carrying_broker_commands_is_granted_unqueued_for_the_caller_to_publish() -> None:
    chunk = leader()
    item = ClaimItem("e", 800, Op.CLAIM, 800, enqueue=(("lpush", "celery", b"m"),))
    assert decide(chunk, item) is Code.UNQUEUED
    assert chunk.written["e"] == Row(800, 5, SlotStatus.CLAIMED)  # not sent: nothing ran
