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


def _store_on(url: str):
    from celery_leaderbeat.config import Config
    from celery_leaderbeat.store.redis_store import connect

    return connect(Config.from_values({"redis_url": url, "key_prefix": "conn", "node_id": "a"}))


def test_a_store_call_to_a_dead_server_raises_store_unreachable_caused_by_the_redis_error(
        make_redis_server):
    import redis

    from celery_leaderbeat.errors import StoreUnreachable
    from celery_leaderbeat.store.base import STORE_ERRORS, STORE_UNREACHABLE

    server = make_redis_server()
    store = _store_on(server.url)
    server.kill()
    for call in (store.ping, lambda: store.ledger.load(), lambda: store.lease.holder()):
        with pytest.raises(StoreUnreachable) as raised:
            call()
        assert isinstance(raised.value, STORE_UNREACHABLE) and isinstance(raised.value, STORE_ERRORS)
        assert isinstance(raised.value.__cause__, redis.ConnectionError)


def test_refused_credentials_raise_store_credentials_refused(make_redis_server):
    from celery_leaderbeat.errors import StoreCredentialsRefused
    from celery_leaderbeat.store.base import STORE_REFUSED

    server = make_redis_server("--requirepass", "right")
    store = _store_on(f"redis://:wrong@127.0.0.1:{server.port}/0")
    with pytest.raises(StoreCredentialsRefused) as raised:
        store.ledger.nodes()
    assert isinstance(raised.value, STORE_REFUSED)


def test_memory_urls_name_one_state_per_name_in_a_process():
    from celery_leaderbeat.store.memory import forget

    one, same = _store_on("memory://conn-a"), _store_on("memory://conn-a")
    other = _store_on("memory://conn-b")
    try:
        one.admin.note({"event": "note"})
        assert [r["event"] for r in same.admin.all_history()] == ["note"]
        assert other.admin.all_history() == []
    finally:
        forget("conn-a")
        forget("conn-b")


def test_a_beat_on_the_in_memory_store_leads_alone_and_sends_its_due_slots(
        make_redis_server, key_prefix):
    import time

    from celery import Celery

    from celery_leaderbeat.scheduler import LEADER, Scheduler
    from celery_leaderbeat.store.memory import forget
    from tests.support.beat import NOOP, Recorder, duplicates

    broker = make_redis_server()
    app = Celery("proj")
    app.conf.update(broker_url=broker.url, leaderbeat_redis_url=f"memory://{key_prefix}",
                    leaderbeat_key_prefix=key_prefix, timezone="UTC", leaderbeat_lease_ttl=3,
                    leaderbeat_renew_interval=1, leaderbeat_standby_poll=0.2,
                    beat_schedule={"a": {"task": NOOP, "schedule": 0.5}})
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        deadline = time.monotonic() + 20
        while len(recorder.drain_all()) < 2:
            assert time.monotonic() < deadline, "no slot sent"
            time.sleep(min(scheduler.tick(), 0.2))
        assert scheduler.role == LEADER
    finally:
        scheduler.close()
        forget(key_prefix)
    assert {m.entry for m in recorder.messages} == {"a"} and duplicates(recorder.messages) == []
    assert recorder.messages[0].headers["leaderbeat_epoch"] == 1
