"""Operating it: every CLI action as a real subprocess against real beats and a real Redis
(step-down, pause and backfill, trigger and metrics on PostgreSQL and RabbitMQ too).

Leaderbeat's and Celery's defaults throughout (lease ttl 10 s, 300 s loop interval).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
import urllib.request
from datetime import datetime, timedelta

import pytest

from celery_leaderbeat.timing.slots import slot_id
from tests.support.beat import NOOP, BeatCluster, Recorder, beat_env, duplicates
from tests.test_cli import cli

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def events(env: dict, *args: str) -> list[dict]:
    done = cli(env, "history", "-n", "2000", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def follow(recorder: Recorder, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        recorder.drain()
        time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule={"tick": {"task": NOOP, "every": 1},
                             "rare": {"task": NOOP, "cron": "0 3 * * *"}})
    ports = [free_port() for _ in range(3)]
    with BeatCluster(3, env, tmp_path,
                     node_env=lambda i: {"LEADERBEAT_METRICS_PORT": str(ports[i])}) as beats:
        recorder = Recorder(broker.client())
        recorder.wait_for(3, timeout=30)
        yield env, beats, recorder, ports, state


@pytest.fixture(params=["redis", "postgres"])
def any_cluster(request, tmp_path, key_prefix):
    """The same three beats on either store; on PostgreSQL a cluster of the test's own and
    RabbitMQ (a queue of the test's own), with no Redis anywhere. The store's server is
    not yielded: tests that reach into it are the Redis store's own."""
    if request.param == "redis":
        env, beats, recorder, ports, _ = request.getfixturevalue("cluster")
        yield env, beats, recorder, ports
        return
    from tests.support.pg_beats import store_url
    from tests.support.pg_cluster import pg_cluster

    amqp = request.getfixturevalue("amqp_recorder")
    with pg_cluster() as server:
        env = beat_env(tmp_path, broker_url=amqp.url, prefix=key_prefix,
                       schedule={"tick": {"task": NOOP, "every": 1},
                                 "rare": {"task": NOOP, "cron": "0 3 * * *"}},
                       settings={"leaderbeat_store_url": store_url(server.port),
                                 "task_default_queue": amqp.queue})
        ports = [free_port() for _ in range(3)]
        with BeatCluster(3, env, tmp_path,
                         node_env=lambda i: {"LEADERBEAT_METRICS_PORT": str(ports[i])}) as beats:
            amqp.wait_for(3, timeout=40)
            yield env, beats, amqp, ports


def test_health_answers_for_the_deployment_and_for_this_node(cluster):
    env, beats, _, _, state = cluster
    deployment, node = cli(env, "health", "--json"), cli(env, "health", "--node", "--json")
    assert deployment.returncode == 0 and json.loads(deployment.stdout)["healthy"]
    assert node.returncode == 0, node.stdout + node.stderr
    assert "leads" in json.loads(node.stdout)["reason"] or "standby" in node.stdout
    token = state.client().get("{" + env["LB_PREFIX"] + "}:leader").decode()
    leader = next(b for b in beats if str(b.pid) == token.split("|")[0].split(":")[-2])
    leader.kill()  # during the failover: the dead leader's lease lives on for up to the ttl
    assert cli(env, "health").returncode == 0
    assert cli(env, "health", "--node").returncode == 0, "a standby on this host is healthy"
    for beat in beats:
        beat.kill()
    state.client().delete("{" + env["LB_PREFIX"] + "}:leader")  # as if its ttl had lapsed
    time.sleep(0.5)
    assert cli(env, "health").returncode == 1
    state.kill()
    down = cli(env, "health", "--node")
    assert down.returncode == 69 and "Redis unreachable" in down.stderr
    assert "Traceback" not in down.stderr


def test_step_down_hands_over_within_a_second_nothing_missed_nothing_twice(any_cluster):
    env, beats, recorder, _ = any_cluster
    follow(recorder, 2)
    done = cli(env, "step-down", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    print(f"step-down handover: {result['handover_ms']} ms "
          f"({result['released']} -> {result['new_leader']})")
    assert result["new_leader"] != result["released"]
    assert result["handover_ms"] < 1000
    follow(recorder, 4)
    assert duplicates(recorder.messages) == []
    ticks = sorted(datetime.fromisoformat(m.slot) for m in recorder.messages if m.entry == "tick")
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ticks)), "a slot missed"
    assert all(b.alive for b in beats)


def test_pause_skips_and_records_resume_does_not_replay_backfill_sends_the_gap_once(any_cluster):
    env, _, recorder, _ = any_cluster
    assert cli(env, "pause", "tick", "--note", "deploy 42").returncode == 0
    follow(recorder, 3.5)
    status = json.loads(cli(env, "status", "--json").stdout)
    tick_row = next(r for r in status["entries"] if r["entry"] == "tick")
    assert tick_row["paused"]["note"] == "deploy 42"
    assert cli(env, "resume", "tick").returncode == 0
    follow(recorder, 2.5)
    marks = {e["event"]: datetime.fromisoformat(e["time"]) for e in events(env, "--entry", "tick")
             if e["event"] in ("paused", "resumed")}
    paused_at, resumed_at = marks["paused"], marks["resumed"]
    ticks = [m for m in recorder.messages if m.entry == "tick"]
    # at most the slot in flight when the pause landed goes out during the pause
    during = [m for m in ticks
              if paused_at + timedelta(seconds=1) < datetime.fromisoformat(m.slot) < resumed_at]
    assert during == [], [m.slot for m in during]
    assert any(datetime.fromisoformat(m.slot) > resumed_at for m in ticks), "resume sends again"
    skipped = [e for e in events(env, "--entry", "tick")
               if e["event"] == "skipped" and e.get("detail") == "paused"]
    assert len(skipped) >= 2
    assert [e["event"] for e in events(env, "--entry", "tick")].count("paused") == 1

    gap_from = min(e["slot"] for e in skipped)
    gap_to = max(e["slot"] for e in skipped)
    first = cli(env, "backfill", "tick", "--from", gap_from, "--to", gap_to, "--yes", "--json")
    assert first.returncode == 0, first.stderr
    planned = json.loads(first.stdout)["to_send"]
    assert sorted(planned) == sorted(e["slot"] for e in skipped)
    follow(recorder, 2)
    backfilled = [m for m in recorder.messages if m.entry == "tick" and m.slot in planned]
    assert sorted(m.slot for m in backfilled) == sorted(planned)
    assert all(m.id == slot_id(env["LB_PREFIX"], "tick", datetime.fromisoformat(m.slot))
               for m in backfilled)
    again = json.loads(cli(env, "backfill", "tick", "--from", gap_from, "--to", gap_to,
                           "--yes", "--json").stdout)
    assert again["to_send"] == [], "a slot already sent is never sent again"
    assert duplicates(recorder.messages) == []


def test_trigger_sends_once_now_under_its_own_id_and_the_schedule_is_unchanged(any_cluster):
    env, _, recorder, _ = any_cluster
    done = cli(env, "trigger", "rare", "--note", "rerun report", "--json")
    assert done.returncode == 0, done.stderr
    follow(recorder, 2)
    rare = [m for m in recorder.messages if m.entry == "rare"]
    assert len(rare) == 1
    assert rare[0].id != slot_id(env["LB_PREFIX"], "rare", datetime.fromisoformat(rare[0].slot))
    assert [e.get("detail") for e in events(env, "--entry", "rare")
            if e["event"] == "triggered"] == ["rerun report"]
    status = json.loads(cli(env, "status", "--json").stdout)
    rare_row = next(r for r in status["entries"] if r["entry"] == "rare")
    assert datetime.fromisoformat(rare_row["next_due"]).hour == 3


def test_unknown_entries_bad_urls_and_unconfirmed_resets_get_one_line_and_their_own_code(
        cluster):
    env, beats, _, _, state = cluster
    unknown = cli(env, "pause", "nope")
    assert unknown.returncode == 65 and "no entry 'nope'" in unknown.stderr
    bad = cli({**env, "LB_REDIS_URL": "http://nowhere"}, "status")
    assert bad.returncode == 78 and "leaderbeat_redis_url" in bad.stderr
    refused = cli(env, "reset")
    assert refused.returncode == 64 and "--yes" in refused.stderr
    for done in (unknown, bad, refused):
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert state.client().exists("{" + env["LB_PREFIX"] + "}:slots")
    for beat in beats:  # stopped first: running beats would write their state again
        beat.term()
    done = cli(env, "reset", "--yes", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["deleted_keys"] >= 3
    assert list(state.client().scan_iter(match="{" + env["LB_PREFIX"] + "}:*")) == []


def test_metrics_are_served_by_every_beat_and_exactly_one_says_it_leads(any_cluster):
    _, _, _, ports = any_cluster
    scrapes = {}
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            scrapes[port] = reply.read().decode()
    leading = [p for p, text in scrapes.items() if "leaderbeat_is_leader 1.0" in text]
    assert len(leading) == 1, {p: t[:300] for p, t in scrapes.items()}
    leader = scrapes[leading[0]]
    print("\n".join(line for line in leader.splitlines()
                    if line.startswith("leaderbeat_") and "bucket" not in line))
    assert 'leaderbeat_slots_total{entry="tick",state="sent"}' in leader
    assert "leaderbeat_epoch 1.0" in leader
    assert "leaderbeat_lease_renew_seconds_count" in leader
    assert os.environ.get("LEADERBEAT_METRICS_PORT") is None
