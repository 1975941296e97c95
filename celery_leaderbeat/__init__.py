"""celery_leaderbeat: a highly available Celery beat scheduler.

Run any number of ``celery beat -S celery_leaderbeat.Scheduler`` processes:
one leads through a fenced Redis lease, and every scheduled slot of every
periodic task is claimed in Redis before it is sent, and Redis grants each
slot once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:  # what a type checker sees; at run time they are imported on first use
    from .scheduler import Scheduler
    from .store.dynamic import Entry
    from .timing.schedules import cron

__all__ = ["Entry", "Scheduler", "__version__", "cron"]

#: the lazily imported names and their modules: importing the package must not import
#: celery.beat (a worker that never runs beat loads this package for its guard)
_LAZY = {"Scheduler": ".scheduler", "Entry": ".store.dynamic", "cron": ".timing.schedules"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
