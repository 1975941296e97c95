"""The kept messages are bounded by the entries scheduled now, not by every entry ever sent.

A leader keeps, per entry, its arguments' texts (its part) and, per shape (task,
options, overlap), the first message Celery built. An entry removed or defined
anew while beat runs leaves nothing behind: its part goes, and a shape goes with
the last entry that had it. Each test churns entries that each have their own
options (a shape each), lets the leader prepare every message in idle time, and
counts what is kept against what the live entries need.
"""

from __future__ import annotations

import time

from celery import Celery

from celery_leaderbeat import Entry
from celery_leaderbeat.scheduler import LEADER, Scheduler
from tests.support.beat import NOOP

HOUR = 3600.0  # nothing comes due while a test runs: every message is built in idle time


def make_app(url: str, prefix: str, schedule: dict) -> Celery:
    app = Celery("proj")
    app.conf.update(broker_url=url, leaderbeat_key_prefix=prefix, beat_schedule=schedule,
                    timezone="UTC")
    return app


def own_options(tenant: str) -> dict:
    return {"headers": {"tenant": tenant}, "priority": 3}


def needed(scheduler: Scheduler) -> tuple[set[str], int]:
    """The entries scheduled now, and how many shapes they have (one per task and options)."""
    entries = scheduler.schedule
    shapes = {(e.task, repr(sorted((e.options or {}).items()))) for e in entries.values()}
    return set(entries), len(shapes)


def kept(scheduler: Scheduler) -> tuple[set[str], int]:
    """The entries whose parts the leader keeps, and how many shapes."""
    assert scheduler._enqueuer is not None
    messages = scheduler._enqueuer.messages
    return set(messages._parts), len(messages._shapes)


def prepared(scheduler: Scheduler, names: set[str], timeout: float = 30.0) -> None:
    """Tick until the schedule is exactly ``names`` (and Celery's own entry) and every
    message of it is prepared."""
    deadline = time.monotonic() + timeout
    while True:
        delay = scheduler.tick()
        live = set(scheduler.schedule) - {"celery.backend_cleanup"}
        warmed = scheduler._warmed == (scheduler._schedule_version,
                                       scheduler._shared.lease.epoch if scheduler._shared else None)
        if scheduler.role == LEADER and live == names and warmed:
            return
        assert time.monotonic() < deadline, f"not prepared: {len(live)} of {len(names)}"
        time.sleep(min(delay, 0.02))


def test_runtime_entries_added_edited_and_removed_leave_only_what_the_live_ones_need(
        redis_server, key_prefix):
    app = make_app(redis_server.url, key_prefix, {})
    scheduler = Scheduler(app=app)
    names: set[str] = set()
    try:
        prepared(scheduler, names)
        for cycle in range(8):
            batch = {f"c{cycle}-{i}" for i in range(40)}
            for name in sorted(batch):
                Entry(name, NOOP, HOUR, args=[name], options=own_options(name)).save(app)
            gone = sorted(names)[: len(names) // 2 + 5] if names else []
            for name in gone:  # most of the previous cycles' entries go
                Entry(name, NOOP, HOUR).delete(app)
            edited = sorted(names - set(gone))[:5]
            for name in edited:  # defined anew: options of their own again, another shape
                Entry(name, NOOP, HOUR, args=[name],
                      options=own_options(f"{name}/{cycle}")).save(app)
            names = (names - set(gone)) | batch
            prepared(scheduler, names)
            assert kept(scheduler) == needed(scheduler), f"cycle {cycle}"
        for name in sorted(names):
            Entry(name, NOOP, HOUR).delete(app)
        prepared(scheduler, set())
        assert kept(scheduler) == needed(scheduler) == ({"celery.backend_cleanup"}, 1)
    finally:
        scheduler.close()


def test_beat_schedule_entries_replaced_by_a_merge_leave_only_what_the_live_ones_need(
        redis_server, key_prefix):
    """A merge changes the schedule without saying which entries it touched: every kept
    entry is looked at again."""
    def schedule(cycle: int) -> dict:
        return {f"s{cycle}-{i}": {"task": NOOP, "schedule": HOUR, "args": [i],
                                  "options": own_options(f"{cycle}-{i}")} for i in range(60)}

    app = make_app(redis_server.url, key_prefix, schedule(0))
    scheduler = Scheduler(app=app)
    try:
        prepared(scheduler, set(schedule(0)))
        sizes = []
        for cycle in range(1, 6):
            scheduler.merge_inplace(schedule(cycle))  # Celery's merge: the others go
            scheduler.install_default_entries(scheduler.schedule)
            prepared(scheduler, set(schedule(cycle)))
            assert kept(scheduler) == needed(scheduler), f"cycle {cycle}"
            sizes.append(len(scheduler._enqueuer.messages._shapes))
        assert sizes == [61] * 5  # sixty entries of their own, and Celery's
    finally:
        scheduler.close()


def test_a_shape_stays_while_an_entry_has_it_and_goes_with_the_last(redis_server, key_prefix):
    def schedule(names) -> dict:
        return {n: {"task": NOOP, "schedule": HOUR, "args": [n], "options": own_options("one")}
                for n in names}

    app = make_app(redis_server.url, key_prefix, schedule(["a", "b", "c"]))
    scheduler = Scheduler(app=app)
    try:
        prepared(scheduler, {"a", "b", "c"})
        shapes = scheduler._enqueuer.messages._shapes
        (ours,) = [s for s in shapes.values() if s is not None and s.headers.get("tenant")]
        scheduler.merge_inplace(schedule(["c"]))
        scheduler.install_default_entries(scheduler.schedule)
        prepared(scheduler, {"c"})
        assert kept(scheduler) == needed(scheduler) == ({"c", "celery.backend_cleanup"}, 2)
        assert ours in shapes.values()  # the same first message: not built again
        scheduler.merge_inplace({})
        scheduler.install_default_entries(scheduler.schedule)
        prepared(scheduler, set())
        assert ours not in shapes.values()
        assert kept(scheduler) == needed(scheduler) == ({"celery.backend_cleanup"}, 1)
    finally:
        scheduler.close()


def test_task_look_ups_are_bounded_by_the_tasks_of_live_entries(redis_server, key_prefix):
    """Entries sent by task name, a name of their own each: the names of tasks no entry
    sends any more are not kept for ever (they are trimmed once they outnumber the
    live entries twice over, plus a margin)."""
    def schedule(cycle: int) -> dict:
        return {f"s{cycle}-{i}": {"task": f"proj.task{cycle}-{i}", "schedule": HOUR}
                for i in range(60)}

    app = make_app(redis_server.url, key_prefix, schedule(0))
    scheduler = Scheduler(app=app)
    try:
        prepared(scheduler, set(schedule(0)))
        for cycle in range(1, 7):
            scheduler.merge_inplace(schedule(cycle))
            scheduler.install_default_entries(scheduler.schedule)
            prepared(scheduler, set(schedule(cycle)))
            tasks = scheduler._enqueuer.messages._tasks
            assert {e.task for e in scheduler.schedule.values()} <= set(tasks)
            assert len(tasks) <= 2 * len(scheduler.schedule) + 64, f"cycle {cycle}"
    finally:
        scheduler.close()
