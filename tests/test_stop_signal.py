"""A stop signal that lands while the scheduler is inside a store call.

Celery's beat handles SIGTERM and SIGINT by closing the scheduler from inside the
handler, wherever the main thread was, then raising SystemExit. On PostgreSQL a record
call's transaction holds the lease row from its first statement to its COMMIT; a close
run on top of it released the lease through another connection and waited for that row:
for the very transaction it had interrupted. The process hung until killed.

Here a real ``celery.beat.Service`` runs with Celery's own handler installed, against
a PostgreSQL database of the test's own; the signal is sent from inside the record call,
after its first round trip took the lease row and before its COMMIT.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.apps.beat import Beat
from celery.beat import Service

from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.store.postgres import claims_sql
from tests.support.beat import NOOP
from tests.support.postgres import HOST, PORT, USER, _connect, postgres_database

pytest.importorskip("psycopg")

#: how long the watchdog lets a stopped service hang before it ends the test's sessions
HANG = 20.0


@pytest.fixture
def database() -> Iterator[str]:
    with postgres_database("lbsignal") as name:
        yield name


@pytest.fixture
def restore_stop_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _watchdog(database: str, seconds: float, done: threading.Event,
              signalled: list[float]) -> None:
    """If the service has not stopped in ``seconds``: stop it (no signal was sent yet), or
    end every session of ``database`` (it hangs): the test then fails instead of holding
    the suite forever."""
    if done.wait(seconds):
        return
    if not signalled:
        os.kill(os.getpid(), signal.SIGTERM)
        return
    with _connect() as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE datname = %s AND pid <> pg_backend_pid()", (database,))


def test_a_stop_signal_inside_a_record_call_stops_beat_at_once_and_releases_the_lease(
        database, key_prefix, restore_stop_handlers, monkeypatch):
    app = Celery("proj")
    app.conf.update(
        # kombu's memory transport keeps its queues for the process: a queue of our own
        broker_url="memory://", task_default_queue=f"q-{key_prefix}", timezone="UTC",
        leaderbeat_store_url=f"postgresql://{USER}@{HOST}:{PORT}/{database}",
        leaderbeat_key_prefix=key_prefix,
        beat_schedule={"report": {"task": NOOP, "schedule": 0.5}})
    service = Service(app, scheduler_cls=Scheduler)
    Beat(app=app).install_sync_handler(service)
    celerys = signal.getsignal(signal.SIGTERM)

    signalled: list[float] = []
    original = claims_sql._generation

    def generation(*args: Any, **kwargs: Any) -> Any:
        # called once the server has run the record's first round trip (its transaction
        # holds the lease row) and before its COMMIT; only record() runs with Celery's own
        # handler in place (a claim runs shielded: the signal waits for the chunk)
        if (not signalled and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is celerys
                and sys._getframe(1).f_code.co_name == "record"):
            signalled.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)  # handled here: the lease row is held
        return original(*args, **kwargs)

    monkeypatch.setattr(claims_sql, "_generation", generation)
    done = threading.Event()
    watchdog = threading.Thread(target=_watchdog, args=(database, HANG, done, signalled),
                                daemon=True)
    watchdog.start()
    started = time.monotonic()
    try:
        service.start()  # returns once the handler's SystemExit ended its loop
    finally:
        done.set()
    stopped = time.monotonic()

    assert signalled, "no record call ran outside a chunk within the run"
    assert stopped - signalled[0] < 5.0, (
        f"beat took {stopped - signalled[0]:.1f} s to stop after the signal "
        f"(ran {stopped - started:.1f} s; the watchdog ends it at {HANG} s)")
    with _connect(database) as conn:
        holder = conn.execute("SELECT holder FROM leaderbeat.lease WHERE app = %s",
                              (key_prefix,)).fetchone()
        released = conn.execute("SELECT count(*) FROM leaderbeat.history WHERE app = %s"
                                 " AND event = 'released'", (key_prefix,)).fetchone()
    assert holder == (None,) and released == (1,), \
        "the stopped leader gave its lease up for the standbys"
