"""Where kombu's Redis transport puts a message: the queues an exchange routes it to, at send.

kombu's Redis transport reads an exchange's bindings (the set
``_kombu.binding.<exchange>``) at every publish, so a queue bound later (a
worker started with a new ``-Q``, a second queue bound to a direct exchange)
receives the next message. A message built from a kept shape
(:mod:`.templates`) is routed the same way: its queues are looked up when it is
sent, with kombu's own exchange types, from bindings read once per batch (one
``SMEMBERS`` per exchange a batch's messages go through, none for Celery's usual
route to a queue by name; a burst is one or two batches, a tick's sends one): a
queue bound later receives the next batch's messages. A route's queues are looked
up once per batch too. Only direct and topic exchanges are routed here; a
fanout's ``PUBLISH`` (and any other exchange type) goes through kombu itself.
This uses parts of kombu's Redis channel that are not public API; it runs only
on the kombu releases the Redis form of messages is used with
(``one_step.KOMBU_RANGE``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from kombu.transport.virtual.exchange import DirectExchange, TopicExchange

#: one broker command as kombu's ``PublishBatch.add`` receives it: name, (key, argument)
Command = tuple[str, tuple[Any, ...]]

#: where a message goes: exchange, routing key, priority (as in the message's properties)
Route = tuple[str, str, int]


class Routes:
    """Routes messages of kept shapes as kombu's Redis channel would at publish.

    ``channel()`` is the kombu channel messages are built on. Bindings read are
    kept until :meth:`fresh` (called once per batch, before its messages are
    built): one round trip a batch, not one a chunk for each of a burst's chunks
    to wait for.
    """

    def __init__(self, channel: Callable[[], Any]) -> None:
        self.channel = channel
        self._tables: dict[str, list[tuple[str, ...]]] = {}
        #: per route, its commands with the payload left out (None), until :meth:`fresh`
        self._routed: dict[Route, list[tuple[str, str, Any]]] = {}

    def fresh(self) -> None:
        """Read bindings again for the next messages (a new batch is about to be sent)."""
        self._tables.clear()
        self._routed.clear()

    def route(self, envelope: dict[str, Any]) -> Route | None:
        """A message's route when it goes through an exchange routed here, else None
        (Celery's route to a queue by name: its key is fixed)."""
        info = envelope["properties"].get("delivery_info") or {}
        exchange = info.get("exchange")
        if not exchange or type(self.channel().typeof(exchange)) not in (DirectExchange,
                                                                         TopicExchange):
            return None
        priority = self.channel()._get_message_priority(envelope, reverse=False)
        return exchange, info.get("routing_key") or "", priority

    def commands(self, route: Route, payload: str) -> list[Command]:
        """The commands kombu's ``_put`` gives ``payload`` for each queue ``route`` reaches now."""
        routed = self._routed.get(route)
        if routed is None:
            routed = self._routed[route] = self._route(route)
        return [(name, (key, payload if arg is None else arg)) for name, key, arg in routed]

    def _route(self, route: Route) -> list[tuple[str, str, Any]]:
        """``route``'s commands, each (name, key, argument), the payload left out (None)."""
        channel = self.channel()
        exchange, routing_key, priority = route
        out: list[tuple[str, str, Any]] = []
        expires = channel._expires
        for queue in self.queues(exchange, routing_key):
            out.append(("lpush", channel._q_for_pri(queue, priority), None))
            if expires and queue in expires:
                out += [("pexpire", channel._q_for_pri(queue, step), expires[queue])
                        for step in channel.priority_steps]
        return out

    def queues(self, exchange: str, routing_key: str) -> list[str]:
        """The queues ``exchange`` routes ``routing_key`` to (kombu's ``_lookup`` and
        ``deliver``)."""
        channel = self.channel()
        kind = channel.typeof(exchange)
        table = self._tables.get(exchange)
        if table is None:
            table = self._tables[exchange] = channel.get_table(exchange)
        try:
            found = list(kind.lookup(table, exchange, routing_key, None))
        except KeyError:
            found = []
        default = channel.deadletter_queue
        if not found and default is not None:
            # kombu's own warning (its private module: imported where it is used, only on
            # the kombu releases this path runs on)
            from kombu.transport.virtual.base import UNDELIVERABLE_FMT, UndeliverableWarning

            warnings.warn(UndeliverableWarning(UNDELIVERABLE_FMT.format(
                exchange=exchange, routing_key=routing_key)), stacklevel=2)
            channel._new_queue(default)
            found = [default]
        if type(kind) is TopicExchange:
            found = [q for q in found if q and q != default]
        return found
