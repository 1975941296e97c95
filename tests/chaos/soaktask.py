"""The soak's task: records every execution (entry, slot, id, worker, time) in a store of its own.

Loaded into the workers with ``celery worker --include tests.chaos.soaktask``; beat sends
it by name. The record goes to ``LB_RECORD_URL`` (a Redis no fault ever touches), list
``executed``, or with ``LB_RECORD_PG`` (a libpq connection string: the PostgreSQL soak,
which runs no Redis) to the table ``executed`` of a database on a server no fault
touches; so an execution is counted whatever happens to the store the beats use.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

from tests.support.beatapp import app

TASK = "tests.chaos.soaktask.record"
_client: redis.Redis | None = None
_pg: Any = None


def _results() -> redis.Redis:
    global _client
    if _client is None:  # one connection per pool process
        _client = redis.Redis.from_url(os.environ["LB_RECORD_URL"], socket_timeout=5)
    return _client


@app.task(name=TASK, bind=True)
def record(self: Any, *args: Any, **kwargs: Any) -> None:
    """Append one row per execution to ``executed`` (wall time of the start of the body)."""
    headers = self.request.headers or {}
    row = {
        "entry": headers.get("leaderbeat_entry", getattr(self.request, "leaderbeat_entry", None)),
        "slot": headers.get("leaderbeat_slot", getattr(self.request, "leaderbeat_slot", None)),
        "epoch": headers.get("leaderbeat_epoch", getattr(self.request, "leaderbeat_epoch", None)),
        "id": self.request.id,
        "hostname": self.request.hostname,
        "pid": os.getpid(),
        "redelivered": bool((self.request.delivery_info or {}).get("redelivered")),
        "at": time.time(),
    }
    if os.environ.get("LB_RECORD_PG"):
        _record_pg(json.dumps(row))
    else:
        _results().rpush("executed", json.dumps(row))


def _record_pg(row: str) -> None:
    global _pg
    import psycopg

    if _pg is None or _pg.closed:  # one connection per pool process
        _pg = psycopg.connect(os.environ["LB_RECORD_PG"], autocommit=True, connect_timeout=5)
    _pg.execute("INSERT INTO executed (row) VALUES (%s)", (row,))
