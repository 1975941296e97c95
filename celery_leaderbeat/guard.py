"""The worker guard's public path: ``app.steps["worker"].add("celery_leaderbeat.guard:GuardStep")``.

The guard itself is :mod:`celery_leaderbeat.integrations.guard`.
"""

from __future__ import annotations

from .integrations.guard import GuardStep, offer_step

__all__ = ["GuardStep", "offer_step"]
