"""ISO date-times with a trailing ``Z`` read alike on every supported Python (3.10 too).

Python 3.10's ``datetime.fromisoformat`` refuses ``2027-01-05T09:00Z``; 3.11 reads it.
Every place the package reads an ISO date-time goes through ``timing.iso.from_iso``.
.ci/run runs this file on the oldest and the newest Python the package supports.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_leaderbeat import Entry
from celery_leaderbeat.demo.summary import slot_ms
from celery_leaderbeat.integrations.guard import _slot_ms
from celery_leaderbeat.ops.cli import leaderbeat
from celery_leaderbeat.timing.iso import from_iso

UTC = timezone.utc
TASK = "proj.tasks.report"


def test_a_trailing_z_a_bare_offset_and_any_fraction_read_alike_and_a_bad_string_fails():
    assert from_iso("2027-01-05T09:00Z") == datetime(2027, 1, 5, 9, 0, tzinfo=UTC)
    assert from_iso("2027-01-05T09:00:00.250Z").utcoffset() == timedelta(0)
    assert from_iso("2027-01-05T09:00+01:00") == datetime(2027, 1, 5, 8, 0, tzinfo=UTC)
    assert from_iso("2027-01-05T09:00").tzinfo is None  # naive stays naive
    with pytest.raises(ValueError):
        from_iso("next tuesday")
    # RFC 3339 allows a lower-case z, and +0100 without a colon: read alike on every Python
    assert from_iso("2027-01-05T09:00z") == datetime(2027, 1, 5, 9, 0, tzinfo=UTC)
    assert from_iso("2027-01-05T09:00+0100") == datetime(2027, 1, 5, 8, 0, tzinfo=UTC)
    assert from_iso("2027-01-05T09:00:00.5Z").microsecond == 500_000  # 3.10 takes only 3 or 6 digits


def test_slot_headers_with_a_z_are_read_by_the_worker_guard_and_the_demo():
    expected = round(datetime(2027, 1, 5, 9, 0, 4, tzinfo=UTC).timestamp() * 1000)
    assert _slot_ms("2027-01-05T09:00:04Z") == expected
    assert slot_ms("2027-01-05T09:00:04Z") == expected


@pytest.fixture
def app(shared_redis, key_prefix):
    app = Celery("proj")
    app.conf.update(leaderbeat_redis_url=shared_redis.url, leaderbeat_key_prefix=key_prefix,
                    beat_schedule={}, timezone="UTC")
    return app


def test_add_at_a_utc_time_written_with_z(app):
    result = CliRunner().invoke(leaderbeat, ["add", "once", TASK, "--at", "2030-01-05T09:00Z"],
                                obj=SimpleNamespace(app=app), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert Entry.get(app, "once").at == datetime(2030, 1, 5, 9, 0, tzinfo=UTC)
