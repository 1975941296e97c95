"""The bench's Celery app: tests.support.beatapp's app, plus a tick counter.

``celery -A bench.benchapp beat -S ...`` behaves exactly like
``-A tests.support.beatapp``; when ``LB_TICK_FILE`` is set, every call of the
scheduler's ``tick()`` also bumps an 8-byte counter in that file (an mmap
write, no system call), so the bench can divide CPU time by ticks.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from celery.signals import beat_init

from tests.support.beatapp import app, noop  # noqa: F401 - the app celery -A loads

_maps: list[mmap.mmap] = []  # kept alive for the process's lifetime


@beat_init.connect
def count_ticks(sender: Any = None, **kwargs: Any) -> None:
    """Wrap ``sender.scheduler.tick`` (connected before RedBeat's blocking lock receiver)."""
    path = os.environ.get("LB_TICK_FILE")
    if not path or sender is None:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 8)
    counter = mmap.mmap(fd, 8)
    os.close(fd)
    _maps.append(counter)
    scheduler = sender.scheduler
    tick = scheduler.tick
    ticks = [0]

    def counted_tick(*args: Any, **kw: Any) -> Any:
        ticks[0] += 1
        struct.pack_into("q", counter, 0, ticks[0])
        return tick(*args, **kw)

    scheduler.tick = counted_tick
