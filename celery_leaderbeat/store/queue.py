"""The CLI's requests for the leader, in Redis: a list, and what backfills sent.

``{prefix}:requests`` is a list of JSON requests: the CLI pushes one and says
``request`` on the events channel; the leader pops every pending one at once
(``LPOP`` with a count is atomic: one leader takes each); one it could not carry
out goes back to the head of the list. ``{prefix}:backfilled`` holds
``<entry>|<slot_ms>`` -> the backfill request that sent that slot, set with
``HSETNX``, so no two backfills send one slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .events import REQUEST
from .keys import Keys
from .scripts import text


class RedisRequests:
    """The requests queue of one key prefix."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def push(self, request: str) -> None:
        self.client.rpush(self.keys.requests, request)
        self.client.publish(self.keys.events, REQUEST)

    def now_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def pop(self, limit: int = 1000) -> list[str]:
        return [text(raw) for raw in self.client.lpop(self.keys.requests, limit) or []]

    def requeue(self, requests: Sequence[str]) -> None:
        if requests:
            self.client.lpush(self.keys.requests, *reversed(requests))

    def mark_backfilled(self, entry: str, slot_ms: int, request_id: str) -> bool:
        return bool(self.client.hsetnx(self.keys.backfilled, f"{entry}|{slot_ms}", request_id))

    def backfilled(self, entry: str) -> set[int]:
        fields = (text(f) for f in self.client.hkeys(self.keys.backfilled))
        return {int(f.rpartition("|")[2]) for f in fields if f.rpartition("|")[0] == entry}
