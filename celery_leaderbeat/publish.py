"""Sending one slot of one entry: a deterministic task id and the leaderbeat headers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery.beat import BeatLazyFunc

from .slots import slot_id


def _evaluate(value: Any) -> Any:
    return value() if isinstance(value, BeatLazyFunc) else value


def publish(scheduler: Any, entry: Any, slot: datetime, epoch: int | None,
            overlap: str = "allow", task_id: str | None = None) -> Any:
    """Publish ``entry`` for ``slot`` as Celery beat would, plus our id and headers.

    The task id is ``slot_id(prefix, entry, slot)``: the same on every node, so
    a consumer that dedupes by id sees a re-sent slot once. Headers
    ``leaderbeat_slot``, ``leaderbeat_epoch`` and ``leaderbeat_entry`` tell
    tasks and monitoring which slot a message carries (epoch 0: a standby's
    rescue); ``leaderbeat_overlap`` tells the worker guard the entry's overlap
    policy when it is not ``allow``.
    """
    app = scheduler.app
    args = [_evaluate(a) for a in (entry.args or ())]
    kwargs = {k: _evaluate(v) for k, v in (entry.kwargs or {}).items()}
    options = dict(entry.options or {})
    headers = dict(options.pop("headers", None) or {})
    headers.update(
        celery_beat_task=True,
        leaderbeat_slot=slot.isoformat(),
        leaderbeat_epoch=epoch,
        leaderbeat_entry=entry.name,
    )
    if overlap != "allow":
        headers["leaderbeat_overlap"] = overlap
    options["task_id"] = task_id or slot_id(scheduler.keys.prefix, entry.name, slot)
    options["headers"] = headers
    task = app.tasks.get(entry.task)
    if task is not None:
        return task.apply_async(args, kwargs, producer=scheduler.producer, **options)
    return app.send_task(entry.task, args, kwargs, producer=scheduler.producer, **options)
