"""Settings: one frozen object built from ``app.conf`` and validated as a whole.

Every setting is a lower-case Celery setting named ``leaderbeat_*``; it is
read with ``app.conf.get`` so Django's ``CELERY_LEADERBEAT_*`` works through
Celery's namespace. Every problem is collected and reported together, and a
``leaderbeat_*`` key this version does not know is an error, not ignored.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
import socket
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError, did_you_mean
from .timing.policy import catchup_problems

logger = logging.getLogger(__name__)

#: the newest Celery minor version CI runs the tests on (the oldest: the lower bound in
#: pyproject.toml); a newer one gets a warning at start-up, not a refusal
TESTED_CELERY = (5, 7)

#: what beats do while the store (Redis or PostgreSQL) is unreachable
STORE_DOWN_POLICIES = ("pause", "last-leader")
REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel", "redis+cluster", "rediss+cluster")
#: the store URLs beside Redis: ``memory://`` (one process only: tests, development)
STORE_SCHEMES = (*REDIS_SCHEMES, "memory")
POSTGRES_SCHEMES = ("postgresql", "postgres")
#: ``leaderbeat_store_url`` naming Django's ``DATABASES["default"]``
DJANGO_STORE = "django"
#: PostgreSQL's reserved key words (``pg_get_keywords()``, category R): not usable as a
#: schema name unquoted, so refused as one
_RESERVED = frozenset({
    "all", "analyse", "analyze", "and", "any", "array", "as", "asc", "asymmetric", "both",
    "case", "cast", "check", "collate", "column", "constraint", "create",
    "current_catalog", "current_date", "current_role", "current_time", "current_timestamp",
    "current_user", "default", "deferrable", "desc", "distinct", "do", "else", "end",
    "except", "false", "fetch", "for", "foreign", "from", "grant", "group", "having", "in",
    "initially", "intersect", "into", "lateral", "leading", "limit", "localtime",
    "localtimestamp", "not", "null", "offset", "on", "only", "or", "order", "placing",
    "primary", "references", "returning", "select", "session_user", "some", "symmetric",
    "table", "then", "to", "trailing", "true", "union", "unique", "user", "using",
    "variadic", "when", "where", "window", "with"
})
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]{0,62}")
SCHEMA_RULE = ("must be a valid unquoted PostgreSQL identifier in lower case: a letter or '_', "
               "then letters, digits, '_' or '$', at most 63 characters, not a reserved key "
               "word and not starting with 'pg_'")
STORE_RULE = ("must be a Redis URL (redis://, rediss://, unix://, sentinel://, "
              "redis+cluster://, memory://), a PostgreSQL URL (postgresql://, postgres://) or "
              f"{DJANGO_STORE!r} (Django's DATABASES['default'])")

#: setting name (without ``leaderbeat_``) -> default.  ``None`` means "derived".
DEFAULTS: dict[str, Any] = {
    "store_url": None,
    "store_schema": "leaderbeat",
    "redis_url": None,
    "redis_options": {},
    "key_prefix": None,
    "node_id": None,
    "lease_ttl": 10.0,
    "renew_interval": None,
    "standby_poll": 1.0,
    "catchup": "latest",
    "catchup_window": None,
    "max_catchup": 100,
    "recover_unsent": None,  # derived: on with the worker guard, else off
    "store_down_policy": "pause",
    "store_timeout": None,  # derived: see Config.store_timeout
    "degraded_max_seconds": 60.0,
    "max_clock_skew": 2.0,
    "history_length": 10_000,
    "min_replicas": 0,
    "rescue_after": 2.0,
    "guard": False,
    "guard_expires": 7200.0,
    "overlap": "allow_all",
    "metrics_port": None,
    "base_scheduler": None,
    "atomic_enqueue": True,
}

#: a setting's old name (without ``leaderbeat_``) -> its name now: the old name is still
#: read, with a DeprecationWarning, and is an error where it disagrees with the new one
RENAMED = {"redis_down_policy": "store_down_policy"}

#: what the worker guard does with a slot due while the entry's previous run still runs
OVERLAP_POLICIES = ("skip", "buffer_one", "buffer_all", "cancel_other", "allow_all")
#: other names accepted (any case): Kubernetes' concurrencyPolicy, and ``allow``, the
#: name ``allow_all`` had when it and ``skip`` were the only policies
OVERLAP_ALIASES = {"forbid": "skip", "replace": "cancel_other", "allow": "allow_all"}
OVERLAP_RULE = (f"must be one of {', '.join(OVERLAP_POLICIES)} "
                "(or Kubernetes' Forbid, Replace, Allow)")


def overlap_policy(value: Any) -> str | None:
    """The policy ``value`` names (an alias or any case), or None when it names none."""
    if not isinstance(value, str):
        return None
    name = value.strip().lower()
    return name if name in OVERLAP_POLICIES else OVERLAP_ALIASES.get(name)


@dataclass(frozen=True)
class Config:
    """The validated settings of one beat process (their defaults: :data:`DEFAULTS`)."""

    redis_url: str
    key_prefix: str
    node_id: str
    redis_options: Mapping[str, Any]
    #: seconds one store call may take: on PostgreSQL a lock wait, an idle transaction,
    #: the pool's wait; on Redis the client's socket and connect timeouts, unless
    #: ``redis_options`` sets them (how it is chosen: :func:`store_timeout`)
    store_timeout: float
    lease_ttl: float
    renew_interval: float
    standby_poll: float
    catchup: str
    catchup_window: float | None
    max_catchup: int
    recover_unsent: bool
    store_down_policy: str
    degraded_max_seconds: float
    max_clock_skew: float
    history_length: int
    min_replicas: int
    rescue_after: float
    guard: bool
    guard_expires: float
    overlap: str
    metrics_port: int | None
    #: the Scheduler class the lease and claims are put around (None: our own schedule)
    base_scheduler: type | None
    #: claim and enqueue in one step where the broker is leaderbeat's Redis
    atomic_enqueue: bool
    #: Celery's ``beat_cron_starting_deadline``: the catch-up window of crontab entries
    cron_starting_deadline: float | None = None
    #: the URL the store is opened from: Redis, PostgreSQL or ``"django"`` (empty: the
    #: Redis of ``redis_url``)
    store_url: str = ""
    #: the PostgreSQL schema the store's tables live in (one per cluster of beats)
    store_schema: str = DEFAULTS["store_schema"]
    #: start-up warnings (Celery settings this scheduler does not use, a newer Celery)
    notes: tuple[str, ...] = field(default=(), compare=False)

    def say_notes(self) -> None:
        """Log each start-up warning once per process."""
        for note in self.notes:
            if note not in _SAID:
                _SAID.add(note)
                logger.warning("leaderbeat: %s", note)

    @property
    def redis_socket_timeout(self) -> float:
        """The Redis client's socket timeout: ``redis_options["socket_timeout"]`` when set
        (the options go to redis-py as given, over the client's defaults), else
        :attr:`store_timeout`."""
        given = self.redis_options.get("socket_timeout")
        return float(given) if given else self.store_timeout

    @property
    def safety_margin(self) -> float:
        """Seconds before the lease could lapse at which the leader stops sending."""
        return min(2.0, self.lease_ttl / 5)

    @classmethod
    def from_app(cls, app: Any) -> Config:
        """Read and validate every ``leaderbeat_*`` setting of a Celery app."""
        conf = app.conf
        problems = [_unknown_setting(name) for name in _unknown_settings(conf)]
        # unset stays None: from_values tells a value given from a default (an old name
        # beside its new one needs that)
        raw = {name: conf.get(f"leaderbeat_{name}") for name in (*DEFAULTS, *RENAMED)}
        if raw["redis_url"] is None and _is_redis_url(raw["store_url"]):
            raw["redis_url"] = raw["store_url"]
        if raw["redis_url"] is None and raw["store_url"] is None:
            broker = conf.get("broker_url") or ""
            if isinstance(broker, str) and broker.split("://", 1)[0] in REDIS_SCHEMES:
                raw["redis_url"] = broker.split(";")[0] if broker.startswith("redis") else broker
        if raw["key_prefix"] is None:
            raw["key_prefix"] = f"leaderbeat:{app.main or 'default'}"
        if raw["node_id"] is None:
            raw["node_id"] = default_node_id()
        deadline = _cron_starting_deadline(conf, problems)
        config = cls.from_values(raw, problems)
        notes = [*config.notes, *beat_setting_notes(conf, config, deadline),
                 *celery_version_notes()]
        return dataclasses.replace(config, cron_starting_deadline=deadline, notes=tuple(notes))

    @classmethod
    def from_values(cls, raw: Mapping[str, Any], problems: list[str] | None = None) -> Config:
        """Validate raw values (names without ``leaderbeat_``); raise every problem at once."""
        problems = list(problems or [])
        notes: list[str] = []
        given, old_names = _given(raw, problems, notes)
        raw = {**DEFAULTS, **given}
        v = _Validator(problems, old_names)
        ttl, renew, poll = _lease_timing(v, raw)
        store, names = _store_settings(v, raw, renew), _names(v, raw)
        catchup, window, max_catchup = (raw.get("catchup"), raw.get("catchup_window"),
                                        raw.get("max_catchup"))
        problems += catchup_problems(catchup, window, max_catchup,
                                     named=lambda key: f"leaderbeat_{key}")
        guarded = _guard_settings(v, raw)
        degraded = v.number("degraded_max_seconds", raw.get("degraded_max_seconds"), minimum=0.0)
        skew = v.number("max_clock_skew", raw.get("max_clock_skew"), minimum=0.0)
        history = v.integer("history_length", raw.get("history_length"), minimum=100)
        replicas = v.integer("min_replicas", raw.get("min_replicas"), minimum=0)
        rescue = v.number("rescue_after", raw.get("rescue_after"), minimum=0.5)
        metrics_port = _metrics_port(raw.get("metrics_port"), problems)
        base = _base_scheduler(raw.get("base_scheduler"), problems)
        if replicas and "+cluster" in str(store["redis_url"]):
            problems.append(f"leaderbeat_min_replicas={replicas!r} is not supported with Redis "
                            "Cluster (leaderbeat_redis_url is a redis+cluster:// URL)")
        if problems:
            raise ConfigurationError(problems)
        assert ttl is not None and renew is not None and poll is not None
        assert degraded is not None and skew is not None and rescue is not None
        return cls(
            **store, **names,
            lease_ttl=float(ttl), renew_interval=float(renew), standby_poll=float(poll),
            catchup=str(catchup), catchup_window=_seconds(window),
            max_catchup=max_catchup,  # type: ignore[arg-type]  # checked above
            **guarded, degraded_max_seconds=float(degraded), max_clock_skew=float(skew),
            history_length=history, min_replicas=replicas, rescue_after=float(rescue),
            metrics_port=metrics_port, base_scheduler=base, notes=tuple(notes),
        )


#: start-up warnings already logged by this process
_SAID: set[str] = set()


def _given(raw: Mapping[str, Any], problems: list[str],
           notes: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The values set (None: unset), each old name of :data:`RENAMED` read as its new one;
    and the new names whose value came from an old one (the old one, to name in problems).

    An old name set warns (a DeprecationWarning, and a start-up note: Python hides
    DeprecationWarnings outside ``__main__`` by default); set beside its new name with
    another value it is a problem naming both.
    """
    given = {k: v for k, v in raw.items() if v is not None and k not in RENAMED}
    old_names = {}
    for old, new in RENAMED.items():
        value = raw.get(old)
        if value is None:
            continue
        if new in given and given[new] != value:
            problems.append(f"leaderbeat_{old}={value!r} must equal leaderbeat_{new} "
                            f"({given[new]!r}) when both are set: it is that setting's old "
                            f"name; set only leaderbeat_{new}")
            continue
        if new not in given:
            given[new], old_names[new] = value, old
        said = (f"leaderbeat_{old} is deprecated: it is now named leaderbeat_{new} (Django: "
                f"CELERY_LEADERBEAT_{new.upper()}); the old name still works for now")
        warnings.warn(said, DeprecationWarning, stacklevel=3)
        notes.append(said)
    return given, old_names


def _names(v: _Validator, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``key_prefix`` (the app's, in the store) and ``node_id`` (this beat's)."""
    return {
        "key_prefix": v.check("key_prefix", raw.get("key_prefix"), lambda x: isinstance(x, str)
                              and bool(x) and not set("{}") & set(x),
                              "must be a non-empty string without '{' or '}'"),
        "node_id": v.check("node_id", raw.get("node_id"),
                           lambda x: isinstance(x, str) and bool(x) and "|" not in x,
                           "must be a non-empty string without '|'"),
    }


def _store_settings(v: _Validator, raw: Mapping[str, Any], renew: Any) -> dict[str, Any]:
    """The store's settings as :class:`Config` fields: its URLs, schema, Redis client
    options, call timeout and what beats do while it is unreachable."""
    url, store_url = _store_urls(v, raw)
    options = v.check("redis_options", raw.get("redis_options"),
                      lambda x: isinstance(x, Mapping), "must be a dict")
    options = dict(options) if isinstance(options, Mapping) else {}
    timeout = raw.get("store_timeout")
    if timeout is not None:
        v.check("store_timeout", timeout, lambda x: not isinstance(x, bool) and
                isinstance(x, (int, float)) and x > 0, "must be a number of seconds > 0")
    return {
        "redis_url": url, "store_url": store_url, "redis_options": options,
        "store_schema": v.check("store_schema", raw.get("store_schema"), is_schema_name,
                                SCHEMA_RULE),
        "store_timeout": store_timeout(timeout, options, renew),
        "store_down_policy": v.check("store_down_policy", raw.get("store_down_policy"),
                                     lambda x: x in STORE_DOWN_POLICIES,
                                     f"must be one of {', '.join(STORE_DOWN_POLICIES)}"),
    }


def store_timeout(setting: Any, redis_options: Mapping[str, Any], renew_interval: Any) -> float:
    """Seconds one store call may take: ``leaderbeat_store_timeout``; unset,
    ``redis_options["socket_timeout"]`` (so a site that set the timeout there keeps it on
    either store); else half the renew interval within 0.5 to 2 s.

    On Redis an explicit ``redis_options["socket_timeout"]`` wins over the setting for
    the client's socket (see :attr:`Config.redis_socket_timeout`)."""
    for chosen in (setting, redis_options.get("socket_timeout")):
        try:
            if chosen:
                return float(chosen)
        except (TypeError, ValueError):
            continue  # not a number: redis-py refuses it when it connects
    renew = renew_interval if isinstance(renew_interval, (int, float)) else 1.0
    return max(0.5, min(2.0, renew / 2))


def _guard_settings(v: _Validator, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The worker guard's settings and those it changes, as :class:`Config` fields."""
    guard = v.flag("guard", raw.get("guard"))
    recover = raw.get("recover_unsent")
    if recover is None:
        recover = guard is True  # the guard makes re-sending safe: each slot runs once
    expires = v.number("guard_expires", raw.get("guard_expires"), minimum=60.0)
    overlap = overlap_policy(v.check("overlap", raw.get("overlap"),
                                     lambda x: overlap_policy(x) is not None, OVERLAP_RULE))
    return {"guard": guard, "recover_unsent": v.flag("recover_unsent", recover),
            "guard_expires": expires, "overlap": str(overlap),
            "atomic_enqueue": v.flag("atomic_enqueue", raw.get("atomic_enqueue"))}


def _lease_timing(v: _Validator, raw: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """``lease_ttl``, ``renew_interval`` (a third of the ttl unless given) and
    ``standby_poll``, checked alone and against each other (None: a problem said)."""
    problems = v.problems
    ttl = v.number("lease_ttl", raw.get("lease_ttl"), minimum=1.0)
    renew = raw.get("renew_interval")
    if renew is None and ttl is not None:
        renew = ttl / 3
    renew = v.number("renew_interval", renew, minimum=0.1)
    if ttl is not None and renew is not None and not ttl > 2 * renew:
        problems.append(f"leaderbeat_lease_ttl={ttl!r} must be more than "
                        f"2 × leaderbeat_renew_interval ({renew!r})")
    poll = v.number("standby_poll", raw.get("standby_poll"), minimum=0.05)
    if ttl is not None and poll is not None and poll > ttl:
        problems.append(f"leaderbeat_standby_poll={poll!r} must not exceed "
                        f"leaderbeat_lease_ttl ({ttl!r})")
    return ttl, renew, poll


def _metrics_port(setting: Any, problems: list[str]) -> Any:
    """The metrics port: ``LEADERBEAT_METRICS_PORT`` in the environment wins over the
    setting (two beats on one host need two ports from one settings module)."""
    port = setting
    env_port = os.environ.get("LEADERBEAT_METRICS_PORT")
    if env_port:
        port = int(env_port) if env_port.isdigit() else env_port
    if port is not None:
        named = "LEADERBEAT_METRICS_PORT" if env_port else "leaderbeat_metrics_port"
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            problems.append(f"{named}={port!r} must be a TCP port (1-65535)")
        elif importlib.util.find_spec("prometheus_client") is None:
            problems.append(f"{named}={port!r} needs prometheus-client: "
                            "pip install 'celery-leaderbeat[metrics]'")
    return port


def _cron_starting_deadline(conf: Any, problems: list[str]) -> float | None:
    value = conf.get("beat_cron_starting_deadline")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        problems.append(f"beat_cron_starting_deadline={value!r} must be a number of seconds > 0 "
                        "(or None)")
        return None
    return float(value)


def beat_setting_notes(conf: Any, config: Config, deadline: float | None) -> list[str]:
    """A warning for each Celery ``beat_*`` setting that is set but not used as Celery says.

    Honoured without a word: ``beat_schedule``, ``beat_scheduler``,
    ``beat_max_loop_interval`` (an upper bound; a leader wakes at least every
    ``leaderbeat_standby_poll``), ``beat_enable_remote_control`` and
    ``beat_remote_control_max_tick_age`` (Celery's beat service answers, whatever the
    scheduler), ``beat_cron_starting_deadline`` (the catch-up window of crontab and cron
    string entries that set none of their own). ``beat_sync_every`` and
    ``beat_schedule_filename`` matter only to a base scheduler that persists.
    """
    notes = []
    base = config.base_scheduler
    if deadline is not None and config.catchup_window is not None:
        notes.append(
            f"beat_cron_starting_deadline={deadline:g} is not used: leaderbeat_catchup_window="
            f"{config.catchup_window:g} is set and bounds the catch-up of every entry "
            "(crontab entries included); unset one of them")
    sync_every = conf.get("beat_sync_every")
    if sync_every and base is None:
        notes.append(f"beat_sync_every={sync_every!r} has no effect: the schedule's state lives "
                     "in Redis and is written at every claim (it applies to a "
                     "leaderbeat_base_scheduler that persists)")
    filename = conf.get("beat_schedule_filename")
    if filename and filename != "celerybeat-schedule" and not _persists(base):
        notes.append(f"beat_schedule_filename={filename!r} has no effect: the schedule's state "
                     "lives in Redis (it applies to a leaderbeat_base_scheduler that is "
                     "celery.beat.PersistentScheduler or a subclass)")
    return notes


def celery_version_notes(version: str | None = None) -> list[str]:
    """A warning when Celery is newer than the newest version the tests run on."""
    if version is None:
        import celery

        version = celery.__version__
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return []
    if (major, minor) <= TESTED_CELERY:
        return []
    tested = ".".join(map(str, TESTED_CELERY))
    return [(f"Celery {version} is newer than the newest version this celery-leaderbeat is "
             f"tested with ({tested}.x); it should work, but look for a newer celery-leaderbeat "
             "and report what breaks")]


def _persists(base: type | None) -> bool:
    if base is None:
        return False
    from celery.beat import PersistentScheduler

    return issubclass(base, PersistentScheduler)


def default_node_id() -> str:
    """``host:pid:random``: unique per scheduler instance, so two never share a lease token."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class _Validator:
    """Collects problems instead of raising at the first one."""

    def __init__(self, problems: list[str], old_names: Mapping[str, str] | None = None) -> None:
        self.problems = problems
        #: a setting whose value was given under its old name is named so in its problems
        self.old_names = dict(old_names or {})

    def check(self, name: str, value: Any, ok: Callable[[Any], bool], rule: str) -> Any:
        try:
            good = ok(value)
        except Exception:  # noqa: BLE001 - a predicate that cannot judge the value rejects it
            good = False
        if not good:
            self.problems.append(f"leaderbeat_{self.old_names.get(name, name)}={value!r} {rule}")
        return value

    def flag(self, name: str, value: Any) -> Any:
        return self.check(name, value, lambda x: isinstance(x, bool), "must be True or False")

    def integer(self, name: str, value: Any, *, minimum: int) -> Any:
        return self.check(name, value,
                          lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= minimum,
                          f"must be an integer of at least {minimum}")

    def number(self, name: str, value: Any, *, minimum: float) -> float | None:
        setting = f"leaderbeat_{self.old_names.get(name, name)}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.problems.append(f"{setting}={value!r} must be a number of seconds")
            return None
        if value < minimum:
            self.problems.append(f"{setting}={value!r} must be at least {minimum}")
            return None
        return float(value)


def _base_scheduler(value: Any, problems: list[str]) -> type | None:
    try:
        return resolve_base(value)
    except ConfigurationError as exc:
        problems.extend(exc.problems)
        return None


def resolve_base(value: Any) -> type | None:
    """The Scheduler class named by ``leaderbeat_base_scheduler`` (None when unset).

    Accepts ``module:Class``, ``module.Class`` or the class itself; raises
    :class:`ConfigurationError` naming the setting, the value and the rule.
    """
    if value is None or value == "":
        return None
    from celery import beat  # late: importing the settings must not import celery.beat

    setting = "leaderbeat_base_scheduler"
    cls = value
    if isinstance(value, str):
        try:
            cls = _import(value)
        except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
            raise ConfigurationError(
                f"{setting}={value!r} is not importable ({type(exc).__name__}: {exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, beat.Scheduler)):
        raise ConfigurationError(
            f"{setting}={value!r} must name a celery.beat.Scheduler subclass, not {cls!r}")
    if getattr(cls, "leaderbeat_scheduler", False):  # set on celery_leaderbeat.Scheduler
        raise ConfigurationError(
            f"{setting}={value!r} is celery_leaderbeat.Scheduler itself: name the scheduler "
            "it wraps, e.g. 'django_celery_beat.schedulers:DatabaseScheduler'")
    return cls


def _import(path: str) -> Any:
    """``symbol_by_name``; a Django app's scheduler outside ``celery beat`` (the CLI, a
    script) is imported once Django is set up, as the beat's Django fixup would."""
    from celery.utils.imports import symbol_by_name

    try:
        return symbol_by_name(path)
    except Exception as exc:
        if type(exc).__name__ != "AppRegistryNotReady":
            raise
        import django

        django.setup()
        return symbol_by_name(path)


def _seconds(value: Any) -> Any:
    total = getattr(value, "total_seconds", None)
    return total() if callable(total) else value


def _store_urls(v: _Validator, raw: Mapping[str, Any]) -> tuple[Any, Any]:
    """``redis_url`` and ``store_url``: the store's URL is Redis's unless it names
    PostgreSQL (then Redis's is not needed, and empty unless given)."""
    store_url = raw.get("store_url")
    if store_url is not None:
        v.check("store_url", store_url, _is_store_url, STORE_RULE)
        if not _is_redis_url(store_url):
            given = raw.get("redis_url")
            if given is not None:
                v.check("redis_url", given, _is_redis_url, "must be a redis://, rediss://, "
                        "unix://, sentinel:// or redis+cluster:// URL")
            return given or "", store_url
    given = raw.get("redis_url") or store_url
    url = v.check("redis_url", given, _is_redis_url,
                  "must be a redis://, rediss://, unix://, sentinel:// or redis+cluster:// "
                  "URL (none given, and the broker is not Redis); or set "
                  "leaderbeat_store_url to a postgresql:// URL to keep leaderbeat on PostgreSQL")
    return url, store_url or url


def _is_store_url(value: Any) -> bool:
    return (value == DJANGO_STORE or _is_redis_url(value) or
            (isinstance(value, str) and value.split("://", 1)[0] in POSTGRES_SCHEMES))


def is_schema_name(value: Any) -> bool:
    """Whether ``value`` is a schema name PostgreSQL takes unquoted, as it is written."""
    return (isinstance(value, str) and _IDENTIFIER.fullmatch(value) is not None
            and value not in _RESERVED and not value.startswith("pg_"))


def store_name(config: Config) -> str:
    """The store as a log line names it: ``PostgreSQL``, ``the in-memory store`` or ``Redis``."""
    if is_postgres_store(config):
        return "PostgreSQL"
    return "the in-memory store" if config.redis_url.startswith("memory://") else "Redis"


def is_postgres_store(config: Config) -> bool:
    """Whether ``config`` puts the store on PostgreSQL (a URL, or Django's database)."""
    return config.store_url == DJANGO_STORE or config.store_url.split("://", 1)[0] in POSTGRES_SCHEMES


def _is_redis_url(value: Any) -> bool:
    return isinstance(value, str) and value.split("://", 1)[0] in STORE_SCHEMES


def _unknown_setting(name: str) -> str:
    """The problem of an unknown ``leaderbeat_<name>``: the nearest names, else all."""
    hint = did_you_mean(name, DEFAULTS, prefix="leaderbeat_")
    return (f"leaderbeat_{name} is not a setting of celery_leaderbeat; " + (
        f"did you mean {hint}?" if hint else
        f"the settings are: {', '.join('leaderbeat_' + k for k in sorted(DEFAULTS))}"))


def _unknown_settings(conf: Any) -> list[str]:
    """``leaderbeat_*`` names in ``conf`` that are not ours, namespace prefix removed."""
    unknown = set()
    for key in list(conf.keys()):
        low = str(key).lower()
        if low.startswith("celery_leaderbeat_"):
            low = low[len("celery_"):]
        name = low[len("leaderbeat_"):]
        if low.startswith("leaderbeat_") and name not in DEFAULTS and name not in RENAMED:
            unknown.add(name)
    return sorted(unknown)
