"""Three real beats follow entries changed through the API while the leader is SIGKILLed."""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_leaderbeat import Entry
from tests.support.beat import NOOP, BeatCluster, Recorder, beat_env, duplicates, slots_by_entry
from tests.test_failover import POLL, beat_by_pid, leader_pid, wait_for_leader

pytestmark = pytest.mark.slow

# Celery's and leaderbeat's defaults (beat_max_loop_interval 300 s, lease ttl 10 s).
#: a change is in force within this (the beats look at least once per standby poll)
SEEN_WITHIN = 1.0


def slots(messages, name: str, **kwargs) -> list[datetime]:
    return sorted(datetime.fromisoformat(m.slot) for m in messages
                  if m.entry == name and all(m.kwargs.get(k) == v for k, v in kwargs.items()))


def now() -> datetime:
    return datetime.now(timezone.utc)


def test_changes_through_the_api_reach_three_beats_through_a_sigkill_every_slot_once(
        tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule={"static": {"task": NOOP, "every": 1}})
    app = Celery("api")
    app.conf.update(leaderbeat_redis_url=state.url, leaderbeat_key_prefix=key_prefix,
                    beat_schedule={"static": {"task": NOOP, "schedule": 1}})
    recorder = Recorder(broker.client())
    client = state.client()
    with BeatCluster(3, env, tmp_path) as cluster:
        token, _ = wait_for_leader(client, key_prefix, timeout=30)
        recorder.wait_for(2, timeout=20)
        Entry("a", NOOP, 1, kwargs={"v": 1}).save(app)
        Entry("b", NOOP, 1).save(app)
        added = now()
        recorder.wait_for(2, timeout=10, task=NOOP)
        time.sleep(3)
        Entry("a", NOOP, 1.5, kwargs={"v": 2}).save(app)
        edited = now()
        time.sleep(3)
        beat_by_pid(cluster, leader_pid(token)).kill()  # mid-way through the changes
        killed = now()
        Entry("b", NOOP, 1, enabled=False).save(app)  # while nobody leads: standbys rescue
        disabled = now()
        _new_token, _ = wait_for_leader(client, key_prefix, other_than=token, timeout=30)
        Entry("c", NOOP, 1).save(app)
        c_added = now()
        time.sleep(4)
        Entry("a", NOOP, 1.5, kwargs={"v": 2}).delete(app)
        removed = now()
        time.sleep(4)
        finished = now()
        recorder.drain()
        logs = cluster.logs()
    messages = recorder.messages
    assert duplicates(messages) == [], "a slot was sent twice"
    by_entry = slots_by_entry(messages)
    # each change in force within a second plus one interval
    a_slots = slots(messages, "a")
    assert a_slots and a_slots[0] <= added + timedelta(seconds=SEEN_WITHIN + 1)
    assert not [s for s in slots(messages, "a", v=1)
                if s > edited + timedelta(seconds=SEEN_WITHIN + 1.5)], "old definition sent"
    assert not [s for s in slots(messages, "b") if s > disabled + timedelta(
        seconds=SEEN_WITHIN + 1)], "a disabled entry was sent (or rescued)"
    c_slots = slots(messages, "c")
    assert c_slots and c_slots[0] <= c_added + timedelta(seconds=SEEN_WITHIN + 1)
    assert not [s for s in a_slots if s > removed + timedelta(seconds=SEEN_WITHIN + 1.5)], \
        "a removed entry was sent"
    # every slot once: no gap in the static entry's or the new entry's slots
    for name, wanted in (("static", 1.0), ("c", 1.0)):
        got = sorted(datetime.fromisoformat(x) for x in by_entry[name])
        gaps = [(x, y) for x, y in itertools.pairwise(got) if y - x != timedelta(seconds=wanted)]
        assert gaps == [], f"{name} lost slots: {gaps}"
    assert c_slots[-1] >= finished - timedelta(seconds=2 + POLL)
    assert killed < disabled < c_added
    assert "dynamic entries at version" in logs
