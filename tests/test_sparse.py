"""Sparse schedules under Celery's and leaderbeat's defaults, the way users run beat.

Celery's ``beat_max_loop_interval`` is 300 s and leaderbeat's lease ttl 10 s, so a
leader whose next slot is 30 s away sleeps 30 s: its heartbeat must keep renewing
all along. Nothing here shortens any setting. Three beats, an entry every 30 s and a
minutely cron string, catch-up ``skip`` (so a slot wrongly taken for missed would be
dropped, not sent late), for a little over two minutes.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta

import pytest

from tests.support.beat import NOOP, BeatCluster, Recorder, beat_env, duplicates

pytestmark = pytest.mark.slow

RUN = 130.0  # seconds: at least 3 interval slots and 2 minutely ones after the start margin


def test_three_beats_with_default_settings_send_every_sparse_slot_once_on_time_under_one_leader(
        tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    schedule = {"every-30s": {"task": NOOP, "every": 30},
                "minutely": {"task": NOOP, "cron": "* * * * *"}}
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule=schedule, settings={"leaderbeat_catchup": "skip"})
    recorder = Recorder(broker.client())
    with BeatCluster(3, env, tmp_path) as cluster:
        deadline = time.monotonic() + RUN
        while time.monotonic() < deadline:
            recorder.drain()  # every 50 ms: ``received`` is at most that after the send
            time.sleep(0.05)
        assert all(b.alive for b in cluster), cluster.logs()
        logs = cluster.logs()
    messages = recorder.messages
    history = state.client().xrange("{" + key_prefix + "}:history")
    events = [fields[b"event"].decode() for _, fields in history]

    assert duplicates(messages) == []
    by_entry: dict[str, list[datetime]] = {}
    for m in messages:
        by_entry.setdefault(m.entry, []).append(datetime.fromisoformat(m.slot))
    interval, minutely = sorted(by_entry["every-30s"]), sorted(by_entry["minutely"])
    assert len(interval) >= 3 and len(minutely) >= 2, (interval, minutely)
    assert all(b - a == timedelta(seconds=30) for a, b in itertools.pairwise(interval))
    assert all(s.second == 0 and s.microsecond == 0 for s in minutely)
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(minutely))
    lateness = sorted(m.lateness for m in messages)
    print(f"sparse run: {len(messages)} slots, lateness median {lateness[len(lateness) // 2]:.3f}"
          f" s, worst {lateness[-1]:.3f} s; history events {sorted(set(events))}")
    assert lateness[-1] < 1.0, "a sparse slot went out late"
    assert events.count("elected") == 1, "leadership changed hands in steady state"
    assert "missed" not in events and "stalled" not in logs
    assert {m.epoch for m in messages} == {1}
