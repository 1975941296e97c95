"""Where one app's state lives, and the one way the adapters reach it.

Every store call goes through :meth:`Place.run`: the fault site of this store. A test
sets :attr:`Place.fault`, which is told each call's name (the ``*_sql`` function's:
``acquire``, ``claim``, ``record`` ...) before the call is sent and after its
transaction committed, and may raise there: a call that failed before the server ran
it, or one whose reply was lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...config import Config
from .events import channel_name
from .pool import Pool, connection

#: a test's fault: told (call name, "before" or "after"); raises to fail the call there
Fault = Callable[[str, str], None]


@dataclass
class Place:
    """Where one app's state lives: a pool, a schema, and the app's key in it."""

    pool: Pool
    schema: str
    app: str
    fault: Fault | None = None

    def run(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        site = getattr(call, "__name__", "call")
        if self.fault is not None:
            self.fault(site, "before")
        with connection(self.pool) as conn:
            result = call(conn, self.schema, self.app, *args, **kwargs)
        if self.fault is not None:
            self.fault(site, "after")
        return result


def wait_ms(config: Config) -> int:
    """How long a call waits for a lock held by another transaction, or idles inside its
    own: a call's timeout (at least 100 ms)."""
    return max(100, int(config.store_timeout * 1000))


def channel(place: Place) -> str:
    """The NOTIFY channel of one app's events."""
    return channel_name(place.schema, place.app)
