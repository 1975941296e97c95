"""Read back what beats published to a RabbitMQ queue of the test's own, every copy.

:class:`AmqpRecorder` reads as :class:`~tests.support.recorder.Recorder` does
(``drain``, ``drain_all``, ``wait_for``, ``watch``), so :func:`~tests.support.recorder.duplicates` and
:func:`~tests.support.recorder.slots_by_entry` judge it the same way. The queue is
declared before any beat starts (nothing published before a consumer exists is
dropped) and deleted at close.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import kombu

from .recorder import Draining, Message


class AmqpRecorder(Draining):
    """Drains one queue on the broker at ``url``; remembers every message seen."""

    def __init__(self, url: str, queue: str | None = None) -> None:
        self.url = url
        self.queue = queue or f"lb-test-{secrets.token_hex(4)}"
        self.conn = kombu.Connection(url, connect_timeout=5)
        self.conn.ensure_connection(max_retries=3)
        # celery declares its default queue durable; the same arguments, or a 406
        kombu.Queue(self.queue, durable=True, channel=self.conn.default_channel).declare()
        self.messages: list[Message] = []

    def drain(self) -> list[Message]:
        """Take and return the new messages, oldest first; also kept in ``messages``."""
        channel = self.conn.default_channel
        new: list[Message] = []
        while (raw := channel.basic_get(self.queue, no_ack=True)) is not None:
            new.append(_message(raw, self.queue, time.time()))
        self.messages.extend(new)
        return new

    def close(self) -> None:
        try:
            kombu.Queue(self.queue, channel=self.conn.default_channel).delete()
        finally:
            self.conn.release()


def _message(raw: Any, queue: str, received: float) -> Message:
    headers = dict(raw.headers or {})
    properties = dict(raw.properties or {})
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if properties.get("content_type") == "application/json":
        body = json.loads(raw.body)
        if isinstance(body, list):  # Celery's protocol 2: [args, kwargs, embed]
            args, kwargs = list(body[0]), dict(body[1])
    return Message(task=str(headers.get("task")),
                   id=str(headers.get("id") or properties.get("correlation_id")),
                   headers=headers, properties=properties, args=args, kwargs=kwargs,
                   queue=queue, received=received)
