"""Redis unreachable: "pause" (default) sends nothing; "last-leader" keeps the leader going."""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta

import pytest

from tests.support.beat import NOOP, BeatCluster, Recorder, beat_env, duplicates, slots_by_entry

pytestmark = pytest.mark.slow

FAST = {"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 1,
        "leaderbeat_standby_poll": 0.5}


def start(tmp_path, state, broker, key_prefix, **settings):
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule={f"e{i}": {"task": NOOP, "every": 1} for i in range(2)},
                   settings={**FAST, **settings})
    return BeatCluster(2, env, tmp_path), Recorder(broker.client())


def slots_in(messages, start: datetime, end: datetime) -> list:
    return [m for m in messages if start <= datetime.fromisoformat(m.slot) <= end]


def through_outage(cluster, state, recorder, seconds: float,
                   during=lambda: None) -> tuple[datetime, datetime]:
    """Once slots flow, kill Redis for ``seconds`` and restart it (empty); ``during``
    runs after the restart. Returns the outage's (start, end); every beat must survive
    it and send again afterwards."""
    with cluster:
        recorder.wait_for(4, timeout=20)
        recorder.drain()
        began = datetime.now().astimezone()
        state.kill()
        until = time.monotonic() + seconds  # the outage itself is a span of time
        while time.monotonic() < until:  # drained often: each message's receipt time
            recorder.drain()               # says when it was sent, within 0.2 s
            time.sleep(0.2)
        recorder.drain()
        ended = datetime.now().astimezone()
        state.restart()
        during()
        recorder.wait_for(len(recorder.messages) + 4, timeout=20)
        assert all(b.alive for b in cluster)
    recorder.drain()
    return began, ended


def test_pause_policy_sends_nothing_while_redis_is_down(tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    cluster, recorder = start(tmp_path, state, broker, key_prefix)
    began, ended = through_outage(cluster, state, recorder, 4)
    # (slots *of* the outage may go out after it, under the catch-up policy)
    during = [m for m in recorder.messages
              if began.timestamp() + 0.5 <= m.received <= ended.timestamp()]
    assert during == [], "no slot may be sent while Redis cannot confirm a claim"
    assert duplicates(recorder.messages) == []


def test_last_leader_keeps_sending_through_an_outage_and_reconciles_without_duplicates(
        tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    cluster, recorder = start(tmp_path, state, broker, key_prefix,
                              leaderbeat_store_down_policy="last-leader",
                              leaderbeat_degraded_max_seconds=30)

    def reconciled() -> None:
        assert any("keeps sending" in b.log_text() for b in cluster)
        deadline = time.monotonic() + 15
        while not any("reconciling" in b.log_text() for b in cluster):
            assert time.monotonic() < deadline, "the last leader never reconciled"
            time.sleep(0.1)

    began, ended = through_outage(cluster, state, recorder, 4, during=reconciled)
    messages = recorder.messages
    assert duplicates(messages) == []
    # sent while Redis was down: received then (the slots of the outage alone could have
    # been sent after it)
    during = [m for m in messages
              if began.timestamp() + 1 <= m.received <= ended.timestamp() - 0.5]
    assert len({m.slot for m in during if m.entry == "e0"}) >= 2, "the leader went on sending"
    for entry, slots in slots_by_entry(messages).items():
        times = sorted(datetime.fromisoformat(s) for s in slots)
        assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(times)), (
            f"{entry}: the last leader keeps the phase and loses no slot: "
            f"{[t.strftime('%S.%f')[:6] for t in times]}")


def test_last_leader_stops_after_degraded_max_seconds(tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    cluster, recorder = start(tmp_path, state, broker, key_prefix,
                              leaderbeat_store_down_policy="last-leader",
                              leaderbeat_degraded_max_seconds=1.5)
    began, ended = through_outage(cluster, state, recorder, 6)
    late = slots_in(recorder.messages, began + timedelta(seconds=3.5), ended)
    assert late == [], "nothing may be sent once degraded_max_seconds has passed"
    assert duplicates(recorder.messages) == []
