"""RedBeat's schedule read from its Redis, for the import (``celery leaderbeat import-redbeat``).

RedBeat keeps a sorted set ``<prefix>:schedule`` of entry keys; each key
``<prefix><name>`` is a hash with a ``definition`` and a ``meta`` in RedBeat's
JSON (decoded by :mod:`celery_leaderbeat.ops.redbeat_import`). Read with plain
Redis commands: RedBeat need not be installed. Nothing is written.
"""

from __future__ import annotations

from .connection import make_client
from .scripts import text

#: RedBeat's Redis answers within this many seconds, or the import says it is unreachable
TIMEOUT = 10.0


def read_redbeat(url: str, prefix: str) -> list[tuple[str, bytes | None, bytes | None]]:
    """(key, definition, meta) of every entry in RedBeat's schedule, two round trips."""
    client = make_client(url, {}, TIMEOUT)
    try:
        keys = [text(k) for k in client.zrange(f"{prefix}:schedule", 0, -1)]
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, "definition", "meta")
        return [(key, *found) for key, found in zip(keys, pipe.execute())]
    finally:
        client.close()
