"""Which driver's errors are PostgreSQL's: a store error keeps its driver's exception as
``__cause__``, and a message that names the server (``PostgreSQL`` or ``Redis``) asks
this. Roles and commands catch the seam's errors (``STORE_ERRORS``), never these.
"""

from __future__ import annotations

#: what a failed PostgreSQL call raises (empty without psycopg)
PG_ERRORS: tuple[type[Exception], ...] = ()
try:
    from .postgres import pool as _pool
except ImportError:  # no psycopg: the PostgreSQL store cannot be chosen, nothing to name
    pass
else:
    PG_ERRORS = _pool.ERRORS
