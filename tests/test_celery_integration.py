"""Celery's own machinery around the Scheduler: the scheduler alias and a real worker.

Uses Celery's in-process pytest fixtures (``celery_app``, ``celery_worker``
from ``celery.contrib.pytest``, registered in conftest) with a real Redis
broker, so the task that runs is the one the leader published.
"""

from __future__ import annotations

import gc
import time
from datetime import datetime

import pytest
from celery.beat import Service

from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.timing.slots import slot_id
from tests.support.redis_server import RedisServer


@pytest.fixture(scope="module")
def broker_server(tmp_path_factory):
    with RedisServer(workdir=tmp_path_factory.mktemp("broker")) as server:
        yield server
        # Results the leader published sit in reference cycles; Celery 5.4 and 5.5 unsubscribe
        # from a result when it is freed, retrying for ~20 s once the server is gone.
        gc.collect()


@pytest.fixture(scope="module")
def celery_config(broker_server):
    return {"broker_url": broker_server.url_for(1), "result_backend": broker_server.url_for(2),
            "leaderbeat_redis_url": broker_server.url_for(3), "timezone": "UTC"}


@pytest.fixture(scope="module")
def celery_worker_pool():
    return "solo"


def test_the_leaderbeat_alias_resolves_to_the_scheduler(celery_app):
    scheduler = Service(celery_app, scheduler_cls="leaderbeat").get_scheduler(lazy=True)
    assert type(scheduler) is Scheduler


def test_a_worker_runs_each_published_slot_with_its_slot_id_and_headers(
        celery_app, celery_worker, key_prefix):
    seen = []

    @celery_app.task(name="integration.record", bind=True)
    def record(self, x):
        # custom message headers surface as attributes of the task request
        seen.append((self.request.id, x, {k: getattr(self.request, k, None) for k in
                                          ("leaderbeat_slot", "leaderbeat_entry")}))
        return x * 2

    celery_worker.reload()
    celery_app.conf.leaderbeat_key_prefix = key_prefix
    celery_app.conf.beat_schedule = {
        "double": {"task": "integration.record", "schedule": 0.5, "args": (21,)}}
    scheduler = Scheduler(app=celery_app)
    try:
        deadline = time.monotonic() + 20
        while len(seen) < 2:
            assert time.monotonic() < deadline, "the worker ran nothing"
            time.sleep(min(scheduler.tick(), 0.1))
    finally:
        scheduler.close()
    task_id, arg, headers = seen[0]
    assert arg == 21
    slot = datetime.fromisoformat(headers["leaderbeat_slot"])
    assert headers["leaderbeat_entry"] == "double"
    assert task_id == slot_id(key_prefix, "double", slot)
    assert celery_app.AsyncResult(task_id).get(timeout=10) == 42
    assert len({s[0] for s in seen}) == len(seen)
