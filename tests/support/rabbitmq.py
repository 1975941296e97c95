"""The RabbitMQ at 127.0.0.1:5672 (guest/guest) for the tests about it.

Skipped with the reason when it is unreachable, except under ``CI=true``, where
that is an error. Each test declares queues of its own (and deletes them).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def require_rabbitmq(url: str = AMQP_URL) -> str:
    """``url`` once a connection to it succeeds; else skip (fail under ``CI=true``)."""
    import kombu
    import kombu.exceptions

    conn = kombu.Connection(url, connect_timeout=3)
    unreachable = (OSError, kombu.exceptions.OperationalError, *conn.connection_errors)
    try:
        with conn:
            conn.ensure_connection(max_retries=1)
    except unreachable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"RabbitMQ is required under CI=true: {url}: {exc}")
        pytest.skip(f"RabbitMQ not reachable at {url}: {exc}")
    return url


@contextmanager
def send_queues() -> Iterator[dict[str, str]]:
    """Queue names of a test's own (the default queue, a routed one, an entry's own),
    deleted after; skipped (failed under ``CI=true``) when RabbitMQ is unreachable."""
    import kombu

    require_rabbitmq(AMQP_URL)
    tag = uuid.uuid4().hex[:8]
    names = {"default": f"lb-send-{tag}", "routed": f"lb-send-routed-{tag}",
             "own": f"lb-send-own-{tag}"}
    try:
        yield names
    finally:
        with kombu.Connection(AMQP_URL) as conn:
            for name in names.values():
                kombu.Queue(name, channel=conn.channel()).delete()
