"""The election after Redis lost writes: the node that led goes first (a real Redis).

Redis going back to older state is made by hand here (the leader key deleted or
put back, the generation counter set lower), as a restore from an older
snapshot leaves them; the beats' side of it, with real processes, is in
test_restore_election.py.
"""

from __future__ import annotations

import pytest

from celery_leaderbeat.config import Config
from celery_leaderbeat.roles.lease import LeaseView
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.redis_store import redis_store


@pytest.fixture
def nodes(redis_client, key_prefix):
    keys = Keys(key_prefix)

    def make(name: str):
        config = Config.from_values({"redis_url": "redis://x", "key_prefix": key_prefix,
                                     "node_id": name})
        return LeaseView(redis_store(redis_client, keys, config).lease, config)

    return make, keys


def restore(client, keys: Keys, *, generation: int, leader: str | None = None) -> None:
    """Redis back on an older snapshot: a lower generation, and its leader key (or none)."""
    client.set(keys.generation, generation)
    client.delete(keys.leader)
    if leader is not None:
        client.set(keys.leader, leader, px=10_000)


def test_after_a_loss_a_standby_holds_back_and_the_node_that_led_takes_the_lease(
        nodes, redis_client):
    make, keys = nodes
    led, standby = make("led"), make("standby")
    redis_client.set(keys.generation, 50)
    assert led.try_acquire()
    assert not standby.try_acquire() and not standby.held_back  # the leader holds it
    restore(redis_client, keys, generation=10)
    assert not standby.try_acquire() and standby.held_back
    assert led.try_acquire() and led.epoch == 2
    assert not standby.try_acquire() and not standby.held_back  # held by the node that led


def test_after_the_grace_a_standby_takes_the_lease_the_node_that_led_did_not_come_for(
        nodes, redis_client):
    make, keys = nodes
    led, standby = make("led"), make("standby")
    redis_client.set(keys.generation, 50)
    assert led.try_acquire()
    standby.try_acquire()
    restore(redis_client, keys, generation=10)
    assert not standby.try_acquire()
    assert standby.try_acquire(despite_loss=True) and standby.epoch == 2


def test_without_a_loss_a_standby_takes_an_expired_lease_at_once(nodes, redis_client):
    make, keys = nodes
    led, standby = make("led"), make("standby")
    redis_client.set(keys.generation, 50)
    assert led.try_acquire()
    standby.try_acquire()
    redis_client.delete(keys.leader)  # the leader crashed: its lease expired
    assert standby.try_acquire() and not standby.held_back


def test_a_lease_key_brought_back_with_an_older_epoch_is_free_to_the_node_that_led(
        nodes, redis_client):
    make, keys = nodes
    first, second = make("first"), make("second")
    redis_client.set(keys.generation, 50)
    assert first.try_acquire() and first.epoch == 1
    old_token = first.token
    redis_client.delete(keys.leader)  # first's lease expired; second leads under epoch 2
    assert second.try_acquire() and second.epoch == 2
    assert not first.try_acquire()
    # the snapshot held first's lease: first does not take "its own" key back ahead of
    # the node that led; the node that led takes it although it names another node
    restore(redis_client, keys, generation=10, leader=old_token)
    assert not first.try_acquire() and first.held_back
    assert second.try_acquire() and second.epoch == 3

