"""What a consumer sees of leaderbeat's messages, read off a broker's queues."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def take_messages(conn: Any, queues: Iterable[str], *,
                  delivery_info: bool = False) -> dict[tuple[str, str], tuple]:
    """Every message in ``queues`` (taken off them) by its (entry, slot) headers: the queue,
    headers, properties but the delivery tag, body, content type and encoding (and, with
    ``delivery_info``, kombu's delivery info). A queue never declared holds nothing."""
    out = {}
    channel = conn.default_channel
    for queue in queues:
        try:
            while (message := channel.basic_get(queue, no_ack=True)) is not None:
                props = dict(message.properties)
                props.pop("delivery_tag", None)
                seen = (queue, message.headers, props, message.body, message.content_type,
                        message.content_encoding)
                out[(message.headers["leaderbeat_entry"], message.headers["leaderbeat_slot"])] = (
                    (*seen, message.delivery_info) if delivery_info else seen)
        except conn.channel_errors:  # not declared (RabbitMQ closes the channel): nothing sent
            channel = conn.channel()
    return out
