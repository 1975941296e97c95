"""The worker guard's runs: each Celery retry a run of its own, and a run taken for dead.

Real ``celery worker`` processes (prefork), a real Redis for leaderbeat's state,
a second one as the broker, a third for what the tasks record. Lease ttl 3 s in
the partition test (said there), to keep it short; otherwise the defaults.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone

import pytest

from celery_leaderbeat.store.keys import Keys
from tests.support.worker import WorkerProcess, executed, wait_until
from tests.test_guard import guarded_env, history, publish_slot

pytestmark = pytest.mark.slow

RETRYING = "tests.support.beatapp.retrying"
FENCED = "tests.support.beatapp.fenced"


def test_a_retry_whose_message_is_delivered_twice_runs_once_and_the_task_still_retries(
        tmp_path, make_redis_server, key_prefix):
    state, broker, results = make_redis_server(), make_redis_server(), make_redis_server()
    # The Redis transport gives a message back to the queue once it has been unacknowledged
    # for the visibility timeout; a retry's countdown longer than that is delivered again
    # (and again) while the worker holds it. Timeout 1 s and a sweep every second so the
    # duplicates come within the test (defaults: 1 h, and a sweep every 100 s).
    env = guarded_env(tmp_path, broker_url=broker.url, state_url=state.url,
                      record_url=results.url, prefix=key_prefix,
                      settings={"broker_transport_options": {
                          "visibility_timeout": 1, "unacked_restore_interval": 1,
                          "unacked_restore_throttle": 1}})
    slot = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    client = state.client()

    def duplicates() -> list[dict[str, str]]:
        return [e for e in history(client, key_prefix)
                if e["event"] == "skipped" and e["detail"].startswith("duplicate")]

    with WorkerProcess(env, tmp_path / "worker.log") as worker:
        worker.wait_ready()
        publish_slot(env, RETRYING, "flaky", slot, key_prefix,
                     kwargs={"times": 2, "countdown": 4})
        wait_until(lambda: any(r["retries"] == 2 for r in executed(results.client())), 60,
                   "the second retry to run")
        # each retry's message goes back to the queue while it waits out its countdown
        deadline = time.monotonic() + 20
        while len(executed(results.client())) + len(duplicates()) < 5 \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # room for a wrong second run of the last retry
        log = worker.log_text()
    runs = Counter(r["retries"] for r in executed(results.client()))
    started = [e.get("detail", "") for e in history(client, key_prefix) if e["event"] == "started"]
    print(f"retries delivered again: {len(duplicates())} duplicate deliveries skipped")
    assert runs == {0: 1, 1: 1, 2: 1}, (runs, log[-3000:])
    assert len(duplicates()) >= 2, "both retries' messages were delivered more than once"
    assert started == ["", "retry 1", "retry 2"]


def test_a_worker_cut_off_from_redis_past_the_ttl_is_superseded_and_its_run_changes_nothing(
        tmp_path, make_redis_server, make_proxy, key_prefix):
    """Documented: Redis cannot tell a dead worker from a cut-off one. A re-send while the
    first worker cannot reach Redis (past the ttl) runs the slot again; the first run, back
    in touch, is told it was superseded and neither renews nor finishes the new run's
    record; the task sees both in ``current_run()``: a higher token and ``still_ours()``."""
    state, broker, results = make_redis_server(), make_redis_server(), make_redis_server()
    proxy = make_proxy(state)
    # lease ttl 3 s: the cut-off run's liveness lapses 3 s after its last renewal (default 10)
    settings = {"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 1}
    common = {"broker_url": broker.url, "record_url": results.url, "prefix": key_prefix,
              "settings": settings}
    cut_env = guarded_env(tmp_path, state_url=proxy.url_for(0), **common)
    env = guarded_env(tmp_path, state_url=state.url, **common)
    slot = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    keys, client = Keys(key_prefix), state.client()

    def rows() -> list[dict]:
        return executed(results.client())

    # one queue per worker: the re-send must reach the worker that can reach Redis
    with WorkerProcess(cut_env, tmp_path / "cut.log", name="cut", concurrency=1,
                       extra_args=["-Q", "cut"]) as cut, \
            WorkerProcess(env, tmp_path / "other.log", name="other", concurrency=1,
                          extra_args=["-Q", "other"]) as other:
        cut.wait_ready()
        other.wait_ready()
        task_id = publish_slot(env, FENCED, "nightly", slot, key_prefix, queue="cut",
                               kwargs={"seconds": 8})
        wait_until(lambda: len(rows()) == 1, 20, "the first run to start")
        proxy.set_mode("drop")
        time.sleep(4.5)  # past the ttl: the first run's liveness lapsed
        publish_slot(env, FENCED, "nightly", slot, key_prefix, queue="other",
                     kwargs={"seconds": 8})
        wait_until(lambda: len(rows()) == 2, 20, "the re-send to start")
        proxy.set_mode("forward")
        wait_until(lambda: any(r["phase"] == "end" for r in rows()), 20,
                   "the first run to end")
        time.sleep(0.5)
        record_while_second_runs = client.get(keys.run(task_id))
        wait_until(lambda: sum(r["phase"] == "end" for r in rows()) == 2, 20,
                   "the second run to end")
        publish_slot(env, FENCED, "nightly", slot, key_prefix, queue="other",
                     kwargs={"seconds": 8})
        wait_until(lambda: any(e["event"] == "skipped" for e in history(client, key_prefix)),
                   20, "the third delivery to be skipped")
        time.sleep(1)
        cut_log = cut.log_text()
    first, second = (sorted((r for r in rows() if r["phase"] == phase), key=lambda r: r["at"])
                     for phase in ("start", "end"))
    ends = {r["token"]: r["still_ours"] for r in second}
    events = [(e["event"], e.get("detail", "")) for e in history(client, key_prefix)]
    assert record_while_second_runs.decode().startswith(f"s|{first[1]['token']}|"), \
        record_while_second_runs
    assert len(first) == 2 and first[1]["token"] > first[0]["token"] > 0
    assert ends == {first[0]["token"]: False, first[1]["token"]: True}
    assert ("started", "rerun: the first run was lost with its worker") in events
    assert any(e == "finished" and d.startswith("ok; superseded: ") for e, d in events), events
    skipped = [d for e, d in events if e == "skipped"]
    assert len(skipped) == 1 and skipped[0].startswith("duplicate: already ran on"), skipped
    assert "has lapsed" in cut_log and "started again elsewhere" in cut_log
