"""The public names as a user and a type checker meet them: the package's lazy names,
one exception hierarchy, the Cluster's typed rows."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings

import pytest
from celery import Celery

import celery_leaderbeat
from celery_leaderbeat import errors
from celery_leaderbeat.cluster import Cluster
from tests.support.beat import REPO_ROOT


def test_the_lazy_names_are_listed_and_importable():
    assert {"Entry", "Scheduler", "cron", "__version__"} <= set(dir(celery_leaderbeat))
    from celery_leaderbeat import Entry, Scheduler, cron

    assert (Entry.__name__, Scheduler.__name__, cron.__name__) == ("Entry", "Scheduler", "cron")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        celery_leaderbeat.Nope  # noqa: B018


def test_every_error_is_a_leaderbeat_error_and_what_callers_catch():
    for cls in (errors.ConfigurationError, errors.EntryNotFound, errors.EntryExists,
                errors.BackfillRefused, errors.LeaseLostError, errors.RedisAuthError):
        assert issubclass(cls, errors.LeaderbeatError)
    assert issubclass(errors.EntryNotFound, LookupError)
    assert issubclass(errors.EntryExists, LookupError)
    assert issubclass(errors.BackfillRefused, LookupError)
    from celery_leaderbeat.store.entry_store import EntryUnknown

    assert EntryUnknown is errors.EntryNotFound


def test_the_old_unknown_entry_name_still_works_and_says_it_is_deprecated():
    from celery_leaderbeat import cluster

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cluster.UnknownEntry is errors.EntryNotFound
    assert [w.category for w in caught] == [DeprecationWarning]


def test_cluster_raises_entry_not_found_naming_the_nearest_entry(shared_redis, key_prefix):
    app = Celery("proj")
    app.conf.update(leaderbeat_redis_url=shared_redis.url, leaderbeat_key_prefix=key_prefix,
                    beat_schedule={"report": {"task": "t", "schedule": 60}})
    with pytest.raises(errors.EntryNotFound, match="did you mean 'report'") as raised:
        Cluster(app).pause("reprot", "")
    assert raised.value.name == "reprot" and "report" in raised.value.known


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_a_type_checker_sees_the_public_names_types(tmp_path):
    user = tmp_path / "user.py"
    user.write_text(
        "from celery_leaderbeat import Entry, Scheduler, cron\n"
        "from celery_leaderbeat.cluster import Cluster\n"
        "reveal_type(Entry)\nreveal_type(cron)\nreveal_type(Scheduler)\n"
        "def f(c: Cluster) -> None:\n"
        "    leader = c.leader()\n"
        "    assert leader is not None\n"
        "    reveal_type(leader['epoch'])\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--strict",
                           "--follow-imports=silent", str(user)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout
    revealed = [line.split("Revealed type is ", 1)[1] for line in out.splitlines()
                if "Revealed type is" in line]
    assert len(revealed) == 4, out
    assert revealed[0].endswith('-> celery_leaderbeat.store.dynamic.Entry"')
    assert revealed[1].endswith('-> celery_leaderbeat.timing.schedules.cron"')
    assert revealed[2].endswith('-> celery_leaderbeat.scheduler.Scheduler"')
    assert revealed[3] in ('"int"', '"builtins.int"')
