"""Real prefork workers run what the claim script enqueued, each slot exactly once.

One beat and one plain Celery worker (the test app never imports
celery_leaderbeat in the worker) on one Redis server and database: the beat
takes the claim-and-enqueue path. The messages go to the default queue, to a
``task_routes`` queue and to a priority list, all under a ``global_keyprefix``,
and the worker acknowledges late.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from tests.support.beat import BeatProcess, beat_env
from tests.support.worker import WorkerProcess, executed, wait_until

RECORD = "tests.support.beatapp.record"


def history(client, prefix: str) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in client.xrange("{" + prefix + "}:history")]


@pytest.mark.slow
def test_prefork_workers_run_each_fast_path_slot_once_across_queues_priorities_and_prefix(
        tmp_path, make_redis_server, key_prefix):
    server, results = make_redis_server(), make_redis_server()
    schedule = {
        "plain": {"task": RECORD, "every": 1},
        "urgent": {"task": RECORD, "every": 1, "options": {"priority": 7}},
        "routed": {"task": RECORD, "every": 1, "options": {"queue": "other"}},
        "by-route": {"task": "tests.support.beatapp.sleepy", "every": 1,
                     "kwargs": {"seconds": 0}},
    }
    settings = {"broker_transport_options": {"global_keyprefix": "gk:"},
                "task_routes": {"tests.support.beatapp.sleepy": {"queue": "other"}},
                "task_acks_late": True}
    # No leaderbeat_redis_url: leaderbeat's state lives on the broker's Redis (the default).
    env = beat_env(tmp_path, broker_url=server.url_for(0), prefix=key_prefix,
                   schedule=schedule, settings=settings)
    env["LB_RECORD_URL"] = results.url
    rows = lambda: executed(results.client())
    with WorkerProcess(env, tmp_path / "worker.log", extra_args=["-Q", "celery,other"]) as worker:
        worker.wait_ready()
        with BeatProcess(env=env, log_path=tmp_path / "beat.log") as beat:
            wait_until(lambda: {r["entry"] for r in rows()} >= set(schedule)
                       and len(rows()) >= 12, 40, "every entry to run")
            beat.term()
            log = beat.log_text()
        sent = [e for e in history(server.client(), key_prefix) if e["event"] == "sent"]
        wait_until(lambda: len({r["id"] for r in rows()}) >= len(sent), 20,
                   "the worker to run every sent slot")
    assert "claims and enqueues each slot in one step" in log
    assert not re.search(r"unsent|Traceback", log), log[-2000:]
    # sleepy writes a start and an end row per run; record one row
    runs = Counter((r["entry"], r["slot"]) for r in rows() if r.get("phase") in (None, "start"))
    assert set(runs.values()) == {1}, runs  # no slot ran twice
    assert set(runs) == {(e["entry"], _iso(e["slot"])) for e in sent}  # and none was lost
    keys = {k.decode() for k in server.client().keys("*")}
    assert not {"celery", "other"} & keys  # kombu's prefix applied to every queue
    assert any(k.startswith("gk:_kombu.binding.") for k in keys)


def _iso(slot_ms: str) -> str:
    from celery_leaderbeat.timing.slots import from_ms

    return from_ms(int(slot_ms)).isoformat()


@pytest.mark.slow
def test_on_the_fast_path_a_killed_leader_costs_no_slot_and_standbys_rescue_within_rescue_after(
        tmp_path, make_redis_server, key_prefix):
    """The failover suite's SIGKILL test with state and broker on one Redis (fast path):
    the rescue hold-off must not delay a rescue once the leader is dead."""
    from datetime import datetime

    from tests.support.beat import duplicates
    from tests.test_failover import (
        POLL,
        RESCUE_AFTER,
        TTL,
        every,
        follow,
        gaps,
        kill_the_leader,
        leader_token,
        slot_times,
        start,
    )

    server = make_redis_server()
    client = server.client()
    cluster, recorder = start(tmp_path, (server, server), key_prefix, every(1.0, 3))
    with cluster:
        follow(recorder, 20, until=lambda: len(recorder.messages) >= 6)
        token, killed_at = kill_the_leader(client, key_prefix, cluster)
        follow(recorder, TTL + POLL + 2,
               until=lambda: leader_token(client, key_prefix) not in (None, token))
        follow(recorder, 4)
        logs = cluster.logs()
    messages = recorder.messages
    assert "claims and enqueues each slot in one step" in logs
    assert duplicates(messages) == []
    after_kill = [m for m in messages if datetime.fromisoformat(m.slot).timestamp() > killed_at]
    assert any(m.epoch == 0 for m in after_kill), "standbys rescued nothing"
    for entry, slots in slot_times(messages).items():
        assert gaps(slots, 1.0) == [], f"{entry} missed a slot across the SIGKILL"
    assert max(m.lateness for m in after_kill) <= RESCUE_AFTER + 1.0
