"""The events channel on Redis pub/sub: what wakes a waiting node at once.

Messages are hints, never state: a node that misses one (its subscription
dropped, a publish that failed) finds the same thing at its next poll. Who
says what: ``release.lua`` says ``released`` (standbys try for the lease at
once), the CLI says ``request`` after queueing a trigger or a backfill (the
leader looks at once). A save of a run-time entry says nothing: every node
looks at the entries' version on a wake it makes anyway.
"""

from __future__ import annotations

from typing import Any

from .keys import Keys
from .scripts import text

#: the lease was released (release.lua publishes it)
RELEASED = "released"
#: the CLI queued a request for the leader
REQUEST = "request"


class RedisSubscription:
    """One node's subscription to the events channel."""

    def __init__(self, client: Any, channel: str) -> None:
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(channel)

    def next(self, timeout: float) -> str | None:
        """The next message, waiting up to ``timeout`` s; None: none yet (or not a message)."""
        message = self._pubsub.get_message(timeout=timeout)
        return None if message is None else text(message.get("data"))


class RedisEvents:
    """The events channel of one key prefix."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def subscribe(self) -> RedisSubscription:
        return RedisSubscription(self.client, self.keys.events)

    def publish(self, message: str) -> None:
        self.client.publish(self.keys.events, message)
