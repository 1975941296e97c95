"""A burst's frames recorded ahead of its slot, on RabbitMQ's single write.

In idle time before a burst the leader records each due slot's frames (py-amqp's own
frame writer, nothing written); the chunk that sends the slot after its claim writes
those bytes. The rules tested here: nothing recorded reaches the broker before its
chunk; what a chunk writes is byte for byte what it writes without the recordings; a
recording is used only under its epoch and the schedule version it was made with, and
none is kept once the node stops leading; a leader ticking as beat does records a burst
and sends each of its slots once from them.

Each test has queues of its own on the RabbitMQ at 127.0.0.1:5672 (deleted after) and a
Redis of its own for the state.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

import kombu
import pytest
from celery import signals

from celery_leaderbeat import cron
from celery_leaderbeat.send.ahead import FEWEST
from tests.support.beat import NOOP
from tests.support.rabbitmq import AMQP_URL as AMQP
from tests.support.rabbitmq import send_queues
from tests.test_send_rabbit import SLOTS, SocketWrites, drain, leading, make_scheduler


@pytest.fixture
def queues() -> Iterator[dict[str, str]]:
    with send_queues() as names:
        yield names


def record(sender, names: list[str], slot: datetime) -> int:
    """Record ``names``' frames for ``slot`` as the leader does in idle time; how many."""
    enqueuer = sender.enqueuer
    before = len(enqueuer.ahead)
    s = enqueuer.scheduler
    due = [(s.schedule[n], slot, s.overlap_of(n)) for n in names]
    assert enqueuer.ahead.record(enqueuer.producer(), enqueuer.messages, due, sender.epoch,
                                 float("inf"), time.monotonic)
    return len(enqueuer.ahead) - before


def test_recorded_frames_reach_the_broker_only_with_their_chunk_byte_for_byte_as_built_there(
        redis_server, key_prefix, queues):
    with leading(redis_server.url, key_prefix, queues) as (_, sender, names):
        drain(queues)
        ahead = sender.enqueuer.ahead
        assert record(sender, names, SLOTS[1]) == len(names) - 1
        assert drain(queues) == {}, "a recording is not written"
        # the entry whose message expires is built by apply_async at its send (the clock)
        assert ("expiring", SLOTS[1]) not in ahead and ("plain-1", SLOTS[1]) in ahead
        fixed = [n for n in names if n != "expiring"]  # the same bytes at every send
        written = SocketWrites(sender)
        published: list[str] = []

        def on_after(headers=None, **_):
            published.append(headers["id"])

        signals.after_task_publish.connect(on_after, weak=False)
        try:
            assert sender.send_many([(n, SLOTS[1]) for n in fixed]) == [True] * len(fixed)
        finally:
            signals.after_task_publish.disconnect(on_after)
        assert ahead.used == len(fixed) and len(ahead) == 0
        from_recordings, written.data = written.data, []
        assert sender.send_many([(n, SLOTS[1]) for n in fixed]) == [True] * len(fixed)
        assert ahead.used == len(fixed)  # nothing left to use: built again
        built_there = list(written.data)  # (closing the connection writes more)
        arrived = drain(queues)
    assert len(from_recordings) == 1  # the chunk's one write
    assert from_recordings == built_there
    assert set(arrived) == {(n, SLOTS[1].isoformat()) for n in fixed}
    ids = sorted(headers["id"] for _, headers, *_ in arrived.values())
    assert sorted(published) == ids, "after_task_publish once for each recorded slot sent"


def test_a_recording_is_used_only_under_its_epoch_and_the_schedule_version_it_was_made_with(
        redis_server, key_prefix, queues):
    with leading(redis_server.url, key_prefix, queues) as (scheduler, sender, names):
        drain(queues)
        ahead = sender.enqueuer.ahead
        assert record(sender, names, SLOTS[1]) > 0
        newer = scheduler._enqueuer.bind(sender.epoch + 1)  # a later epoch's batch
        assert newer.send_many([(n, SLOTS[1]) for n in names]) == [True] * len(names)
        assert ahead.used == 0
        epochs = {headers["leaderbeat_epoch"] for _, headers, *_ in drain(queues).values()}
        assert epochs == {sender.epoch + 1}
        assert record(sender, names, SLOTS[2]) > 0
        scheduler._schedule_version += 1  # the schedule changed since (an entry edited)
        batch = scheduler._chunk_sender(sender.epoch)  # as the next batch gets its sender
        assert len(ahead) == 0
        assert batch.send_many([(n, SLOTS[2]) for n in names]) == [True] * len(names)
        assert ahead.used == 0
        assert len(drain(queues)) == len(names)


def test_a_leader_that_steps_down_keeps_none_of_its_recordings(redis_server, key_prefix,
                                                              queues):
    """Ticking as beat does until a burst's frames are recorded ahead of it, then the
    lease lost: the recordings (of that epoch) go with the leadership."""
    extra = {f"b{i}": {"task": NOOP, "schedule": cron("*/3 * * * * *"), "args": [i]}
             for i in range(FEWEST + 50)}
    scheduler = make_scheduler(redis_server.url, key_prefix, queues, extra)
    try:
        deadline = time.monotonic() + 10  # a burst every 3 s: recorded 1.5 s before one
        while not (scheduler._enqueuer is not None and len(scheduler._enqueuer.ahead)):
            assert time.monotonic() < deadline, "no burst was framed ahead within 10 s"
            time.sleep(min(scheduler.tick(), 0.05))
        assert scheduler._leader is not None
        scheduler._step_down("lease lost (test)")
        assert scheduler._leader is None and len(scheduler._enqueuer.ahead) == 0
    finally:
        scheduler.close()


def test_a_leader_ticking_as_beat_does_frames_a_burst_ahead_and_sends_each_slot_once_from_it(
        redis_server, key_prefix, queues):
    """150 entries due every 3 s: each burst once the leader leads goes out from frames
    recorded in the idle time before it (the producer connected for it there)."""
    n = FEWEST + 50
    extra = {f"b{i}": {"task": NOOP, "schedule": cron("*/3 * * * * *"), "args": [i]}
             for i in range(n)}
    scheduler = make_scheduler(redis_server.url, key_prefix, queues, extra)
    counted: Counter[tuple[str, str]] = Counter()
    used_per_burst = []
    try:
        deadline = time.monotonic() + 11  # three bursts or more, 3 s apart
        while time.monotonic() < deadline:
            used = scheduler._enqueuer.ahead.used if scheduler._enqueuer else 0
            delay = scheduler.tick()
            if scheduler._enqueuer is not None and scheduler._enqueuer.ahead.used > used:
                used_per_burst.append(scheduler._enqueuer.ahead.used - used)
            time.sleep(min(delay, 1.0))
        assert scheduler._leader is not None
        with kombu.Connection(AMQP) as conn:
            channel = conn.default_channel
            while (message := channel.basic_get(queues["default"], no_ack=True)) is not None:
                if message.headers["leaderbeat_entry"].startswith("b"):
                    counted[(message.headers["leaderbeat_entry"],
                             message.headers["leaderbeat_slot"])] += 1
    finally:
        scheduler.close()
    slots = Counter(slot for _, slot in counted)
    assert len(slots) >= 3 and set(slots.values()) == {n}, slots
    assert set(counted.values()) == {1}, "each slot once"
    assert used_per_burst and max(used_per_burst) == n, used_per_burst
