"""Redis restored from an older snapshot under three live beats: the node that led goes first.

Real ``celery beat`` processes with Celery's and leaderbeat's defaults (300 s beat
loop, 10 s lease), ten entries every second, the broker a second Redis drained
every 20 ms. The snapshot is taken, the beats go on past the lease ttl (so the
lease in the snapshot has expired), then Redis is put back to it:

- ``reload``: ``DEBUG RELOAD NOSAVE`` from the snapshot file; every connection
  stays up, so no beat sees an outage (the case where a standby used to win
  before the node that led noticed);
- ``restart``: the server is killed, the snapshot put in place, started again.

Redis lost writes and nobody holds the lease: the node that led takes it again
and carries on from what it sent; a standby elected instead starts every entry
again after a margin (3 s on this machine), the slots it skips recorded
``missed``.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from celery_leaderbeat.config import Config
from celery_leaderbeat.roles.loss import loss_grace
from celery_leaderbeat.store.keys import Keys
from tests.support.beat import BeatCluster, beat_env
from tests.support.recorder import Message, Recorder

pytestmark = pytest.mark.slow

NOOP = "tests.support.beatapp.noop"
REPEATS = {"reload": 3, "restart": 2}


@contextmanager
def draining(client) -> Iterator[Recorder]:
    """Take every message off the broker every 20 ms (``received`` is when it was seen)."""
    recorder, stop = Recorder(client), threading.Event()

    def run() -> None:
        while not stop.wait(0.02):
            recorder.drain()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        stop.set()
        thread.join(5)


def sender(message: Message) -> int | None:
    found = re.match(r"gen(\d+)@", str(message.headers.get("origin") or ""))
    return int(found.group(1)) if found else None


def leader_pid(client, prefix: str) -> int | None:
    raw = client.get(Keys(prefix).leader)
    return int(raw.decode().split("|")[0].split(":")[-2]) if raw else None


def events_since(client, prefix: str, since: float) -> list[dict[str, str]]:
    rows = []
    for event_id, fields in client.xrange(Keys(prefix).history, min=f"{int(since * 1000)}-0"):
        rows.append({**{k.decode(): v.decode() for k, v in fields.items()},
                     "at": int(event_id.decode().split("-")[0]) / 1000})
    return rows


def put_back(state, snapshot, how: str) -> float:
    """Redis back on the snapshot; the wall time it answers again."""
    if how == "reload":
        shutil.copy(snapshot, state.dir / "dump.rdb")
        state.client().execute_command("DEBUG", "RELOAD", "NOSAVE")
    else:
        state.kill()
        shutil.copy(snapshot, state.dir / "dump.rdb")
        state.restart()
    return time.time()


@contextmanager
def three_beats_sending(tmp_path, make_redis_server, key_prefix: str
                        ) -> Iterator[tuple[Any, Recorder, BeatCluster]]:
    """Three real beats (the defaults) on a state Redis of their own, ten entries every
    second, the broker a second Redis drained every 20 ms; yields (state, recorder,
    cluster) once a leader has sent 30 messages."""
    # DEBUG RELOAD needs the debug command (off by default since Redis 7)
    state = make_redis_server("--enable-debug-command", "yes")
    broker = make_redis_server()
    schedule = {f"e{i}": {"task": NOOP, "every": 1, "args": [f"e{i}"]} for i in range(10)}
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule=schedule)
    with draining(broker.client()) as recorder, BeatCluster(3, env, tmp_path) as cluster:
        deadline = time.monotonic() + 60
        while len(recorder.messages) < 30:  # a leader sends every second
            assert time.monotonic() < deadline, "no leader sent 30 messages within 60 s"
            time.sleep(0.1)
        yield state, recorder, cluster


def take_snapshot(state, snapshot) -> None:
    """Redis's data now, kept at ``snapshot`` for :func:`put_back`."""
    state.client().save()
    shutil.copy(state.dir / "dump.rdb", snapshot)


@pytest.mark.parametrize("how", ["reload", "restart"])
def test_redis_restored_from_an_older_snapshot_the_node_that_led_wins_and_carries_on(
        tmp_path, make_redis_server, key_prefix, how):
    snapshot = tmp_path / "snapshot.rdb"
    measured = []
    with three_beats_sending(tmp_path, make_redis_server, key_prefix) as (state, recorder,
                                                                         cluster):
        for _ in range(REPEATS[how]):
            time.sleep(2)
            take_snapshot(state, snapshot)
            time.sleep(12)  # past the lease ttl: the lease in the snapshot has expired
            led = leader_pid(state.client(), key_prefix)
            assert led is not None
            up = put_back(state, snapshot, how)
            time.sleep(6)
            events = events_since(state.client(), key_prefix, up - 0.5)
            elected = [e for e in events if e["event"] == "elected"]
            first = next((m for m in list(recorder.messages) if m.received > up), None)
            missed = [e for e in events if e["event"] == "missed"]
            measured.append((elected[0]["at"] - up if elected else None,
                             first.received - up if first else None))
            assert elected and int(elected[0]["node"].split(":")[-2]) == led, \
                (led, elected, [b.pid for b in cluster])
            assert first is not None and sender(first) == led
            # the node that led notices at its next claim (a slot every second) and sends
            # it: about 1 s; a standby elected instead starts after the margin (3 s or more)
            assert first.received - up < 2.0, measured
            assert missed == [], missed
            assert all(b.alive for b in cluster)
    print(f"{how}: (elected, first send) s after Redis answered: "
          + ", ".join(f"({e:.2f}, {f:.2f})" for e, f in measured))


def test_the_node_that_led_killed_as_redis_is_restored_a_standby_leads_after_the_grace(
        tmp_path, make_redis_server, key_prefix):
    """The one case the grace slows: Redis lost writes and the node that led is gone too.
    A standby holds back for the grace (renew interval + 2 standby polls, 5.3 s with
    the defaults), then leads."""
    snapshot = tmp_path / "snapshot.rdb"
    with three_beats_sending(tmp_path, make_redis_server, key_prefix) as (state, recorder,
                                                                         cluster):
        grace = loss_grace(Config.from_values({"redis_url": state.url,
                                               "key_prefix": key_prefix, "node_id": "test"}))
        take_snapshot(state, snapshot)
        time.sleep(12)  # past the lease ttl: the lease in the snapshot has expired
        led = leader_pid(state.client(), key_prefix)
        next(b for b in cluster if b.pid == led).kill()
        up = put_back(state, snapshot, "reload")
        deadline = time.monotonic() + 30
        while not (elected := [e for e in events_since(state.client(), key_prefix, up - 0.5)
                               if e["event"] == "elected"]):
            assert time.monotonic() < deadline, "no standby led within 30 s"
            time.sleep(0.05)
        first = None
        while first is None and time.monotonic() < deadline:
            first = next((m for m in list(recorder.messages) if m.received > up), None)
            time.sleep(0.05)
    took = elected[0]["at"] - up
    print(f"the node that led killed at the restore: a standby elected {took:.2f} s, first "
          f"send {first.received - up if first else float('nan'):.2f} s after Redis answered "
          f"(grace {grace:.2f} s)")
    assert int(elected[0]["node"].split(":")[-2]) != led
    # held back for the grace from its first attempt (within a poll of Redis answering),
    # then elected at its next poll
    assert grace - 0.2 <= took <= grace + 3.0, took
    assert first is not None and sender(first) != led
