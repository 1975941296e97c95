"""Run-time entries in a failover and after an edit, with three real beats.

Celery's and leaderbeat's defaults throughout (beat_max_loop_interval 300 s, lease
ttl 10 s, standby poll 1 s, rescue after 2 s): the way users run it. Entries are
made through the ``Entry`` API while the beats run, as an application would.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_leaderbeat import Entry
from tests.support.beat import NOOP, BeatCluster, Recorder, beat_env, duplicates
from tests.test_failover import (
    POLL,
    RESCUE_AFTER,
    TTL,
    beat_by_pid,
    follow,
    gaps,
    leader_pid,
    leader_token,
    wait_for_leader,
)

pytestmark = pytest.mark.slow

#: the README's promise for a crash: every slot within rescue_after + about a second
RESCUED_WITHIN = RESCUE_AFTER + 1.0
#: the README's promise for a change: in force within a second of the save
IN_FORCE_WITHIN = 1.0


def api_app(state_url: str, prefix: str) -> Celery:
    app = Celery("api")
    app.conf.update(leaderbeat_redis_url=state_url, leaderbeat_key_prefix=prefix,
                    timezone="UTC")
    return app


def slot_times(messages, name: str) -> list[datetime]:
    return sorted(datetime.fromisoformat(m.slot) for m in messages if m.entry == name)


def start(tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule={"static": {"task": NOOP, "every": 1}})
    return state, BeatCluster(3, env, tmp_path), Recorder(broker.client()), \
        api_app(state.url, key_prefix)


def test_a_killed_leaders_runtime_entries_are_rescued_by_a_standby_like_static_ones(
        tmp_path, make_redis_server, key_prefix):
    state, cluster, recorder, app = start(tmp_path, make_redis_server, key_prefix)
    client = state.client()
    with cluster:
        token, _ = wait_for_leader(client, key_prefix, timeout=30)
        for name in ("d0", "d1", "d2"):
            Entry(name, NOOP, 1).save(app)
        follow(recorder, 20, until=lambda: len(slot_times(recorder.messages, "d2")) >= 3)
        # due 0.3 s after the kill: nobody leads when it comes due, a standby must send it
        once_at = datetime.fromtimestamp(time.time() + 1.3, timezone.utc)
        Entry("once", NOOP, at=once_at).save(app)
        time.sleep(1.0)  # every beat has taken the one-off in
        killed_at = time.time()
        beat_by_pid(cluster, leader_pid(token)).kill()
        # saved while nobody leads: no leader ever reads them before their first slot
        gap_once = Entry("gap-once", NOOP, at=datetime.fromtimestamp(time.time() + 1.0,
                                                                      timezone.utc))
        gap_once.save(app)
        gap_new = Entry("gap-new", NOOP, 1)
        gap_new.save(app)
        follow(recorder, TTL + POLL + 3,
               until=lambda: leader_token(client, key_prefix) not in (None, token))
        follow(recorder, 4)  # the new leader's own slots
        logs = cluster.logs()
    messages = recorder.messages
    assert duplicates(messages) == []
    after_kill = [m for m in messages
                  if datetime.fromisoformat(m.slot).timestamp() > killed_at]
    for name in ("static", "d0", "d1", "d2"):
        slots = slot_times(messages, name)
        assert gaps(slots, 1.0) == [], f"{name} missed a slot across the SIGKILL"
        late = sorted(round(m.lateness, 2) for m in after_kill if m.entry == name)
        assert late and late[-1] <= RESCUED_WITHIN, (name, late[-5:], logs[-3000:])
        assert any(m.epoch == 0 for m in after_kill if m.entry == name), \
            f"no standby rescued {name} while nobody led"
    for name in ("once", "gap-once"):
        once = [m for m in messages if m.entry == name]
        assert len(once) == 1, f"the one-off {name} was sent {len(once)} times"
        assert once[0].lateness <= RESCUED_WITHIN, (name, once[0].lateness, once[0].epoch)
    new = [m for m in messages if m.entry == "gap-new"]
    assert new and min(datetime.fromisoformat(m.slot) for m in new) \
        == gap_new.anchor + timedelta(seconds=1), "the new entry did not start at its save"
    assert gaps(slot_times(messages, "gap-new"), 1.0) == []
    assert max(m.lateness for m in new) <= RESCUED_WITHIN, sorted(m.lateness for m in new)


def test_an_edited_interval_is_in_force_within_a_second_of_the_save_anchored_at_the_save(
        tmp_path, make_redis_server, key_prefix):
    state, cluster, recorder, app = start(tmp_path, make_redis_server, key_prefix)
    client = state.client()
    with cluster:
        wait_for_leader(client, key_prefix, timeout=30)
        Entry("edited", NOOP, 5, kwargs={"v": 1}).save(app)
        Entry("toggled", NOOP, 2, enabled=False).save(app)
        follow(recorder, 20, until=lambda: len(slot_times(recorder.messages, "static")) >= 4)
        time.sleep(1.0)
        edit = Entry("edited", NOOP, 1.5, kwargs={"v": 2})
        edit.save(app)
        enable = Entry("toggled", NOOP, 2)
        enable.save(app)
        follow(recorder, 6)
    messages = recorder.messages
    assert duplicates(messages) == []
    assert edit.anchor is not None and enable.anchor is not None
    v2 = sorted(datetime.fromisoformat(m.slot) for m in messages
                if m.entry == "edited" and m.kwargs.get("v") == 2)
    assert v2, "the edited definition never ran"
    # the new interval counts from the save (by Redis TIME, which stores the anchor)
    assert v2[0] == edit.anchor + timedelta(seconds=1.5), (v2[0], edit.anchor)
    assert all(b - a == timedelta(seconds=1.5) for a, b in itertools.pairwise(v2))
    first = next(m for m in messages if m.entry == "edited" and m.kwargs.get("v") == 2
             and datetime.fromisoformat(m.slot) == v2[0])
    assert first.lateness <= IN_FORCE_WITHIN, first.lateness
    toggled = slot_times(messages, "toggled")
    assert toggled and toggled[0] == enable.anchor + timedelta(seconds=2), (toggled, enable.anchor)
    assert not [m for m in messages if m.entry == "edited" and m.kwargs.get("v") == 1
                and datetime.fromisoformat(m.slot) > edit.anchor], "the old definition ran on"
