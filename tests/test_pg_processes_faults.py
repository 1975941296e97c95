"""Real ``celery beat`` processes on PostgreSQL and RabbitMQ through the server's own
failures: a leader frozen mid-burst, a streaming replica promoted (synchronous and
asynchronous replication), the beats behind PgBouncer. No Redis process anywhere.

Each test starts PostgreSQL clusters of its own (``tests/support/pg_cluster.py``) and
publishes to a RabbitMQ queue of its own, read back message by message. The beats run
with leaderbeat's and Celery's defaults (10 s lease, 2 s rescue, 300 s loop interval)
unless a test says which setting it changes and why.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import psycopg
import pytest

from celery_leaderbeat.config import Config
from celery_leaderbeat.store.postgres import lease_sql
from tests.support.amqp_recorder import AmqpRecorder
from tests.support.beat import NOOP, BeatCluster, beat_env, duplicates
from tests.support.pg_beats import (
    by_pid,
    first_holder,
    pid_of,
    queue_depth,
    recorded_unsent,
    slot_ms,
    store_url,
    unaccounted,
    wait_holder,
)
from tests.support.pg_cluster import Cluster as PgCluster
from tests.support.pg_cluster import pg_cluster, pgbouncer

# each test runs three beats and PostgreSQL clusters of its own: never beside another heavy test
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("heavy")]

DEFAULTS = Config.from_values({"store_url": "postgresql://x", "key_prefix": "p", "node_id": "n"})
TTL, POLL, RESCUE_AFTER = DEFAULTS.lease_ttl, DEFAULTS.standby_poll, DEFAULTS.rescue_after
ENTRIES = 5


def env_for(tmp_path, url: str, amqp_recorder: AmqpRecorder, key_prefix: str,
            schedule: dict | None = None, **settings) -> dict[str, str]:
    schedule = schedule or {f"e{i}": {"task": NOOP, "every": 1} for i in range(ENTRIES)}
    return beat_env(tmp_path, broker_url=amqp_recorder.url, prefix=key_prefix, schedule=schedule,
                    settings={"leaderbeat_store_url": url,
                              "task_default_queue": amqp_recorder.queue, **settings})


# -- a leader frozen mid-burst --------------------------------------------------------------

BURST = 2000


def test_a_leader_paused_mid_burst_of_2000_resigns_on_waking_and_no_slot_goes_twice(
        tmp_path, amqp_recorder, key_prefix):
    """SIGSTOP once about 200 of the 2,000 slots due together are at the broker, past the
    ttl; SIGCONT. Every slot of every burst is sent once or recorded ``unsent``/``missed``."""
    schedule = {f"e{i:04d}": {"task": NOOP, "every": 5} for i in range(BURST)}
    with pg_cluster() as server:
        # 2,000 'sent' events per burst would prune the default 10,000-row history within
        # 25 s, the records this test reads among them
        env = env_for(tmp_path, store_url(server.port), amqp_recorder, key_prefix, schedule,
                      leaderbeat_history_length=100_000)
        with BeatCluster(3, env, tmp_path) as beats:
            node = wait_holder(server.conninfo, key_prefix, timeout=40)
            leader = by_pid(beats, pid_of(node))
            deadline = time.monotonic() + 40
            while queue_depth(amqp_recorder) < 200:
                assert time.monotonic() < deadline, "the leader never started its burst"
                time.sleep(0.002)
            leader.stop()
            paused_at, at_pause = time.monotonic(), queue_depth(amqp_recorder)
            assert at_pause < BURST - 100, f"the pause landed after {at_pause} publishes"
            # the test is about what the paused leader does on waking, not how fast a
            # standby takes over (the failover tests bound that): a standby rescuing the
            # frozen burst on a loaded machine may take well past the ttl
            wait_holder(server.conninfo, key_prefix, other_than=node, timeout=TTL + POLL + 20)
            time.sleep(max(0.0, TTL + 1.0 - (time.monotonic() - paused_at)))
            since = len(leader.log_text())
            leader.cont()
            leader.wait_for_log(r"steps down", timeout=10, since=since)
            amqp_recorder.watch(6)
            end_ms = round(time.time() * 1000)
            alive = [b.alive for b in beats]
            messages = amqp_recorder.drain_all()
            recorded = recorded_unsent(server.conninfo, key_prefix)
            logs = beats.logs()
    first = min(slot_ms(m.slot) for m in messages)
    in_burst = {m.entry for m in messages if slot_ms(m.slot) == first}
    print(f"\npaused after {at_pause} publishes; {len(in_burst)} of {BURST} slots of that "
          f"burst sent, {len(recorded)} slots recorded unsent or missed, {len(messages)} "
          "messages in all")
    assert duplicates(messages) == []
    assert alive == [True] * 3, "a resumed leader becomes a standby, it does not exit"
    assert unaccounted(messages, recorded, schedule, 5000, first, end_ms - 5000) == [], logs[-5000:]
    assert len(in_burst) >= BURST - 100, "more than one chunk of the paused burst was lost"


# -- a streaming replica promoted -----------------------------------------------------------


def _wait_sync(primary: PgCluster, names: str) -> None:
    with psycopg.connect(primary.conninfo, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while not conn.execute("SELECT count(*) FROM pg_stat_replication"
                               " WHERE sync_state IN ('sync', 'quorum')").fetchone()[0]:
            assert time.monotonic() < deadline, "the replica never became synchronous"
            time.sleep(0.05)


def _cut_replication(replica: PgCluster) -> None:
    """The replica stops receiving (as a lagging one would lack the newest commits)."""
    with psycopg.connect(replica.conninfo, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()[0]:
            assert time.monotonic() < deadline, "the replica kept receiving"
            time.sleep(0.05)


def sent_after(messages, since_ms: int) -> int:
    """How many entries had a slot after ``since_ms`` sent: the beats work on the promoted
    server (a URL naming both servers, libpq choosing the writable one)."""
    return len({m.entry for m in messages if slot_ms(m.slot) > since_ms})


def _identity(cluster: PgCluster) -> tuple[int, int]:
    with psycopg.connect(cluster.conninfo) as conn:
        return lease_sql.server_identity(conn)


class Promoted(NamedTuple):
    messages: list[Any]
    recorded: Any  # the slots the promoted server's history records as not sent
    promoted_ms: int
    end_ms: int
    before: tuple[int, int]  # (system identifier, timeline) of the primary
    after: tuple[int, int]  # the same of the promoted replica
    logs: str
    led: str  # the node that led on the primary
    first: str  # the first node to lead on the promoted server


def _promote_under_beats(tmp_path, amqp_recorder, key_prefix, primary: PgCluster,
                         replica: PgCluster, *, lag: float = 0.0,
                         leader_away: float = 0.0) -> Promoted:
    """Three beats on ``primary`` (a URL naming both servers, libpq choosing the writable
    one); the primary stopped (immediate: a crash) and the replica promoted. ``lag``: the
    replica stops receiving that many seconds before. ``leader_away``: the leader is
    SIGSTOPped before the primary stops and woken that many seconds after the promotion
    (the standbys meet the promoted server first)."""
    url = store_url(primary.port, replica.port, target_session_attrs="read-write")
    env = env_for(tmp_path, url, amqp_recorder, key_prefix)
    with BeatCluster(3, env, tmp_path) as beats:
        wait_holder(primary.conninfo, key_prefix, timeout=40)
        amqp_recorder.wait_for(3 * ENTRIES, timeout=40)
        before = _identity(primary)
        if lag:
            _cut_replication(replica)
            amqp_recorder.watch(lag)
        led = wait_holder(primary.conninfo, key_prefix)
        if leader_away:
            by_pid(beats, pid_of(led)).stop()
        primary.stop("immediate")
        replica.promote()
        promoted_ms = round(time.time() * 1000)
        first = None
        if leader_away:  # a standby that takes the lease meanwhile is what callers look for
            first = first_holder(replica.conninfo, key_prefix, timeout=leader_away)
            by_pid(beats, pid_of(led)).cont()
        # (with a lag past the ttl the lease the replica holds has expired: this is the
        # first node to take it on the promoted server)
        first = first or wait_holder(replica.conninfo, key_prefix, timeout=TTL + 10)
        amqp_recorder.watch(TTL + 5)
        end_ms = round(time.time() * 1000)
        messages = amqp_recorder.drain_all()
        recorded = recorded_unsent(replica.conninfo, key_prefix)
        after = _identity(replica)
        alive = len(beats.alive)
        logs = beats.logs()
    assert alive == 3, logs[-5000:]
    return Promoted(messages, recorded, promoted_ms, end_ms, before, after, logs, led, first)


@pytest.mark.parametrize("names", ["*", "ANY 1 (*)"])
def test_a_synchronous_replica_promoted_under_real_beats_no_slot_twice_none_unrecorded(
        tmp_path, amqp_recorder, key_prefix, names):
    with pg_cluster() as primary, pg_cluster(standby_of=primary) as replica:
        _wait_sync(primary, names)
        messages, recorded, promoted_ms, end_ms, before, after, logs, *_ = (
            _promote_under_beats(tmp_path, amqp_recorder, key_prefix, primary, replica))
    first = min(slot_ms(m.slot) for m in messages)
    assert after[0] == before[0] and after[1] > before[1]  # the same data, a new timeline
    assert duplicates(messages) == [], logs[-5000:]
    assert unaccounted(messages, recorded, [f"e{i}" for i in range(ENTRIES)], 1000, first,
                       end_ms - 3000) == [], logs[-5000:]
    assert sent_after(messages, promoted_ms + round((TTL + 2) * 1000)) == ENTRIES, logs[-5000:]


def test_an_asynchronous_replica_that_lacks_commits_is_detected_and_the_node_that_led_goes_first(
        tmp_path, amqp_recorder, key_prefix):
    """PostgreSQL's side of Redis restored from an older snapshot under live beats: the
    replica stopped receiving a lease ttl and 2 s before the promotion, so it lacks the
    commits since and the lease it holds has expired: every beat may take it. The leader
    is paused over the promotion and woken 2 s after it, so the standbys meet the
    promoted server first (a beat stalled by a swap or a long GC): they see the server
    went back, hold back for the grace (5.3 s), and the node that led takes the lease
    when it wakes and carries on from what it sent: no slot twice, every slot from the
    failover on sent or recorded."""
    with pg_cluster() as primary, pg_cluster(standby_of=primary) as replica:
        run = _promote_under_beats(tmp_path, amqp_recorder, key_prefix, primary, replica,
                                   lag=TTL + 2, leader_away=2.0)
    messages, recorded, logs = run.messages, run.recorded, run.logs
    assert run.after[0] == run.before[0] and run.after[1] > run.before[1]  # a new timeline
    assert "holds older state than this node has seen" in logs, logs[-5000:]
    assert f"on timeline {run.after[1]}" in logs, "the loss names the promoted server's timeline"
    assert run.first == run.led, (f"{run.first} led first, not {run.led}", logs[-5000:])
    assert duplicates(messages) == [], logs[-5000:]
    # the slots the lost commits had settled may be neither sent again nor recorded (their
    # records went with the commits); from the failover on, every one is either
    after_loss = run.promoted_ms + round((TTL + 2) * 1000)
    assert unaccounted(messages, recorded, [f"e{i}" for i in range(ENTRIES)], 1000,
                       after_loss, run.end_ms - 3000) == [], logs[-5000:]
    assert sent_after(messages, after_loss) == ENTRIES, logs[-5000:]


# -- behind PgBouncer ------------------------------------------------------------------------


def test_beats_behind_pgbouncer_in_transaction_mode_lead_and_a_standby_rescues_after_sigkill(
        tmp_path, amqp_recorder, key_prefix):
    with pg_cluster() as server, pgbouncer(server.port) as port:
        env = env_for(tmp_path, store_url(port), amqp_recorder, key_prefix)
        with BeatCluster(3, env, tmp_path) as beats:
            node = wait_holder(server.conninfo, key_prefix, timeout=40)
            amqp_recorder.wait_for(3 * ENTRIES, timeout=40)
            killed_at = time.time()
            by_pid(beats, pid_of(node)).kill()
            after = amqp_recorder.watch(TTL + 6)
            new = wait_holder(server.conninfo, key_prefix, other_than=node, timeout=10)
            amqp_recorder.watch(3)
            messages = amqp_recorder.drain_all()
            logs = beats.logs()
    assert new != node
    assert duplicates(messages) == [], logs[-5000:]
    due_after_kill = [m for m in after if slot_ms(m.slot) > killed_at * 1000]
    assert due_after_kill, logs[-5000:]
    worst = max(m.lateness for m in due_after_kill)
    print(f"\nbehind PgBouncer: worst lateness of a slot due after the SIGKILL {worst:.2f} s")
    # rescue_after plus about a second, and the margin test_pg_processes.py gives a loaded
    # machine
    assert worst <= RESCUE_AFTER + 1 + 2, (worst, logs[-5000:])
    assert "rescued" in logs
