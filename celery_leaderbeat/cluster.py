"""The cluster's public Python API: ``from celery_leaderbeat.cluster import Cluster``.

It lives in :mod:`celery_leaderbeat.ops.cluster` (and the trigger's task id in
:mod:`celery_leaderbeat.roles.requests`); its errors in :mod:`celery_leaderbeat.errors`.
"""

from __future__ import annotations

import warnings
from typing import Any

from .errors import BackfillRefused, EntryNotFound, LeaderbeatError
from .ops.cluster import Cluster, EntryRow, HistoryEvent, Leader, NodeRow
from .roles.requests import trigger_task_id

__all__ = ["BackfillRefused", "Cluster", "EntryNotFound", "EntryRow", "HistoryEvent",
           "Leader", "LeaderbeatError", "NodeRow", "trigger_task_id"]


def __getattr__(name: str) -> Any:
    if name == "UnknownEntry":  # a deprecated alias of EntryNotFound
        warnings.warn("celery_leaderbeat.cluster.UnknownEntry is deprecated: catch "
                      "celery_leaderbeat.errors.EntryNotFound", DeprecationWarning, stacklevel=2)
        return EntryNotFound
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
