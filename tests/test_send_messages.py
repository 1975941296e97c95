"""Our messages are byte for byte what ``apply_async`` sends (bar kombu's random delivery tag).

Messages after the first of a shape (task, options, overlap) are built from it
with what a slot changes put in. Each test sends two slots of two entries per
shape through a chunk sender on each path (the plain path, templates after the
claim, claim and enqueue in one step), then sends the same slots through Celery's ``apply_async`` with
the same task id and headers, and compares what reached the broker: the
default queue, a ``task_routes`` queue, a message priority and an entry's own
queue, with and without ``global_keyprefix``.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery, signals

from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.send import sender as sender_module
from celery_leaderbeat.send.plain import publish
from celery_leaderbeat.store.types import ClaimItem, Code, Op
from celery_leaderbeat.timing.slots import to_ms
from tests.support.beat import NOOP
from tests.support.queues import take_messages

UTC = timezone.utc
SLOTS = [datetime(2020, 1, 1, tzinfo=UTC), datetime(2020, 1, 1, 0, 0, 7, tzinfo=UTC)]
TAG = re.compile(rb'"delivery_tag": "[^"]*"')


#: the send paths on a Redis broker: ``plain``, the reference (Celery builds every message,
#: kombu's ``Producer.batch`` sends it after the claim); ``templates``, after the claim with
#: messages built from kept shapes (leaderbeat's state on another database); ``one_step``,
#: the claim script runs kombu's commands (the state on the broker's own database)
REDIS_PATHS = ["plain", "templates", "one_step"]


@pytest.fixture(params=REDIS_PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The send path a test's scheduler takes."""
    if request.param == "plain":
        monkeypatch.setattr(sender_module, "OPTIMISED", False)
    return str(request.param)


def schedule() -> dict:
    entries = {}
    for i in (1, 2):  # two entries per shape: the second one's message is built from the first
        entries[f"plain-{i}"] = {"task": NOOP, "schedule": 60.0, "args": [i, "x" * i],
                                 "kwargs": {"k": {"n": i}}}
        entries[f"urgent-{i}"] = {"task": NOOP, "schedule": 60.0, "args": [i],
                                  "options": {"priority": 7}}
        entries[f"routed-{i}"] = {"task": "proj.routed", "schedule": 60.0, "args": [i]}
        entries[f"own-queue-{i}"] = {"task": NOOP, "schedule": 60.0, "kwargs": {"i": i},
                                     "options": {"queue": "mine", "headers": {"h": "x"}}}
    return entries


def make_app(broker_url: str, state_url: str | None, prefix: str, keyprefix: str) -> Celery:
    app = Celery("proj")
    app.conf.update(broker_url=broker_url, leaderbeat_key_prefix=prefix, timezone="UTC",
                    beat_schedule=schedule(), task_routes={"proj.routed": {"queue": "other"}})
    if state_url:
        app.conf.leaderbeat_redis_url = state_url
    if keyprefix:
        app.conf.broker_transport_options = {"global_keyprefix": keyprefix}
    return app


def send_through_chunks(scheduler: Scheduler) -> None:
    """Claim every entry's two slots as the leader does, a chunk per slot, and send them."""
    assert scheduler.lease.try_acquire()
    token, epoch = scheduler.lease.credentials()
    sender = scheduler._chunk_sender(epoch)
    for slot in SLOTS:
        wanted = [(name, slot) for name in scheduler.schedule if name in schedule()]
        prepared = sender.prepare(wanted)
        results = scheduler.ledger.claim(token, epoch, [
            ClaimItem(name, to_ms(slot), Op.CLAIM, to_ms(slot), enqueue=commands or ())
            for (name, _), commands in zip(wanted, prepared)])
        assert results == [Code.GRANTED] * len(wanted)
        sender.enqueued([w for w, c in zip(wanted, prepared) if c])
        rest = [w for w, c in zip(wanted, prepared) if not c]
        assert sender.send_many(rest, lambda: True) == [True] * len(rest)


def send_through_apply_async(scheduler: Scheduler) -> None:
    epoch = scheduler.lease.credentials()[1]
    with scheduler.app.producer_or_acquire() as producer:
        for slot in SLOTS:
            for name in schedule():
                publish(scheduler, scheduler.schedule[name], slot, epoch, producer=producer)


def queued(client) -> dict[tuple[str, str], tuple[str, bytes]]:
    """Every message in the broker's lists, by (entry, slot): its list and payload, then emptied."""
    import json

    out = {}
    for key in client.keys("*"):
        if client.type(key) != b"list":
            continue
        for raw in client.lrange(key, 0, -1):
            headers = json.loads(raw)["headers"]
            out[(headers["leaderbeat_entry"], headers["leaderbeat_slot"])] = (
                key.decode(), TAG.sub(b'"delivery_tag": "-"', raw))
        client.delete(key)
    return out


@pytest.mark.parametrize("keyprefix", ["", "gk:"])
def test_messages_on_redis_are_what_apply_async_puts_there(redis_server, key_prefix, path,
                                                           keyprefix):
    fast = path == "one_step"  # leaderbeat's state on the broker's database, else another
    app = make_app(redis_server.url_for(0 if fast else 1),
                   None if fast else redis_server.url_for(0), key_prefix, keyprefix)
    broker = redis_server.client(db=0 if fast else 1)
    scheduler = Scheduler(app=app)
    try:
        send_through_chunks(scheduler)
        assert scheduler._enqueuer is not None and scheduler._enqueuer.path()[0] == (
            "one_step" if fast else "plain")
        ours = queued(broker)
        send_through_apply_async(scheduler)
        celerys = queued(broker)
        shapes = scheduler._enqueuer.messages._shapes
    finally:
        scheduler.close()
    assert len(ours) == 2 * len(schedule())
    assert ours == celerys  # same list, same bytes
    assert all(key.startswith(keyprefix) for key, _ in ours.values())
    lists = {key for key, _ in ours.values()}
    assert {keyprefix + "celery", keyprefix + "other", keyprefix + "mine"} <= lists
    assert any(key.startswith(keyprefix + "celery\x06\x16") for key in lists)  # priority list
    # one shape per task and options, each checked against apply_async and found exact
    assert len(shapes) == (0 if path == "plain" else 4)
    assert all(s is not None and s.exact for s in shapes.values())


def test_messages_on_another_transport_are_what_apply_async_publishes(redis_server, key_prefix):
    """kombu's in-memory transport: no commands known, so Producer.publish with Celery's own
    arguments (the body serialised once per entry)."""
    app = make_app("memory://", redis_server.url_for(0), key_prefix, "")
    scheduler = Scheduler(app=app)

    def drain() -> dict:
        with app.connection_for_write() as conn:
            return take_messages(conn, ("celery", "other", "mine"), delivery_info=True)

    try:
        send_through_chunks(scheduler)
        assert not scheduler._enqueuer.fast and not scheduler._enqueuer.redis
        ours = drain()
        send_through_apply_async(scheduler)
        celerys = drain()
        shapes = scheduler._enqueuer.messages._shapes
    finally:
        scheduler.close()
    assert len(ours) == 2 * len(schedule())
    assert ours == celerys
    assert len(shapes) == 4 and all(s is not None and s.exact for s in shapes.values())


def test_a_before_task_publish_receiver_gets_every_message_built_by_apply_async(
        redis_server, key_prefix):
    app = make_app(redis_server.url_for(0), None, key_prefix, "")
    broker = redis_server.client()
    seen = []

    def stamp(headers=None, **kwargs):  # a receiver may change each message
        headers["stamped"] = len(seen)
        seen.append(headers["leaderbeat_entry"])

    signals.before_task_publish.connect(stamp, weak=False)
    scheduler = Scheduler(app=app)
    try:
        send_through_chunks(scheduler)
    finally:
        signals.before_task_publish.disconnect(stamp)
        scheduler.close()
    ours = queued(broker)
    assert len(seen) == len(ours) == 2 * len(schedule())
    stamps = sorted(re.search(rb'"stamped": (\d+)', raw).group(1) for _, raw in ours.values())
    assert stamps == sorted(str(i).encode() for i in range(len(seen)))


def test_an_entry_changed_in_place_gets_new_arguments(redis_server, key_prefix):
    app = make_app(redis_server.url_for(0), None, key_prefix, "")
    broker = redis_server.client()
    scheduler = Scheduler(app=app)
    try:
        send_through_chunks(scheduler)
        queued(broker)
        entry = scheduler.schedule["plain-2"]
        entry.args = [42]
        epoch = scheduler.lease.credentials()[1]
        sender = scheduler._chunk_sender(epoch)
        slot = SLOTS[1] + timedelta(seconds=60)
        built = scheduler._enqueuer.build(entry, slot, epoch, "allow")
    finally:
        scheduler.close()
    assert built.body[0] == [42]
    assert built.kwargs["headers"]["argsrepr"] == "[42]"
    assert sender.fast


def test_a_leader_prepares_messages_in_idle_time_before_their_first_slot(redis_server, key_prefix):
    app = make_app(redis_server.url_for(0), None, key_prefix, "")
    app.conf.beat_schedule = {f"e{i}": {"task": NOOP, "schedule": crontab_far(), "args": [i]}
                              for i in range(50)}
    broker = redis_server.client()
    scheduler = Scheduler(app=app)
    try:
        for _ in range(50):
            scheduler.tick()
            if scheduler._warmed is not None:
                break
        assert scheduler._warmed is not None  # every entry prepared
        messages = scheduler._enqueuer.messages
        assert all(messages._parts[f"e{i}"].ready for i in range(50))
        shapes = {key[0]: shape for key, shape in messages._shapes.items()}
        assert shapes[NOOP] is not None
        # Celery's own backend_cleanup entry expires: its messages are apply_async's each time
        assert shapes["celery.backend_cleanup"] is None
        assert not [k for k in broker.keys("*") if broker.type(k) == b"list"]  # nothing sent
    finally:
        scheduler.close()


def test_a_leader_goes_on_preparing_at_once_while_entries_are_left_and_idle_time_remains(
        redis_server, key_prefix, monkeypatch):
    """One slice per tick (here one entry: no time at all a slice); the tick asks to be
    called again at once until every entry is prepared, then sleeps until its slot."""
    from celery_leaderbeat.integrations import sending

    monkeypatch.setattr(sending, "WARM_MAX", 0.0)  # each slice stops after one entry
    app = make_app(redis_server.url_for(0), None, key_prefix, "")
    app.conf.beat_schedule = {f"e{i}": {"task": NOOP, "schedule": crontab_far(), "args": [i]}
                              for i in range(20)}
    scheduler = Scheduler(app=app)
    try:
        unfinished = []  # the delay of each tick that left entries to prepare
        for _ in range(100):
            delay = scheduler.tick()
            if scheduler._warmed is not None:
                break
            if scheduler._warming is not None:
                unfinished.append(delay)
        assert scheduler._warmed is not None
        messages = scheduler._enqueuer.messages
        assert all(messages._parts[f"e{i}"].ready for i in range(20))
        assert len(unfinished) >= 19  # one entry a slice: the work was spread over ticks
        assert set(unfinished) == {0.0}  # each asked to be called again at once
        assert delay > sending.WARM_MIN  # done: it sleeps until its next wake-up
        assert scheduler.tick() > sending.WARM_MIN  # and stays idle once all is prepared
    finally:
        scheduler.close()


def crontab_far():
    from celery.schedules import crontab

    return crontab(minute=0, hour=0, day_of_month=1, month_of_year=1)  # once a year


def test_delivery_tags_are_random_uuid4s_as_kombu_makes_them():
    import uuid

    from celery_leaderbeat.send.templates import delivery_tag

    tags = [delivery_tag() for _ in range(200)]
    assert len(set(tags)) == 200
    for tag in tags:
        parsed = uuid.UUID(tag)
        assert str(parsed) == tag and parsed.version == 4 and parsed.variant == uuid.RFC_4122
