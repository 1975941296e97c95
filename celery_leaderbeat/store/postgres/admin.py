"""What the CLI reads and does beyond the lease and the slots, on PostgreSQL: step a
leader down (fenced), pauses, notes in the history, follow it, forget nodes, reset."""

from __future__ import annotations

import json
import time
from typing import Any

from . import lease_sql, state_sql
from .events import channel_name
from .place import Place
from .schema import qualified

#: the history's own columns; a note's other fields go to ``extra``
_COLUMNS = ("event", "entry", "slot", "node", "epoch", "detail")

_NOTE = """
INSERT INTO {schema}.history (app, event, entry, slot_ms, node, epoch, detail, extra)
VALUES (%(app)s, %(event)s, %(entry)s, %(slot_ms)s, %(node)s, %(epoch)s, %(detail)s,
        %(extra)s)
"""
_FORGET_NODES = "DELETE FROM {schema}.nodes WHERE app = %(app)s AND node = ANY(%(nodes)s)"
#: every table of an app's state but the run-time entries (they stay)
_RESET_TABLES = ("lease", "slots", "grants", "overtaken", "definitions", "paused", "history",
                 "nodes", "requests", "backfilled", "lost_reports", "guard_runs",
                 "guard_fence", "guard_locks", "guard_waiting", "guard_decisions")


class PostgresAdmin:
    """The CLI's calls for one app."""

    def __init__(self, place: Place, history_length: int) -> None:
        self.place = place
        self.history_length = history_length

    @property
    def where(self) -> str:
        return f"schema {self.place.schema!r}, app {self.place.app!r}"

    def step_down(self, token: str, reason: str) -> bool:
        """Release the lease held under ``token`` (fenced by its holder and epoch)."""
        holder, _, epoch = token.rpartition("|")
        if not epoch.isdigit():
            return False
        return bool(self.place.run(lease_sql.release, holder=holder, epoch=int(epoch),
                                   node=holder.rpartition("/")[0] or holder, reason=reason,
                                   channel=channel_name(self.place.schema, self.place.app)))

    def paused(self) -> dict[str, dict[str, Any]]:
        return self.place.run(state_sql.paused)  # type: ignore[no-any-return]

    def pause(self, name: str, record: dict[str, Any]) -> None:
        self.place.run(state_sql.pause, name, record)

    def resume(self, name: str) -> bool:
        return bool(self.place.run(state_sql.resume, name))

    def note(self, fields: dict[str, str]) -> None:
        """Add one event to the history."""
        slot = fields.get("slot", "")
        epoch = fields.get("epoch", "")
        extra = {k: v for k, v in fields.items() if k not in _COLUMNS}
        params = {"event": fields.get("event", "note"), "entry": fields.get("entry", ""),
                  "slot_ms": int(slot) if slot.isdigit() else None,
                  "node": fields.get("node", ""), "epoch": int(epoch) if epoch.isdigit() else 0,
                  "detail": fields.get("detail", ""),
                  "extra": json.dumps(extra) if extra else None}
        self.place.run(note, params)

    def all_history(self) -> list[dict[str, str]]:
        """Every history event kept, oldest first."""
        return self.place.run(state_sql.history,  # type: ignore[no-any-return]
                              self.history_length * 2 + 1000)

    def follow(self, cursor: str | None = None, block_ms: int = 1000
               ) -> tuple[str, list[dict[str, str]]]:
        """Events after ``cursor`` (None: from now), polling up to ``block_ms``."""
        last_id = cursor or "$"
        if last_id == "$":
            newest = self.place.run(state_sql.history, 1)
            last_id = newest[-1]["id"] if newest else "0-0"
        after = int(last_id.rpartition("-")[2] or 0)
        deadline = time.monotonic() + block_ms / 1000
        while True:
            rows = self.place.run(state_sql.history, 1000, after)
            if rows or time.monotonic() >= deadline:
                return (rows[-1]["id"] if rows else last_id), rows
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def forget_nodes(self, node_ids: list[str]) -> None:
        if node_ids:
            self.place.run(forget_nodes, node_ids)

    def reset(self) -> int:
        """Delete this app's state (the lease, its epoch and generation with it: nodes
        that remember lift both again); how many rows went."""
        return int(self.place.run(reset))


def note(conn: Any, schema: str, app: str, params: dict[str, Any]) -> None:
    conn.execute(qualified(_NOTE, schema), {"app": app, **params})


def forget_nodes(conn: Any, schema: str, app: str, node_ids: list[str]) -> None:
    conn.execute(qualified(_FORGET_NODES, schema), {"app": app, "nodes": node_ids})


def reset(conn: Any, schema: str, app: str) -> int:
    """Delete every row of ``app`` in one transaction; how many went."""
    gone = 0
    with conn.transaction():
        for table in _RESET_TABLES:
            gone += conn.execute(qualified(
                "DELETE FROM {schema}." + table + " WHERE app = %(app)s", schema),
                {"app": app}).rowcount
    return gone
