"""The fingerprint of an entry's definition: what a rescuer must share with the leader.

A standby rescues a slot the leader missed, but only a slot of the definition
the leader itself plans: a standby that has not yet read a changed row, or
runs an older ``beat_schedule`` during a rolling deploy, would otherwise send
slots of a schedule the leader no longer has. The leader writes the
fingerprint of its definition beside each entry's slot state; a rescue whose
fingerprint differs is refused, and a leader that finds a fingerprint other
than its own starts the entry again from now (a changed interval re-anchors
from the change).

The fingerprint covers what decides *which* slots exist and *what* is sent:
the schedule, its time zone and jitter, the task and its arguments. Delivery
options (queue, priority, expiry) are left out: some schedulers compute them
afresh on every load, and they change no slot.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta, tzinfo
from typing import Any

from celery.schedules import schedule as interval


def fingerprint(entry: Any, tz: tzinfo | None, jitter: float | None) -> str:
    """A short, stable hash of ``entry``'s definition (the same on every node)."""
    parts = [
        str(getattr(entry, "task", "")),
        _stable(getattr(entry, "args", ())),
        _stable(getattr(entry, "kwargs", {})),
        describe_schedule(getattr(entry, "schedule", None)),
        str(tz) if tz is not None else "",
        "" if jitter is None else repr(float(jitter)),
    ]
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()


def describe_schedule(schedule_: Any) -> str:
    """A text that names a schedule the same way in every process."""
    own = getattr(schedule_, "leaderbeat_fingerprint", None)
    if callable(own):
        return str(own())
    if isinstance(schedule_, interval) and type(schedule_).__repr__ is interval.__repr__:
        every = schedule_.run_every
        seconds = every.total_seconds() if isinstance(every, timedelta) else float(every)
        return f"interval {seconds!r} relative={bool(schedule_.relative)}"
    text = repr(schedule_)
    if " object at 0x" in text:  # no repr of its own: its class and plain attributes
        fields = {k: v for k, v in sorted(vars(schedule_).items())
                  if isinstance(v, (str, int, float, bool, type(None)))}
        return f"{type(schedule_).__module__}.{type(schedule_).__qualname__} {fields!r}"
    return f"{type(schedule_).__qualname__} {text}"


def _stable(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return repr(value)
