"""Clock skew with real beat processes: ``LB_CLOCK_OFFSET`` shifts one beat's wall clock.

The lease itself is relative (PX) and does not care about clocks, but slots are wall
clock times: a node whose clock is further off Redis ``TIME`` than
``leaderbeat_max_clock_skew`` must never lead. Within the limit a skewed node may
lead, and since claims are monotonic per entry no slot is sent twice when the
leadership moves between clocks that disagree.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from itertools import pairwise

import pytest

from tests.support.beat import NOOP, BeatProcess, Recorder, beat_env, duplicates

pytestmark = pytest.mark.slow

TTL, RENEW, POLL = 3.0, 1.0, 0.5
FAST = {"leaderbeat_lease_ttl": TTL, "leaderbeat_renew_interval": RENEW,
        "leaderbeat_standby_poll": POLL}
MAX_SKEW = 2.0
INTERVAL = timedelta(milliseconds=1500)
#: a handover's schedule: every slot counts (policy ``all``), a second's and an interval's grid
SKEWED_SCHEDULE = {
    "every-second": {"task": NOOP, "cron": "* * * * * *", "leaderbeat": {"catchup": "all"}},
    "interval": {"task": NOOP, "every": INTERVAL.total_seconds(),
                 "leaderbeat": {"catchup": "all"}},
}


def leader_token(client, prefix: str) -> str | None:
    raw = client.get("{" + prefix + "}:leader")
    return raw.decode() if raw else None


def leader_pid(token: str) -> int:
    return int(token.split("|")[0].split(":")[-2])


def wait_for_leader_pid(client, prefix: str, pid: int, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        token = leader_token(client, prefix)
        if token and leader_pid(token) == pid:
            return token
        time.sleep(0.02)
    raise AssertionError(f"beat {pid} did not become leader within {timeout}s "
                         f"(leader: {leader_token(client, prefix)})")


def more(recorder: Recorder, count: int, timeout: float = 15.0) -> None:
    recorder.drain()
    recorder.wait_for(len(recorder.messages) + count, timeout=timeout)


def slots(messages, entry: str) -> list[datetime]:
    return sorted(datetime.fromisoformat(m.slot) for m in messages if m.entry == entry)


def test_a_node_skewed_beyond_the_limit_never_leads(tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    client = state.client()
    env = beat_env(tmp_path, broker_url=broker.url_for(0), redis_url=state.url,
                   prefix=key_prefix, schedule={"tick": {"task": NOOP, "every": 1}},
                   settings={**FAST, "leaderbeat_max_clock_skew": MAX_SKEW})
    recorder = Recorder(broker.client())
    ahead = BeatProcess(env={**env, "LB_CLOCK_OFFSET": "10"}, log_path=tmp_path / "ahead.log")
    behind = BeatProcess(env={**env, "LB_CLOCK_OFFSET": "-10"}, log_path=tmp_path / "behind.log")
    with ahead, behind:
        # 10 s off, as measured against Redis TIME: +9.999 is as right as +10.001
        ahead.wait_for_log(r"clock is \+(?:9\.9\d\d|10\.\d+) s off Redis's clock.*refusing to lead",
                           timeout=20)
        behind.wait_for_log(r"clock is -(?:9\.9\d\d|10\.\d+) s off Redis's clock.*refusing to lead",
                            timeout=20)
        for _ in range(int(3 * TTL / 0.1)):  # alone for 3 ttl: nobody leads, nothing sent
            assert leader_token(client, key_prefix) is None
            time.sleep(0.1)
        assert recorder.drain() == []

        with BeatProcess(env=env, log_path=tmp_path / "normal.log") as normal:
            wait_for_leader_pid(client, key_prefix, normal.pid, timeout=20)
            recorder.wait_for(3, timeout=10)
            normal.kill()
        killed_at = time.monotonic()
        recorder.drain()
        sent_by_normal = len(recorder.messages)
        # The dead node's lease expires within a ttl; the skewed nodes still may not take it.
        while time.monotonic() - killed_at < TTL + 3 * POLL + 2:
            token = leader_token(client, key_prefix)
            assert token is None or leader_pid(token) == normal.pid, "a skewed node led"
            time.sleep(0.1)
        assert leader_token(client, key_prefix) is None
        assert recorder.drain() == [], "nothing is sent once the only sane node is gone"
        assert ahead.alive and behind.alive, "refusing to lead never stops beat"
        for beat in (ahead, behind):
            assert beat.log_text().count("refusing to lead") == 1, "logged once, not per poll"
            assert "elected leader" not in beat.log_text()
    assert sent_by_normal >= 3
    assert duplicates(recorder.messages) == []


def test_nodes_skewed_within_the_limit_hand_over_without_duplicates_or_phase_drift(
        tmp_path, make_redis_server, key_prefix):
    """A(+1.5 s) leads, is SIGKILLed, B(0) takes over 1.5 s "in the past"; then B is
    SIGTERMed and C(+1.5 s) takes over 1.5 s "in the future". Policy ``all``: every
    slot is sent exactly once and the interval entry keeps its phase throughout."""
    state, broker = make_redis_server(), make_redis_server()
    client = state.client()
    env = beat_env(tmp_path, broker_url=broker.url_for(0), redis_url=state.url,
                   prefix=key_prefix, schedule=SKEWED_SCHEDULE,
                   settings={**FAST, "leaderbeat_max_clock_skew": MAX_SKEW})
    recorder = Recorder(broker.client())

    def leads(beat: BeatProcess, previous: str | None, timeout: float) -> tuple[str, int]:
        token = wait_for_leader_pid(client, key_prefix, beat.pid, timeout=timeout)
        return token, int(token.split("|")[1])

    epochs, logs = hand_over_between_skewed_beats(env, tmp_path, recorder, leads)
    each_slot_once_on_one_grid(recorder.messages, epochs, logs)


def hand_over_between_skewed_beats(env: dict[str, str], tmp_path, recorder,
                                   leads) -> tuple[list[int], str]:
    """A (+1.5 s) leads and is SIGKILLed, B (0) takes over; B is SIGTERMed, C (+1.5 s)
    takes over; six more messages each time. ``leads(beat, previous, timeout)`` waits
    until ``beat`` holds the lease instead of ``previous`` and answers (holder, epoch).
    The three leaders' epochs and the beats' logs."""
    a = BeatProcess(env={**env, "LB_CLOCK_OFFSET": "1.5"}, log_path=tmp_path / "a.log")
    b = c = None
    try:
        holder_a, epoch_a = leads(a, None, 30)
        b = BeatProcess(env=env, log_path=tmp_path / "b.log")
        b.wait_for_log(r"beat: Starting", timeout=20)
        more(recorder, 6)
        a.kill()
        holder_b, epoch_b = leads(b, holder_a, TTL + 5)
        more(recorder, 6)
        c = BeatProcess(env={**env, "LB_CLOCK_OFFSET": "1.5"}, log_path=tmp_path / "c.log")
        c.wait_for_log(r"beat: Starting", timeout=20)
        time.sleep(1.0)  # C is polling as a standby
        assert b.term() == 0
        _, epoch_c = leads(c, holder_b, 5)
        more(recorder, 6)
        logs = "\n".join(p.log_text() for p in (a, b, c))
    finally:
        for p in (a, b, c):
            if p is not None:
                p.close()
    recorder.drain()
    return [epoch_a, epoch_b, epoch_c], logs


def each_slot_once_on_one_grid(messages, epochs: list[int], logs: str) -> None:
    """Every slot of :data:`SKEWED_SCHEDULE` sent once, none lost, the phase kept, and
    each leader of ``epochs`` sent some, in order, on the same grid."""
    assert duplicates(messages) == [], logs
    assert {int(m.epoch) for m in messages} == set(epochs), "three leaders sent"
    assert "refusing to lead" not in logs
    for entry, step in (("every-second", timedelta(seconds=1)), ("interval", INTERVAL)):
        times = slots(messages, entry)
        diffs = {b_ - a_ for a_, b_ in pairwise(times)}
        print(f"\n{entry}: {len(times)} slots {times[0]:%H:%M:%S.%f}..{times[-1]:%H:%M:%S.%f}, "
              f"gaps between consecutive slots: {sorted(d.total_seconds() for d in diffs)}")
        assert diffs == {step}, f"{entry}: a slot was lost or re-sent, or the phase moved"
        for epoch in epochs:  # each leader sent some, in order, on the same grid
            mine = [datetime.fromisoformat(m.slot) for m in messages
                    if m.entry == entry and int(m.epoch) == epoch]
            assert mine and mine == sorted(mine), (entry, epoch, mine)
            assert all((s - times[0]) % step == timedelta(0) for s in mine)
