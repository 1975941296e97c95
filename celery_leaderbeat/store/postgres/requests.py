"""The seam's request queue over :mod:`.requests_sql` (the CLI's triggers and backfills)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import lease_sql, requests_sql
from .events import channel_name


class PostgresRequests:
    """The requests of one app."""

    def __init__(self, place: Any) -> None:
        self.place = place
        self.channel = channel_name(place.schema, place.app)

    def push(self, request: str) -> None:
        """Queue ``request`` and wake the leader."""
        self.place.run(requests_sql.push, request, self.channel)

    def now_ms(self) -> int:
        """The server's time (ms): what a request is stamped with when queued."""
        return self.place.run(lease_sql.now_ms)  # type: ignore[no-any-return]

    def pop(self, limit: int = 1000) -> list[str]:
        return self.place.run(requests_sql.pop, limit)  # type: ignore[no-any-return]

    def requeue(self, requests: Sequence[str]) -> None:
        self.place.run(requests_sql.requeue, list(requests))

    def mark_backfilled(self, entry: str, slot_ms: int, request_id: str) -> bool:
        return self.place.run(  # type: ignore[no-any-return]
            requests_sql.mark_backfilled, entry, slot_ms, request_id)

    def backfilled(self, entry: str) -> set[int]:
        return self.place.run(requests_sql.backfilled, entry)  # type: ignore[no-any-return]
