"""Read what beat really enqueued, straight from the test broker.

Kombu's Redis transport publishes by ``LPUSH <queue> <json>`` on the broker's
database (newest at the head). A message with a priority above 0 goes to
``<queue>\\x06\\x16<step>`` (steps 3, 6, 9), so all four lists are drained.
Each list item is JSON::

    {"body": "<base64 of json [args, kwargs, embed]>",
     "content-encoding": "utf-8", "content-type": "application/json",
     "headers": {"task": ..., "id": ..., "leaderbeat_slot": ..., ...},
     "properties": {"correlation_id": <id>, "delivery_info": {...},
                    "body_encoding": "base64", "delivery_tag": ..., ...}}
"""

from __future__ import annotations

import base64
import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)


@dataclass(frozen=True)
class Message:
    """One task message as the broker holds it."""

    task: str
    id: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str = "celery"
    #: wall time the recorder drained it: an upper bound on when it was enqueued
    received: float = 0.0

    @property
    def entry(self) -> str | None:
        """The ``leaderbeat_entry`` header (None from stock beat)."""
        return self.headers.get("leaderbeat_entry")

    @property
    def slot(self) -> Any:
        """The ``leaderbeat_slot`` header (None from stock beat)."""
        return self.headers.get("leaderbeat_slot")

    @property
    def epoch(self) -> Any:
        """The ``leaderbeat_epoch`` header (None from stock beat)."""
        return self.headers.get("leaderbeat_epoch")

    @classmethod
    def parse(cls, raw: bytes | str, queue: str = "celery", received: float = 0.0) -> Message:
        """Parse one list item written by kombu's Redis transport."""
        data = json.loads(raw)
        headers: dict[str, Any] = data.get("headers") or {}
        properties: dict[str, Any] = data.get("properties") or {}
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        body = data.get("body")
        if body is not None and data.get("content-type") == "application/json":
            if properties.get("body_encoding") == "base64":
                body = base64.b64decode(body)
            decoded = json.loads(body)
            if isinstance(decoded, list) and len(decoded) >= 2:
                args, kwargs = list(decoded[0]), dict(decoded[1])
        return cls(
            task=str(headers.get("task")),
            id=str(headers.get("id") or properties.get("correlation_id")),
            headers=headers,
            properties=properties,
            args=args,
            kwargs=kwargs,
            queue=queue,
            received=received,
        )

    @property
    def lateness(self) -> float:
        """Seconds from the slot to when the recorder saw the message (an upper bound)."""
        from datetime import datetime

        return self.received - datetime.fromisoformat(str(self.slot)).timestamp()


class Draining:
    """What a recorder offers beyond its own ``drain``: the messages seen so far, and a
    wait for a number of them (a Redis list or an AMQP queue alike)."""

    queue: str
    messages: list[Message]

    def drain(self) -> list[Message]:
        raise NotImplementedError

    def drain_all(self) -> list[Message]:
        """Drain, then return every message seen so far (not only the new ones)."""
        self.drain()
        return self.messages

    def wait_for(self, count: int, timeout: float = 10.0, task: str | None = None) -> list[Message]:
        """Drain until at least ``count`` messages (of ``task``, if given) were seen in total."""
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            seen = [m for m in self.messages if task is None or m.task == task]
            if len(seen) >= count:
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"expected {count} messages{f' of {task}' if task else ''} "
                    f"within {timeout}s on queue {self.queue!r}, saw {len(seen)}"
                )
            time.sleep(0.05)

    def watch(self, seconds: float) -> list[Message]:
        """Drain every 50 ms for ``seconds`` (so each message's ``received`` is close to
        when it was published); the new messages."""
        start = len(self.messages)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.drain()
            time.sleep(0.05)
        return self.messages[start:]


class Recorder(Draining):
    """Drains one queue of the broker and remembers every message seen.

    ``drain()`` returns the messages published since the last drain, oldest
    first, and removes them from Redis atomically (LRANGE + DEL in MULTI), so
    no message is counted twice and none is lost to a concurrent LPUSH.
    """

    def __init__(self, broker_client: redis.Redis, queue: str = "celery") -> None:
        self.client = broker_client
        self.queue = queue
        self.messages: list[Message] = []

    def keys(self) -> list[str]:
        """The list keys kombu may use for this queue (one per priority step)."""
        return [self.queue] + [f"{self.queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS]

    def drain(self) -> list[Message]:
        """Remove and return the new messages, oldest first; also kept in ``messages``."""
        with self.client.pipeline(transaction=True) as pipe:
            for key in self.keys():
                pipe.lrange(key, 0, -1)
                pipe.delete(key)
            results = pipe.execute()
        new: list[Message] = []
        received = time.time()
        for items in results[0::2]:
            new.extend(Message.parse(raw, self.queue, received) for raw in reversed(items))
        self.messages.extend(new)
        return new

def duplicates(messages: Iterable[Message]) -> list[tuple[str | None, Any]]:
    """The (entry, slot) pairs seen more than once: must be empty (guarantee G1)."""
    counts = Counter((m.entry, _hashable(m.slot)) for m in messages)
    return sorted(
        ((entry, slot) for (entry, slot), n in counts.items() if n > 1),
        key=lambda pair: (str(pair[0]), str(pair[1])),
    )


def slots_by_entry(messages: Iterable[Message]) -> dict[str | None, list[Any]]:
    """Entry name -> its slots in publish order (duplicates kept, to be visible)."""
    grouped: dict[str | None, list[Any]] = defaultdict(list)
    for m in messages:
        grouped[m.entry].append(m.slot)
    return dict(grouped)


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value
