"""The cluster's public Python API: ``from celery_leaderbeat.cluster import Cluster``.

It lives in :mod:`celery_leaderbeat.ops.cluster` (and the trigger's task id in
:mod:`celery_leaderbeat.roles.requests`).
"""

from __future__ import annotations

from .ops.cluster import Cluster, UnknownEntry
from .roles.requests import trigger_task_id

__all__ = ["Cluster", "UnknownEntry", "trigger_task_id"]
