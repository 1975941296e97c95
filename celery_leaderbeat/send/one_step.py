"""Claim and enqueue in one step when the broker is the Redis that holds leaderbeat's state.

Celery builds each message as it always does (``apply_async``: routes,
queues, priorities, ``global_keyprefix``, ``before_task_publish``), and kombu
routes it, but into a collector standing in for kombu's own publish batch
(``Producer.batch()``; the Redis transport hands a batch each message's final
commands through ``batch.add``). Those commands, ``LPUSH`` to the queue's
priority list and ``PEXPIRE`` where a queue expires, travel with the claim,
and the claim script runs them for exactly the slots it grants: a slot is
granted and enqueued, or neither. ``after_task_publish`` fires for each one
granted. A message that goes through an exchange is routed when it is sent
(:mod:`.routing`), as kombu routes each publish.

This leans on parts of kombu's Redis transport that are not public API, so
it is checked at start-up (:func:`fast_path_problem`). Where it cannot be
exact the chunk goes out on the plain path after the claim instead (said once
at start-up, and :func:`one_step_fallback` says why): a broker on another
server or database, Redis Cluster or Sentinel, a transport option this module
does not know, a kombu outside :data:`KOMBU_RANGE`,
``leaderbeat_min_replicas``, or ``leaderbeat_atomic_enqueue = False``. A chunk
sent while a ``before_task_publish`` receiver is connected is claimed first
and built after, so the signal fires only for slots granted. A single message
whose routing gives other commands (fanout: ``PUBLISH``) is published after
its claim was granted, with the very commands kombu computed.
"""

from __future__ import annotations

from typing import Any

import kombu

from .base import SchedulerSide
from .plain import DeclaringOnce
from .templates import Captured

#: commands the claim script runs for a message (kombu's Redis transport, 5.7)
EXACT = frozenset({"lpush", "pexpire"})

#: the kombu releases whose Redis transport the one-step path knows (its batch's commands,
#: its routing): >=5.7,<5.8; outside it every chunk is sent after its claim
KOMBU_RANGE = ((5, 7), (5, 8))

#: broker transport options that change nothing in a message's final commands, or
#: that kombu applies while it computes them (priority steps, separator, key prefix)
KNOWN_OPTIONS = frozenset({
    "visibility_timeout", "global_keyprefix", "priority_steps", "sep", "queue_order_strategy",
    "fanout_prefix", "fanout_patterns", "socket_timeout", "socket_connect_timeout",
    "socket_keepalive", "socket_keepalive_options", "max_connections", "health_check_interval",
    "client_name", "polling_interval", "brpop_timeout", "unacked_key", "unacked_index_key",
    "unacked_mutex_key", "unacked_mutex_expire", "unacked_restore_limit", "max_retries",
    "interval_start", "interval_step", "interval_max", "retry_policy", "ssl",
})

#: one broker command: name ('lpush' / 'pexpire'), the final key, its argument
Command = tuple[str, str, Any]


class _Collector:
    """Stands in for kombu's ``PublishBatch``: keeps the commands, runs none."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.commands: list[tuple[str, tuple[Any, ...]]] = []

    def publish(self, message: Any, **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))

    def flush(self) -> None:
        """Nothing to flush: the claim script runs the commands."""

    def discard(self) -> None:
        self.commands.clear()

    def close(self) -> None:
        """Holds no connection."""


class CaptureProducer(DeclaringOnce):
    """A producer whose every publish is routed into a :class:`_Collector`, then stopped.

    Raising after routing keeps Celery from firing ``after_task_publish`` and
    from sending a ``task-sent`` event for a message that is not enqueued yet.
    """

    def publish(self, body: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if not self.supports_batch_publish:  # kombu would publish at once: never here
            raise RuntimeError("the broker channel no longer batches: cannot capture")
        collector = _Collector(self.channel)
        self.channel.create_publish_batch = lambda max_size: collector
        with self.batch():  # type: ignore[no-untyped-call]
            super().publish(body, **kwargs)  # type: ignore[no-untyped-call]
        raise Captured(body, kwargs, collector.commands)


class CallCapture(DeclaringOnce):
    """A producer that keeps Celery's call to ``publish`` and stops it (any transport)."""

    def publish(self, body: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise Captured(body, kwargs)


def kombu_known() -> bool:
    """Whether the installed kombu is in :data:`KOMBU_RANGE`."""
    low, high = KOMBU_RANGE
    return low <= tuple(kombu.VERSION[:2]) < high


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)


def one_step_fallback(scheduler: SchedulerSide) -> str | None:
    """Why ``scheduler``'s chunks do not go out claimed and enqueued in one step, or None
    when they do (for ``status`` and a metric). Before its first send: "not checked yet"."""
    enqueuer = scheduler.enqueuer
    if enqueuer is None:
        return "not checked yet (no chunk sent by this beat)"
    reason: str | None = enqueuer.fallback
    return reason


def routes_redis(conn: Any) -> bool:
    """Whether kombu 5.7's plain Redis transport routes ``conn``'s messages into batches."""
    from kombu.transport import redis as kombu_redis

    if not kombu_known() or type(conn.transport) is not kombu_redis.Transport:
        return False
    channel = conn.default_channel
    return type(channel) is kombu_redis.Channel and bool(channel.supports_batch_publish)


def fast_path_problem(app: Any, client: Any, min_replicas: int) -> str | None:
    """Why claim-and-enqueue cannot be exact with this broker; None when it can."""
    if not kombu_known():
        return (f"kombu {kombu.__version__} (the commands are known for kombu "
                f">={_dotted(KOMBU_RANGE[0])},<{_dotted(KOMBU_RANGE[1])})")
    if min_replicas:
        return "leaderbeat_min_replicas is set (a claim is confirmed after it ran)"
    if client is None:
        return "the store is not Redis (the broker's commands cannot ride on its claims)"
    pool = getattr(client, "connection_pool", None)
    if pool is None or not hasattr(pool, "connection_kwargs"):
        return "leaderbeat's Redis is a Cluster or has no single server"
    unknown = sorted(set(app.conf.broker_transport_options or {}) - KNOWN_OPTIONS)
    if unknown:
        return f"broker transport option(s) {', '.join(unknown)} not understood here"
    from kombu.transport import redis as kombu_redis

    with app.connection_for_write() as conn:
        if type(conn.transport) is not kombu_redis.Transport:  # known without connecting
            return f"the broker transport is {conn.transport_cls!r}, not plain Redis"
        channel = conn.default_channel
        if type(channel) is not kombu_redis.Channel:
            return f"the broker transport is {conn.transport_cls!r}, not plain Redis"
        if not channel.supports_batch_publish:
            return "the broker connection retries commands (retry_on_timeout)"
        broker = channel.client.connection_pool.connection_kwargs
    ours = pool.connection_kwargs
    where = ("host", "port", "path", "db")
    if [broker.get(k) for k in where] != [ours.get(k) for k in where]:
        return "the broker is another Redis server or database than leaderbeat's"
    return None
