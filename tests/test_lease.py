"""The leader lease against a real Redis: acquire, renew, release, fencing, self-fencing."""

from __future__ import annotations

import time

import pytest

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import LeaseLostError
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.lease import Lease
from celery_leaderbeat.store.scripts import Scripts


def make_lease(client, prefix: str, node: str, ttl: float = 3.0, clock=time.monotonic) -> Lease:
    config = Config.from_values({"redis_url": "redis://x", "key_prefix": prefix, "node_id": node,
                                 "lease_ttl": ttl, "renew_interval": ttl / 3})
    return LeaseView(Lease(client, Scripts(client), Keys(prefix), config), config, clock=clock)


class FakeClock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_only_one_of_two_nodes_acquires_a_free_lease(redis_client, key_prefix):
    a, b = make_lease(redis_client, key_prefix, "a"), make_lease(redis_client, key_prefix, "b")
    assert a.try_acquire() is True
    assert b.try_acquire() is False
    assert a.is_held() and not b.is_held()
    assert a.holder()[0] == f"a|{a.epoch}"


def test_each_acquisition_gets_a_higher_epoch(redis_client, key_prefix):
    a, b = make_lease(redis_client, key_prefix, "a"), make_lease(redis_client, key_prefix, "b")
    assert a.try_acquire()
    first = a.epoch
    assert a.release()
    assert b.try_acquire()
    assert b.epoch == first + 1


def test_a_stolen_token_makes_renew_raise_lease_lost(redis_client, key_prefix):
    a = make_lease(redis_client, key_prefix, "a")
    assert a.try_acquire()
    redis_client.set(Keys(key_prefix).leader, "intruder|99", px=5000)
    with pytest.raises(LeaseLostError, match="intruder"):
        a.renew()
    assert not a.is_held()


def test_an_expired_lease_is_taken_by_another_node(redis_client, key_prefix):
    a = make_lease(redis_client, key_prefix, "a", ttl=1.0)
    b = make_lease(redis_client, key_prefix, "b", ttl=1.0)
    assert a.try_acquire()
    deadline = time.monotonic() + 3
    while not b.try_acquire():
        assert time.monotonic() < deadline, "b never acquired the expired lease"
        time.sleep(0.05)
    assert b.epoch > a.epoch


def test_a_resumed_stale_holder_cannot_renew_or_release_the_new_leaders_lease(redis_client, key_prefix):
    a = make_lease(redis_client, key_prefix, "a", ttl=1.0)
    b = make_lease(redis_client, key_prefix, "b", ttl=1.0)
    assert a.try_acquire()
    redis_client.delete(Keys(key_prefix).leader)  # as if a's lease expired while it was paused
    assert b.try_acquire()
    with pytest.raises(LeaseLostError):
        a.renew()
    assert a.release() is False
    assert b.holder()[0] == f"b|{b.epoch}"


def test_release_is_compare_and_set_and_publishes_released(redis_client, key_prefix):
    a = make_lease(redis_client, key_prefix, "a")
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(Keys(key_prefix).events)
    assert a.try_acquire()
    assert a.release() is True
    assert redis_client.get(Keys(key_prefix).leader) is None
    deadline = time.monotonic() + 2
    message = None
    while message is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.2)
    assert message is not None and message["data"] == b"released"
    pubsub.close()


def test_self_fencing_stops_sending_before_the_ttl_lapses_without_asking_redis(redis_client, key_prefix):
    clock = FakeClock()
    a = make_lease(redis_client, key_prefix, "a", ttl=10.0, clock=clock)
    assert a.try_acquire()
    margin = a.config.safety_margin
    clock.now += 10.0 - margin - 0.01
    assert a.is_held()
    clock.now += 0.02
    assert not a.is_held(), "the lease must be given up before ttl - safety margin"


def test_a_successful_renew_pushes_the_deadline_from_when_the_call_started(redis_client, key_prefix):
    clock = FakeClock()
    a = make_lease(redis_client, key_prefix, "a", ttl=10.0, clock=clock)
    assert a.try_acquire()
    clock.now += 5
    a.renew()
    assert a.remaining() == pytest.approx(10.0 - a.config.safety_margin)
    assert a.clock_skew is not None and abs(a.clock_skew) < 1.0


def test_the_same_node_retakes_its_own_leftover_key_with_a_new_epoch(redis_client, key_prefix):
    a = make_lease(redis_client, key_prefix, "a")
    assert a.try_acquire()
    old = a.epoch
    a.mark_lost()
    assert a.try_acquire()
    assert a.epoch == old + 1


def test_heartbeat_keeps_the_lease_alive_past_its_ttl(redis_client, key_prefix):
    a = make_lease(redis_client, key_prefix, "a", ttl=1.0)
    b = make_lease(redis_client, key_prefix, "b", ttl=1.0)
    assert a.try_acquire()
    beat = a.start_heartbeat(time.monotonic)
    try:
        time.sleep(2.5)
        assert b.try_acquire() is False
        assert a.is_held()
    finally:
        a.stop_heartbeat()
    assert not beat.is_alive()


def test_heartbeat_lets_go_when_the_main_loop_stalls(redis_client, key_prefix):
    a = make_lease(redis_client, key_prefix, "a", ttl=1.0)
    stalled_since = time.monotonic()
    assert a.try_acquire()
    beat = a.start_heartbeat(lambda: stalled_since)
    beat.join(5)
    assert beat.stopped_because == "main loop stalled"
    b = make_lease(redis_client, key_prefix, "b", ttl=1.0)
    deadline = time.monotonic() + 3
    while not b.try_acquire():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_heartbeat_reports_a_lost_lease(redis_client, key_prefix):
    a = make_lease(redis_client, key_prefix, "a", ttl=1.0)
    assert a.try_acquire()
    beat = a.start_heartbeat(time.monotonic)
    redis_client.set(Keys(key_prefix).leader, "other|1", px=5000)
    beat.join(3)
    assert beat.stopped_because == "lost"
    assert not a.is_held()


def test_a_reconcile_cut_short_by_redis_keeps_the_slots_sent_during_the_outage(make_redis_server):
    """last-leader: if Redis drops again mid-reconcile, nothing sent meanwhile is forgotten."""
    import redis as redis_py

    from celery_leaderbeat.roles.degraded import Outage
    from celery_leaderbeat.store.ledger import Ledger
    from celery_leaderbeat.timing.slots import from_ms

    server = make_redis_server()
    client = server.client()
    lease = make_lease(client, "rc", "a")
    ledger = Ledger(client, lease.store.scripts, lease.store.keys, lease.config)
    assert lease.try_acquire()
    outage = Outage(lease.config, started=time.monotonic())
    outage.sent = [("e", from_ms(1000)), ("e", from_ms(2000))]
    server.kill()
    with pytest.raises(redis_py.ConnectionError):
        outage.reconcile(lease, ledger, time.monotonic)
    assert outage.sent == [("e", from_ms(1000)), ("e", from_ms(2000))]
    server.restart()
    assert outage.reconcile(lease, ledger, time.monotonic) is True
    assert outage.sent == []
    assert ledger.load()["e"].slot_ms == 2000
    lease.stop_heartbeat()


def test_a_heartbeat_renewing_an_old_token_never_touches_the_nodes_newer_lease(
        redis_client, key_prefix):
    """A renewal blocked past stop()'s join used to mark the node's next lease lost."""
    lease = make_lease(redis_client, key_prefix, "a")
    assert lease.try_acquire()
    old_token = lease.token
    lease.release()
    assert lease.try_acquire()  # the same node leads again, a new token and epoch
    with pytest.raises(LeaseLostError):
        lease.renew(old_token)  # what a heartbeat thread that outlived its lease does
    assert lease.is_held() and not lease.lost
    lease.renew()  # the current lease is untouched


def test_the_epoch_never_goes_backwards_when_redis_loses_its_data(redis_client, key_prefix):
    a, b = make_lease(redis_client, key_prefix, "a"), make_lease(redis_client, key_prefix, "b")
    for _ in range(3):
        a.release()
        assert a.try_acquire()
    assert a.epoch == 3
    assert not b.try_acquire()  # a standby's failed attempt shows it the holder's epoch
    for key in redis_client.scan_iter(f"{{{key_prefix}}}:*"):
        redis_client.delete(key)  # Redis restarted empty: the counter is gone
    assert b.try_acquire()
    assert b.epoch == 4, "the counter would have restarted at 1"
