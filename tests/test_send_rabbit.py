"""Sending on RabbitMQ (py-amqp), on each path that applies to it: the plain path (one
write a message) and the single write (a chunk's messages reach the socket in one write).

Behaviour shared by both is tested on both (``path``): messages as ``apply_async``
publishes them (routes, headers, priorities, expiry), Celery's signals once per slot, a
lease lost before anything is written sends nothing. The single write keeps a kombu
batch's rules: nothing counts as sent before that write, a write that fails leaves the
whole chunk unsent. A py-amqp outside the releases it was tested with falls back to the
plain path, said at start.

Each test has queues of its own on the RabbitMQ at 127.0.0.1:5672 (deleted after).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from datetime import datetime, timezone
from unittest.mock import patch

import kombu
import pytest
from celery import Celery, signals

from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.send import sender as sender_module
from celery_leaderbeat.send import single_write
from celery_leaderbeat.send.plain import publish
from tests.support.beat import NOOP
from tests.support.queues import take_messages
from tests.support.rabbitmq import AMQP_URL as AMQP
from tests.support.rabbitmq import send_queues

UTC = timezone.utc
SLOTS = [datetime(2020, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 7, 14)]


@pytest.fixture
def queues() -> Iterator[dict[str, str]]:
    """Queue names of this test's own: the default queue, a routed one, an entry's own."""
    with send_queues() as names:
        yield names


@pytest.fixture(params=["plain", "single_write"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The send path a test's scheduler takes: the plain one is the reference."""
    if request.param == "plain":
        monkeypatch.setattr(sender_module, "OPTIMISED", False)
    return str(request.param)


def make_scheduler(state_url: str, prefix: str, queues: dict[str, str],
                   extra: dict | None = None, **settings) -> Scheduler:
    entries = dict(extra or {})
    for i in (1, 2):  # two entries per shape: the second's message is built from the first
        entries[f"plain-{i}"] = {"task": NOOP, "schedule": 60.0, "args": [i, "é" * i]}
        entries[f"urgent-{i}"] = {"task": NOOP, "schedule": 60.0, "args": [i],
                                  "options": {"priority": 7}}
        entries[f"routed-{i}"] = {"task": "proj.routed", "schedule": 60.0, "args": [i]}
        entries[f"own-{i}"] = {"task": NOOP, "schedule": 60.0, "kwargs": {"i": i},
                               "options": {"queue": queues["own"], "headers": {"h": "x"}}}
    entries["expiring"] = {"task": NOOP, "schedule": 60.0, "options": {"expires": 3600}}
    app = Celery("proj")
    app.conf.update(broker_url=AMQP, leaderbeat_redis_url=state_url,
                    leaderbeat_key_prefix=prefix, timezone="UTC", beat_schedule=entries,
                    task_default_queue=queues["default"],
                    task_routes={"proj.routed": {"queue": queues["routed"]}}, **settings)
    return Scheduler(app=app)


@contextlib.contextmanager
def leading(state_url: str, prefix: str, queues: dict[str, str],
            **settings) -> Iterator[tuple[Scheduler, object, list[str]]]:
    """A scheduler that holds the lease, its chunk sender, and the schedule's own entries
    after a first chunk went out (it connects and declares the queues: py-amqp waits
    for each answer). Closed after."""
    scheduler = make_scheduler(state_url, prefix, queues, **settings)
    try:
        assert scheduler.lease.try_acquire()
        sender = scheduler._chunk_sender(scheduler.lease.credentials()[1])
        names = [n for n in scheduler.schedule if not n.startswith("celery.")]
        assert sender.send_many([(n, SLOTS[0]) for n in names]) == [True] * len(names)
        yield scheduler, sender, names
    finally:
        scheduler.close()


def drain(queues: dict[str, str]) -> dict[tuple[str, str], tuple]:
    """Every message in the test's queues by (entry, slot): what a consumer sees of it."""
    with kombu.Connection(AMQP) as conn:
        return take_messages(conn, queues.values())


class SocketWrites:
    """The writes to the producer connection's socket, each one's bytes (wraps its sendall)."""

    def __init__(self, sender) -> None:
        client = sender.enqueuer.producer().channel.connection
        self.transport = client.transport
        self.real = self.transport._write
        self.data: list[bytes] = []

        def kept(data):
            self.data.append(bytes(data))
            return self.real(data)

        self.transport._write = kept

    @property
    def count(self) -> int:
        return len(self.data)


def test_a_chunk_goes_out_as_apply_async_would_publish_it_in_one_write_on_the_single_write(
        redis_server, key_prefix, queues, path):
    scheduler = make_scheduler(redis_server.url, key_prefix, queues)
    try:
        assert scheduler.lease.try_acquire()
        epoch = scheduler.lease.credentials()[1]
        sender = scheduler._chunk_sender(epoch)
        names = list(scheduler.schedule)
        names = [n for n in names if not n.startswith("celery.")]
        # the first chunk connects and declares the queues (py-amqp waits for each answer)
        assert sender.send_many([(n, SLOTS[0]) for n in names]) == [True] * len(names)
        # as status and nodes show it
        assert scheduler._send_path() == ("single_write" if path == "single_write" else
                                          f"plain: {sender_module.OFF}")
        writes = SocketWrites(sender)
        assert sender.send_many([(n, SLOTS[1]) for n in names]) == [True] * len(names)
        assert writes.count == 1 if path == "single_write" else writes.count >= len(names)
        ours = drain(queues)
        with scheduler.app.producer_or_acquire() as producer:  # Celery's, one by one
            for slot in SLOTS[:2]:
                for name in names:
                    publish(scheduler, scheduler.schedule[name], slot, epoch, producer=producer)
        celerys = drain(queues)
    finally:
        scheduler.close()
    assert len(ours) == 2 * len(names)
    expiring = [key for key in ours if key[0] == "expiring"]
    for key in expiring:  # computed from the clock at each publish: a time, an hour ahead
        ours_expires, celerys_expires = ours.pop(key)[1]["expires"], celerys.pop(key)[1]["expires"]
        assert abs(datetime.fromisoformat(ours_expires)
                   - datetime.fromisoformat(celerys_expires)).total_seconds() < 600
    assert len(expiring) == 2
    assert ours == celerys


def test_a_gathered_chunk_looks_for_rabbitmqs_notices_once_not_before_each_message(
        redis_server, key_prefix, queues, path):
    """py-amqp reads the socket before each publish (``connection.blocked``); a chunk
    whose frames go out in one write at its end reads it once, as it starts, and the
    connection is py-amqp's own again after it."""
    with leading(redis_server.url, key_prefix, queues) as (_, sender, names):
        client = sender.enqueuer.producer().channel.connection
        assert client.client_properties["capabilities"]["connection.blocked"]
        reads: list[float | None] = []
        real = type(client).blocking_read

        def counted(self, timeout=None):
            reads.append(timeout)
            return real(self, timeout)

        with patch.object(type(client), "blocking_read", counted):
            assert sender.send_many([(n, SLOTS[1]) for n in names]) == [True] * len(names)
        assert "drain_events" not in vars(client), "py-amqp's drain_events is put back"
    if path == "single_write":
        assert reads == [0]
    else:
        assert reads.count(0) >= len(names)
    assert len(drain(queues)) == 2 * len(names)


def test_a_failed_write_leaves_the_whole_chunk_unsent_and_the_next_chunk_reconnects(
        redis_server, key_prefix, queues):
    with leading(redis_server.url, key_prefix, queues) as (_, sender, names):
        client = sender.enqueuer.producer().channel.connection

        def socket_closes() -> bool:  # asked just before the chunk's one write
            client.transport.sock.shutdown(socket.SHUT_RDWR)
            return True

        assert sender.send_many([(n, SLOTS[1]) for n in names], socket_closes) == (
            [False] * len(names))
        assert sender.send_many([(n, SLOTS[2]) for n in names]) == [True] * len(names)
        arrived = drain(queues)
    slots = sorted({slot for _, slot in arrived})
    assert slots == [SLOTS[0].isoformat(), SLOTS[2].isoformat()]
    assert len(arrived) == 2 * len(names)


def test_a_lease_lost_before_the_write_sends_nothing_of_the_chunk(
        redis_server, key_prefix, queues, path):
    with leading(redis_server.url, key_prefix, queues) as (scheduler, sender, names):
        asked = []

        def lease_gone() -> bool:
            asked.append(1)
            return False

        assert scheduler._enqueuer.path()[0] == path
        assert sender.send_many([(n, SLOTS[1]) for n in names], lease_gone) == []
        assert asked == [1]
        arrived = drain(queues)
    assert {slot for _, slot in arrived} == {SLOTS[0].isoformat()}


def test_with_publisher_confirms_each_message_is_written_and_confirmed_on_its_own(
        redis_server, key_prefix, queues):
    """A confirm waits for the broker's answer after each publish: frames kept back
    would never be answered."""
    with leading(redis_server.url, key_prefix, queues,
                 broker_transport_options={"confirm_publish": True}) as (scheduler, sender, names):
        assert scheduler._enqueuer.path() == (
            "plain", "publisher confirms are on (each message waits for its answer)")
        writes = SocketWrites(sender)
        assert sender.send_many([(n, SLOTS[1]) for n in names]) == [True] * len(names)
        arrived = drain(queues)
    assert writes.count >= len(names)  # one or more each, never one for the chunk
    assert len(arrived) == 2 * len(names)


@pytest.mark.parametrize("lease_kept", [True, False], ids=["lease kept", "lease lost"])
def test_a_queue_declared_mid_chunk_writes_what_was_kept_first_and_the_answer_says_so(
        redis_server, key_prefix, queues, lease_kept):
    """A queue's first declaration waits for RabbitMQ's answer: the frames kept before it
    are written first. Had the lease been lost by the end, the answer covers exactly
    what was written before (nothing after)."""
    scheduler = make_scheduler(redis_server.url, key_prefix, queues)
    try:
        assert scheduler.lease.try_acquire()
        sender = scheduler._chunk_sender(scheduler.lease.credentials()[1])
        plain = [n for n in scheduler.schedule if n.startswith("plain-")]
        assert sender.send_many([(n, SLOTS[0]) for n in plain]) == [True] * len(plain)
        drain(queues)
        # plain entries first (their queue declared), then an entry of a queue not yet declared
        names = [*plain, "own-1", "own-2"]
        answer = sender.send_many([(n, SLOTS[1]) for n in names], lambda: lease_kept)
        arrived = drain(queues)
    finally:
        scheduler.close()
    if lease_kept:
        assert answer == [True] * len(names)
        assert {entry for entry, _ in arrived} == set(names)
    else:
        assert answer == [True] * len(plain)  # written when own-1's queue was declared
        assert {entry for entry, _ in arrived} == set(plain)


@pytest.mark.parametrize("receiver", [False, True], ids=["after only", "before and after"])
def test_celerys_publish_signals_fire_once_for_each_slot_sent(
        redis_server, key_prefix, queues, path, receiver):
    """``before_task_publish`` (a receiver connected: every message built by Celery) and
    ``after_task_publish`` fire once for each slot, with its task id."""
    before: list[str] = []
    after: list[str] = []

    def on_before(headers=None, **_):
        before.append(headers["id"])

    def on_after(headers=None, **_):
        after.append(headers["id"])

    signals.after_task_publish.connect(on_after, weak=False)
    if receiver:
        signals.before_task_publish.connect(on_before, weak=False)
    try:
        with leading(redis_server.url, key_prefix, queues) as (scheduler, sender, names):
            assert scheduler._enqueuer.path()[0] == path
            before.clear()
            after.clear()
            assert sender.send_many([(n, SLOTS[1]) for n in names]) == [True] * len(names)
            arrived = drain(queues)
    finally:
        signals.after_task_publish.disconnect(on_after)
        signals.before_task_publish.disconnect(on_before)
    ids = sorted(headers["id"] for _, headers, *_ in arrived.values())
    assert len(ids) == 2 * len(names)
    sent = sorted(headers["id"] for (_, slot), (_, headers, *_) in arrived.items()
                  if slot == SLOTS[1].isoformat())
    assert sorted(after) == sent
    assert sorted(before) == (sent if receiver else [])


def test_a_py_amqp_outside_the_tested_releases_falls_back_to_the_plain_path_and_says_so(
        redis_server, key_prefix, queues, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="celery_leaderbeat")
    monkeypatch.setattr(single_write, "AMQP_RANGE", ((5, 99), (6, 0)))
    with leading(redis_server.url, key_prefix, queues) as (scheduler, sender, names):
        path, why = scheduler._enqueuer.path()
        writes = SocketWrites(sender)
        assert sender.send_many([(n, SLOTS[1]) for n in names]) == [True] * len(names)
        arrived = drain(queues)
    assert path == "plain"
    assert why.endswith("(the frame writer is known for py-amqp >=5.99,<6.0)")
    said = [r for r in caplog.records if "send path plain" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert writes.count >= len(names)
    assert len(arrived) == 2 * len(names)


class Unserialisable:
    """An argument JSON cannot carry: Celery's publish of it fails, and only it."""


def test_a_message_that_cannot_be_published_fails_only_its_own_slot(
        redis_server, key_prefix, queues, path, caplog):
    extra = {"bad": {"task": NOOP, "schedule": 60.0, "args": [Unserialisable()]}}
    scheduler = make_scheduler(redis_server.url, key_prefix, queues, extra)
    try:
        assert scheduler.lease.try_acquire()
        sender = scheduler._chunk_sender(scheduler.lease.credentials()[1])
        names = [n for n in scheduler.schedule if not n.startswith("celery.")]
        names.remove("bad")
        names.insert(len(names) // 2, "bad")  # in the middle of the chunk
        answer = sender.send_many([(n, SLOTS[0]) for n in names])
        assert scheduler._enqueuer.path()[0] == path
        arrived = drain(queues)
    finally:
        scheduler.close()
    assert answer == [n != "bad" for n in names]
    assert {entry for entry, _ in arrived} == set(names) - {"bad"}
    assert "leaderbeat: could not send bad for slot" in caplog.text
