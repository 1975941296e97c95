"""The worker guard's public path: ``app.steps["worker"].add("celery_leaderbeat.guard:GuardStep")``.

Inside a guarded task, :func:`current_run` says which run it is: the slot, the
retry, the run's fencing token, and ``still_ours()`` (is the slot's run still
this one). The guard itself is :mod:`celery_leaderbeat.integrations.guard`.
"""

from __future__ import annotations

from .integrations.guard import CurrentRun, GuardStep, current_run, offer_step

__all__ = ["CurrentRun", "GuardStep", "current_run", "offer_step"]
