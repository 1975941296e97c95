"""example_project/ end to end: migrate, run its beat, see its tasks sent and its rows written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest

from tests.support.beat import REPO_ROOT, BeatProcess, Recorder, duplicates

pytestmark = pytest.mark.slow

pytest.importorskip("django_celery_beat", reason="needs the django extra")

EXAMPLE = REPO_ROOT / "example_project"

INSPECT = """
import json
from django.contrib.admin import site
from django_celery_beat.admin import PeriodicTaskAdmin
from django_celery_beat.models import PeriodicTask
rows = {t.name: {"enabled": t.enabled, "runs": t.total_run_count,
                 "last": t.last_run_at and t.last_run_at.isoformat(),
                 "crontab": t.crontab and str(t.crontab.minute) + " " + str(t.crontab.hour)}
        for t in PeriodicTask.objects.all()}
admin = PeriodicTaskAdmin(PeriodicTask, site)
admin.message_user = lambda *args, **kwargs: None
admin.run_tasks(None, PeriodicTask.objects.filter(name="purge-old-reports"))
print("ROWS=" + json.dumps(rows))
"""


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=EXAMPLE, env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_example_project_migrates_runs_its_beat_and_sends_its_tasks(
        tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    env = {**os.environ, "SQLITE_PATH": str(tmp_path / "db.sqlite3"),
           "CELERY_BROKER_URL": broker.url_for(0), "LEADERBEAT_REDIS_URL": state.url,
           "LEADERBEAT_KEY_PREFIX": key_prefix, "PYTHONPATH": str(EXAMPLE),
           "DJANGO_SETTINGS_MODULE": "proj.settings"}
    env.pop("POSTGRES_DB", None)
    env.pop("LEADERBEAT_STORE", None)
    run_the_example(tmp_path, env, Recorder(broker.client()))


def test_the_example_project_on_postgresql_keeps_its_lease_in_the_sites_database(
        tmp_path, key_prefix):
    from tests.support.amqp_recorder import AmqpRecorder
    from tests.support.postgres import _connect, postgres_database
    from tests.support.rabbitmq import require_rabbitmq

    pytest.importorskip("psycopg")
    recorder = AmqpRecorder(require_rabbitmq())
    with postgres_database("lbexample") as name:
        env = {**os.environ, "LEADERBEAT_STORE": "postgres", "POSTGRES_DB": name,
               "POSTGRES_HOST": "127.0.0.1", "POSTGRES_PORT": "5432",
               "POSTGRES_USER": "postgres", "CELERY_TASK_DEFAULT_QUEUE": recorder.queue,
               "LEADERBEAT_KEY_PREFIX": key_prefix, "PYTHONPATH": str(EXAMPLE),
               "DJANGO_SETTINGS_MODULE": "proj.settings"}
        for unset in ("CELERY_BROKER_URL", "LEADERBEAT_REDIS_URL", "SQLITE_PATH"):
            env.pop(unset, None)  # the settings' own: RabbitMQ, no Redis at all
        try:
            log = run_the_example(tmp_path, env, recorder)
        finally:
            recorder.close()
        banner = ". leaderbeat -> django (PostgreSQL of DATABASES['default']) schema=leaderbeat"
        assert f"{banner} prefix=" in log and "Redis" not in log, log
        with _connect(name) as conn:
            lease = conn.execute("SELECT epoch FROM leaderbeat.lease WHERE app = %s",
                                 (key_prefix,)).fetchone()
            elected = conn.execute("SELECT count(*) FROM leaderbeat.history WHERE app = %s"
                                   " AND event = 'elected'", (key_prefix,)).fetchone()
            tables = conn.execute("SELECT count(*) FROM pg_tables"
                                  " WHERE tablename = 'django_celery_beat_periodictask'"
                                  ).fetchone()
        assert lease is not None and lease[0] >= 1, "the lease lives in the site's database"
        assert elected == (1,) and tables == (1,)


def run_the_example(tmp_path, env: dict[str, str], recorder) -> str:
    """Migrate, run one beat until it sent ``say-hello`` twice, stop it; check what it
    sent and wrote. Returns the beat's log."""
    manage(env, "migrate", "--verbosity", "0")
    beat = BeatProcess("proj", env, tmp_path / "beat.log")
    with beat:
        recorder.wait_for(2, timeout=30, task="reports.tasks.say_hello")
        assert beat.term() == 0
    hello = [m for m in recorder.drain_all() if m.task == "reports.tasks.say_hello"]
    log = beat.log_text()
    assert "base=django_celery_beat.schedulers:DatabaseScheduler" in log
    assert "elected leader" in log
    assert duplicates(hello) == []
    out = manage(env, "shell", "-c", INSPECT)
    rows = json.loads(out.split("ROWS=", 1)[1])
    assert set(rows) >= {"say-hello", "quarter-hourly-report", "nightly-digest",
                         "purge-old-reports"}
    assert rows["quarter-hourly-report"]["crontab"] == "*/15 *"  # a cron string, as a crontab row
    sent = sorted(datetime.fromisoformat(m.slot) for m in hello)
    # written by the leader on its graceful stop, from the slot it sent
    assert rows["say-hello"]["runs"] == len(sent)
    assert datetime.fromisoformat(rows["say-hello"]["last"]) == sent[-1]
    # the admin's "Run selected tasks" sends directly through the app, outside any slot
    (run,) = recorder.wait_for(1, timeout=10, task="reports.tasks.purge_old_reports")
    assert run.slot is None and run.headers["periodic_task_name"] == "purge-old-reports"
    return log
