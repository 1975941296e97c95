"""Where one app's state lives, and the one way the adapters reach it."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg_pool

from .events import channel_name
from .pool import connection


@dataclass(frozen=True)
class Place:
    """Where one app's state lives: a pool, a schema, and the app's key in it."""

    pool: psycopg_pool.ConnectionPool
    schema: str
    app: str

    def run(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with connection(self.pool) as conn:
            return call(conn, self.schema, self.app, *args, **kwargs)


def holder_id(node_id: str) -> str:
    """This process's holder id: the node id and a token no other process has."""
    return f"{node_id}/{secrets.token_hex(6)}"


def channel(place: Place) -> str:
    """The NOTIFY channel of one app's events."""
    return channel_name(place.schema, place.app)
