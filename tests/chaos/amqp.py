"""RabbitMQ for the soak: a topology of the run's own, and a consumer recording every publish.

Celery publishes a task to the default exchange ('') when the queue's exchange is
direct; nothing can be bound there. So the run's queue gets a *topic* exchange of its
own (``task_default_exchange_type = "topic"``): the workers' queue and a recording
queue (bound ``#``) each receive every message beat publishes; the recorder drains its
copy with ``no_ack``. RabbitMQ is never faulted, so the record is complete. Every name
carries the run's tag; :meth:`Topology.delete` removes them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import kombu
import kombu.exceptions
from amqp.exceptions import AMQPError as amqp_errors

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


@dataclass(frozen=True)
class Published:
    """One message as the recording queue received it."""

    entry: str | None
    slot: Any
    id: str
    epoch: Any
    received: float


class Topology:
    """The run's exchange, the workers' queue and the recording queue."""

    def __init__(self, tag: str, url: str = AMQP_URL) -> None:
        self.url = url
        self.queue = f"lb-soak-{tag}"
        self.exchange = kombu.Exchange(self.queue, type="topic", durable=True)
        self.work = kombu.Queue(self.queue, self.exchange, routing_key=self.queue)
        self.record = kombu.Queue(f"{self.queue}.record", self.exchange, routing_key="#")

    def settings(self) -> dict[str, Any]:
        """Celery settings that make beat publish, and workers consume, on this topology."""
        return {"task_default_queue": self.queue, "task_default_exchange": self.queue,
                "task_default_exchange_type": "topic", "task_default_routing_key": self.queue}

    def declare(self) -> None:
        with kombu.Connection(self.url, connect_timeout=5) as conn:
            channel = conn.channel()
            for queue in (self.work, self.record):
                queue.bind(channel).declare()

    def delete(self) -> list[str]:
        """Remove the run's queues and exchange; the errors met (teardown goes on)."""
        errors = []
        try:
            with kombu.Connection(self.url, connect_timeout=5) as conn:
                channel = conn.channel()
                for queue in (self.work, self.record):
                    queue.bind(channel).delete()
                self.exchange.bind(channel).delete()
        except (OSError, kombu.exceptions.KombuError, amqp_errors) as exc:
            errors.append(repr(exc))
        return errors

    def backlog(self) -> int:
        """Messages ready in the workers' queue (unacknowledged ones not counted)."""
        with kombu.Connection(self.url, connect_timeout=5) as conn:
            _, count, _ = self.work.bind(conn.channel()).queue_declare(passive=True)
            return int(count)


class AmqpRecorder(threading.Thread):
    """Consumes the recording queue; ``messages`` is every publish seen, in arrival order."""

    def __init__(self, topology: Topology) -> None:
        super().__init__(name="chaos-amqp-recorder", daemon=True)
        self.topology = topology
        self.lock = threading.Lock()
        self.messages: list[Published] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with kombu.Connection(self.topology.url, connect_timeout=5) as conn, \
                        conn.Consumer(self.topology.record, callbacks=[self._on_message],
                                      no_ack=True, accept=["json"]):
                    while not self._halt.is_set():
                        try:
                            conn.drain_events(timeout=0.5)
                        except TimeoutError:
                            continue
            except (OSError, kombu.exceptions.KombuError, amqp_errors) as exc:
                # RabbitMQ is not faulted: a lost connection goes in the report
                self.errors.append(f"{time.time():.1f}: {exc!r}")
                self._halt.wait(0.5)

    def _on_message(self, body: Any, message: Any) -> None:
        headers = message.headers or {}
        row = Published(headers.get("leaderbeat_entry"), headers.get("leaderbeat_slot"),
                        str(headers.get("id")), headers.get("leaderbeat_epoch"), time.time())
        with self.lock:
            self.messages.append(row)

    def drain(self) -> None:
        """For symmetry with the Redis recorder: the consumer drains by itself."""

    def snapshot(self) -> list[Published]:
        with self.lock:
            return list(self.messages)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
