"""Shared fixtures: real Redis servers on free ports, unique key prefixes, a TCP proxy.

- ``redis_server``: a fresh server for this test (kill / restart / pause it freely).
- ``shared_redis``: one server for the whole session; fast unit tests use it
  with their own ``key_prefix`` and must not kill it.
- ``redis_client``: a raw-bytes client on ``shared_redis`` (db 0).
- ``key_prefix``: unique per test, e.g. ``t-3f9a1c2b-5e0d77``.
- ``make_redis_server(*extra_args, **kw)``: more servers in one test.
- ``make_proxy(server)``: a :class:`TcpProxy` in front of a server.
- ``amqp_recorder``: a RabbitMQ queue of the test's own on the machine's broker, read
  back message by message (skipped, or failed under ``CI=true``, without RabbitMQ).
- Celery's own ``celery_app`` / ``celery_worker`` come from ``celery.contrib.pytest``.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

# ``tests.support`` must import the same way under ``pytest`` and ``python -m pytest``.
REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from tests.support.amqp_recorder import AmqpRecorder
from tests.support.proxy import TcpProxy
from tests.support.rabbitmq import require_rabbitmq
from tests.support.redis_server import RedisServer

pytest_plugins = ("celery.contrib.pytest",)


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One Redis server for the whole session (do not kill, pause or flush it)."""
    with RedisServer(workdir=tmp_path_factory.mktemp("shared-redis")) as server:
        yield server


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh Redis server owned by this test; its log stays in ``tmp_path/redis``."""
    with RedisServer(workdir=tmp_path / "redis") as server:
        yield server


@pytest.fixture
def make_redis_server(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Factory: ``make_redis_server("--requirepass", "pw")``; all are killed at teardown."""
    with ExitStack() as stack:
        count = itertools.count()

        def make(*extra_args: str, **kwargs: Any) -> RedisServer:
            kwargs.setdefault("workdir", tmp_path / f"redis-{next(count)}")
            return stack.enter_context(RedisServer(extra_args, **kwargs))

        yield make


@pytest.fixture
def make_proxy() -> Iterator[Callable[[RedisServer], TcpProxy]]:
    """Factory: ``make_proxy(server)`` -> a forwarding proxy, closed at teardown."""
    with ExitStack() as stack:
        yield lambda server: stack.enter_context(TcpProxy("127.0.0.1", server.port))


@pytest.fixture
def key_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix no other test (or earlier run) uses: ``t-<test hash>-<random>``."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    return f"t-{digest}-{secrets.token_hex(3)}"


@pytest.fixture
def redis_client(shared_redis: RedisServer) -> Iterator[redis.Redis]:
    """A raw-bytes client on ``shared_redis`` db 0, with short timeouts."""
    client = shared_redis.client()
    yield client
    client.close()


@pytest.fixture
def amqp_recorder() -> Iterator[AmqpRecorder]:
    """A queue of this test's own on RabbitMQ, drained message by message."""
    recorder = AmqpRecorder(require_rabbitmq())
    try:
        yield recorder
    finally:
        recorder.close()
