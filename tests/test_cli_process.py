"""The exit codes a probe or a script sees from a real ``celery -A ... leaderbeat`` process."""

from __future__ import annotations

import json

import pytest

from celery_leaderbeat import __version__
from tests.support.beat import NOOP, beat_env
from tests.support.redis_binary import free_port
from tests.test_cli import cli

pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path, make_redis_server, key_prefix):
    state = make_redis_server()
    return beat_env(tmp_path, broker_url=state.url, redis_url=state.url, prefix=key_prefix,
                    schedule={"tick": {"task": NOOP, "every": 1}})


def test_a_typo_and_an_outage_exit_with_different_codes(env):
    typo = cli(env, "history", "-n", "-3")
    assert typo.returncode == 64, typo.stderr
    assert "Invalid value for '-n'" in typo.stderr and "unreachable" not in typo.stderr
    command = cli(env, "histroy")
    assert command.returncode == 64 and "Did you mean 'history'?" in command.stderr
    outage = cli({**env, "LB_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, "health")
    assert outage.returncode == 69, outage.stderr
    assert "Redis unreachable" in outage.stderr and "Traceback" not in outage.stderr
    no_leader = cli(env, "health")
    assert no_leader.returncode == 1 and "NO LEADER" in no_leader.stdout


def test_json_errors_through_celery_are_json_with_the_exit_code(env):
    down = cli({**env, "LB_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
               "health", "--json")
    assert down.returncode == 69
    error = json.loads(down.stdout)["error"]
    assert (error["code"], error["kind"]) == (69, "unavailable")
    assert error["message"].startswith("Redis unreachable")
    unknown = cli(env, "pause", "tikc", "--json")
    assert unknown.returncode == 65
    assert "did you mean 'tick'?" in json.loads(unknown.stdout)["error"]["message"]


def test_a_mistyped_setting_exits_78_and_version_exits_0(env):
    bad = cli({**env, "LB_SETTINGS": json.dumps({"leaderbeat_lease_tll": 10})}, "status")
    assert bad.returncode == 78
    assert "did you mean 'leaderbeat_lease_ttl'?" in bad.stderr
    version = cli(env, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"celery-leaderbeat {__version__}"
