"""Entries defined at run time: the API and its Redis store, against a real Redis."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from celery import Celery
from celery.schedules import BaseSchedule, crontab, solar

from celery_leaderbeat import Entry
from celery_leaderbeat.config import Config
from celery_leaderbeat.entries import split_entries
from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.roles.dynamic_schedule import reanchor
from celery_leaderbeat.store.entry_store import EntryStore
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.types import SlotState
from celery_leaderbeat.timing.schedules import cron

TASK = "proj.tasks.report"


@pytest.fixture
def app(shared_redis, key_prefix):
    app = Celery("proj")
    app.conf.update(leaderbeat_redis_url=shared_redis.url, leaderbeat_key_prefix=key_prefix,
                    beat_schedule={"nightly": {"task": TASK, "schedule": 3600}}, timezone="UTC")
    return app


@pytest.fixture
def store(app, redis_client, key_prefix):
    return EntryStore(redis_client, Keys(key_prefix))


def test_an_entry_saved_reads_back_the_same_from_redis_stored_as_json(app, redis_client,
                                                                      key_prefix):
    schedules = {"every": timedelta(seconds=90), "cron": "*/5 * * * *",
                 "tab": crontab(minute="15", hour="2-4"), "sun": solar("sunset", 52.5, 13.4),
                 "zoned": cron("0 9 * * 1-5", "Europe/Berlin")}
    for name, sched in schedules.items():
        assert Entry(name, TASK, sched, args=[1, "x"], kwargs={"k": 1.5}, options={"queue": "q"},
                     tz="Europe/Paris", jitter=5, catchup="all").save(app) is True
    got = {e.name: e for e in Entry.all(app)}
    assert sorted(got) == sorted(schedules)
    assert got["every"].schedule == timedelta(seconds=90)
    assert got["cron"].schedule == "*/5 * * * *"
    assert got["tab"].schedule == crontab(minute="15", hour="2-4")
    assert got["zoned"].schedule == cron("0 9 * * 1-5", "Europe/Berlin")
    assert got["sun"].schedule == solar("sunset", 52.5, 13.4)
    one = Entry.get(app, "every")
    assert (one.args, one.kwargs, one.options) == ([1, "x"], {"k": 1.5}, {"queue": "q"})
    assert one.leaderbeat == {"catchup": "all", "jitter": 5, "tz": "Europe/Paris"}
    assert one.enabled is True and one.version and one.anchor is not None
    raw = redis_client.hget(Keys(key_prefix).entries, "cron").decode()
    _header, body = raw.split("\n", 1)
    assert json.loads(body)["schedule"] == {"cron": "*/5 * * * *"}  # JSON, not pickle


def test_a_bad_cron_string_is_refused_with_start_ups_message_and_nothing_is_stored(app):
    with pytest.raises(ConfigurationError) as saved:
        Entry("bad", TASK, "61 * * * *").save(app)
    with pytest.raises(ConfigurationError) as at_start:
        split_entries({"bad": {"task": TASK, "schedule": "61 * * * *"}}, Config.from_app(app))
    assert str(saved.value) == str(at_start.value)
    assert "'bad'" in str(saved.value) and "61" in str(saved.value)
    assert Entry.get(app, "bad") is None


def test_bad_leaderbeat_options_and_non_json_arguments_are_refused_naming_the_entry(app):
    with pytest.raises(ConfigurationError, match="'e'.*tz='Mars/Olympus'.*IANA"):
        Entry("e", TASK, 10, tz="Mars/Olympus").save(app)
    with pytest.raises(ConfigurationError, match="'e'.*JSON"):
        Entry("e", TASK, 10, args=[object()]).save(app)
    with pytest.raises(ConfigurationError, match="'e'.*at=.*aware"):
        Entry("e", TASK, at=datetime(2030, 1, 1)).save(app)
    with pytest.raises(ConfigurationError, match="'e'.*cannot be stored as JSON"):
        Entry("e", TASK, _OwnSchedule()).save(app)
    assert Entry.all(app) == []


class _OwnSchedule(BaseSchedule):
    """A schedule class of the user's own: JSON cannot hold it."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return timedelta(seconds=60)


def test_a_dynamic_entry_may_not_take_a_static_entry_name(app):
    with pytest.raises(ConfigurationError, match="'nightly' is a static beat_schedule entry"):
        Entry("nightly", TASK, 60).save(app)
    with pytest.raises(ConfigurationError, match="celery.backend_cleanup"):
        Entry("celery.backend_cleanup", TASK, 60).save(app)


def test_saving_an_unchanged_definition_changes_nothing_not_even_the_anchor(app, store):
    entry = Entry("e", TASK, 60, kwargs={"a": 1})
    assert entry.save(app) is True
    first = store.get("e")
    again = Entry("e", TASK, timedelta(seconds=60), kwargs={"a": 1})
    assert again.save(app) is False
    assert store.get("e") == first and again.version == first.version


def test_only_a_timing_change_or_a_re_enable_moves_the_anchor(app, store):
    Entry("e", TASK, 60).save(app)
    anchor = store.get("e").anchor_ms
    Entry("e", TASK, 60, kwargs={"changed": True}).save(app)
    assert store.get("e").anchor_ms == anchor  # new arguments keep the phase
    Entry("e", TASK, 60, kwargs={"changed": True}, enabled=False).save(app)
    assert store.get("e").anchor_ms == anchor
    time.sleep(1.0)  # anchors are Redis TIME rounded up to the whole second
    Entry("e", TASK, 60, kwargs={"changed": True}).save(app)
    re_enabled = store.get("e").anchor_ms
    assert re_enabled > anchor
    time.sleep(1.0)
    Entry("e", TASK, 30, kwargs={"changed": True}).save(app)
    assert store.get("e").anchor_ms > re_enabled
    assert anchor % 1000 == re_enabled % 1000 == store.get("e").anchor_ms % 1000 == 0
    assert store.get("e").timing != Entry("e", TASK, 60).timing()


def test_changes_since_a_version_list_only_what_changed(app, store):
    for i in range(200):
        Entry(f"e{i}", TASK, 60 + i).save(app)
    seen = store.changes(-1)
    assert seen.full and len(seen.saved) == 200
    Entry("e7", TASK, 5).save(app)
    Entry("e9", TASK, 60).delete(app)
    later = store.changes(seen.version)
    assert not later.full
    assert list(later.saved) == ["e7"] and later.removed == ["e9"]
    assert later.version == seen.version + 2
    assert store.changes(later.version).saved == {}


def test_a_delete_repeated_after_a_lost_reply_answers_false_and_removes_nothing_else(app, store):
    Entry("a", TASK, 60).save(app)
    Entry("b", TASK, 60).save(app)
    assert Entry("a", TASK, 60).delete(app) is True
    assert Entry("a", TASK, 60).delete(app) is False
    assert [e.name for e in Entry.all(app)] == ["b"]


def test_a_node_far_behind_the_removed_cap_reads_everything_again(app, store, monkeypatch):
    monkeypatch.setattr("celery_leaderbeat.store.entry_store.REMOVED_CAP", 3)
    for name in "abcdef":
        Entry(name, TASK, 60).save(app)
    start = store.changes(-1).version
    for name in "abcde":
        store.delete(name)
    behind = store.changes(start)
    assert behind.full and list(behind.saved) == ["f"]
    assert store.changes(behind.version - 2).removed == ["d", "e"]


def test_reanchor_starts_an_entry_at_its_anchor_only_when_its_slot_is_older_or_exact():
    stored = {"old": SlotState(1000, 3, "s"), "new": SlotState(9000, 3, "s")}
    anchors = {name: SlotState(ms, 0, "a") for name, ms in
               (("old", 5000), ("new", 5000), ("fresh", 7000))}
    out = reanchor(stored, anchors)
    assert out["old"].slot_ms == 5000 and out["new"] == stored["new"]
    assert "fresh" not in out  # not exact: left to the leader's own anchoring
    assert reanchor(stored, anchors, exact={"fresh"})["fresh"].slot_ms == 7000
    assert reanchor(stored, {}) is stored


def follower(app, store):
    from celery_leaderbeat.roles.dynamic_schedule import DynamicSchedule

    entries: dict = {}
    options: dict = {}
    made = DynamicSchedule(store, Config.from_app(app), entries=entries, options=options,
                           make_entry=lambda name, raw: SimpleNamespace(name=name, **raw),
                           static=lambda: app.conf.beat_schedule)
    return made, entries, options


def test_a_follower_takes_in_only_the_changed_entries_and_says_which(app, store):
    for name in ("a", "b", "c"):
        Entry(name, TASK, 60).save(app)
    made, entries, options = follower(app, store)
    assert made.refresh(force=True) == {"a", "b", "c"}
    assert set(entries) == set(options) == {"a", "b", "c"}
    assert made.refresh(force=True) == set()  # nothing changed: nothing to do
    Entry("b", TASK, 60, enabled=False).save(app)
    Entry("c", TASK, 60).delete(app)
    Entry("d", TASK, at=datetime(2030, 1, 1, tzinfo=timezone.utc)).save(app)
    assert made.refresh(force=True) == {"b", "c", "d"}
    assert set(entries) == {"a", "d"}
    assert entries["d"].leaderbeat_once is True
    assert entries["d"].leaderbeat_anchor_ms < store.get("d").anchor_ms + 1


def test_a_follower_drops_every_dynamic_entry_when_redis_comes_back_empty(app, store,
                                                                           redis_client,
                                                                           key_prefix):
    Entry("a", TASK, 60).save(app)
    made, entries, _ = follower(app, store)
    made.refresh(force=True)
    keys = Keys(key_prefix)
    redis_client.delete(keys.entries, keys.entries_meta, keys.entries_changed)
    assert made.refresh(force=True) == {"a"}
    assert entries == {}
