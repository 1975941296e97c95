"""What a test of real beats on a PostgreSQL store reads straight from the server: the
lease's holder, the slots the history records as not sent, a RabbitMQ queue's depth.

    url = store_url(cluster.port)                     # leaderbeat_store_url of the beats
    node = wait_holder(cluster.conninfo, key_prefix)  # "host:pid:random" of the leader
    beat = by_pid(beats, pid_of(node))
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import psycopg

SCHEMA = "leaderbeat"


def store_url(*ports: int, **params: str) -> str:
    """A libpq URL of the server(s) on 127.0.0.1 at ``ports`` (several: libpq tries each in
    turn, ``target_session_attrs`` choosing among them)."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
    query = "&".join(f"{k}={v}" for k, v in {"connect_timeout": "3", **params}.items())
    return f"postgresql://postgres@{hosts}/postgres?{query}"


def holder(conninfo: str, prefix: str) -> tuple[str, int] | None:
    """(node, epoch) of the unexpired lease of app ``prefix``; None when nobody holds it
    or the server does not answer."""
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(f"SELECT holder, epoch FROM {SCHEMA}.lease WHERE app = %s "
                               "AND holder IS NOT NULL AND expires_at > clock_timestamp()",
                               (prefix,)).fetchone()
    except psycopg.Error:
        return None
    return (str(row[0]), int(row[1])) if row else None


def first_holder(conninfo: str, prefix: str, *, other_than: str | None = None,
                 timeout: float = 30.0) -> str | None:
    """The first node seen holding the lease (not ``other_than``), polled until
    ``timeout``; None when nobody did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = holder(conninfo, prefix)
        if held and held[0] != other_than:
            return held[0]
        time.sleep(0.05)
    return None


def wait_holder(conninfo: str, prefix: str, *, other_than: str | None = None,
                timeout: float = 30.0) -> str:
    """The node holding the lease (not ``other_than``), polled until ``timeout``."""
    found = first_holder(conninfo, prefix, other_than=other_than, timeout=timeout)
    if found is None:
        raise AssertionError(f"no leader (other than {other_than}) within {timeout} s")
    return found


def pid_of(node: str) -> int:
    """The pid in a node id ``host:pid:random``."""
    return int(node.split(":")[-2])


def by_pid(beats: Iterable[Any], pid: int) -> Any:
    return next(b for b in beats if b.pid == pid)


def recorded_unsent(conninfo: str, prefix: str) -> set[tuple[str, int]]:
    """(entry, slot ms) of every slot the history records ``missed`` or ``unsent`` (an
    aggregate row naming no slot is left out)."""
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=3) as conn:
        rows = conn.execute(f"SELECT entry, slot_ms FROM {SCHEMA}.history WHERE app = %s "
                            "AND event IN ('missed', 'unsent') AND slot_ms IS NOT NULL",
                            (prefix,)).fetchall()
    return {(str(entry), int(slot)) for entry, slot in rows}


def slot_ms(value: Any) -> int:
    """A ``leaderbeat_slot`` header (ISO time) as epoch milliseconds."""
    return round(datetime.fromisoformat(str(value)).timestamp() * 1000)


def queue_depth(recorder: Any) -> int:
    """Messages waiting in an :class:`~tests.support.amqp_recorder.AmqpRecorder`'s queue."""
    _, count, _ = recorder.conn.default_channel.queue_declare(recorder.queue, passive=True)
    return int(count)


def unaccounted(messages: Iterable[Any], recorded: set[tuple[str, int]], entries: Iterable[str],
                step_ms: int, since_ms: int, until_ms: int) -> list[str]:
    """The slots of interval ``entries`` in ``since_ms .. until_ms`` neither sent nor
    recorded as not sent. An entry's grid is ``step_ms`` through its first slot sent,
    reaching back as far as the first slot sent of any entry (an entry whose first
    slots were lost is on the same grid)."""
    sent = {(str(m.entry), slot_ms(m.slot)) for m in messages}
    if not sent:
        return ["nothing was sent"]
    earliest = min(s for _, s in sent)
    out = []
    for entry in entries:
        mine = [s for e, s in sent if e == entry]
        if not mine:
            out.append(f"{entry}: nothing sent")
            continue
        anchor = min(mine) - (min(mine) - earliest) // step_ms * step_ms
        start = anchor + max(0, -(-(since_ms - anchor) // step_ms)) * step_ms
        for slot in range(start, until_ms + 1, step_ms):
            if (entry, slot) not in sent and (entry, slot) not in recorded:
                out.append(f"{entry}@{datetime.fromtimestamp(slot / 1000).isoformat()}")
    return out
