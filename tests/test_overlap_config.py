"""The overlap policy's names: the setting, an entry's option, the Entry API, a header.

Checked where users meet them (Config.from_app, split_entries as beat's start-up
reads beat_schedule, Entry.save against a real Redis, the message beat publishes).
"""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from celery import Celery

from celery_leaderbeat import Entry
from celery_leaderbeat.config import OVERLAP_POLICIES, Config
from celery_leaderbeat.entries import split_entries
from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.send.plain import publish

TASK = "proj.tasks.report"
ALLOWED = "skip, buffer_one, buffer_all, cancel_other, allow_all (or Kubernetes' Forbid, Replace, Allow)"


def app_with(**settings) -> Celery:
    app = Celery("proj")
    app.conf.update(leaderbeat_redis_url="redis://localhost:1/0", **settings)
    return app


def overlap_of(raw, config: Config | None = None) -> str:
    config = config or Config.from_app(app_with())
    _, options = split_entries({"e": {"task": TASK, "schedule": 60, "leaderbeat":
                                      {"overlap": raw}}}, config)
    return options["e"].overlap


def test_the_five_policies_and_the_kubernetes_names_and_allow_are_accepted():
    assert OVERLAP_POLICIES == ("skip", "buffer_one", "buffer_all", "cancel_other", "allow_all")
    for name in OVERLAP_POLICIES:
        assert overlap_of(name) == name
        assert Config.from_app(app_with(leaderbeat_overlap=name)).overlap == name
    aliases = {"Forbid": "skip", "Replace": "cancel_other", "Allow": "allow_all",
               "allow": "allow_all", "BUFFER_ONE": "buffer_one"}
    for alias, name in aliases.items():
        assert overlap_of(alias) == name
        assert Config.from_app(app_with(leaderbeat_overlap=alias)).overlap == name


def test_the_default_is_allow_all_and_an_entry_without_the_option_takes_the_setting():
    assert Config.from_app(app_with()).overlap == "allow_all"
    config = Config.from_app(app_with(leaderbeat_overlap="buffer_all"))
    _, options = split_entries({"e": {"task": TASK, "schedule": 60}}, config)
    assert options["e"].overlap == "buffer_all"


def test_a_bad_value_names_the_setting_or_entry_the_value_and_the_allowed_ones():
    with pytest.raises(ConfigurationError) as setting:
        Config.from_app(app_with(leaderbeat_overlap="sometimes"))
    assert f"leaderbeat_overlap='sometimes' must be one of {ALLOWED}" in str(setting.value)
    with pytest.raises(ConfigurationError) as entry:
        overlap_of("queue")
    assert f"'e': leaderbeat option overlap='queue' must be one of {ALLOWED}" in str(entry.value)
    with pytest.raises(ConfigurationError) as header:
        split_entries({"h": {"task": TASK, "schedule": 60, "options": {
            "headers": {"leaderbeat_overlap": "nope"}}}}, Config.from_app(app_with()))
    assert ("'h': options['headers']['leaderbeat_overlap']='nope' must be one of "
            f"{ALLOWED}") in str(header.value)


def test_the_entry_api_refuses_a_bad_policy_naming_the_entry_and_stores_a_good_one(
        shared_redis, key_prefix):
    app = Celery("proj")
    app.conf.update(leaderbeat_redis_url=shared_redis.url, leaderbeat_key_prefix=key_prefix)
    with pytest.raises(ConfigurationError, match=r"'later'.*overlap='whenever' must be one of"):
        Entry("later", TASK, 60, overlap="whenever").save(app)
    assert Entry("later", TASK, 60, overlap="Replace").save(app)
    stored = Entry.get(app, "later").leaderbeat
    assert stored == {"overlap": "Replace"}
    assert overlap_of(stored["overlap"]) == "cancel_other"  # as the beats read it


class _Scheduler:
    """What publish() reads of a scheduler; the message is taken at the producer."""

    def __init__(self) -> None:
        self.app = Celery("proj")
        self.keys = SimpleNamespace(prefix="p")
        self.sent: list[dict] = []
        self.producer = None

    def entry(self, **options):
        return SimpleNamespace(name="e", task=TASK, args=(), kwargs={}, options=options)


@pytest.mark.parametrize(("overlap", "own", "header"), [
    ("allow_all", None, None), ("allow", None, None), ("buffer_all", None, "buffer_all"),
    ("skip", "buffer_one", "buffer_one"), ("allow_all", "cancel_other", "cancel_other")])
def test_the_message_carries_the_policy_and_an_entrys_own_header_wins(
        monkeypatch, overlap, own, header):
    sched, seen = _Scheduler(), {}
    monkeypatch.setattr(sched.app, "send_task",
                        lambda *a, headers=None, **kw: seen.update(headers or {}))
    options = {"headers": {"leaderbeat_overlap": own}} if own else {}
    publish(sched, sched.entry(**options), datetime(2026, 12, 1, tzinfo=timezone.utc), 1,
            overlap)
    assert seen.get("leaderbeat_overlap") == header
