"""Sparse schedules under Celery's and leaderbeat's defaults, the way users run beat.

Celery's ``beat_max_loop_interval`` is 300 s and leaderbeat's lease ttl 10 s, so a
leader whose next slot is 30 s away sleeps 30 s: its heartbeat must keep renewing
all along. Nothing here shortens any setting. Three beats, an entry every 30 s and a
minutely cron string, catch-up ``skip`` (so a slot wrongly taken for missed would be
dropped, not sent late), for a little over two minutes: on the Redis store and on the
PostgreSQL store (a database of the test's own) at the same time, each with a broker
Redis of its own, so the run's two minutes of waiting are spent once.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta

import pytest

from tests.support.beat import NOOP, BeatCluster, Recorder, beat_env, duplicates
from tests.support.postgres import HOST, PORT, USER, postgres_database
from tests.test_catchup_processes import PostgresView, RedisView

pytestmark = pytest.mark.slow

RUN = 130.0  # seconds: at least 3 interval slots and 2 minutely ones after the start margin
SCHEDULE = {"every-30s": {"task": NOOP, "every": 30},
            "minutely": {"task": NOOP, "cron": "* * * * *"}}


def test_three_beats_with_default_settings_send_every_sparse_slot_once_on_time_under_one_leader_on_either_store(
        tmp_path, make_redis_server, key_prefix):
    state, broker, pg_broker = make_redis_server(), make_redis_server(), make_redis_server()
    settings = {"leaderbeat_catchup": "skip"}
    (tmp_path / "redis").mkdir()
    (tmp_path / "postgresql").mkdir()
    env = beat_env(tmp_path / "redis", broker_url=broker.url, redis_url=state.url,
                   prefix=key_prefix, schedule=SCHEDULE, settings=settings)
    recorders = {"redis": Recorder(broker.client()), "postgresql": Recorder(pg_broker.client())}
    with postgres_database("lbsparse") as name:
        conninfo = f"host={HOST} port={PORT} user={USER} dbname={name}"
        pg_env = beat_env(tmp_path / "postgresql", broker_url=pg_broker.url, prefix=key_prefix,
                          schedule=SCHEDULE, settings={
                              **settings,
                              "leaderbeat_store_url": f"postgresql://{USER}@{HOST}:{PORT}/{name}"})
        with BeatCluster(3, env, tmp_path / "redis") as on_redis, \
                BeatCluster(3, pg_env, tmp_path / "postgresql") as on_postgresql:
            deadline = time.monotonic() + RUN
            while time.monotonic() < deadline:
                for recorder in recorders.values():
                    recorder.drain()  # every 50 ms: ``received`` is at most that after the send
                time.sleep(0.05)
            clusters = {"redis": on_redis, "postgresql": on_postgresql}
            for store, cluster in clusters.items():
                assert all(b.alive for b in cluster), (store, cluster.logs())
            logs = {store: cluster.logs() for store, cluster in clusters.items()}
        views = {"redis": RedisView(state.client(), key_prefix),
                 "postgresql": PostgresView(conninfo, key_prefix)}
        events = {store: [e["event"] for e in view.history()] for store, view in views.items()}
    for store in ("redis", "postgresql"):
        check(store, recorders[store].messages, events[store], logs[store])


def check(store: str, messages: list, events: list[str], logs: str) -> None:
    """Every sparse slot once, on its grid, on time, by the one leader of the run."""
    assert duplicates(messages) == [], store
    by_entry: dict[str, list[datetime]] = {}
    for m in messages:
        by_entry.setdefault(m.entry, []).append(datetime.fromisoformat(m.slot))
    interval, minutely = sorted(by_entry["every-30s"]), sorted(by_entry["minutely"])
    assert len(interval) >= 3 and len(minutely) >= 2, (store, interval, minutely)
    assert all(b - a == timedelta(seconds=30) for a, b in itertools.pairwise(interval)), store
    assert all(s.second == 0 and s.microsecond == 0 for s in minutely), store
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(minutely)), store
    lateness = sorted(m.lateness for m in messages)
    print(f"sparse run on {store}: {len(messages)} slots, lateness median "
          f"{lateness[len(lateness) // 2]:.3f} s, worst {lateness[-1]:.3f} s; history events "
          f"{sorted(set(events))}")
    assert lateness[-1] < 1.0, f"a sparse slot went out late ({store})"
    assert events.count("elected") == 1, f"leadership changed hands in steady state ({store})"
    assert "missed" not in events and "stalled" not in logs, store
    assert {m.epoch for m in messages} == {1}, store
