"""Redis clients for celery_leaderbeat, built from one URL in one place.

Supported URLs: ``redis://``, ``rediss://`` (TLS), ``unix://``, kombu-style
``sentinel://host:port;sentinel://host:port/db`` and ``redis+cluster://`` (or
``rediss+cluster://``) for Redis Cluster. ``leaderbeat_redis_options`` is
passed to the client (``password``, ``username``, ``ssl_ca_certs``, ...);
for Sentinel, ``master_name`` (or ``service_name``) and ``sentinel_kwargs``.

redis-py retries a dead server for about 5 s by default and ``celery beat``
sets a 30 s global socket timeout; a lease renewal must fail much faster than
that, so every client gets explicit timeouts and a short retry policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlparse

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ..errors import ConfigurationError
from .errors import StoreCredentialsRefused, StoreError, StoreRefused, StoreUnreachable

#: what a failed Redis call raises: no answer (the server, the network), or an error reply
ERRORS: tuple[type[Exception], ...] = (redis.RedisError, OSError)
#: of those, the ones that mean Redis could not be reached at all
UNREACHABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)
#: of those, Redis refusing the credentials or a command (retrying cannot help)
REFUSED: tuple[type[Exception], ...] = (redis.AuthenticationError,
                                        redis.exceptions.NoPermissionError)


def store_error(exc: Exception) -> StoreError:
    """The store error a failed Redis call leaves the store as (``exc`` kept as its cause)."""
    if isinstance(exc, redis.AuthenticationError):
        return StoreCredentialsRefused(str(exc))
    if isinstance(exc, REFUSED):
        return StoreRefused(str(exc))
    if isinstance(exc, UNREACHABLE):
        return StoreUnreachable(str(exc))
    return StoreError(str(exc))


def client_defaults(timeout: float) -> dict[str, Any]:
    """Client options every connection gets unless the user overrides them."""
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=1),
        "health_check_interval": 0,
    }


def make_client(url: str, options: Mapping[str, Any], timeout: float) -> Any:
    """A redis-py client (``Redis``, Sentinel master or ``RedisCluster``) for ``url``.

    ``timeout`` is the socket timeout (``Config.store_timeout``) unless ``options`` sets one.
    """
    opts = {**client_defaults(timeout), **dict(options)}
    scheme = url.split("://", 1)[0]
    if scheme == "sentinel":
        return _sentinel_master(url, opts)
    if scheme.endswith("+cluster"):
        from redis.cluster import RedisCluster

        opts.pop("health_check_interval", None)
        return RedisCluster.from_url(url.replace("+cluster", "", 1), **opts)
    return redis.Redis.from_url(url, **opts)


def _sentinel_class() -> Any:
    from redis.sentinel import MasterNotFoundError, Sentinel

    class _Sentinel(Sentinel):
        """Tells "the Sentinels refused our password" apart from "no master found".

        redis-py counts a Sentinel that refuses AUTH as unreachable and answers
        MasterNotFoundError, which beat would retry for ever; a refused password
        is a configuration error that retrying cannot fix.
        """

        def discover_master(self, service_name: str) -> Any:
            try:
                return super().discover_master(service_name)  # type: ignore[no-untyped-call, unused-ignore]
            except MasterNotFoundError:
                for sentinel in self.sentinels:
                    try:
                        sentinel.ping()
                    except redis.AuthenticationError as exc:
                        kw = sentinel.connection_pool.connection_kwargs
                        raise redis.AuthenticationError(
                            f"Sentinel {kw.get('host')}:{kw.get('port')}: {exc} (the Sentinels' "
                            "own password goes in leaderbeat_redis_options['sentinel_kwargs'])"
                        ) from exc
                    except (redis.RedisError, OSError):
                        continue
                raise

    return _Sentinel


def _sentinel_master(url: str, opts: dict[str, Any]) -> Any:
    _Sentinel = _sentinel_class()
    hosts = []
    db = 0
    password = None
    for part in url.split(";"):
        parsed = urlparse(part.strip())
        if parsed.scheme != "sentinel" or not parsed.hostname:
            raise ConfigurationError(
                f"leaderbeat_redis_url={url!r}: every part must look like "
                "sentinel://[:password@]host:port[/db], separated by ';'")
        hosts.append((parsed.hostname, parsed.port or 26379))
        if parsed.path.strip("/"):
            db = int(parsed.path.strip("/"))
        if parsed.password:
            password = unquote(parsed.password)
    service = opts.pop("master_name", None) or opts.pop("service_name", None)
    if not service:
        raise ConfigurationError(
            f"leaderbeat_redis_url={url!r} is a Sentinel URL: set "
            "leaderbeat_redis_options={'master_name': '<service name>'}")
    sentinel_kwargs = dict(opts.pop("sentinel_kwargs", None) or {})  # never edit the setting
    for key in ("socket_timeout", "socket_connect_timeout", "retry"):
        sentinel_kwargs.setdefault(key, opts[key])
    if password is not None:
        opts.setdefault("password", password)
    sentinel = _Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **{
        k: v for k, v in opts.items() if k in ("socket_timeout", "socket_connect_timeout")})
    return sentinel.master_for(service, db=db, **opts)


def describe(url: str) -> str:
    """The URL with any password masked, for log lines."""
    parsed = urlparse(url.split(";")[0])
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


#: maxmemory policies under which Redis may evict our keys silently
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random",
                     "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")


def server_warnings(client: Any) -> list[str]:
    """What about this Redis server puts the schedule's guarantees at risk (checked once)."""
    warnings: list[str] = []
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.ResponseError:  # CONFIG may be disabled (managed Redis, ACL): nothing to say
        return warnings
    if isinstance(policy, bytes):
        policy = policy.decode()
    if policy in EVICTING_POLICIES:
        warnings.append(
            f"Redis maxmemory-policy is {policy!r}: under memory pressure Redis may evict the "
            "lease, slot and history keys silently (a missing slot state is treated as 'first "
            "seen'). Use 'noeviction' or a dedicated database for leaderbeat.")
    return warnings
