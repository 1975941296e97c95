"""The worker guard with real prefork workers: each slot runs at most once.

Real ``celery worker -c 2`` processes, leaderbeat's state in a real Redis and, in a
second run of each test, in a PostgreSQL database of its own (``guarded_store``); the
machine's RabbitMQ (a queue of this test's own) where the test is about broker
redelivery. Lease ttl 3 s where a test waits for a dead run's liveness to lapse (said
there), to keep the suite short; otherwise the defaults.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from itertools import pairwise

import pytest

from celery_leaderbeat.timing.slots import slot_id
from tests.support.beat import BeatCluster, beat_env
from tests.support.beatapp import make_app
from tests.support.rabbitmq import require_rabbitmq
from tests.support.worker import WorkerProcess, executed, wait_until
from tests.test_catchup_processes import leader_pid

pytestmark = pytest.mark.slow

RECORD = "tests.support.beatapp.record"
SLEEPY = "tests.support.beatapp.sleepy"


def history(client, prefix: str) -> list[dict[str, str]]:
    """The history stream of a Redis store, each event's fields decoded."""
    return [{k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in client.xrange("{" + prefix + "}:history")]


@pytest.fixture(params=["redis", "postgresql"])
def guarded_store(request, make_redis_server, key_prefix):
    """(the state's Redis URL or None, the store's settings, a view of its history): a Redis
    server of the test's own, or a PostgreSQL database of its own."""
    from tests.support.postgres import HOST, PORT, USER, postgres_database
    from tests.test_catchup_processes import PostgresView, RedisView

    if request.param == "redis":
        state = make_redis_server()
        yield state.url, {}, RedisView(state.client(), key_prefix)
        return
    with postgres_database("lbguard") as name:
        yield (None, {"leaderbeat_store_url": f"postgresql://{USER}@{HOST}:{PORT}/{name}"},
               PostgresView(f"host={HOST} port={PORT} user={USER} dbname={name}", key_prefix))


def guarded_env(tmp_path, *, broker_url: str, state_url: str | None, record_url: str,
                prefix: str, schedule=None, settings=None) -> dict[str, str]:
    env = beat_env(tmp_path, broker_url=broker_url, redis_url=state_url, prefix=prefix,
                   schedule=schedule or {}, settings={"leaderbeat_guard": True, **(settings or {})})
    env["LB_RECORD_URL"] = record_url
    return env


def publish_slot(env: dict[str, str], task: str, entry: str, slot: datetime, prefix: str,
                 **options) -> str:
    """Publish one slot's message as beat does: its deterministic id and headers."""
    app = make_app(env)
    task_id = slot_id(prefix, entry, slot)
    app.send_task(task, task_id=task_id, headers={
        "leaderbeat_slot": slot.isoformat(), "leaderbeat_entry": entry, "leaderbeat_epoch": 1},
        **options)
    app.close()
    return task_id


def test_the_same_slot_published_twice_runs_once_and_the_second_is_recorded_duplicate(
        tmp_path, make_redis_server, key_prefix, guarded_store):
    state_url, store_settings, view = guarded_store
    broker, results = make_redis_server(), make_redis_server()
    env = guarded_env(tmp_path, broker_url=broker.url, state_url=state_url,
                      record_url=results.url, prefix=key_prefix, settings=store_settings)
    slot = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    with WorkerProcess(env, tmp_path / "worker.log") as worker:
        worker.wait_ready()
        for _ in range(2):
            publish_slot(env, RECORD, "report", slot, key_prefix)
        app = make_app(env)
        for _ in range(2):  # no leaderbeat headers: untouched, runs every time
            app.send_task(RECORD, task_id=str(uuid.uuid4()))
        app.close()
        wait_until(lambda: len(executed(results.client())) >= 3, 20, "3 runs")
        time.sleep(1.5)  # room for a wrong fourth run
        log = worker.log_text()
    rows = executed(results.client())
    assert "leaderbeat guard: on" in log
    assert [r["entry"] for r in rows].count("report") == 1
    assert sum(1 for r in rows if r["entry"] is None) == 2
    events = [(e["event"], e.get("detail", "")) for e in view.history()]
    assert ("started", "") in events and ("finished", "ok") in events
    skipped = [d for e, d in events if e == "skipped"]
    assert len(skipped) == 1 and skipped[0].startswith("duplicate: "), skipped


def test_acks_late_and_a_worker_killed_mid_task_the_redelivery_runs_it_once_more_to_the_end(
        tmp_path, make_redis_server, key_prefix, guarded_store):
    """Rule: a run recorded started whose liveness lapsed died with its worker: run again.
    A failure here says what the second worker did (the runs recorded, its log)."""
    import kombu

    state_url, store_settings, view = guarded_store
    results = make_redis_server()
    queue = f"lb-guard-{uuid.uuid4().hex[:8]}"
    amqp = require_rabbitmq()
    # lease ttl 3 s: the dead run's liveness lapses 3 s after the kill (default 10 s)
    env = guarded_env(tmp_path, broker_url=amqp, state_url=state_url, record_url=results.url,
                      prefix=key_prefix,
                      settings={"task_acks_late": True, "worker_prefetch_multiplier": 1,
                                "task_default_queue": queue, "leaderbeat_lease_ttl": 3,
                                "leaderbeat_renew_interval": 1, **store_settings})
    slot = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    try:
        with WorkerProcess(env, tmp_path / "first.log", name="first") as first:
            first.wait_ready()
            publish_slot(env, SLEEPY, "nightly", slot, key_prefix, kwargs={"seconds": 4})
            wait_until(lambda: any(r["phase"] == "start" for r in executed(results.client())),
                       20, "the first run to start")
            first.kill()  # mid-task: the message was never acknowledged
        with WorkerProcess(env, tmp_path / "second.log", name="second") as second:
            try:
                wait_until(lambda: any(r["phase"] == "end" for r in executed(results.client())),
                           30, "the redelivered run to finish")
            except AssertionError as exc:  # what the second worker did, to tell why
                raise AssertionError(f"{exc}; runs {executed(results.client())}; the second "
                                     f"worker's log:\n{second.log_text()[-3000:]}") from None
            time.sleep(1)
            log = second.log_text()
    finally:
        with kombu.Connection(amqp) as conn:
            kombu.Queue(queue, channel=conn.channel()).delete()
    phases = Counter(r["phase"] for r in executed(results.client()))
    assert phases == {"start": 2, "end": 1}, (phases, log[-2000:])
    details = [e.get("detail", "") for e in view.history() if e["event"] == "started"]
    assert details == ["", "rerun: the first run was lost with its worker"]


def test_overlap_skip_never_runs_two_runs_of_an_entry_at_once_across_two_workers(
        tmp_path, make_redis_server, key_prefix, guarded_store):
    state_url, store_settings, view = guarded_store
    broker, results = make_redis_server(), make_redis_server()
    schedule = {"slow": {"task": SLEEPY, "every": 1, "kwargs": {"seconds": 2.5},
                         "leaderbeat": {"overlap": "skip"}}}
    # one task at a time per worker, none prefetched: while one worker runs the entry,
    # the next slot's message goes to the other worker, whose guard must skip it
    env = guarded_env(tmp_path, broker_url=broker.url, state_url=state_url,
                      record_url=results.url, prefix=key_prefix, schedule=schedule,
                      settings={"worker_prefetch_multiplier": 1, **store_settings})
    with WorkerProcess(env, tmp_path / "w1.log", name="w1", concurrency=1) as w1, \
            WorkerProcess(env, tmp_path / "w2.log", name="w2", concurrency=1) as w2, \
            BeatCluster(1, env, tmp_path):
        w1.wait_ready()
        w2.wait_ready()
        wait_until(lambda: sum(r["phase"] == "end" for r in executed(results.client())) >= 3,
                   40, "three runs to finish")
    rows = executed(results.client())
    runs: dict[str, dict[str, float]] = {}
    for r in rows:
        runs.setdefault(r["id"], {})[r["phase"]] = r["at"]
    spans = sorted((v["start"], v.get("end", float("inf"))) for v in runs.values())
    overlapping = [(a, b) for a, b in pairwise(spans) if b[0] < a[1]]
    skipped = [e for e in view.history()
               if e["event"] == "skipped" and e.get("detail", "").startswith("overlap")]
    processes = {r["pid"] for r in rows} | {e["node"].rsplit(":", 1)[1] for e in skipped}
    print(f"overlap run: {len(spans)} runs, {len(skipped)} slots skipped for overlap, "
          f"{len({str(p) for p in processes})} worker processes involved")
    assert overlapping == []
    assert len(skipped) >= 3, "slots due while a run ran were skipped and recorded"
    assert len({str(p) for p in processes}) >= 2, "both workers took part"


@pytest.mark.xdist_group("heavy")  # CPU-heavy: never beside another heavy test
def test_a_leader_paused_mid_batch_with_the_guard_on_every_slot_runs_exactly_once(
        tmp_path, make_redis_server, key_prefix, guarded_store):
    state_url, store_settings, view = guarded_store
    broker, results = make_redis_server(), make_redis_server()
    n = 1000
    schedule = {f"e{i}": {"task": RECORD, "every": 5} for i in range(n)}
    # 200 sends a second: a history long enough to still hold the first slot's records
    env = guarded_env(tmp_path, broker_url=broker.url, state_url=state_url,
                      record_url=results.url, prefix=key_prefix, schedule=schedule,
                      settings={"leaderbeat_history_length": 100_000, **store_settings})

    def first_slot_sent() -> set[str]:
        sent = [(int(e["slot"]), e["entry"]) for e in view.history() if e["event"] == "sent"]
        first_ms = min(slot for slot, _ in sent)
        return {entry for slot, entry in sent if slot == first_ms}

    with WorkerProcess(env, tmp_path / "w1.log", name="w1") as w1:
        with BeatCluster(3, env, tmp_path) as cluster:
            w1.wait_ready()
            wait_until(lambda: view.token() is not None, 30, "a leader")
            token = view.token()
            leader = next(b for b in cluster if b.pid == leader_pid(token))
            deadline = time.monotonic() + 30
            # paused once about 200 slots of the first batch were recorded sent
            while sum(1 for e in view.history() if e["event"] == "sent") < 200:
                assert time.monotonic() < deadline, "the leader never started its batch"
                time.sleep(0.005)
            leader.stop()
            # past the ttl: a standby leads (and re-sends the paused chunk) before it wakes
            wait_until(lambda: (token := view.token()) is not None
                       and leader_pid(token) != leader.pid, 30,
                       "a standby to lead while the leader is paused")
            leader.cont()
            # the beats' part: every entry's first slot sent (by the paused leader before
            # its pause, a standby's rescue, or the next leader's recovery)
            deadline = time.monotonic() + 60
            while len(first_slot_sent()) < n:
                assert time.monotonic() < deadline, (
                    f"{len(first_slot_sent())} of {n} slots of the paused batch recorded sent "
                    f"within 60 s; history: {Counter((e['event'], e.get('detail', '')[:40]) for e in view.history())}")
                time.sleep(1)
            time.sleep(2)
            assert leader.alive
        # Beats stopped: the worker runs what they enqueued. On a loaded machine one worker
        # runs behind 400 slots a second, and the recovered chunk waits behind later slots.
        first = min(r["slot"] for r in executed(results.client()))
        def ran() -> int:
            return len({r["entry"] for r in executed(results.client()) if r["slot"] == first})
        try:
            wait_until(lambda: ran() >= n, 180, f"{n} runs of the first slot")
        except AssertionError:
            raise AssertionError(f"{ran()} of {n} slots of the paused batch ran within 180 s "
                                 "of the beats' stop") from None
        queue = broker.client()
        wait_until(lambda: queue.llen("celery") == 0, 180, "the worker drained the queue")
        time.sleep(2)  # the last messages taken: a second run of any slot would land by now
    rows = [r for r in executed(results.client()) if r["slot"] == first]
    per_entry = Counter(r["entry"] for r in rows)
    skipped = [e for e in view.history() if e["event"] == "skipped"
               and e.get("detail", "").startswith("duplicate")]
    print(f"paused leader with the guard: {len(per_entry)} of {n} slots of the paused batch "
          f"executed, {sum(v - 1 for v in per_entry.values())} twice; {len(skipped)} duplicate "
          "deliveries skipped by the guard")
    assert len(per_entry) == n
    assert max(per_entry.values()) == 1
