"""The roles' Celery side (``roles/port.py``): what the Scheduler hands the roles, and what
the roles' memory learns through it."""

from __future__ import annotations

from typing import Any

from celery_leaderbeat.roles.port import CelerySide
from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.timing.iso import from_iso
from celery_leaderbeat.timing.slots import to_ms
from tests.faults.seam import AFTER, Seam
from tests.support.beat import NOOP
from tests.test_send_step import BATCH_CLAIM, faulted, make_app, messages, tick_until


def test_the_scheduler_is_the_roles_celery_side_and_sends_chunks_unless_it_wraps_a_base(
        redis_server: Any, key_prefix: str, tmp_path: Any) -> None:
    plain = Scheduler(app=make_app(redis_server.url_for(0), key_prefix,
                                   {"a": {"task": NOOP, "schedule": 1.0,
                                          "leaderbeat": {"overlap": "skip"}}}))
    wrapped = Scheduler(app=make_app(redis_server.url_for(0), key_prefix + "-w",
                                     {"a": {"task": NOOP, "schedule": 1.0}},
                                     leaderbeat_base_scheduler="celery.beat:PersistentScheduler"),
                        schedule_filename=str(tmp_path / "beat-schedule"))
    try:
        for scheduler in (plain, wrapped):
            side: CelerySide = scheduler
            assert scheduler._connect().celery is side
            assert set(side.slot_entries()) >= {"a"}
        assert plain.overlap_of("a") == "skip" and wrapped.overlap_of("a") == "allow_all"
        assert plain.chunk_sender(1) is not None and wrapped.chunk_sender(1) is None
    finally:
        plain.close()
        wrapped.close()


def test_a_slot_a_claim_enqueued_before_its_reply_was_lost_is_remembered_as_sent(
        redis_server: Any, key_prefix: str, monkeypatch: Any) -> None:
    """The claim script enqueued the slot; the reply and the lease went. Once this process
    learns the slot went out, its memory has it: it never publishes that slot itself."""
    seam = Seam()
    seam.aim(BATCH_CLAIM, AFTER, occurrence=1)
    app = make_app(redis_server.url_for(0), key_prefix, {"a": {"task": NOOP, "schedule": 1.0}})
    client = redis_server.client()
    with faulted(monkeypatch, seam):
        scheduler = Scheduler(app=app)
        try:
            tick_until(scheduler, lambda: seam.injected())
            [first] = messages(client, "celery")  # the lost reply's slot went out
            client.delete(Keys(key_prefix).leader)  # the lease is gone: no retry comes
            tick_until(scheduler, lambda: client.llen("celery") >= 3, timeout=40)
            shared = scheduler._connect()
        finally:
            scheduler.close()
    slot_ms = to_ms(from_iso(first["headers"]["leaderbeat_slot"]))
    assert shared.sent.published("a", slot_ms)
