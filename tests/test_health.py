"""Probes on the metrics port: ``/healthz`` (liveness) and ``/readyz`` (readiness).

Liveness says only "this process is stuck" (beat's main loop more than the lease
ttl past its planned wake-up): a Redis outage of any length must not get a beat
restarted, since a restarted Redis relies on the surviving leader's memory.
Readiness may say "Redis is down". The same port keeps serving ``/metrics``,
including which send path the beat uses.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import kombu
import pytest
from celery import Celery
from click.testing import CliRunner

from celery_leaderbeat.ops.health import Health
from celery_leaderbeat.ops.metrics import Metrics
from tests.support.beat import NOOP, BeatProcess, beat_env
from tests.support.redis_binary import free_port

pytest.importorskip("prometheus_client")  # the metrics port needs it (config.py)

ONE_STEP = "one_step" if kombu.VERSION[:2] == (5, 7) else "plain"


def get(port: int, path: str) -> tuple[int, str]:
    """(HTTP status, body) of ``path`` on this host's ``port``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_for(port: int, path: str, status: int, timeout: float) -> str:
    """Poll ``path`` until it answers ``status``; its body."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = get(port, path)
        except OSError as exc:  # not listening yet
            seen = (None, repr(exc))
        if seen[0] == status:
            return seen[1]
        time.sleep(0.1)
    raise AssertionError(f"{path} did not answer {status} within {timeout} s; last: {seen}")


# -- in-process: the probes' answers, over HTTP -------------------------------------------


def test_probes_answer_from_the_main_loop_and_redis_and_metrics_stay_on_the_same_port():
    wake_by = [time.monotonic() + 60]  # the main loop asleep until then
    failing = [False]
    health = Health(lambda: wake_by[0], stall_after=10.0, ticks_failing=lambda: failing[0])
    metrics = Metrics()
    port = free_port()
    metrics.serve(port, health)
    try:
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/readyz") == (503, "not ready: Redis has not answered this beat yet\n")
        metrics.clock_skew(0.0)  # a tick whose Redis calls all succeeded
        assert get(port, "/readyz")[0] == 200
        metrics.renewed(None)  # a lease renewal Redis did not answer
        status, body = get(port, "/readyz")
        assert status == 503 and "last lease renewal" in body
        assert get(port, "/healthz")[0] == 200  # Redis is no business of liveness
        metrics.renewed(0.001)
        assert get(port, "/readyz")[0] == 200
        failing[0] = True  # the scheduler's ticks find Redis unreachable
        assert get(port, "/readyz")[0] == 503
        failing[0] = False
        wake_by[0] = time.monotonic() - 11  # 11 s past the wake-up it planned: stuck
        status, body = get(port, "/healthz")
        assert status == 503 and "past its planned wake-up" in body
        assert get(port, "/readyz")[0] == 503
        status, body = get(port, "/metrics")
        assert status == 200 and "leaderbeat_lease_renew_failures_total 1.0" in body
    finally:
        metrics.close()


def _scheduler_metrics(redis_server, key_prefix: str, broker_db: int) -> tuple[str, dict]:
    """The scheduler's /metrics once it sent, and ``leaderbeat status --json`` once its
    registry record says how it sends."""
    from celery_leaderbeat.ops.cli import leaderbeat
    from celery_leaderbeat.scheduler import Scheduler

    port = free_port()
    app = Celery("proj")
    app.conf.update(broker_url=redis_server.url_for(broker_db),
                    leaderbeat_redis_url=redis_server.url_for(0), leaderbeat_key_prefix=key_prefix,
                    beat_schedule={"a": {"task": NOOP, "schedule": 0.5}}, timezone="UTC",
                    leaderbeat_standby_poll=0.2, leaderbeat_metrics_port=port)
    broker = redis_server.client(db=broker_db)
    scheduler = Scheduler(app=app)
    try:
        deadline = time.monotonic() + 15
        while broker.llen("celery") < 1:
            assert time.monotonic() < deadline, "nothing was sent"
            time.sleep(min(scheduler.tick(), 0.1))
        body = get(port, "/metrics")[1]
        status: dict = {}
        while not status.get("send_path"):  # the record is written once a renew interval
            assert time.monotonic() < deadline, f"status never said how the leader sends: {status}"
            time.sleep(min(scheduler.tick(), 0.1))
            out = CliRunner().invoke(leaderbeat, ["status", "--json"], catch_exceptions=False,
                                     obj=SimpleNamespace(app=app, no_color=True))
            status = json.loads(out.output)
        return body, status
    finally:
        scheduler.close()
        scheduler._telemetry.metrics.close()  # type: ignore[attr-defined]


def test_the_send_path_metric_and_status_say_one_step_on_the_brokers_own_redis(
        redis_server, key_prefix):
    body, status = _scheduler_metrics(redis_server, key_prefix, broker_db=0)
    line = next(x for x in body.splitlines() if x.startswith("leaderbeat_send_path{"))
    assert f'path="{ONE_STEP}"' in line and line.endswith(" 1.0")
    assert status["send_path"].startswith(ONE_STEP)


def test_the_send_path_metric_and_status_say_plain_and_why_when_the_broker_is_another_database(
        redis_server, key_prefix):
    body, status = _scheduler_metrics(redis_server, key_prefix, broker_db=1)
    lines = [x for x in body.splitlines() if x.startswith("leaderbeat_send_path{")]
    assert len(lines) == 1 and 'path="plain"' in lines[0] and lines[0].endswith(" 1.0")
    # the first reason found: a kombu outside the known range is checked before the broker
    why = ("the broker is another Redis server or database" if ONE_STEP == "one_step"
           else f"kombu {kombu.__version__}")
    assert f'reason="{why}' in lines[0]
    assert status["send_path"].startswith(f"plain: {why}")


# -- real beat processes ------------------------------------------------------------------

#: the lease ttl by default: liveness fails once the main loop is a ttl past its wake-up
TTL = 10.0
#: shortened on purpose for the hung loop (defaults: ttl 10 s, renew 10/3 s, poll 1 s), so
#: that it is found stuck within seconds
FAST = {"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 1,
        "leaderbeat_standby_poll": 0.5}


def start_beat(tmp_path: Path, state, key_prefix: str, port: int,
               app_module: str = "tests.support.beatapp", settings: dict | None = None,
               **env: str) -> BeatProcess:
    settings = {**(settings or {}), "leaderbeat_metrics_port": port}
    full_env = beat_env(tmp_path, broker_url=state.url_for(0), redis_url=state.url,
                        prefix=key_prefix, schedule={"e": {"task": NOOP, "every": 1}},
                        settings=settings)
    beat = BeatProcess(app_module, {**full_env, **env}, tmp_path / "beat.log")
    beat.wait_for_log(r"elected leader", timeout=30)
    wait_for(port, "/readyz", 200, timeout=15)
    return beat


@pytest.mark.slow
def test_a_redis_outage_longer_than_the_probe_window_keeps_the_beat_live_and_only_unready(
        tmp_path, make_redis_server, key_prefix):
    """deploy/kubernetes/beat.yaml restarts a pod after periodSeconds × failureThreshold =
    30 s of failed liveness probes. The outage here lasts 35 s, just past that window
    (shortened on purpose from the 90 s, three windows, an outage may well last), with the
    lease settings at their defaults. Redis comes back empty (killed, not paused), as after
    a crash without persistence. The broker is the same Redis, down with it."""
    state = make_redis_server()
    port = free_port()
    beat = start_beat(tmp_path, state, key_prefix, port)
    try:
        state.kill()
        outage_ends = time.monotonic() + 35
        live, ready = [], []
        while time.monotonic() < outage_ends:
            live.append(get(port, "/healthz"))
            ready.append(get(port, "/readyz")[0])
            time.sleep(0.25)
        assert [x for x in live if x[0] != 200] == [], "liveness failed during a Redis outage"
        assert 503 in ready, "readiness never said Redis was down"
        assert ready[-1] == 503
        state.restart()
        wait_for(port, "/readyz", 200, timeout=20)
        assert get(port, "/healthz")[0] == 200
        assert beat.alive
        # the broker (this Redis) is checked again at the leader's next batch after it
        # answers: the metric says so within a few of the entry's slots
        deadline, metrics = time.monotonic() + 15, ""
        while time.monotonic() < deadline:
            metrics = get(port, "/metrics")[1]
            if f'leaderbeat_send_path{{path="{ONE_STEP}"' in metrics:
                break
            time.sleep(0.25)
        assert f'leaderbeat_send_path{{path="{ONE_STEP}"' in metrics
    finally:
        beat.close()


@pytest.mark.slow
def test_a_beat_whose_main_loop_hangs_fails_liveness_and_recovers_when_it_goes_on(
        tmp_path, make_redis_server, key_prefix):
    """The loop hangs in a ``slot_sent`` receiver (tests/support/stuckapp.py) while the
    process and its HTTP thread run on: a stopped process would answer no probe at all."""
    state = make_redis_server()
    port = free_port()
    stuck = tmp_path / "stuck"
    beat = start_beat(tmp_path, state, key_prefix, port, "tests.support.stuckapp", FAST,
                      LB_STUCK_FILE=str(stuck))
    try:
        assert get(port, "/healthz")[0] == 200
        stuck.touch()  # the next slot's receiver does not return
        body = wait_for(port, "/healthz", 503, timeout=4 * FAST["leaderbeat_lease_ttl"])
        assert "past its planned wake-up" in body
        assert get(port, "/readyz")[0] == 503
        assert get(port, "/metrics")[0] == 200  # the process answers: only its loop is stuck
        stuck.unlink()
        wait_for(port, "/healthz", 200, timeout=10)
        assert beat.alive
    finally:
        beat.close()
