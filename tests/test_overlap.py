"""Overlap policies kept by the worker guard, with real prefork workers.

Two ``celery worker -c1`` processes, ``task_acks_late`` and a prefetch of one, so a
slot due while one worker runs the entry is delivered to the other worker, whose
guard decides. Slots are published as beat publishes them (deterministic task id,
leaderbeat headers, ``leaderbeat_overlap``) every 0.5 s, for a task that runs 2.5
times that: a few seconds of schedule per test, short on purpose. Real Redis for
leaderbeat's state, a second as the broker, a third for what the tasks record.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.timing.slots import slot_id
from tests.support.beatapp import make_app
from tests.support.overlap_tasks import overlaps, spans
from tests.support.worker import WorkerProcess, wait_until
from tests.test_guard import guarded_env, history

pytestmark = pytest.mark.slow

TICKING = "tests.support.overlap_tasks.ticking"
INTERVAL = 0.5  # seconds between slots: short on purpose, the task runs 2.5 times it
RUNS_FOR = 2.5 * INTERVAL
START = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
WORKER_ARGS = ["-I", "tests.support.overlap_tasks"]


def slot_at(i: int) -> datetime:
    return START + timedelta(seconds=INTERVAL * i)


def publish(app, prefix: str, entry: str, policy: str, i: int, seconds: float = RUNS_FOR,
            **options) -> str:
    """Publish slot ``i`` of ``entry`` as beat does: its task id, headers, overlap."""
    slot = slot_at(i)
    task_id = slot_id(prefix, entry, slot)
    app.send_task(TICKING, kwargs={"seconds": seconds}, task_id=task_id, headers={
        "leaderbeat_slot": slot.isoformat(), "leaderbeat_entry": entry,
        "leaderbeat_epoch": 1, "leaderbeat_overlap": policy}, **options)
    return task_id


def events(client, prefix: str, entry: str) -> list[tuple[str, str, str]]:
    return [(e["event"], e.get("detail", ""), e["slot"]) for e in history(client, prefix)
            if e.get("entry") == entry]


def decisions(client, prefix: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(Keys(prefix).overlap_decisions).items()}


@pytest.fixture
def cluster(tmp_path, make_redis_server, key_prefix):
    """Redis servers, the env, two workers; yields a namespace the test drives."""
    state, broker, results = make_redis_server(), make_redis_server(), make_redis_server()

    class Cluster:
        prefix = key_prefix
        env = guarded_env(tmp_path, broker_url=broker.url, state_url=state.url,
                          record_url=results.url, prefix=key_prefix,
                          settings={"task_acks_late": True, "worker_prefetch_multiplier": 1})
        store = state.client()
        record = results.client()

        def feed(self, entry: str, policy: str, n: int) -> list[str]:
            app = make_app(self.env)
            try:
                ids = []
                for i in range(n):
                    ids.append(publish(app, self.prefix, entry, policy, i))
                    time.sleep(INTERVAL)
            finally:
                app.close()
            return ids

        def runs(self):
            return spans(self.record)

    c = Cluster()
    with WorkerProcess(c.env, tmp_path / "w1.log", name="w1", concurrency=1,
                       extra_args=WORKER_ARGS) as w1, \
            WorkerProcess(c.env, tmp_path / "w2.log", name="w2", concurrency=1,
                          extra_args=WORKER_ARGS) as w2:
        w1.wait_ready()
        w2.wait_ready()
        c.workers = (w1, w2)
        yield c


def settle(cluster, entry: str, n: int) -> None:
    """Wait until each of the ``n`` slots started or was skipped and no run is going."""
    def decided() -> int:
        return len({slot for event, _, slot in events(cluster.store, cluster.prefix, entry)
                    if event in ("started", "skipped")})

    def quiet() -> bool:  # every run started has ticked, and ended or stopped (terminated)
        started = {int(slot) for event, _, slot in events(cluster.store, cluster.prefix, entry)
                   if event == "started"}
        runs = cluster.runs()
        return started <= {_ms(r["slot"]) for r in runs} and \
            all(r["ended"] or time.time() - r["last"] > 1.0 for r in runs)

    wait_until(lambda: decided() == n and quiet(), 40, f"all {n} slots of {entry} to be done")
    time.sleep(1.0)
    assert quiet()


def test_skip_never_runs_two_at_once_and_records_each_skipped_slot(cluster):
    ids = cluster.feed("nightly", "skip", 8)
    settle(cluster, "nightly", len(ids))
    runs = cluster.runs()
    skipped = [e for e in events(cluster.store, cluster.prefix, "nightly")
               if e[0] == "skipped" and e[1].startswith("overlap: ")]
    assert overlaps(runs) == []
    assert len(runs) + len(skipped) == len(ids), (len(runs), skipped)
    assert len(skipped) >= 3
    counts = decisions(cluster.store, cluster.prefix)
    assert counts["nightly|skip|skipped"] == len(skipped)
    assert counts["nightly|skip|started"] == len(runs)
    # a beat's /metrics reports them from the store
    from prometheus_client import generate_latest

    from celery_leaderbeat.config import Config
    from celery_leaderbeat.ops.metrics import Metrics
    from celery_leaderbeat.store.redis_store import connect

    metrics, app = Metrics(), make_app(cluster.env)
    metrics.overlap_from(connect(Config.from_app(app)).guard.decisions)
    text = generate_latest(metrics.registry).decode()
    app.close()
    assert ('leaderbeat_overlap_decisions_total{decision="skipped",entry="nightly",'
            f'policy="skip"}} {float(len(skipped))}') in text, text


def test_buffer_one_keeps_one_waiting_slot_and_starts_it_when_the_run_ends(cluster):
    ids = cluster.feed("nightly", "buffer_one", 6)
    settle(cluster, "nightly", len(ids))
    runs = cluster.runs()
    history_ = events(cluster.store, cluster.prefix, "nightly")
    waiting, most = 0, 0
    for event, detail, _ in history_:  # the history in the order Redis wrote it
        waiting += event == "buffered"
        waiting -= event == "started" and detail == "after wait"
        most = max(most, waiting)
    after_wait = [r for r in runs if any(e == ("started", "after wait", str(_ms(r["slot"])))
                                         for e in history_)]
    skipped = [e for e in history_ if e[0] == "skipped"]
    assert overlaps(runs) == []
    assert most == 1
    assert after_wait and len(runs) + len(skipped) == len(ids)
    assert all(e[1].startswith("overlap: ") and "waits already" in e[1] for e in skipped)
    for run in after_wait:  # it started once the run before it had ended, within 2 s
        before = max((r for r in runs if r["start"] < run["start"]), key=lambda r: r["start"])
        assert before["last"] <= run["start"] <= before["last"] + 2.0, (before, run)


def test_buffer_all_runs_every_slot_in_order_one_at_a_time(cluster):
    ids = cluster.feed("backfill", "buffer_all", 5)
    settle(cluster, "backfill", len(ids))
    runs = cluster.runs()
    assert [r["id"] for r in runs] == ids  # every slot, in slot order
    assert overlaps(runs) == []
    started = [d for e, d, _ in events(cluster.store, cluster.prefix, "backfill")
               if e == "started"]
    assert started.count("after wait") >= 3


def test_cancel_other_terminates_the_running_one_and_records_it(cluster):
    ids = cluster.feed("latest", "cancel_other", 4)
    settle(cluster, "latest", len(ids))
    runs = cluster.runs()
    history_ = events(cluster.store, cluster.prefix, "latest")
    cancelled = [e for e in history_ if e[0] == "cancelled"]
    terminated = [r for r in runs if not r["ended"]]
    assert overlaps(runs) == []
    assert terminated, "a running slot was terminated"
    assert runs[-1]["ended"]  # nothing came after the last to start: it ran to its end
    # each terminated run is recorded cancelled under its own slot, naming its replacement,
    # and its end says so (the guard's finish, or the revoking worker's release)
    assert {_ms(r["slot"]) for r in terminated} == {int(e[2]) for e in cancelled}, history_
    assert all(e[1].startswith("replaced by slot ") for e in cancelled)
    ended = {int(slot) for event, detail, slot in history_
             if event == "finished" and detail.startswith("cancelled: ")}
    assert ended == {_ms(r["slot"]) for r in terminated}, history_


def test_allow_all_lets_runs_overlap(cluster):
    cluster.feed("free", "allow_all", 4)
    settle(cluster, "free", 4)
    runs = cluster.runs()
    assert len(runs) == 4 and overlaps(runs) != []
    assert not [e for e in events(cluster.store, cluster.prefix, "free")
                if e[0] in ("skipped", "buffered", "cancelled")]


def _ms(slot: str) -> int:
    return int(datetime.fromisoformat(slot).timestamp() * 1000)


def test_a_worker_killed_mid_run_releases_the_waiting_slot_after_the_lease_ttl(
        tmp_path, make_redis_server, key_prefix):
    """The run's worker is SIGKILLed: it never ends in the guard, its lock lapses after the
    lease ttl, and the other worker's sweep starts the waiting slot."""
    state, broker, results = make_redis_server(), make_redis_server(), make_redis_server()
    # lease ttl 3 s: the dead run's lock lapses 3 s after its last renewal (default 10 s)
    env = guarded_env(tmp_path, broker_url=broker.url, state_url=state.url,
                      record_url=results.url, prefix=key_prefix,
                      settings={"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 1})
    client, record = state.client(), results.client()
    # one queue per worker: the first slot runs on the worker that dies, the second
    # reaches the one that lives
    with WorkerProcess(env, tmp_path / "doomed.log", name="doomed", concurrency=1,
                       extra_args=[*WORKER_ARGS, "-Q", "doomed"]) as doomed, \
            WorkerProcess(env, tmp_path / "other.log", name="other", concurrency=1,
                          extra_args=[*WORKER_ARGS, "-Q", "other"]) as other:
        doomed.wait_ready()
        other.wait_ready()
        app = make_app(env)
        first = publish(app, key_prefix, "nightly", "buffer_one", 0, seconds=30, queue="doomed")
        wait_until(lambda: len(spans(record)) == 1, 20, "the first run to start")
        second = publish(app, key_prefix, "nightly", "buffer_one", 1, queue="other")
        wait_until(lambda: any(e[0] == "buffered" for e in events(client, key_prefix,
                                                                  "nightly")),
                   20, "the second slot to wait")
        time.sleep(1.0)  # it waits while the first run goes on
        waited_while_alive = len(spans(record)) == 1
        doomed.kill()
        killed_at = time.time()
        wait_until(lambda: any(r["id"] == second and r["ended"] for r in spans(record)), 30,
                   "the waiting slot to run")
        app.close()
    runs = spans(record)
    started = [(d, slot) for e, d, slot in events(client, key_prefix, "nightly")
               if e == "started"]
    assert waited_while_alive
    assert [r["id"] for r in runs] == [first, second] and not runs[0]["ended"]
    assert started == [("", str(_ms(runs[0]["slot"]))), ("after wait", str(_ms(runs[1]["slot"])))]
    # after the lease ttl (3 s) and within a sweep and a delivery more (generous: 5 s)
    assert killed_at + 2.0 <= runs[1]["start"] <= killed_at + 3.0 + 5.0, runs[1]["start"] - killed_at


def test_cancel_other_on_the_threads_pool_lets_the_run_end_then_starts_the_waiting_slot(
        tmp_path, make_redis_server, key_prefix):
    """Documented: a pool that cannot terminate (threads, solo) refuses the revoke; the
    running task runs to its end and the waiting slot starts then."""
    state, broker, results = make_redis_server(), make_redis_server(), make_redis_server()
    env = guarded_env(tmp_path, broker_url=broker.url, state_url=state.url,
                      record_url=results.url, prefix=key_prefix,
                      settings={"task_acks_late": True, "worker_prefetch_multiplier": 1})
    client, record = state.client(), results.client()
    args = [*WORKER_ARGS, "-P", "threads"]
    with WorkerProcess(env, tmp_path / "t1.log", name="t1", concurrency=1,
                       extra_args=args) as t1, \
            WorkerProcess(env, tmp_path / "t2.log", name="t2", concurrency=1,
                          extra_args=args) as t2:
        t1.wait_ready()
        t2.wait_ready()
        app = make_app(env)
        first = publish(app, key_prefix, "latest", "cancel_other", 0, seconds=2.0)
        wait_until(lambda: len(spans(record)) == 1, 20, "the first run to start")
        second = publish(app, key_prefix, "latest", "cancel_other", 1, seconds=0.5)
        app.close()
        wait_until(lambda: any(r["id"] == second and r["ended"] for r in spans(record)), 30,
                   "the waiting slot to run")
        logs = t1.log_text() + t2.log_text()
    runs = spans(record)
    history_ = events(client, key_prefix, "latest")
    assert [r["id"] for r in runs] == [first, second]
    assert all(r["ended"] for r in runs) and overlaps(runs) == []
    assert ("cancelled", "replaced by slot " + slot_at(1).isoformat(),
            str(_ms(slot_at(0).isoformat()))) in history_
    assert ("started", "after wait", str(_ms(slot_at(1).isoformat()))) in history_
    assert "does not implement kill_job" in logs


def test_cancel_other_a_task_that_catches_the_termination_keeps_its_turn_until_it_ends(
        tmp_path, make_redis_server, key_prefix):
    """The worker that terminated the run hands its turn on only once the pool process is
    gone: a task that catches prefork's SystemExit and goes on still runs alone."""
    state, broker, results = make_redis_server(), make_redis_server(), make_redis_server()
    env = guarded_env(tmp_path, broker_url=broker.url, state_url=state.url,
                      record_url=results.url, prefix=key_prefix,
                      settings={"task_acks_late": True, "worker_prefetch_multiplier": 1})
    client, record = state.client(), results.client()
    with WorkerProcess(env, tmp_path / "w1.log", name="w1", concurrency=1,
                       extra_args=WORKER_ARGS) as w1, \
            WorkerProcess(env, tmp_path / "w2.log", name="w2", concurrency=1,
                          extra_args=WORKER_ARGS) as w2:
        w1.wait_ready()
        w2.wait_ready()
        app = make_app(env)
        slot = slot_at(0)
        first = slot_id(key_prefix, "latest", slot)
        app.send_task(TICKING, kwargs={"seconds": 3.0, "stubborn": True}, task_id=first,
                      headers={"leaderbeat_slot": slot.isoformat(), "leaderbeat_entry": "latest",
                               "leaderbeat_epoch": 1, "leaderbeat_overlap": "cancel_other"})
        wait_until(lambda: len(spans(record)) == 1, 20, "the first run to start")
        time.sleep(0.5)
        second = publish(app, key_prefix, "latest", "cancel_other", 1, seconds=0.5)
        app.close()
        wait_until(lambda: any(r["id"] == second and r["ended"] for r in spans(record)), 30,
                   "the waiting slot to run")
    runs = spans(record)
    caught = [json.loads(raw) for raw in record.lrange("ticks", 0, -1)
              if json.loads(raw)["phase"] == "caught"]
    assert caught, "the first run was terminated and caught it"
    assert [r["id"] for r in runs] == [first, second] and runs[0]["ended"]
    assert overlaps(runs) == [], runs
    assert ("cancelled", "replaced by slot " + slot_at(1).isoformat(),
            str(_ms(slot.isoformat()))) in events(client, key_prefix, "latest")
