"""``celery leaderbeat`` on a django-celery-beat site: a row is named as what it is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.beat import NOOP, REPO_ROOT, BeatProcess
from tests.support.postgres import postgres_database

pytestmark = pytest.mark.slow

pytest.importorskip("django_celery_beat", reason="needs the django extra")

from tests.support.djangosite.testing import SETTINGS, add, every, migrated

APP = "tests.support.djangosite"


def site_env(name: str, state, key_prefix: str) -> dict[str, str]:
    return {"LB_DJANGO_DB": name, "LB_BROKER_URL": state.url_for(1), "LB_REDIS_URL": state.url,
            "LB_PREFIX": key_prefix, "DJANGO_SETTINGS_MODULE": SETTINGS}


@pytest.fixture
def env(monkeypatch, make_redis_server, key_prefix):
    with postgres_database("lbcli") as name:
        monkeypatch.setenv("LB_DJANGO_DB", name)
        monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS)
        with migrated(name):
            yield site_env(name, make_redis_server(), key_prefix)


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "celery", "-A", APP, "leaderbeat", *args],
                          cwd=REPO_ROOT, env={**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_runtime_command_given_a_django_row_names_it_a_django_celery_beat_entry(env):
    add("nightly-report", task=NOOP, interval=every(3600))
    done = cli(env, "disable", "nightly-report")
    assert done.returncode == 65, done.stderr
    assert "it is a django-celery-beat entry (change it in the Django admin" in done.stderr
    paused = cli(env, "pause", "nightly-reprot")
    assert paused.returncode == 65 and "did you mean 'nightly-report'?" in paused.stderr


def test_status_labels_a_django_row_database_and_a_beat_schedule_entry_static(env):
    import json

    add("nightly-report", task=NOOP, interval=every(3600))
    done = cli(env, "status", "--json")
    assert done.returncode == 0, done.stderr
    source = {row["entry"]: row["source"] for row in json.loads(done.stdout)["entries"]}
    assert source["nightly-report"] == "database"
    assert all(source[name] == "static" for name in source if name.startswith("celery."))



def test_status_on_a_database_whose_migrations_were_not_applied_says_to_migrate(
        make_redis_server, key_prefix):
    with postgres_database("lbcli") as name:
        done = cli(site_env(name, make_redis_server(), key_prefix), "status")
    assert done.returncode == 78, done.stderr
    assert "Traceback" not in done.stderr
    assert "django_celery_beat_periodictask" in done.stderr
    assert f"({name})" in done.stderr
    assert "python manage.py migrate django_celery_beat" in done.stderr


def test_beat_on_a_database_whose_migrations_were_not_applied_stops_saying_to_migrate(
        tmp_path, make_redis_server, key_prefix):
    with postgres_database("lbcli") as name:
        env = {**site_env(name, make_redis_server(), key_prefix), "PYTHONPATH": str(REPO_ROOT)}
        with BeatProcess(APP, env=env, log_path=tmp_path / "beat.log") as beat:
            assert beat.wait_exit(60) != 0
            log = beat.log_text()
    assert f"django-celery-beat's tables cannot be read in database 'default' ({name})" in log
    assert "python manage.py migrate django_celery_beat" in log
