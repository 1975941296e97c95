"""What a failed store call raises, whichever store is chosen: Redis's errors and, where
psycopg is installed, PostgreSQL's. Catching these and not one driver's keeps a
PostgreSQL outage from ending a loop written when Redis was the only store.
"""

from __future__ import annotations

from .connection import ERRORS as REDIS_ERRORS
from .connection import REFUSED as REDIS_REFUSED
from .connection import UNREACHABLE as REDIS_UNREACHABLE

#: what a failed PostgreSQL call raises (empty without psycopg)
PG_ERRORS: tuple[type[Exception], ...] = ()
#: of those, the ones that mean the server could not be reached
PG_UNREACHABLE: tuple[type[Exception], ...] = ()
#: of those, PostgreSQL refusing the credentials or a statement (retrying cannot help)
PG_REFUSED: tuple[type[Exception], ...] = ()
try:
    import psycopg

    from .postgres import pool as _pool
except ImportError:  # no psycopg: the PostgreSQL store cannot be chosen, nothing to catch
    pass
else:
    PG_ERRORS = _pool.ERRORS
    PG_UNREACHABLE = _pool.UNREACHABLE
    PG_REFUSED = (psycopg.errors.InvalidAuthorizationSpecification,
                  psycopg.errors.InvalidPassword, psycopg.errors.InsufficientPrivilege)

#: what a failed call raises: no answer, or an error answer
ERRORS: tuple[type[Exception], ...] = REDIS_ERRORS + PG_ERRORS
#: of those, the ones that mean the store could not be reached at all (an outage)
UNREACHABLE: tuple[type[Exception], ...] = REDIS_UNREACHABLE + PG_UNREACHABLE
#: of those, the store refusing the credentials or a command (retrying cannot help)
REFUSED: tuple[type[Exception], ...] = REDIS_REFUSED + PG_REFUSED
