"""Trouble from outside: the store not answering, refusing credentials, the wall clock stepping.

``tick()`` never raises for store or leadership trouble (beat would exit): an
unreachable store is retried with a backoff capped at one standby poll, and
when it answers again the node that led goes first. Refused credentials or a
missing permission are a configuration error, said once, clearly.
"""

from __future__ import annotations

import logging
import time

from ..config import is_postgres_store, store_name
from ..errors import LeaseLostError, PostgresAuthError, RedisAuthError, StoreAuthError
from ..roles.shared import utcnow
from ..store.base import STORE_ERRORS
from ..store.connection import describe
from ..store.errors import StoreCredentialsRefused
from .attributes import Attributes

logger = logging.getLogger(__name__)

#: seconds by which the wall clock must move against the monotonic one to count as a
#: step (NTP slews smaller offsets; GC pauses and SIGSTOP move both clocks alike)
CLOCK_STEP = 2.0

class Trouble(Attributes):
    """What the Scheduler does when the store stops answering, and when the wall clock steps."""

    def _store_at(self) -> str:
        """The store's server for a log line: ``Redis at <url>`` or ``PostgreSQL at <url>``."""
        config = self.lb_config
        if is_postgres_store(config):
            return f"PostgreSQL at {describe(config.store_url)}"
        return f"Redis at {describe(config.redis_url)}"

    def _refused(self, exc: Exception) -> StoreAuthError:
        """Credentials or a permission the store refused, as the error of the store that
        refused (:class:`PostgresAuthError` or :class:`RedisAuthError`), saying what to
        check."""
        if is_postgres_store(self.lb_config):
            schema = self.lb_config.store_schema
            if isinstance(exc, StoreCredentialsRefused):
                return PostgresAuthError(
                    f"{self._store_at()} refused the credentials ({exc}); check the role and "
                    "password in leaderbeat_store_url (or Django's DATABASES)")
            return PostgresAuthError(
                f"{self._store_at()} refused a privilege ({exc}); the role needs USAGE on "
                f"the schema {schema!r} (leaderbeat_store_schema) and SELECT, INSERT, UPDATE, "
                "DELETE on its tables")
        if isinstance(exc, StoreCredentialsRefused):
            return RedisAuthError(
                f"Redis at {describe(self.lb_config.redis_url)} refused the credentials "
                f"({exc}); check the password/username in leaderbeat_redis_url or "
                "leaderbeat_redis_options")
        return RedisAuthError(
            f"the Redis user of {describe(self.lb_config.redis_url)} lacks a permission "
            f"leaderbeat needs ({exc}); it needs the keys and channels '{{{self.keys.prefix}}}:*' "
            "and the script, string, hash, stream, pub/sub, TIME and PING commands")

    def _store_trouble(self, exc: Exception) -> float:
        if not self._store_failures:
            self._led_at_outage = self._leader is not None
            logger.warning("leaderbeat: %s unreachable (%s); %s, retrying with backoff",
                           self._store_at(), exc,
                           "leader stops sending until its lease is confirmed"
                           if self._leader is not None else "standing by")
        self._store_failures += 1
        if self._standby is not None:
            self._standby.lost_connection()
        if self._leader is not None:
            self._leader.close()  # its subscription is made again once the store answers
        if (self._leader is not None and not self._leader.store_unreachable(exc)
                and (self._shared is None or not self._shared.lease.is_held())):
            self._step_down("lease could not be confirmed while "
                            f"{store_name(self.lb_config)} was unreachable")
        # capped at one standby poll (1 s): a leader that survived its store restarting
        # empty is back within about a second of the store answering, not a backoff step
        # later
        backoff: float = 0.25 * 2 ** min(self._store_failures - 1, 6)
        return min(backoff, max(0.25, float(self.lb_config.standby_poll)))

    def _store_back(self) -> None:
        logger.info("leaderbeat: %s answers again", self._store_at())
        self._store_failures = 0
        self._contact_since = time.time()
        config = self.lb_config
        if self._leader is not None and self._shared is not None:
            # Is the lease still there? If the store lost it while it was valid, this node (the
            # only one that can know nobody sent later slots) steps down now and takes the
            # lease again first, carrying on from what it sent.
            try:
                self._shared.lease.renew()
            except LeaseLostError as exc:
                self._step_down(str(exc))
            except STORE_ERRORS:
                pass  # the heartbeat and the next tick find out
        if self._standby is not None and self._leader is None:
            if config.store_down_policy == "last-leader" and not self._led_at_outage:
                # the previous leader reconciles what it sent meanwhile first
                self._standby.restart(head_start=config.lease_ttl, shift_since=True)
            elif not self._led_at_outage:
                # the node that led goes first: it knows what it sent (the store may not)
                self._standby.restart(head_start=min(config.lease_ttl,
                                                     2 * config.standby_poll))
            else:
                self._standby.restart()

    def _watch_wall_clock(self) -> None:
        """A forward wall-clock step makes the slots it jumped over 'missed' (catch-up policy)."""
        wall, mono = time.time(), time.monotonic()
        last_wall, last_mono = self._last_wall
        self._last_wall = (wall, mono)
        jump = (wall - last_wall) - (mono - last_mono)
        if abs(jump) > CLOCK_STEP:
            logger.warning("leaderbeat: the wall clock stepped %+.1f s; slots it skipped follow "
                           "the catch-up policy, claimed slots are never re-sent", jump)
            if jump > 0:
                if self._leader is not None:
                    self._leader.since = utcnow()
                if self._standby is not None:
                    self._standby.restart()
