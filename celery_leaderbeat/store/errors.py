"""The store's own errors (defined with the package's others in :mod:`celery_leaderbeat.errors`).

A store translates its driver's exceptions at its boundary (:mod:`.calls`), so the
roles, the CLI and the worker guard catch these (``except STORE_ERRORS``) and never a
Redis (or PostgreSQL) exception class. The driver's exception is kept as ``__cause__``.
"""

from __future__ import annotations

from ..errors import StoreCredentialsRefused, StoreError, StoreRefused, StoreUnreachable

__all__ = ["StoreCredentialsRefused", "StoreError", "StoreRefused", "StoreUnreachable"]
