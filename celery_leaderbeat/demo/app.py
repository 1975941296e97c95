"""The Celery app the failover demo runs: ``celery -A celery_leaderbeat.demo.app ...``.

Configured entirely from environment variables, set by :mod:`celery_leaderbeat.demo`
for each process it starts:

- ``LBDEMO_BROKER_URL``: the broker (a database of the demo's own Redis; on PostgreSQL,
  RabbitMQ or ``lbdemofs://``, kombu's filesystem transport writing each message whole:
  :mod:`celery_leaderbeat.demo.fsbroker`);
- ``LBDEMO_BROKER_DIR``: the filesystem transport's folder (with ``lbdemofs://``);
- ``LBDEMO_QUEUE``: the queue of the demo's own on a shared broker (``task_default_queue``);
- ``LBDEMO_REDIS_URL``: ``leaderbeat_redis_url``;
- ``LBDEMO_STORE_URL``: ``leaderbeat_store_url`` (the demo's PostgreSQL);
- ``LBDEMO_PREFIX``: ``leaderbeat_key_prefix``;
- ``LBDEMO_RECORD_URL``: where :func:`record` appends each run it executes (a Redis
  list, or a PostgreSQL table).

Only these are set: ``beat_max_loop_interval`` and every lease setting keep their
defaults, so the demo shows what a user gets out of the box.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

#: the Redis list (at ``LBDEMO_RECORD_URL``) that :func:`record` appends to
RUNS_KEY = "leaderbeat-demo:runs"
#: the table (in the demo's PostgreSQL database) :func:`record` appends to instead
RUNS_TABLE = "leaderbeat_demo_runs"
TASK_NAME = "celery_leaderbeat.demo.app.record"

#: entry name -> (schedule as given to beat, seconds between slots)
SCHEDULE: dict[str, tuple[Any, float]] = {
    "every-2s": (2.0, 2.0),
    "every-3s": (3.0, 3.0),
    "cron-5s": ("*/5 * * * * *", 5.0),  # six fields: seconds first
}

app = Celery("leaderbeat_demo")
app.conf.update(
    broker_url=os.environ.get("LBDEMO_BROKER_URL", "memory://"),
    broker_connection_retry_on_startup=True,
    result_backend=None,
    task_ignore_result=True,
    timezone="UTC",
    enable_utc=True,
    worker_hijack_root_logger=True,
    beat_schedule={name: {"task": TASK_NAME, "schedule": spec, "args": (name,)}
                   for name, (spec, _) in SCHEDULE.items()},
)
if os.environ.get("LBDEMO_BROKER_DIR"):
    from . import fsbroker  # noqa: F401 - registers the lbdemofs:// scheme with kombu

    folder = os.environ["LBDEMO_BROKER_DIR"]
    # the exchanges' bindings too (kombu's default is "control" in the working directory)
    app.conf.broker_transport_options = {"data_folder_in": folder, "data_folder_out": folder,
                                         "control_folder": os.path.join(folder, "control"),
                                         "polling_interval": 0.1}
if os.environ.get("LBDEMO_QUEUE"):
    app.conf.task_default_queue = os.environ["LBDEMO_QUEUE"]
if os.environ.get("LBDEMO_STORE_URL"):
    app.conf.leaderbeat_store_url = os.environ["LBDEMO_STORE_URL"]
if os.environ.get("LBDEMO_REDIS_URL"):
    app.conf.leaderbeat_redis_url = os.environ["LBDEMO_REDIS_URL"]
if os.environ.get("LBDEMO_PREFIX"):
    app.conf.leaderbeat_key_prefix = os.environ["LBDEMO_PREFIX"]


@app.task(name=TASK_NAME, bind=True)  # type: ignore[untyped-decorator]  # Celery is untyped
def record(self: Any, entry: str) -> None:
    """Append this run (entry, slot, epoch, task id, worker, start time) to the runs list."""
    started = time.time()  # first: lateness is measured to the start of the run
    headers = self.request.headers or {}
    row = {
        "entry": headers.get("leaderbeat_entry", getattr(self.request, "leaderbeat_entry", entry)),
        "slot": headers.get("leaderbeat_slot", getattr(self.request, "leaderbeat_slot", None)),
        "epoch": headers.get("leaderbeat_epoch", getattr(self.request, "leaderbeat_epoch", None)),
        "id": self.request.id,
        "hostname": self.request.hostname,
        "started": started,
    }
    url = os.environ["LBDEMO_RECORD_URL"]
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {RUNS_TABLE} (run) VALUES (%s::jsonb)", (json.dumps(row),))
        return
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.rpush(RUNS_KEY, json.dumps(row))
    finally:
        client.close()
