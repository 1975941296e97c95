"""Real ``celery beat`` processes on PostgreSQL and RabbitMQ alone: no Redis process anywhere.

Each test starts a PostgreSQL cluster of its own (``tests/support/pg_cluster.py``, so it
may restart it) and publishes to a RabbitMQ queue of its own, read back message by
message (every copy: a slot sent twice shows as two). The beats run with leaderbeat's
and Celery's defaults (10 s lease, 2 s rescue, 300 s loop interval): the way users run it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from celery_leaderbeat.config import Config
from celery_leaderbeat.ops.cluster import Cluster
from tests.support.amqp_recorder import AmqpRecorder
from tests.support.beat import NOOP, BeatCluster, BeatProcess, beat_env, duplicates, slots_by_entry
from tests.support.beatapp import make_app
from tests.support.pg_cluster import Cluster as PgCluster
from tests.support.pg_cluster import pg_cluster

# each test runs three beats and a PostgreSQL cluster of its own: never beside another heavy test
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("heavy")]

DEFAULTS = Config.from_values({"store_url": "postgresql://x", "key_prefix": "p", "node_id": "n"})
TTL, RESCUE_AFTER = DEFAULTS.lease_ttl, DEFAULTS.rescue_after
ENTRIES = 5


@pytest.fixture
def server() -> Iterator[PgCluster]:
    """A PostgreSQL cluster of this test's own (restartable)."""
    with pg_cluster() as cluster:
        yield cluster


def url_of(cluster: PgCluster) -> str:
    return f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres?connect_timeout=3"


def env_for(tmp_path, cluster, amqp_recorder: AmqpRecorder, key_prefix: str) -> dict[str, str]:
    schedule = {f"e{i}": {"task": NOOP, "every": 1} for i in range(ENTRIES)}
    return beat_env(tmp_path, broker_url=amqp_recorder.url,
                    prefix=key_prefix, schedule=schedule,
                    settings={"leaderbeat_store_url": url_of(cluster),
                              "task_default_queue": amqp_recorder.queue})


def watcher(env: dict[str, str]) -> Cluster:
    """The CLI's view of the beats' store (what ``celery leaderbeat status`` reads)."""
    cluster = Cluster(make_app(env))
    assert cluster.config.redis_url == "", "no Redis is configured anywhere"
    return cluster


def leader_pid(view: Cluster, *, other_than: str | None = None, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            leader = view.leader()
        except Exception:  # noqa: BLE001 - the server restarting: ask again
            leader = None
        if leader and leader["node"] != other_than:
            return int(leader["node"].split(":")[-2])
        time.sleep(0.05)
    raise AssertionError(f"no leader (other than {other_than}) within {timeout} s")


def gaps(messages) -> dict[str, list[str]]:
    """Per entry, the slots missing between its first and its last (none expected)."""
    out = {}
    for entry, slots in slots_by_entry(messages).items():
        seconds = sorted({int(datetime.fromisoformat(str(s)).timestamp()) for s in slots})
        missing = sorted(set(range(seconds[0], seconds[-1] + 1)) - set(seconds))
        if missing:
            out[str(entry)] = [datetime.fromtimestamp(m).isoformat() for m in missing]
    return out


def beat_pid(beats: BeatCluster, pid: int):
    return next(b for b in beats if b.pid == pid)


def test_three_beats_on_postgresql_one_leads_and_every_slot_goes_out_once(
        tmp_path, server, amqp_recorder, key_prefix):
    env = env_for(tmp_path, server, amqp_recorder, key_prefix)
    view = watcher(env)
    with BeatCluster(3, env, tmp_path) as beats:
        leader = leader_pid(view)
        amqp_recorder.wait_for(3 * ENTRIES, timeout=40)
        amqp_recorder.watch(8)
        roles = {row["node"]: row["role"] for row in view.nodes()}
        messages = amqp_recorder.drain_all()
        logs = beats.logs()
    assert duplicates(messages) == [], logs
    assert gaps(messages) == {}, logs
    assert sorted(roles.values()) == ["leader", "standby", "standby"], roles
    assert {m.entry for m in messages} == {f"e{i}" for i in range(ENTRIES)}
    assert leader in {b.pid for b in beats}
    assert all(int(node.split(":")[-2]) != leader for node, role in roles.items()
               if role == "standby")
    assert "Redis" not in "".join(line for line in logs.splitlines() if "ERROR" in line)


def test_sigkill_of_the_leader_a_standby_rescues_within_rescue_after_and_another_leads(
        tmp_path, server, amqp_recorder, key_prefix):
    env = env_for(tmp_path, server, amqp_recorder, key_prefix)
    view = watcher(env)
    with BeatCluster(3, env, tmp_path) as beats:
        old = leader_pid(view)
        old_node = view.leader()["node"]
        amqp_recorder.wait_for(3 * ENTRIES, timeout=40)
        killed_at = time.time()
        beat_pid(beats, old).kill()
        after = amqp_recorder.watch(TTL + 6)
        new = leader_pid(view, other_than=old_node)
        amqp_recorder.watch(3)
        messages = amqp_recorder.drain_all()
        logs = beats.logs()
    assert new != old
    assert duplicates(messages) == [], logs
    assert gaps(messages) == {}, logs
    due_after_kill = [m for m in after
                      if datetime.fromisoformat(str(m.slot)).timestamp() > killed_at]
    assert due_after_kill, logs
    # rescue_after plus about a second, and a generous margin for a loaded machine
    worst = max(m.lateness for m in due_after_kill)
    print(f"worst lateness of a slot due after the SIGKILL: {worst:.2f} s")  # shown with -s
    assert worst <= RESCUE_AFTER + 1 + 2, (worst, logs)
    assert "rescued" in logs


def test_sigterm_hands_over_with_no_slot_twice_and_none_missed(
        tmp_path, server, amqp_recorder, key_prefix):
    env = env_for(tmp_path, server, amqp_recorder, key_prefix)
    view = watcher(env)
    with BeatCluster(3, env, tmp_path) as beats:
        old = leader_pid(view)
        old_node = view.leader()["node"]
        amqp_recorder.wait_for(3 * ENTRIES, timeout=40)
        assert beat_pid(beats, old).term() == 0
        new = leader_pid(view, other_than=old_node, timeout=TTL)
        amqp_recorder.watch(5)
        messages = amqp_recorder.drain_all()
        logs = beats.logs()
    assert new != old
    assert duplicates(messages) == [], logs
    assert gaps(messages) == {}, logs


def test_postgresql_restarted_under_running_beats_they_go_on_with_no_slot_twice(
        tmp_path, server, amqp_recorder, key_prefix):
    env = env_for(tmp_path, server, amqp_recorder, key_prefix)
    view = watcher(env)
    with BeatCluster(3, env, tmp_path) as beats:
        leader_pid(view)
        amqp_recorder.wait_for(3 * ENTRIES, timeout=40)
        server.restart()
        restarted_at = time.time()
        amqp_recorder.watch(TTL + 5)
        messages = amqp_recorder.drain_all()
        alive = len(beats.alive)
        logs = beats.logs()
    assert alive == 3, logs
    assert duplicates(messages) == [], logs
    assert "Redis at" not in logs, "an outage of PostgreSQL is named as such"
    late = [m for m in messages if datetime.fromisoformat(str(m.slot)).timestamp() > restarted_at + 3]
    assert {m.entry for m in late} == {f"e{i}" for i in range(ENTRIES)}, logs


def test_last_leader_on_postgresql_keeps_sending_through_an_outage_and_reconciles(
        tmp_path, server, amqp_recorder, key_prefix):
    """``store_down_policy = "last-leader"``: the server stopped for 5 s under two beats
    (default ttl and intervals); the leader goes on sending from its schedule, says so,
    and once the server answers records what it sent. No slot twice, none lost."""
    env = env_for(tmp_path, server, amqp_recorder, key_prefix)
    env["LB_SETTINGS"] = json.dumps({**json.loads(env["LB_SETTINGS"]),
                                     "leaderbeat_store_down_policy": "last-leader"})
    view = watcher(env)
    with BeatCluster(2, env, tmp_path) as beats:
        leader = beat_pid(beats, leader_pid(view))
        amqp_recorder.wait_for(2 * ENTRIES, timeout=40)
        since = len(leader.log_text())
        began = time.time()
        server.stop()
        amqp_recorder.watch(5)  # drained as it goes: each message's receipt time is kept
        ended = time.time()
        server.start()
        leader.wait_for_log(r"reconciling \d+ slot\(s\)", timeout=20, since=since)
        amqp_recorder.watch(3)
        messages = amqp_recorder.drain_all()
        alive = len(beats.alive)
        logs = beats.logs()
    assert alive == 2, logs
    assert "keeps sending" in leader.log_text()[since:], logs
    assert duplicates(messages) == [], logs
    during = {m.slot for m in messages if m.entry == "e0" and began + 1 <= m.received <= ended}
    assert len(during) >= 3, f"the leader went on sending while the server was down: {during}"
    assert gaps(messages) == {}, logs


def test_runtime_entries_on_postgresql_are_rescued_after_a_sigkill_like_static_ones(
        tmp_path, server, amqp_recorder, key_prefix):
    """Run-time entries saved with the ``Entry`` API into the PostgreSQL store while three
    beats run; the leader SIGKILLed: a standby rescues their slots, and a one-off due
    0.3 s after the kill, within ``rescue_after`` + 1 s, as it does ``beat_schedule``'s."""
    from datetime import timezone

    from celery import Celery

    from celery_leaderbeat import Entry
    from tests.support.pg_beats import holder, pid_of, wait_holder

    env = env_for(tmp_path, server, amqp_recorder, key_prefix)
    app = Celery("api")
    app.conf.update(leaderbeat_store_url=url_of(server), leaderbeat_key_prefix=key_prefix,
                    timezone="UTC")
    within = RESCUE_AFTER + 1.0
    with BeatCluster(3, env, tmp_path) as beats:
        node = wait_holder(server.conninfo, key_prefix, timeout=40)
        for name in ("d0", "d1"):
            Entry(name, NOOP, 1).save(app)
        deadline = time.monotonic() + 20
        while len({m.slot for m in amqp_recorder.drain_all() if m.entry == "d1"}) < 3:
            assert time.monotonic() < deadline, "the run-time entries never went out"
            time.sleep(0.05)
        once_at = datetime.fromtimestamp(time.time() + 1.3, timezone.utc)
        Entry("once", NOOP, at=once_at).save(app)
        time.sleep(1.0)  # every beat has taken the one-off in
        killed_at = time.time()
        beat_pid(beats, pid_of(node)).kill()
        deadline = time.monotonic() + TTL + 10
        while (holder(server.conninfo, key_prefix) or (node,))[0] == node:
            assert time.monotonic() < deadline, "no standby took the lease over"
            amqp_recorder.drain()  # as they arrive: each message's receipt time is kept
            time.sleep(0.02)
        amqp_recorder.watch(4)  # the new leader's own slots
        messages = amqp_recorder.drain_all()
        logs = beats.logs()
    assert duplicates(messages) == [], logs
    after_kill = [m for m in messages if datetime.fromisoformat(str(m.slot)).timestamp()
                  > killed_at]
    for name in ("d0", "d1"):
        late = sorted(round(m.lateness, 2) for m in after_kill if m.entry == name)
        assert late and late[-1] <= within, (name, late[-5:], logs[-3000:])
        assert any(m.epoch == 0 for m in after_kill if m.entry == name), \
            f"no standby rescued {name} while nobody led"
    assert gaps([m for m in messages if m.entry in ("d0", "d1")]) == {}, logs
    once = [m for m in messages if m.entry == "once"]
    assert len(once) == 1 and once[0].lateness <= within, [(m.lateness, m.epoch) for m in once]


def test_a_beat_whose_clock_is_off_postgresqls_beyond_the_limit_never_leads(
        tmp_path, server, amqp_recorder, key_prefix):
    """Two beats 10 s ahead of and behind the server's clock (``LB_CLOCK_OFFSET``) with
    ``max_clock_skew`` 2 s: each says once that it refuses to lead, nobody leads and
    nothing is sent; a beat with the right clock leads, and once it is killed neither
    skewed beat takes the lease. Lease ttl 3 s (not 10) so that the three ttls the test
    watches take 9 s."""
    from tests.support.pg_beats import holder, pid_of, wait_holder

    env = beat_env(tmp_path, broker_url=amqp_recorder.url, prefix=key_prefix,
                   schedule={"tick": {"task": NOOP, "every": 1}},
                   settings={"leaderbeat_store_url": url_of(server),
                             "task_default_queue": amqp_recorder.queue,
                             "leaderbeat_lease_ttl": 3.0, "leaderbeat_renew_interval": 1.0,
                             "leaderbeat_standby_poll": 0.5, "leaderbeat_max_clock_skew": 2.0})
    ahead = BeatProcess(env={**env, "LB_CLOCK_OFFSET": "10"}, log_path=tmp_path / "ahead.log")
    behind = BeatProcess(env={**env, "LB_CLOCK_OFFSET": "-10"},
                         log_path=tmp_path / "behind.log")
    with ahead, behind:
        for beat, sign in ((ahead, r"\+"), (behind, "-")):
            beat.wait_for_log(sign + r"(?:9\.9\d\d|10\.\d+) s off PostgreSQL's clock.*refusing "
                              "to lead", timeout=30)
        for _ in range(90):  # three ttls alone: nobody leads, nothing is sent
            assert holder(server.conninfo, key_prefix) is None
            time.sleep(0.1)
        assert amqp_recorder.drain() == []
        with BeatProcess(env=env, log_path=tmp_path / "right.log") as right:
            assert pid_of(wait_holder(server.conninfo, key_prefix, timeout=30)) == right.pid
            amqp_recorder.wait_for(3, timeout=10)
            right.kill()
        killed_at = time.monotonic()
        sent = len(amqp_recorder.drain_all())
        while time.monotonic() - killed_at < 3.0 + 3 * 0.5 + 2:
            held = holder(server.conninfo, key_prefix)
            assert held is None or pid_of(held[0]) == right.pid, "a skewed beat led"
            time.sleep(0.1)
        assert holder(server.conninfo, key_prefix) is None
        assert amqp_recorder.drain() == [], "nothing is sent once the only sane beat is gone"
        assert ahead.alive and behind.alive, "refusing to lead never stops beat"
        for beat in (ahead, behind):
            assert beat.log_text().count("refusing to lead") == 1, "said once, not per poll"
    assert sent >= 3
    assert duplicates(amqp_recorder.messages) == []


def test_an_edit_on_postgresql_is_in_force_within_a_second_of_the_save_anchored_at_it(
        tmp_path, server, amqp_recorder, key_prefix):
    """Run-time entries saved into the PostgreSQL store while three beats run: an interval
    edited and an entry enabled are in force within a second of the save on the leader,
    counted from the save (the server's clock), and the old definition never runs on."""
    import itertools
    from datetime import timedelta

    from celery import Celery

    from celery_leaderbeat import Entry
    from tests.support.pg_beats import wait_holder
    from tests.test_failover import follow

    env = env_for(tmp_path, server, amqp_recorder, key_prefix)
    app = Celery("api")
    app.conf.update(leaderbeat_store_url=url_of(server), leaderbeat_key_prefix=key_prefix,
                    timezone="UTC")

    def slots_of(name: str, **kwargs) -> list[datetime]:
        return sorted(datetime.fromisoformat(str(m.slot)) for m in amqp_recorder.messages
                      if m.entry == name and all(m.kwargs.get(k) == v
                                                 for k, v in kwargs.items()))

    with BeatCluster(3, env, tmp_path) as beats:
        wait_holder(server.conninfo, key_prefix, timeout=40)
        Entry("edited", NOOP, 5, kwargs={"v": 1}).save(app)
        Entry("toggled", NOOP, 2, enabled=False).save(app)
        follow(amqp_recorder, 20, until=lambda: len(slots_of("e0")) >= 4 and slots_of("edited"))
        edit = Entry("edited", NOOP, 1.5, kwargs={"v": 2})
        edit.save(app)
        enable = Entry("toggled", NOOP, 2)
        enable.save(app)
        follow(amqp_recorder, 6)
        logs = beats.logs()
    messages = amqp_recorder.messages
    assert duplicates(messages) == [], logs[-3000:]
    assert edit.anchor is not None and enable.anchor is not None
    v2 = slots_of("edited", v=2)
    assert v2, f"the edited definition never ran: {logs[-3000:]}"
    assert v2[0] == edit.anchor + timedelta(seconds=1.5), (v2[0], edit.anchor)
    assert all(b - a == timedelta(seconds=1.5) for a, b in itertools.pairwise(v2))
    first = next(m for m in messages if m.entry == "edited" and m.kwargs.get("v") == 2
                 and datetime.fromisoformat(str(m.slot)) == v2[0])
    assert first.lateness <= 1.0, first.lateness
    toggled = slots_of("toggled")
    assert toggled and toggled[0] == enable.anchor + timedelta(seconds=2), (toggled, enable.anchor)
    assert [s for s in slots_of("edited", v=1) if s > edit.anchor] == [], \
        "the old definition ran on"


def test_beats_skewed_within_the_limit_hand_over_on_postgresql_each_slot_once_on_one_grid(
        tmp_path, server, amqp_recorder, key_prefix):
    """As on Redis: A (+1.5 s) leads and is SIGKILLed, B (0) takes over 1.5 s "in the past";
    B is SIGTERMed and C (+1.5 s) takes over 1.5 s "in the future", ``max_clock_skew`` 2 s
    judged against PostgreSQL's clock. Policy ``all``: every slot is sent once and the
    interval keeps its phase. Lease ttl 3 s (not 10), as on Redis: the SIGKILL's handover
    takes a ttl."""
    from tests.support.pg_beats import holder, pid_of, wait_holder
    from tests.test_clock_skew import (
        FAST,
        MAX_SKEW,
        SKEWED_SCHEDULE,
        each_slot_once_on_one_grid,
        hand_over_between_skewed_beats,
    )

    env = beat_env(tmp_path, broker_url=amqp_recorder.url, prefix=key_prefix,
                   schedule=SKEWED_SCHEDULE,
                   settings={"leaderbeat_store_url": url_of(server),
                             "task_default_queue": amqp_recorder.queue, **FAST,
                             "leaderbeat_max_clock_skew": MAX_SKEW})

    def leads(beat: BeatProcess, other_than: str | None, timeout: float) -> tuple[str, int]:
        node = wait_holder(server.conninfo, key_prefix, other_than=other_than, timeout=timeout)
        held = holder(server.conninfo, key_prefix)
        assert pid_of(node) == beat.pid and held is not None and held[0] == node
        return held

    epochs, logs = hand_over_between_skewed_beats(env, tmp_path, amqp_recorder, leads)
    each_slot_once_on_one_grid(amqp_recorder.messages, epochs, logs)
