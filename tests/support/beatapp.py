"""A Celery app configured entirely from environment variables.

Imported by ``celery -A tests.support.beatapp beat`` in a subprocess, so a test
describes the whole app through the environment:

- ``LB_BROKER_URL``: the broker (a test Redis URL, e.g. db 1 of the test server).
- ``LB_REDIS_URL``: ``leaderbeat_redis_url`` (optional).
- ``LB_PREFIX``: ``leaderbeat_key_prefix`` (optional).
- ``LB_STORE_URL``: ``leaderbeat_store_url`` (optional; e.g. a PostgreSQL URL, which
  each beat of a run may reach by another address, through a proxy of its own).
- ``LB_SCHEDULE_FILE``: a JSON file, entry name -> one of
  ``{"task": ..., "every": seconds}``,
  ``{"task": ..., "crontab": {crontab kwargs}}``,
  ``{"task": ..., "cron": "*/5 * * * *"}`` (passed as the string schedule
  celery_leaderbeat understands), plus optional ``args``, ``kwargs``,
  ``options`` and ``leaderbeat`` (per-entry overrides, passed through as-is).
- ``LB_RECORD_URL``: a Redis URL where the ``record`` task appends what it ran
  (JSON: entry, slot, id, hostname) to the list ``executed``.
- ``LB_CLOCK_OFFSET``: seconds added to this process's wall clock (``time.time``),
  to test clock skew; monotonic time is untouched.
- ``LB_SETTINGS``: a JSON object of extra settings (``leaderbeat_*`` or any
  Celery setting) applied to ``app.conf`` last.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab

SCHEDULE_KEYS = ("every", "crontab", "cron")
PASSTHROUGH_KEYS = ("args", "kwargs", "options", "leaderbeat")


def build_entry(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Turn one JSON entry description into a ``beat_schedule`` entry."""
    given = [key for key in SCHEDULE_KEYS if key in spec]
    if len(given) != 1 or "task" not in spec:
        raise ValueError(
            f"schedule entry {name!r}: needs 'task' and exactly one of {SCHEDULE_KEYS}, "
            f"got keys {sorted(spec)}"
        )
    schedule: Any
    if "every" in spec:
        schedule = timedelta(seconds=float(spec["every"]))
    elif "crontab" in spec:
        schedule = crontab(**spec["crontab"])
    else:
        schedule = str(spec["cron"])
    entry: dict[str, Any] = {"task": spec["task"], "schedule": schedule}
    for key in PASSTHROUGH_KEYS:
        if key in spec:
            entry[key] = spec[key]
    return entry


def load_schedule(path: str | None) -> dict[str, dict[str, Any]]:
    """Read ``LB_SCHEDULE_FILE`` into a ``beat_schedule`` dict (empty without a file)."""
    if not path:
        return {}
    with open(path, encoding="utf-8") as fh:
        raw = json.load(fh)
    return {name: build_entry(name, spec) for name, spec in raw.items()}


def make_app(env: os._Environ[str] | dict[str, str] = os.environ) -> Celery:
    """Build the test app from ``env`` (``os.environ`` in a subprocess)."""
    app = Celery("leaderbeat_test")
    conf: dict[str, Any] = {
        "broker_url": env.get("LB_BROKER_URL", "memory://"),
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "beat_scheduler": "celery_leaderbeat.Scheduler",
        "beat_schedule": load_schedule(env.get("LB_SCHEDULE_FILE")),
        "timezone": "UTC",
        "enable_utc": True,
    }
    if env.get("LB_REDIS_URL"):
        conf["leaderbeat_redis_url"] = env["LB_REDIS_URL"]
    if env.get("LB_PREFIX"):
        conf["leaderbeat_key_prefix"] = env["LB_PREFIX"]
    if env.get("LB_STORE_URL"):
        conf["leaderbeat_store_url"] = env["LB_STORE_URL"]
    conf.update(json.loads(env.get("LB_SETTINGS") or "{}"))
    app.conf.update(conf)
    return app


def shift_wall_clock(offset: float) -> None:
    """Make ``time.time()`` in this process run ``offset`` seconds ahead (or behind)."""
    import time

    real = time.time
    time.time = lambda: real() + offset  # type: ignore[assignment]


if os.environ.get("LB_CLOCK_OFFSET"):
    shift_wall_clock(float(os.environ["LB_CLOCK_OFFSET"]))

app = make_app()


@app.task(name="tests.support.beatapp.noop")
def noop(*args: Any, **kwargs: Any) -> None:
    """Does nothing: beat tests only look at what was enqueued."""
    return


@app.task(name="tests.support.beatapp.record", bind=True)
def record(self: Any, *args: Any, **kwargs: Any) -> None:
    """Append what ran (entry, slot, task id, worker) to the list ``executed``."""
    import redis

    headers = self.request.headers or {}
    row = {
        "entry": headers.get("leaderbeat_entry", getattr(self.request, "leaderbeat_entry", None)),
        "slot": headers.get("leaderbeat_slot", getattr(self.request, "leaderbeat_slot", None)),
        "id": self.request.id,
        "hostname": self.request.hostname,
    }
    client = redis.Redis.from_url(os.environ["LB_RECORD_URL"])
    client.rpush("executed", json.dumps(row))
    client.close()


@app.task(name="tests.support.beatapp.sleepy", bind=True)
def sleepy(self: Any, seconds: float = 1.0) -> None:
    """Record a 'start' row, sleep ``seconds``, record an 'end' row (list ``executed``)."""
    import time

    import redis

    headers = self.request.headers or {}
    client = redis.Redis.from_url(os.environ["LB_RECORD_URL"])
    base = {
        "entry": headers.get("leaderbeat_entry", getattr(self.request, "leaderbeat_entry", None)),
        "slot": headers.get("leaderbeat_slot", getattr(self.request, "leaderbeat_slot", None)),
        "id": self.request.id,
        "hostname": self.request.hostname,
        "pid": os.getpid(),
    }
    client.rpush("executed", json.dumps({**base, "phase": "start", "at": time.time()}))
    time.sleep(seconds)
    client.rpush("executed", json.dumps({**base, "phase": "end", "at": time.time()}))
    client.close()


@app.task(name="tests.support.beatapp.retrying", bind=True)
def retrying(self: Any, times: int = 1, countdown: float = 1.0) -> None:
    """Record a row (with its retry number), then retry until it has retried ``times``."""
    import redis

    headers = self.request.headers or {}
    client = redis.Redis.from_url(os.environ["LB_RECORD_URL"])
    client.rpush("executed", json.dumps({
        "entry": headers.get("leaderbeat_entry", getattr(self.request, "leaderbeat_entry", None)),
        "id": self.request.id, "retries": self.request.retries, "pid": os.getpid()}))
    client.close()
    if self.request.retries < times:
        raise self.retry(countdown=countdown, max_retries=times)


@app.task(name="tests.support.beatapp.fenced", bind=True)
def fenced(self: Any, seconds: float = 1.0) -> None:
    """Like ``sleepy``, with the guard's run: its token, and at the end ``still_ours()``."""
    import time

    import redis

    from celery_leaderbeat.guard import current_run

    run = current_run()
    client = redis.Redis.from_url(os.environ["LB_RECORD_URL"])
    base = {"id": self.request.id, "hostname": self.request.hostname, "pid": os.getpid(),
            "token": run.token if run else None}
    client.rpush("executed", json.dumps({**base, "phase": "start", "at": time.time()}))
    time.sleep(seconds)
    ours = run.still_ours() if run else None
    client.rpush("executed", json.dumps({**base, "phase": "end", "at": time.time(),
                                         "still_ours": ours}))
    client.close()
