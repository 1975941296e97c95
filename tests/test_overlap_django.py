"""A django-celery-beat row's own overlap policy: its Headers field, through a real beat.

The row is made through the ORM in its own PostgreSQL database while a real
``celery beat`` of the test site runs; every message is read back from the broker.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.beat import BeatProcess, Recorder
from tests.support.postgres import postgres_database

pytestmark = pytest.mark.slow

pytest.importorskip("django_celery_beat", reason="needs the django extra")

from tests.support.djangosite.testing import SETTINGS, add, every, migrated

APP = "tests.support.djangosite"
ROWS = {"backfill", "plain"}
STATIC = "static-cron"  # the site's beat_schedule entry (tests/support/djangosite/settings.py)


def test_a_rows_headers_field_sets_its_overlap_policy_over_the_setting_and_a_row_without_one_takes_it(
        tmp_path, monkeypatch, make_redis_server, key_prefix):
    with postgres_database("lboverlap") as name:
        monkeypatch.setenv("LB_DJANGO_DB", name)
        monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS)
        with migrated(name):
            state, broker = make_redis_server(), make_redis_server()
            env = {"LB_DJANGO_DB": name, "LB_BROKER_URL": broker.url_for(0),
                   "LB_REDIS_URL": state.url, "LB_PREFIX": key_prefix,
                   "DJANGO_SETTINGS_MODULE": SETTINGS,
                   "LB_SETTINGS": json.dumps({"leaderbeat_overlap": "skip"})}
            recorder = Recorder(broker.client())
            add("backfill", interval=every(1),
                headers=json.dumps({"leaderbeat_overlap": "buffer_all"}))
            add("plain", interval=every(1))
            with BeatProcess(APP, env, tmp_path / "beat.log"):
                deadline = time.monotonic() + 30
                while len({m.entry for m in recorder.messages} & ROWS) < len(ROWS):
                    assert time.monotonic() < deadline, "both rows not sent within 30 s"
                    recorder.wait_for(len(recorder.messages) + 1, timeout=30)
    sent = {m.entry: m.headers.get("leaderbeat_overlap") for m in recorder.messages}
    # the site's static every-minute entry goes out too when the run crosses a minute;
    # it has no headers of its own, so it takes the setting
    assert sent.pop(STATIC, "skip") == "skip"
    assert sent == {"backfill": "buffer_all", "plain": "skip"}
