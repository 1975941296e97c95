"""The store's own errors: what any store raises when a call fails, whatever its driver.

A store translates its driver's exceptions at its boundary (:mod:`.calls`), so the
roles, the CLI and the worker guard catch these (``except STORE_ERRORS``) and never a
Redis (or PostgreSQL) exception class. The driver's exception is kept as ``__cause__``.
"""

from __future__ import annotations

from ..errors import LeaderbeatError


class StoreError(LeaderbeatError):
    """A store call failed: no answer, or an error answer (it may have run: retry with care)."""


class StoreUnreachable(StoreError):
    """The store could not be reached or did not answer in time: an outage, retried."""


class StoreRefused(StoreError):
    """The store refused a permission or a command; retrying cannot help."""


class StoreCredentialsRefused(StoreRefused):
    """The store refused the credentials (user name, password)."""
