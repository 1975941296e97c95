"""Found by the chaos suite: SIGTERM must stop a *standby* cleanly too (exit 0).

A standby spends its time in ``pubsub.get_message(timeout=poll)`` (waiting for
``released``). Celery beat's SIGTERM handler runs ``Service.sync()`` ->
``Scheduler.close()`` -> ``self._pubsub.close()`` inside the signal handler,
i.e. on top of the frame blocked in that very socket read; the handler then
raises ``SystemExit``, which unwinds into redis-py's ``finally:
buf.seek(current_pos)`` on the buffer just closed: ``ValueError: I/O operation
on closed file`` replaces ``SystemExit``, beat logs ``CRITICAL beat raised
exception`` and exits 1. The leader (asleep in ``time.sleep``) exits 0.
"""

from __future__ import annotations

import time

import pytest

from tests.support.beat import NOOP, BeatCluster, beat_env

from .harness import SETTINGS, pid_of, wait_until

pytestmark = pytest.mark.slow


def test_sigterm_to_a_standby_exits_0_without_a_critical_error(tmp_path, make_redis_server):
    state, broker = make_redis_server(), make_redis_server()
    env = beat_env(tmp_path, broker_url=broker.url_for(0), redis_url=state.url, prefix="st",
                   schedule={"a": {"task": NOOP, "every": 1}}, settings=SETTINGS)
    client = state.client()
    with BeatCluster(2, env, tmp_path) as cluster:
        token = wait_until(lambda: client.get("{st}:leader"), 30)
        assert token, cluster.logs()
        leader_pid = pid_of(token.decode())
        standby = next(b for b in cluster if b.pid != leader_pid)
        standby.wait_for_log(r"beat: Starting", timeout=20)
        time.sleep(1.5)  # a few standby polls: it now waits in pubsub.get_message
        code = standby.term()
        critical = [line for line in standby.log_text().splitlines() if "CRITICAL" in line]
        assert (code, critical) == (0, []), standby.log_text()[-3000:]
