"""The demo's arithmetic: which slots it expects, what counts as a duplicate or a miss."""

from __future__ import annotations

from datetime import datetime, timezone

from celery_leaderbeat.demo.summary import Rhythm, Signalled, summarize

T0 = 1_800_000_000_000  # ms, a whole multiple of 5 s


def run(entry: str, slot_ms: int, started: float | None = None) -> dict[str, object]:
    iso = datetime.fromtimestamp(slot_ms / 1000, timezone.utc).isoformat()
    return {"entry": entry, "slot": iso, "started": started or slot_ms / 1000 + 0.01}


def test_interval_slots_follow_the_anchor_and_cron_steps_follow_the_wall_clock() -> None:
    assert Rhythm(2.0, aligned=False).slots(T0 + 700, T0 + 6_700) == [
        T0 + 2_700, T0 + 4_700, T0 + 6_700]
    assert Rhythm(5.0, aligned=True).slots(T0 + 700, T0 + 15_000) == [
        T0 + 5_000, T0 + 10_000, T0 + 15_000]


def test_a_slot_run_twice_is_one_duplicate_and_a_slot_never_run_is_missed() -> None:
    runs = [run("a", T0 + 1_000), run("a", T0 + 1_000), run("a", T0 + 3_000, started=0)]
    summary = summarize(runs=runs, history=[], anchors={"a": T0}, rhythms={
        "a": Rhythm(1.0, aligned=False)}, until=(T0 + 3_000) / 1000, signals=[], beat_of={},
        origin=T0 / 1000)
    assert summary["expected"] == 3
    assert summary["executed"] == 2
    assert summary["duplicates"] == 1
    assert [row["slot"] for row in summary["missed_slots"]] == [
        "2027-01-15T08:00:02.000+00:00"]


def test_a_failover_is_timed_from_the_signal_to_the_first_send_by_another_node() -> None:
    at = T0 + 10_000
    history = [
        {"id": f"{T0 + 9_000}-0", "event": "sent", "node": "old", "entry": "a"},
        {"id": f"{at + 9_500}-0", "event": "elected", "node": "new", "epoch": "2"},
        {"id": f"{at + 9_600}-0", "event": "sent", "node": "new", "entry": "a"},
    ]
    summary = summarize(runs=[], history=history, anchors={}, rhythms={}, until=at / 1000,
                        signals=[Signalled("SIGKILL", at / 1000, 0, 1, "old")],
                        beat_of={"new": 1}, origin=T0 / 1000)
    (failover,) = summary["failovers"]
    assert failover["new_leader_beat"] == 1
    assert failover["new_leader_elected_after_s"] == 9.5
    assert failover["first_send_by_another_beat_after_s"] == 9.6
    assert failover["send_gap_s"] == 10.6
    assert failover["released_after_s"] is None
    assert summary["longest_gap_s"] == 10.6
