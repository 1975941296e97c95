"""Client construction and the start-up checks of a Redis server."""

from __future__ import annotations

import pytest

from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.store.connection import describe, make_client, server_warnings


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_an_evicting_maxmemory_policy_is_warned_about(make_redis_server, policy):
    server = make_redis_server("--maxmemory-policy", policy)
    warnings = server_warnings(make_client(server.url, {}, 1.0))
    assert len(warnings) == 1 and repr(policy) in warnings[0] and "noeviction" in warnings[0]


def test_noeviction_raises_no_warning(make_redis_server):
    server = make_redis_server("--maxmemory-policy", "noeviction")
    assert server_warnings(make_client(server.url, {}, 1.0)) == []


def test_a_client_fails_fast_against_a_dead_server(make_redis_server):
    import time

    import redis

    server = make_redis_server()
    client = make_client(server.url, {}, 1.0)
    server.kill()
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - started < 2.0, "no 5 s redis-py default retry on the hot path"


def test_passwords_are_masked_in_log_lines():
    assert describe("redis://user:hunter2@h:6379/0") == "redis://user:***@h:6379/0"
    assert describe("redis://h:6379/0") == "redis://h:6379/0"


def test_a_sentinel_url_without_a_master_name_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="master_name"):
        make_client("sentinel://127.0.0.1:26379", {}, 1.0)
