"""Reading the demo's Redis: who leads, what was sent (history), what ran (worker records).

The demo never asks a beat anything: all it knows comes from the keys any
operator could read, plus the beats' logs to put a name on a node id. The same reads
on PostgreSQL's tables: :class:`~.postgres.PostgresWatcher`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import redis

from ..store.keys import Keys
from .app import RUNS_KEY
from .procs import Proc

_ELECTED_LOG = re.compile(r"leaderbeat: (\S+) elected leader \(epoch (\d+)\)")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Watcher:
    """Incremental reads of the lease, the node registry, the history and the runs."""

    def __init__(self, client: redis.Redis | None, records: redis.Redis | None,
                 keys: Keys | None, beats: Sequence[Proc], broker: redis.Redis | None = None
                 ) -> None:
        self.client: Any = client
        self.records: Any = records
        self.keys: Any = keys
        self.broker: Any = broker
        self.beats = beats
        self.beat_of: dict[str, int] = {}  # node id -> beat index
        self.node_of_epoch: dict[int, str] = {}
        self.history: list[dict[str, str]] = []
        self.runs: list[dict[str, Any]] = []
        self._last_id = "0-0"

    def leader(self) -> tuple[str, int] | None:
        """(node id, epoch) from ``{prefix}:leader``, None while nobody holds the lease."""
        raw = self._lease()
        if raw is None:
            return None
        node, _, epoch = raw.rpartition("|")
        self.identify(node)
        return node, int(epoch)

    def identify(self, node: str) -> int | None:
        """Which beat runs ``node``: by the pid in the node registry, else by the logs."""
        if node in self.beat_of:
            return self.beat_of[node]
        record = self._node_record(node)
        pid = record.get("pid") if record else None
        for index, beat in enumerate(self.beats):
            if beat.pid == pid or any(m.group(1) == node
                                      for m in _ELECTED_LOG.finditer(beat.log_text())):
                self.beat_of[node] = index
                return index
        return None

    def name(self, node: str | None) -> str:
        """``beat 1 (pid 4242)`` for a node id, or the id itself when no beat matches."""
        index = self.identify(node) if node else None
        if index is None:
            return node or "?"
        return f"beat {index} (pid {self.beats[index].pid})"

    def sender(self, epoch: Any) -> str:
        """Who sent a run, from its ``leaderbeat_epoch`` header (0: a standby rescued it,
        holding no lease)."""
        if str(epoch) == "0":
            return "a standby (rescue, epoch 0)"
        try:
            node = self.node_of_epoch.get(int(epoch))
        except (TypeError, ValueError):
            node = None
        index = self.identify(node) if node else None
        return f"beat {index} (epoch {epoch})" if index is not None else f"epoch {epoch}"

    def new_history(self) -> list[dict[str, str]]:
        """History events written since the last call, oldest first, each with its ``id``
        (``<ms>-<n>``: the time it was written, as a Redis stream id)."""
        new = self._history_since()
        for row in new:
            if row.get("event") == "elected" and row.get("epoch"):
                self.node_of_epoch[int(row["epoch"])] = row.get("node", "")
        self.history += new
        return new

    def _lease(self) -> str | None:
        """``node|epoch`` of the lease's holder (None: nobody holds it)."""
        raw = self.client.get(self.keys.leader)
        return None if raw is None else _text(raw)

    def _node_record(self, node: str) -> dict[str, Any] | None:
        raw = self.client.hget(self.keys.nodes, node)
        return dict(json.loads(_text(raw))) if raw else None

    def _history_since(self) -> list[dict[str, str]]:
        rows: list[tuple[Any, dict[Any, Any]]] = self.client.xrange(
            self.keys.history, min=f"({self._last_id}")
        new = []
        for event_id, fields in rows:
            row = {_text(k): _text(v) for k, v in fields.items()}
            row["id"] = self._last_id = _text(event_id)
            new.append(row)
        return new

    def new_runs(self) -> list[dict[str, Any]]:
        """Runs the worker recorded since the last call."""
        raw = self.records.lrange(RUNS_KEY, len(self.runs), -1)
        new = [json.loads(_text(item)) for item in raw]
        self.runs += new
        return new

    def slot_states(self) -> dict[str, tuple[int, str]]:
        """Entry -> (slot ms, state letter) of its last slot, as the leader stored it."""
        out = {}
        for name, value in self.client.hgetall(self.keys.slots).items():
            slot, _, state = _text(value).split("|")
            out[_text(name)] = (int(slot), state)
        return out

    def pending(self) -> int:
        """Messages the worker has not finished: still queued, or delivered but unacked."""
        return int(self.broker.llen("celery")) + int(self.broker.hlen("unacked"))

    def close(self) -> None:
        """Nothing to close: the demo's Redis clients go with the server."""
