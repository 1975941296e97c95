"""The chaos verdict itself, on hand-made evidence (fast, no processes)."""

from __future__ import annotations

from datetime import datetime, timezone

from .harness import (
    Fault,
    Observation,
    Report,
    expected_slots,
    measure_failovers,
    pid_of,
    verdict,
)

T0 = 1_700_000_000_000  # ms, an even second


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat()


def test_interval_grid_is_split_at_redis_restarts_and_phase_may_change():
    before = [T0 + k * 1000 for k in range(5)]  # ..T0+4000
    after = [T0 + 9_300 + k * 1000 for k in range(4)]  # re-anchored with a new phase
    grid, off = expected_slots("interval", 1000, before + after, [T0 + 5_000], T0 + 12_300)
    assert off == []
    assert grid == before + [T0 + 5000, T0 + 6000, T0 + 7000, T0 + 8000] + after


def test_off_grid_slots_are_reported():
    grid, off = expected_slots("interval", 2000, [T0, T0 + 2000, T0 + 3000, T0 + 4000], [], T0 + 4000)
    assert off == [T0 + 3000]
    grid, off = expected_slots("cron", 2000, [T0, T0 + 1000], [], T0 + 4000)
    assert off == [T0 + 1000] and grid == [T0, T0 + 2000, T0 + 4000]


def test_missing_slots_are_explained_by_history_or_window_else_reported():
    schedule = {"a": {"every": 1}}
    sent = [T0, T0 + 1000, T0 + 4000, T0 + 20_000]  # 2000, 3000 and 5000..19000 missing
    fault = Fault("kill_leader", "x", 0.0, (T0 + 4500) / 1000, 0.0, (T0 + 4500) / 1000)
    report = verdict(Report(seed=1, nodes=3, faults=[fault]), schedule=schedule,
                     messages=[("a", iso(s)) for s in sent + [T0]],
                     history=[{"event": "missed", "entry": "a", "slot": str(T0 + 2000),
                               "detail": "latest"}],
                     restarts_wall=[], end_wall=(T0 + 23_000) / 1000)
    assert report.duplicates == [("a", iso(T0))]
    assert report.explained_history == 1  # 2000
    # 3000 .. 10000 lie in [4500 - 1000, 4500 + ttl + poll + 2] = [3500, 10000]? 3000 does not
    assert report.explained_window == len(range(T0 + 5000, T0 + 10_001, 1000))
    unexplained = {e_slot for e_slot in report.unexplained}
    assert len(unexplained) == 1 + len(range(T0 + 11_000, T0 + 20_000, 1000))
    assert report.unrecorded == report.explained_window  # G3: a kill's misses must be recorded
    assert any(i.startswith("G3-UNRECORDED-MISS") for i in report.issues)
    assert not report.ok


def test_history_missed_but_sent_is_an_issue():
    report = verdict(Report(seed=1, nodes=3), schedule={"a": {"every": 1}},
                     messages=[("a", iso(T0)), ("a", iso(T0 + 1000))],
                     history=[{"event": "missed", "entry": "a", "slot": str(T0 + 1000),
                               "detail": "latest"}],
                     restarts_wall=[], end_wall=(T0 + 4000) / 1000)
    assert report.missing == 0 and any("recorded 'missed'" in i for i in report.issues)


def test_failover_is_time_to_a_different_token():
    f = Fault("kill_leader", "x", 10.0, 0.0, 10.0, 0.0, leader_before="h:1:a|1", hit_leader=True)
    obs = [Observation(9.0, 0, "h:1:a|1", True), Observation(12.0, 0, None, True),
           Observation(13.4, 0, "h:2:b|2", True)]
    report = Report(seed=1, nodes=3)
    measure_failovers([f], obs, report)
    assert abs(f.failover - 3.4) < 1e-9 and report.issues == []
    assert pid_of("host:1234:abc|7") == 1234


def test_a_link_fault_the_leader_survived_gets_no_failover_from_the_next_fault():
    stall = Fault("stall_link", "x", 10.0, 0.0, 12.0, 0.0, leader_before="h:1:a|1",
                  hit_leader=True)
    cut = Fault("cut_link", "x", 16.0, 0.0, 20.0, 0.0, leader_before="h:1:a|1", hit_leader=True)
    obs = [Observation(9.0, 0, "h:1:a|1", True), Observation(19.0, 0, "h:2:b|2", True)]
    report = Report(seed=1, nodes=3)
    measure_failovers([stall, cut], obs, report)
    assert stall.failover is None and "kept its lease" in stall.note
    assert abs(cut.failover - 3.0) < 1e-9 and report.issues == []


def test_soak_grids_know_seconds_and_minute_crons_and_refuse_others():
    from .soakschedule import grid_of, soak_schedule

    assert grid_of({"every": 5}) == ("interval", 5000)
    assert grid_of({"cron": "*/10 * * * * *"}) == ("cron", 10_000)
    assert grid_of({"cron": "* * * * *"}) == ("cron", 60_000)
    assert len(soak_schedule()) == 219
    import pytest

    with pytest.raises(ValueError, match="does not know"):
        grid_of({"cron": "5 4 * * *"})


def test_a_redis_restart_with_its_data_does_not_excuse_an_unrecorded_miss():
    sent = [T0, T0 + 1000, T0 + 3000, T0 + 4000]
    kept = Fault("restart_redis_kept", "r", 0.0, (T0 + 1500) / 1000, 0.0, (T0 + 1600) / 1000)
    report = verdict(Report(seed=1, nodes=3, faults=[kept]), schedule={"a": {"every": 1}},
                     messages=[("a", iso(s)) for s in sent], history=[], restarts_wall=[],
                     end_wall=(T0 + 7000) / 1000)
    assert report.explained_window == 1 and report.unrecorded == 1
    assert report.missed_without_reason == 1 and not report.ok


def test_soak_figures_count_double_publishes_double_runs_and_lateness():
    from .figures import soak_figures

    a0, a1 = iso(T0), iso(T0 + 1000)
    published = [("a", a0, "id0", T0 / 1000 + 0.2), ("a", a0, "id0", T0 / 1000 + 4.2),
                 ("a", a1, "id1", T0 / 1000 + 1.4), ("a", iso(T0 + 2000), "id2", T0 / 1000 + 2.1)]
    executed = [{"entry": "a", "slot": a0, "at": T0 / 1000 + 0.5},
                {"entry": "a", "slot": a0, "at": T0 / 1000 + 4.5},
                {"entry": "a", "slot": a1, "at": T0 / 1000 + 1.5}]
    history = [{"event": "skipped", "entry": "a", "slot": str(T0 + 2000),
                "detail": "overlap: w1 still runs"},
               {"event": "skipped", "entry": "a", "slot": str(T0 + 1000),
                "detail": "already claimed by standby x (rescue)"},
               {"event": "skipped", "entry": "a", "slot": str(T0), "detail": "duplicate: x"}]
    f = soak_figures(published=published, executed=executed, history=history,
                     end_ms=T0 + 10_000)
    assert f["published_more_than_once"] == 1 and f["extra_publishes"] == 1
    assert f["executed_twice"] == 1 and f["slots_executed"] == 2
    assert f["published_never_executed"] == 0 and f["published_not_executed_guard_reason"] == 1
    assert f["lateness_publish_s"]["worst"] == 0.4 and f["lateness_execution_s"]["worst"] == 0.5
    assert f["guard_events"] == {"guard skipped overlap": 1, "guard skipped duplicate": 1,
                                 "beat skipped": 1}


def test_a_run_killed_with_its_worker_and_run_again_is_a_rerun_not_a_double_run():
    from .figures import soak_figures

    a0, a1 = iso(T0), iso(T0 + 1000)
    t = T0 / 1000
    executed = [{"entry": "a", "slot": a0, "at": t + 0.1, "hostname": "w0g0-x@h", "pid": 7},
                {"entry": "a", "slot": a0, "at": t + 10.1, "hostname": "w1g0-x@h", "pid": 8},
                {"entry": "a", "slot": a1, "at": t + 1.1, "hostname": "w0g0-x@h", "pid": 7},
                {"entry": "a", "slot": a1, "at": t + 11.1, "hostname": "w1g0-x@h", "pid": 8}]
    history = [{"event": "finished", "entry": "a", "slot": str(T0 + 1000), "node": "h:7"}]
    f = soak_figures(published=[("a", a0, "i0", t), ("a", a1, "i1", t + 1)], executed=executed,
                     history=history, end_ms=T0 + 20_000, killed_workers={"w0g0-x": t + 1.5})
    # a0: killed before it recorded finishing: a rerun; a1: it had finished: a double run
    assert f["executed_twice_rerun_after_worker_kill"] == 1
    assert f["executed_twice"] == 1 and f["executed_twice_examples"][0].startswith("a@")
    assert str(T0 + 1000) in f["executed_twice_examples"][0]
