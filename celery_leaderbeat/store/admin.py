"""What the CLI reads and does in Redis beyond the lease and the slots.

Every write here is one a running cluster handles safely: a step-down is the
release script under the leader's own token (fenced: nothing more is granted
under it), a pause is read at the entry's next claim, a forgotten node writes
its record again if it is alive, and ``reset`` leaves the run-time entries'
definitions alone.
"""

from __future__ import annotations

import json
from typing import Any

from .scripts import RedisPart, text


class RedisAdmin(RedisPart):
    """The CLI's side of one key prefix."""

    def step_down(self, token: str, reason: str) -> bool:
        return bool(self.scripts.release(keys=[self.keys.leader, self.keys.history],
                                  args=[token, self.config.history_length, self.keys.events,
                                        reason]))

    def paused(self) -> dict[str, dict[str, Any]]:
        return {text(k): json.loads(text(v))
                for k, v in self.client.hgetall(self.keys.paused).items()}

    def pause(self, name: str, record: dict[str, Any]) -> None:
        self.client.hset(self.keys.paused, name, json.dumps(record))

    def resume(self, name: str) -> bool:
        return bool(self.client.hdel(self.keys.paused, name))

    def note(self, fields: dict[str, str]) -> None:
        self.client.xadd(self.keys.history, fields, maxlen=self.config.history_length,
                         approximate=True)

    def all_history(self) -> list[dict[str, str]]:
        return [_row(event_id, fields)
                for event_id, fields in self.client.xrange(self.keys.history)]

    def follow(self, cursor: str | None = None, block_ms: int = 1000
               ) -> tuple[str, list[dict[str, str]]]:
        if cursor is None:  # from now: after the newest event, so none written next is missed
            newest = self.client.xrevrange(self.keys.history, count=1)
            cursor = text(newest[0][0]) if newest else "0-0"
        reply = self.client.xread({self.keys.history: cursor}, block=block_ms, count=500)
        rows = [_row(event_id, fields) for _, events in reply or [] for event_id, fields in events]
        return (rows[-1]["id"] if rows else cursor), rows

    def forget_nodes(self, node_ids: list[str]) -> None:
        if node_ids:
            self.client.hdel(self.keys.nodes, *node_ids)

    def reset(self) -> int:
        deleted = 0
        definitions = {self.keys.entries, self.keys.entries_meta, self.keys.entries_changed,
                       self.keys.entries_removed}
        for key in self.client.scan_iter(match=f"{self.keys.tag}:*", count=1000):
            if text(key) not in definitions:  # entries defined at run time stay
                deleted += int(self.client.delete(key))
        return deleted

    @property
    def where(self) -> str:
        return self.keys.tag


def _row(event_id: Any, fields: dict[Any, Any]) -> dict[str, str]:
    """A history event: its fields, its stream id (``<ms>-<seq>``) and the ms in it."""
    event = text(event_id)
    return {**{text(k): text(v) for k, v in fields.items()}, "id": event,
            "at": event.partition("-")[0]}
