"""Deployments: Sentinel, Redis Cluster, TLS, ACL users, wrong passwords, Valkey.

Every test runs against real servers it starts itself (see tests/deployments/),
with a separate plain Redis as the broker so the evidence survives the faults.
"""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import redis

from celery_leaderbeat.config import Config
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.connection import make_client
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.lease import Lease
from celery_leaderbeat.store.ledger import Ledger
from celery_leaderbeat.store.records import GuardRun
from celery_leaderbeat.store.runs import RedisRuns
from celery_leaderbeat.store.scripts import Scripts
from celery_leaderbeat.store.types import (
    BackfillReason,
    BackfillRefused,
    ClaimItem,
    Code,
    Event,
    Op,
    Refused,
    SlotStatus,
)
from tests.deployments.cluster import RedisClusterSet
from tests.deployments.sentinel import MASTER, SentinelSet
from tests.deployments.tls import make_certificates, tls_server
from tests.support.beat import NOOP, BeatCluster, BeatProcess, Recorder, beat_env, duplicates
from tests.support.redis_server import RedisServer

TTL, RENEW, POLL = 3.0, 1.0, 0.5
FAST = {"leaderbeat_lease_ttl": TTL, "leaderbeat_renew_interval": RENEW,
        "leaderbeat_standby_poll": POLL}
SLOW_POLL = 2.5


def every(seconds: float, n: int = 1) -> dict:
    return {f"e{i}": {"task": NOOP, "every": seconds} for i in range(n)}


def start_beats(tmp_path: Path, broker: RedisServer, redis_url: str, prefix: str, *,
                n: int = 2, schedule: dict | None = None, settings: dict | None = None,
                ) -> tuple[BeatCluster, Recorder]:
    env = beat_env(tmp_path, broker_url=broker.url_for(0), redis_url=redis_url, prefix=prefix,
                   schedule=schedule or every(1.0, 2), settings={**FAST, **(settings or {})})
    return BeatCluster(n, env, tmp_path), Recorder(broker.client())


def slots_after(messages, moment: datetime) -> list:
    return [m for m in messages if datetime.fromisoformat(m.slot) > moment]


def wait_for_slot_after(recorder: Recorder, moment: datetime, timeout: float = 20.0) -> float:
    """Drain until a slot later than ``moment`` arrives; the monotonic time it was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recorder.drain()
        if slots_after(recorder.messages, moment):
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"no slot later than {moment.isoformat()} within {timeout}s")


def config(prefix: str, url: str, **options) -> Config:
    return Config.from_values({"redis_url": url, "key_prefix": prefix, "node_id": "n1",
                               "redis_options": options, **{k[len("leaderbeat_"):]: v
                                                            for k, v in FAST.items()}})


def exercise_every_call(url: str, prefix: str, **options) -> None:
    """Every kind of Redis call the scheduler makes, through the client connection.py builds."""
    cfg = config(prefix, url, **options)
    client = make_client(url, cfg.redis_options, cfg.store_timeout)
    keys = Keys(prefix)
    scripts = Scripts(client)
    lease, ledger = LeaseView(Lease(client, scripts, keys, cfg), cfg), Ledger(client, scripts, keys, cfg)
    standby = client.pubsub(ignore_subscribe_messages=True)
    standby.subscribe(keys.events)
    assert abs(lease.measure_skew()) < 1.0                      # TIME
    assert lease.try_acquire()                                  # acquire.lua
    lease.renew()                                               # renew.lua
    assert lease.holder()[0] == lease.token                     # pipeline(transaction=False)
    granted = ledger.claim(lease.token, lease.epoch, [ClaimItem("a", 1000, Op.CLAIM)])  # lead.lua
    assert granted == [Code.GRANTED]
    assert ledger.record(lease.epoch, [Event("a", 1000, "sent")]) == 1          # record.lua
    assert ledger.load()["a"].state == SlotStatus.SENT                          # HGETALL
    assert ledger.load(["a", "b"]) == {"a": ledger.load()["a"]}                  # states.lua
    ledger.check_generation(lease.token, lease.epoch)                           # check.lua
    ledger.mark_definitions(lease.token, lease.epoch)                           # define.lua
    assert ledger.backfill(lease.token, lease.epoch, "a", [500], "r1") == [    # backfill.lua
        BackfillRefused(BackfillReason.HORIZON)]
    assert ledger.rescue([ClaimItem("a", 1000, Op.CLAIM, 1000)]).results == [  # rescue.lua
        Refused(ledger.load()["a"], "already claimed by the leader of epoch "
                f"{lease.epoch}")]
    assert [row["event"] for row in ledger.history()][-1] == "sent"             # XREVRANGE
    ledger.register_node("leader", {"pid": 1})                  # HSET
    assert "n1" in ledger.nodes()
    from celery_leaderbeat.store.connection import server_warnings
    assert server_warnings(client) == []                        # CONFIG GET
    assert lease.release("released")                            # release.lua + PUBLISH
    deadline = time.monotonic() + 5
    message = None
    while message is None and time.monotonic() < deadline:
        message = standby.get_message(timeout=0.5)
    assert message and message["data"] in (b"released", "released")
    standby.close()
    exercise_the_guard(RedisRuns(client, scripts, keys, cfg))
    client.close()


def exercise_the_guard(runs: RedisRuns) -> None:
    """Every script of the worker guard, an overlap hand-over among them."""
    first = GuardRun("t1", "g", 1000, 1, "buffer_one", "w:1", message='{"n": 1}')
    second = GuardRun("t2", "g", 2000, 1, "buffer_one", "w:1", message='{"n": 2}')
    started = runs.start(first)                                 # guard_start.lua
    assert started.decision == "run"
    assert runs.renew(first, started.token)                     # guard_renew.lua
    assert runs.start(second).decision == "wait"
    assert runs.end(first, started.token, "ok") == (True, '{"n": 2}')  # guard_finish.lua
    assert runs.sweep() == []                                   # guard_sweep.lua
    handed = GuardRun("t2", "g", 2000, 1, "buffer_one", "w:1", handed_over=True)
    assert runs.start(handed).decision == "run"
    assert runs.release(handed, "terminated") == ""             # guard_release.lua
    assert runs.runs(["t1", "t2"])["t2"].state == "finished"


# -- Redis Cluster -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    with RedisClusterSet(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


def test_every_redis_call_of_the_scheduler_works_on_a_redis_cluster(redis_cluster, key_prefix):
    exercise_every_call(redis_cluster.url, key_prefix)


def test_all_keys_of_a_prefix_live_in_one_cluster_slot(redis_cluster, key_prefix):
    client = make_client(redis_cluster.url, {}, 1.0)
    keys = Keys(key_prefix)
    names = [keys.leader, keys.epoch, keys.slots, keys.nodes, keys.history]
    assert len({client.keyslot(k) for k in names}) == 1


@pytest.mark.slow
def test_three_beats_on_a_redis_cluster_send_every_slot_exactly_once(
        tmp_path, redis_cluster, make_redis_server, key_prefix):
    broker = make_redis_server()
    cluster, recorder = start_beats(tmp_path, broker, redis_cluster.url, key_prefix, n=3)
    with cluster:
        recorder.wait_for(2 * 5, timeout=20)
        assert all(b.alive for b in cluster), cluster.logs()
    assert duplicates(recorder.messages) == []
    assert {m.entry for m in recorder.messages} == {"e0", "e1"}


# -- Sentinel ------------------------------------------------------------------------------


@pytest.fixture
def sentinel_set(tmp_path):
    with SentinelSet(tmp_path / "sentinel") as deployment:
        yield deployment


def test_every_redis_call_of_the_scheduler_works_through_sentinel(sentinel_set, key_prefix):
    exercise_every_call(sentinel_set.url, key_prefix, master_name=MASTER)


def test_a_sentinel_url_without_a_master_name_is_a_configuration_error(sentinel_set):
    from celery_leaderbeat.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="master_name"):
        make_client(sentinel_set.url, {}, 1.0)


@pytest.fixture(scope="module")
def sentinel_set_with_passwords(tmp_path_factory):
    with SentinelSet(tmp_path_factory.mktemp("sentinel-pw"), password="data-pw",
                     sentinel_password="sentinel-pw") as deployment:
        yield deployment


def test_sentinels_and_data_nodes_may_each_have_their_own_password(
        sentinel_set_with_passwords, key_prefix):
    exercise_every_call(sentinel_set_with_passwords.url, key_prefix, master_name=MASTER,
                        password="data-pw", sentinel_kwargs={"password": "sentinel-pw"})


@pytest.mark.parametrize("data_pw, sentinel_pw, says", [
    ("data-pw", "wrong", "sentinel_kwargs"),
    ("data-pw", None, "sentinel_kwargs"),
    ("wrong", "sentinel-pw", "invalid username-password"),
], ids=["wrong-sentinel-password", "no-sentinel-password", "wrong-data-password"])
def test_a_password_refused_behind_sentinel_is_an_authentication_error_not_a_retry(
        sentinel_set_with_passwords, data_pw, sentinel_pw, says):
    options = {"master_name": MASTER, "password": data_pw}
    if sentinel_pw:
        options["sentinel_kwargs"] = {"password": sentinel_pw}
    client = make_client(sentinel_set_with_passwords.url, options, 1.0)
    started = time.monotonic()
    with pytest.raises(redis.AuthenticationError, match=says):
        client.time()
    assert time.monotonic() - started < 3


def test_the_sentinel_kwargs_setting_is_not_modified(sentinel_set):
    sentinel_kwargs = {"socket_keepalive": True}
    make_client(sentinel_set.url, {"master_name": MASTER, "sentinel_kwargs": sentinel_kwargs}, 1.0)
    assert sentinel_kwargs == {"socket_keepalive": True}


@pytest.mark.slow
def test_beats_behind_sentinel_ride_out_an_ordered_failover_and_a_killed_master(
        tmp_path, sentinel_set, make_redis_server, key_prefix):
    broker = make_redis_server()
    cluster, recorder = start_beats(
        tmp_path, broker, sentinel_set.url, key_prefix, n=3, schedule=every(1.0, 3),
        # a long standby poll: a takeover faster than it proves 'released' came over pub/sub
        settings={"leaderbeat_redis_options": {"master_name": MASTER},
                  "leaderbeat_standby_poll": SLOW_POLL})
    figures = {}
    with cluster:
        recorder.wait_for(3 * 3, timeout=20)

        # 1. an ordered failover: SENTINEL FAILOVER
        old = sentinel_set.master_port()
        ordered = time.monotonic()
        sentinel_set.sentinel_client().execute_command("SENTINEL", "FAILOVER", MASTER)
        new = sentinel_set.wait_for_new_master(old)
        promoted = datetime.now(timezone.utc)
        figures["ordered: promoted after"] = time.monotonic() - ordered
        figures["ordered: sending again after"] = wait_for_slot_after(recorder, promoted) - ordered
        sentinel_set.wait_settled()

        # 2. the master dies: Sentinel promotes the replica after down-after-milliseconds
        killed = time.monotonic()
        sentinel_set.master().kill()
        sentinel_set.wait_for_new_master(new)
        promoted = datetime.now(timezone.utc)
        figures["killed: promoted after"] = time.monotonic() - killed
        figures["killed: sending again after"] = wait_for_slot_after(recorder, promoted) - killed

        # 3. pub/sub still wakes the standbys: a released lease is taken over at once
        before = len(recorder.messages)
        recorder.wait_for(before + 3, timeout=10)
        leader = leader_beat(cluster, sentinel_set, key_prefix)
        token = leader_token(sentinel_set, key_prefix)
        leader.proc.send_signal(15)
        # timed from the release itself, not the signal: a loaded machine can take a
        # second to deliver SIGTERM to beat and reach its shutdown handler
        released = wait_for_release(sentinel_set, key_prefix, token)
        took_over = wait_for_new_leader(cluster, sentinel_set, key_prefix, other_than=leader)
        figures["takeover after SIGTERM"] = took_over - released
        assert leader.wait_exit(15) == 0
        recorder.wait_for(len(recorder.messages) + 3, timeout=10)

        assert all(b.alive for b in cluster if b is not leader), cluster.logs()
    slots = {}
    for m in recorder.messages:
        slots.setdefault(m.entry, []).append(datetime.fromisoformat(m.slot))
    figures["longest gap between slots"] = max(
        (b - a).total_seconds() for ts in slots.values() for a, b in zip(sorted(ts), sorted(ts)[1:]))
    print({k: round(v, 2) for k, v in figures.items()}, len(recorder.messages), "messages")
    assert duplicates(recorder.messages) == [], cluster.logs()
    assert figures["ordered: sending again after"] < 15
    assert figures["killed: sending again after"] < 20
    assert figures["takeover after SIGTERM"] < SLOW_POLL / 2
    # every 1 s slot went out, late at worst: none lost across two Redis failovers
    assert figures["longest gap between slots"] <= 1.0, figures


def leader_token(sentinel_set: SentinelSet, prefix: str) -> str | None:
    raw = sentinel_set.master().client().get("{" + prefix + "}:leader")
    return raw.decode() if raw else None


def leader_beat(cluster: BeatCluster, sentinel_set: SentinelSet, prefix: str,
                timeout: float = 10.0) -> BeatProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        token = leader_token(sentinel_set, prefix)
        if token:
            pid = int(token.split("|")[0].split(":")[-2])
            return next(b for b in cluster if b.pid == pid)
        time.sleep(0.02)
    raise AssertionError("no leader")


def wait_for_release(sentinel_set, prefix, token: str | None, timeout: float = 15.0) -> float:
    """When the leader key stopped holding ``token`` (the lease released)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if leader_token(sentinel_set, prefix) != token:
            return time.monotonic()
        time.sleep(0.005)
    raise AssertionError(f"the lease {token} was not released within {timeout}s")


def wait_for_new_leader(cluster, sentinel_set, prefix, *, other_than: BeatProcess,
                        timeout: float = 10.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        token = leader_token(sentinel_set, prefix)
        if token and int(token.split("|")[0].split(":")[-2]) != other_than.pid:
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError(f"no new leader within {timeout}s\n{cluster.logs()}")


# -- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def tls_redis(tmp_path, certificates):
    with tls_server(certificates, tmp_path / "tls-redis") as server:
        yield server


def tls_options(certs) -> dict:
    return {"ssl_ca_certs": str(certs.ca), "ssl_certfile": str(certs.client_cert),
            "ssl_keyfile": str(certs.client_key)}


def test_every_redis_call_of_the_scheduler_works_over_tls(tls_redis, certificates, key_prefix):
    exercise_every_call(f"rediss://127.0.0.1:{tls_redis.port}/0", key_prefix,
                        **tls_options(certificates))


def test_tls_files_may_be_given_as_url_query_parameters(tls_redis, certificates):
    query = "&".join(f"{k}={v}" for k, v in tls_options(certificates).items())
    client = make_client(f"rediss://127.0.0.1:{tls_redis.port}/0?{query}", {}, 1.0)
    assert client.ping()


def test_a_plain_connection_to_a_tls_port_fails_instead_of_hanging(tls_redis):
    client = make_client(f"redis://127.0.0.1:{tls_redis.port}/0", {}, 1.0)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_a_beat_over_tls_sends_its_slots(tmp_path, tls_redis, certificates, make_redis_server,
                                         key_prefix):
    broker = make_redis_server()
    cluster, recorder = start_beats(
        tmp_path, broker, f"rediss://127.0.0.1:{tls_redis.port}/0", key_prefix, n=1,
        settings={"leaderbeat_redis_options": tls_options(certificates)})
    with cluster:
        recorder.wait_for(2 * 3, timeout=20)
        assert cluster[0].alive
    assert duplicates(recorder.messages) == []


# -- ACL users and passwords ---------------------------------------------------------------


@pytest.fixture
def acl_redis(make_redis_server):
    server = make_redis_server("--requirepass", "default-secret")
    server.client().execute_command("ACL", "SETUSER", "lb", "on", ">pw", "~*", "&*", "+@all")
    return server


def test_every_redis_call_of_the_scheduler_works_as_an_acl_user(acl_redis, key_prefix):
    exercise_every_call(f"redis://lb:pw@127.0.0.1:{acl_redis.port}/0", key_prefix)


def test_acl_credentials_may_be_given_as_options(acl_redis, key_prefix):
    exercise_every_call(f"redis://127.0.0.1:{acl_redis.port}/0", key_prefix,
                        username="lb", password="pw")


def test_a_user_limited_to_the_prefix_and_without_config_is_enough(acl_redis, key_prefix):
    tag = "{" + key_prefix + "}"
    acl_redis.client().execute_command("ACL", "SETUSER", "narrow", "on", ">pw", f"~{tag}:*",
                                       f"&{tag}:*", "+@all", "-config")
    exercise_every_call(f"redis://narrow:pw@127.0.0.1:{acl_redis.port}/0", key_prefix)


@pytest.mark.parametrize("credentials", ["lb:wrong@", ":wrong@", "nobody:pw@", ""],
                         ids=["wrong-user-password", "wrong-default-password", "unknown-user",
                              "no-password"])
def test_refused_credentials_raise_an_authentication_error_quickly(acl_redis, credentials):
    client = make_client(f"redis://{credentials}127.0.0.1:{acl_redis.port}/0", {}, 1.0)
    started = time.monotonic()
    with pytest.raises(redis.AuthenticationError):
        client.time()
    assert time.monotonic() - started < 2


@pytest.mark.slow
def test_a_beat_logs_in_as_an_acl_user(tmp_path, acl_redis, make_redis_server, key_prefix):
    broker = make_redis_server()
    cluster, recorder = start_beats(tmp_path, broker,
                                    f"redis://lb:pw@127.0.0.1:{acl_redis.port}/0", key_prefix, n=2)
    with cluster:
        recorder.wait_for(2 * 3, timeout=20)
        assert all(b.alive for b in cluster)
    assert duplicates(recorder.messages) == []


@pytest.mark.slow
def test_a_wrong_password_stops_the_beat_at_once_with_a_clear_error(
        tmp_path, acl_redis, make_redis_server, key_prefix):
    broker = make_redis_server()
    cluster, recorder = start_beats(tmp_path, broker,
                                    f"redis://lb:wrong@127.0.0.1:{acl_redis.port}/0",
                                    key_prefix, n=1)
    with cluster:
        started = time.monotonic()
        status = cluster[0].wait_exit(timeout=20)
        took = time.monotonic() - started
        log = cluster[0].log_text()
    print(f"a beat with a wrong password exits {status} after {took:.1f} s")
    assert status != 0
    assert "refused the credentials" in log
    assert "lb:***@" in log and "lb:wrong@" not in log, "the password must not be logged"
    assert log.count("refused the credentials") <= 3, "no retry loop"
    assert recorder.drain() == []


# -- Valkey --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valkey-server") is None, reason="no valkey-server binary")
def test_two_beats_on_valkey_send_every_slot_exactly_once(tmp_path, make_redis_server,
                                                          key_prefix):
    valkey = RedisServer(workdir=tmp_path / "valkey", binary=shutil.which("valkey-server"))
    with valkey:
        exercise_every_call(valkey.url, key_prefix + "-calls")
        broker = make_redis_server()
        cluster, recorder = start_beats(tmp_path, broker, valkey.url, key_prefix, n=2)
        with cluster:
            recorder.wait_for(2 * 3, timeout=20)
            assert all(b.alive for b in cluster)
    assert duplicates(recorder.messages) == []
