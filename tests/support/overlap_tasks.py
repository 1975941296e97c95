"""A task for the overlap tests and bench: its run's span, seen from outside.

Loaded into test workers with ``-I tests.support.overlap_tasks``. ``ticking`` appends
``start``, then a ``tick`` every 50 ms, then ``end`` to the list ``ticks`` of the Redis
at ``LB_RECORD_URL``: a run killed by a signal leaves no ``end``, and its last tick
says when it last ran (within 50 ms).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tests.support.beatapp import app

TICK = 0.05


@app.task(name="tests.support.overlap_tasks.ticking", bind=True)
def ticking(self: Any, seconds: float = 1.0, stubborn: bool = False) -> None:
    """``stubborn``: a SystemExit (prefork's terminate) is caught and the run goes on."""
    import redis

    headers = self.request.headers or {}
    client = redis.Redis.from_url(os.environ["LB_RECORD_URL"])
    base = {"id": self.request.id, "pid": os.getpid(), "hostname": self.request.hostname,
            "slot": headers.get("leaderbeat_slot", getattr(self.request, "leaderbeat_slot", None))}
    client.rpush("ticks", json.dumps({**base, "phase": "start", "at": time.time()}))
    end = time.monotonic() + seconds
    while True:
        try:
            _tick_until(client, base, end)
            break
        except SystemExit:  # wherever in the loop the signal lands
            if not stubborn:
                raise
            client.rpush("ticks", json.dumps({**base, "phase": "caught", "at": time.time()}))
    client.rpush("ticks", json.dumps({**base, "phase": "end", "at": time.time()}))
    client.close()


def _tick_until(client: Any, base: dict[str, Any], end: float) -> None:
    while time.monotonic() < end:
        time.sleep(min(TICK, max(0.0, end - time.monotonic())))
        client.rpush("ticks", json.dumps({**base, "phase": "tick", "at": time.time()}))


def spans(client: Any) -> list[dict[str, Any]]:
    """One row per run, by start: id, slot, pid, start, last (last sign of life), ended."""
    runs: dict[str, dict[str, Any]] = {}
    for raw in client.lrange("ticks", 0, -1):
        row = json.loads(raw)
        run = runs.setdefault(row["id"], {"id": row["id"], "slot": row["slot"],
                                          "pid": row["pid"], "start": row["at"],
                                          "last": row["at"], "ended": False})
        run["last"] = max(run["last"], row["at"])
        run["ended"] = run["ended"] or row["phase"] == "end"
    return sorted(runs.values(), key=lambda r: r["start"])


def overlaps(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of runs of which the second started before the first's last sign of life."""
    found = []
    for i, run in enumerate(runs):
        for other in runs[i + 1:]:
            if other["start"] < run["last"]:
                found.append((run["slot"], other["slot"]))
    return found
