"""One transaction in one pipeline: the fewest round trips a transaction can take.

psycopg's ``transaction()`` inside a pipeline syncs as it begins and twice as it ends:
four round trips of its own, each a wake-up of both processes, during which the
transaction holds its row locks (the lease row, for every claim and renewal). Here BEGIN
rides with the first statements and COMMIT with the last: a transaction whose statements
need no answer before the next is sent takes one round trip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus


@contextmanager
def transaction(conn: Any) -> Iterator[Any]:
    """BEGIN, the block's statements, COMMIT, in one pipeline (yielded: ``sync()`` it to
    read answers midway); rolled back on any error, the error raised."""
    try:
        with conn.pipeline() as pipeline:
            conn.execute("BEGIN")
            yield pipeline
            conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise


def rollback(conn: Any) -> None:
    """End a transaction an error left open (a connection that cannot is dropped by its
    pool on return)."""
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            pass  # the error that brought us here is the one to raise
