"""The worker guard as a bootstep: on wherever the worker's app says so, nowhere else.

In-process: a worker built in Python (``app.WorkController``; Celery's in-thread
test worker with a real Redis broker) and the ``celery`` command's hook-up;
importing the package is checked in a clean interpreter. The guard's own rules
(duplicates, overlap, redelivery) are tested with real prefork workers in
test_guard.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from datetime import datetime, timezone

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_leaderbeat.integrations.guard import STEP_PATH, add_step, offer_step
from celery_leaderbeat.timing.slots import slot_id
from tests.conftest import REPO_ROOT


def make_app(redis_url: str, prefix: str, *, guard: bool) -> Celery:
    app = Celery(f"guardstep-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(broker_url=redis_url, leaderbeat_redis_url=redis_url,
                    leaderbeat_key_prefix=prefix, leaderbeat_guard=guard)
    return app


def guarded(task) -> bool:
    return getattr(task.run, "__leaderbeat_guard__", False)


def test_importing_the_package_and_the_celery_plugin_connects_no_signal_receiver():
    code = textwrap.dedent("""
        import celery_leaderbeat, celery_leaderbeat.integrations.guard, celery_leaderbeat.ops.cli
        from celery import signals
        ours = [name for name in dir(signals) if isinstance(getattr(signals, name), signals.Signal)
                for receiver in getattr(signals, name).receivers
                if "leaderbeat" in repr(receiver)]
        print(ours)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_a_worker_built_in_python_with_the_step_line_guards_every_task_of_its_app(
        shared_redis, key_prefix):
    app = make_app(shared_redis.url_for(5), key_prefix, guard=True)

    @app.task(name="guardstep.work-on")
    def work():
        return 1

    app.steps["worker"].add(STEP_PATH)
    worker = app.WorkController(pool_cls="solo", concurrency=1, hostname=f"gs-{key_prefix}")
    assert guarded(work)
    assert "leaderbeat guard" in [step.alias for step in worker.steps]
    assert not any(guarded(task) for name, task in app.tasks.items()
                   if name.startswith("celery."))


def test_a_worker_whose_app_leaves_the_guard_off_runs_its_tasks_unwrapped(
        shared_redis, key_prefix):
    app = make_app(shared_redis.url_for(5), key_prefix, guard=False)

    @app.task(name="guardstep.work-off")
    def work():
        return 1

    add_step(app)
    worker = app.WorkController(pool_cls="solo", concurrency=1, hostname=f"gs-{key_prefix}")
    assert not guarded(work)
    assert "leaderbeat guard" not in [step.alias for step in worker.steps]


def test_bad_leaderbeat_settings_stop_a_guarded_worker_with_the_reason(shared_redis, key_prefix):
    app = make_app(shared_redis.url_for(5), key_prefix, guard=True)
    app.conf.leaderbeat_lease_ttl = 0.5
    add_step(app)
    with pytest.raises(SystemExit, match="leaderbeat_lease_ttl=0.5"):
        app.WorkController(pool_cls="solo", concurrency=1, hostname=f"gs-{key_prefix}")


def test_the_celery_plugin_gives_the_step_to_apps_that_exist_and_apps_finalized_later(
        shared_redis, key_prefix):
    before = make_app(shared_redis.url_for(5), key_prefix, guard=False)
    offer_step()
    after = make_app(shared_redis.url_for(5), key_prefix, guard=False)
    assert STEP_PATH in before.steps["worker"]
    assert STEP_PATH not in after.steps["worker"]  # not before the app is finalized
    after.finalize()
    assert STEP_PATH in after.steps["worker"]


def test_a_slot_delivered_twice_to_a_worker_started_in_python_runs_once(
        shared_redis, key_prefix):
    url = shared_redis.url_for(6)
    app = make_app(url, key_prefix, guard=True)
    app.conf.result_backend = url
    runs = shared_redis.client(db=6)
    counter = f"{key_prefix}:runs"

    @app.task(name="guardstep.count")
    def count():
        runs.incr(counter)

    app.steps["worker"].add(STEP_PATH)
    slot = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)
    headers = {"leaderbeat_slot": slot.isoformat(), "leaderbeat_entry": "report",
               "leaderbeat_epoch": 1}
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        for _ in range(2):
            count.apply_async(task_id=slot_id(key_prefix, "report", slot), headers=headers)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and runs.llen(app.conf.task_default_queue) != 0:
            time.sleep(0.1)
        time.sleep(1.0)  # room for a wrong second run
    assert int(runs.get(counter) or 0) == 1
    history = [fields[b"event"] for _, fields in
               runs.xrange("{" + key_prefix + "}:history")]
    assert history.count(b"skipped") == 1 and history.count(b"started") == 1
