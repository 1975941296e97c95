"""celery_leaderbeat: a highly available Celery beat scheduler.

Run any number of ``celery beat -S celery_leaderbeat.Scheduler`` processes:
one leads through a fenced Redis lease, and every scheduled slot of every
periodic task is claimed in Redis before it is sent, so it is enqueued once.
"""

from __future__ import annotations

from ._version import __version__

__all__ = ["Entry", "Scheduler", "__version__", "cron"]


def __getattr__(name: str):  # lazy: importing the package must not import celery.beat
    if name == "Scheduler":
        from .scheduler import Scheduler

        return Scheduler
    if name == "Entry":
        from .store.dynamic import Entry

        return Entry
    if name == "cron":
        from .timing.schedules import cron

        return cron
    raise AttributeError(name)
