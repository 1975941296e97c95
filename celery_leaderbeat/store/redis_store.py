"""The Redis store: every part of :class:`~celery_leaderbeat.store.base.Store` on one client.

:func:`connect` opens it from the settings (``leaderbeat_redis_url``, its options
and timeout); :func:`redis_store` builds it on a client one already has. Making
it sends nothing to Redis: each script is loaded on its first call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from ..config import Config
from .admin import RedisAdmin
from .base import (
    ClusterAdmin,
    EntryDefinitions,
    Events,
    GuardStore,
    LeaseStore,
    LossDetection,
    RequestQueue,
    SlotStore,
    Store,
)
from .calls import PARTS, store_call, through_boundary
from .connection import ERRORS, make_client, server_warnings, store_error
from .entry_store import EntryStore
from .events import RedisEvents
from .keys import Keys
from .lease import Lease
from .ledger import Ledger
from .queue import RedisRequests
from .runs import RedisRuns
from .scripts import Scripts


class RedisStore:
    """The Redis store of one key prefix: the lease, the ledger and the rest, one client.

    Its parts are typed by their protocols, so the type checker holds each Redis class
    to the interface a second store would implement."""

    def __init__(self, client: Any, keys: Keys, config: Config) -> None:
        scripts = Scripts(client)
        self.client = client
        self.lease: LeaseStore = Lease(client, scripts, keys, config)
        ledger = Ledger(client, scripts, keys, config)
        self.ledger: SlotStore = ledger
        self.loss: LossDetection = ledger  # it detects losses of writes
        self.events: Events = RedisEvents(client, keys)
        self.requests: RequestQueue = RedisRequests(client, keys)
        self.entries: EntryDefinitions = EntryStore(client, keys)
        self.guard: GuardStore = RedisRuns(client, scripts, keys, config)
        self.admin: ClusterAdmin = RedisAdmin(client, scripts, keys, config)

        through_boundary(self, PARTS, errors=ERRORS, translate=store_error)
        self.loss = cast(LossDetection, self.ledger)  # behind the boundary: ``ledger.*``

    def ping(self) -> None:
        with store_call("store.ping"), _translated():
            self.client.ping()

    def warnings(self) -> list[str]:
        with store_call("store.warnings"), _translated():
            return server_warnings(self.client)

    def close(self) -> None:
        self.client.close()


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except ERRORS as exc:
        raise store_error(exc) from exc


def redis_store(client: Any, keys: Keys, config: Config) -> RedisStore:
    """The Redis implementation of :class:`~celery_leaderbeat.store.base.Store` on ``client``."""
    return RedisStore(client, keys, config)


def connect(config: Config) -> Store:
    """The store these settings name, on a new client (one per process: never share it
    across a fork); ``memory://`` names the in-memory store of this process."""
    if config.redis_url.startswith("memory://"):
        from .memory import connect as memory_store

        return memory_store(config)
    client = make_client(config.redis_url, config.redis_options, config.store_timeout)
    return redis_store(client, Keys(config.key_prefix), config)
