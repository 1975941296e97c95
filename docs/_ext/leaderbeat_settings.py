"""``{leaderbeat-settings}``: the settings table, built from celery_leaderbeat/config.py.

The names and defaults come from ``config.DEFAULTS``; each rule is what
``Config.from_values`` itself answers when it is given a value of the wrong kind and
one below any minimum, so the table says what the code enforces. What each setting is
*for* is prose, kept here beside the names: a setting the code has and this file does
not describe, or a description of a setting the code no longer has, is a build warning
(an error under ``-W``), so the page cannot drift from the code.
"""

from __future__ import annotations

from typing import Any

#: defaults that are derived when unset (``None`` in DEFAULTS and not "unset")
DERIVED = {
    "store_url": "`redis_url`",
    "redis_url": "the broker URL, when the broker is Redis (or `store_url` when it is Redis)",
    "key_prefix": "`leaderbeat:<app name>`",
    "node_id": "`host:pid:random`",
    "renew_interval": "lease_ttl / 3",
    "recover_unsent": "on with `leaderbeat_guard`, else off",
    "store_timeout": "`redis_options[\"socket_timeout\"]` when given, else half the renew "
                     "interval within 0.5 to 2 s (1.67 s with the defaults)",
}

#: what each setting is for (Markdown); every name of config.DEFAULTS, no other
MEANING = {
    "store_url": "Which store keeps leaderbeat's state: a Redis URL (as `redis_url`), "
                 "`postgresql://user@host/db` (or `postgres://`), or `django`: the "
                 "PostgreSQL of Django's `DATABASES[\"default\"]`, on connections of its own. "
                 "See [PostgreSQL](../postgresql.md).",
    "store_schema": "On a PostgreSQL store: the schema its tables live in, created by the "
                    "first beat or by `celery leaderbeat init-store`. Beats in two schemas of "
                    "one database are two clusters that never see each other. See "
                    "[PostgreSQL](../postgresql.md#the-schema).",
    "redis_url": "Where leaderbeat keeps its state: `redis://`, `rediss://` (TLS), `unix://`, "
                 "`sentinel://h:p;sentinel://h2:p/db`, `redis+cluster://`. Required when the "
                 "broker is not Redis and `store_url` does not name PostgreSQL.",
    "redis_options": "Passed to the redis-py client (`password`, `username`, `ssl_ca_certs`, "
                     "`socket_timeout`, ...; Sentinel: `master_name`, `sentinel_kwargs`). "
                     "Its `socket_timeout` is the Redis client's, over `store_timeout`; "
                     "while `store_timeout` is unset it is the store's call timeout (either "
                     "store).",
    "key_prefix": "Every key lives under the hash tag `{<prefix>}`; one prefix per app.",
    "node_id": "Unique per beat process: two running beats with one id are stopped with an "
               "error naming this setting.",
    "lease_ttl": "After a crash a standby leads within ttl + `standby_poll`; standbys rescue "
                 "every due slot meanwhile. Must be more than 2 × `renew_interval`.",
    "renew_interval": "How often the leader's heartbeat renews the lease.",
    "standby_poll": "How often a standby tries to lead (it also wakes on `released`; at most "
                    "every 0.9 s while it follows run-time entries, which it looks at then) "
                    "and the leader looks for CLI requests. At most `lease_ttl`.",
    "catchup": "`latest`, `skip` or `all`: what happens to slots nobody could send (every "
               "beat down, Redis unreachable). See [catch-up](../guide/catchup.md).",
    "catchup_window": "Missed slots older than this are never sent.",
    "max_catchup": "`all` sends at most this many missed slots per entry.",
    "recover_unsent": "Re-send, under the same task ids, the slots an earlier leader claimed "
                      "and never confirmed.",
    "store_down_policy": "What beats do while the store (Redis or PostgreSQL) is "
                         "unreachable. `pause`: nobody sends; `last-leader`: see [when Redis "
                         "goes away](../operations/redis.md#when-redis-goes-away). Its old "
                         "name, `leaderbeat_redis_down_policy`, is still read, with a "
                         "deprecation warning; both set to different values is an error.",
    "store_timeout": "Seconds one store call may take: on PostgreSQL a statement's wait for "
                     "a lock, a transaction's idle time, the wait for a pooled connection; on "
                     "Redis the client's socket and connect timeouts, except that "
                     "`redis_options[\"socket_timeout\"]` (or `socket_connect_timeout`), "
                     "when set, wins for the socket (or the connect). See "
                     "[PostgreSQL](../postgresql.md#connections).",
    "degraded_max_seconds": "How long a `last-leader` node sends without Redis (a hard cap).",
    "max_clock_skew": "A node whose clock is further off Redis `TIME` refuses to lead; also "
                      "the margin before an entry seen for the first time starts.",
    "history_length": "Approximate cap of the history stream.",
    "min_replicas": "Claims wait (Redis `WAIT`) for this many replicas before sending; not "
                    "with Cluster. See [Sentinel](../operations/redis.md).",
    "rescue_after": "A standby claims and sends a due slot nobody claimed this long after "
                    "its fire time (judged by Redis `TIME`).",
    "guard": "On the **workers'** app: each slot's message runs at most once. See "
             "[the worker guard](../guide/guard.md).",
    "guard_expires": "How long the guard remembers a slot's run: keep it above your broker's "
                     "redelivery window.",
    "overlap": "`skip` (with the guard): a slot does not start while the entry's previous "
               "run still runs. Per entry too.",
    "metrics_port": "Serve Prometheus `/metrics` (and the probes) on this port; the "
                    "environment's `LEADERBEAT_METRICS_PORT` wins. Needs the `metrics` extra.",
    "base_scheduler": "Another `celery.beat.Scheduler` subclass to put the lease and claims "
                      "around (`django_celery_beat.schedulers:DatabaseScheduler`, "
                      "`celery.beat:PersistentScheduler`). See [Django](../django.md).",
    "atomic_enqueue": "Claim and enqueue in one step where the broker is leaderbeat's Redis; "
                      "`False` publishes each chunk after its claim.",
}


class _Probe:
    """A value of no setting's kind, with a repr that is easy to cut out of a message."""

    def __repr__(self) -> str:
        return "<probe>"


def rules(name: str) -> list[str]:
    """What ``Config.from_values`` answers for ``name`` given a wrong kind and a low value."""
    from celery_leaderbeat.config import Config
    from celery_leaderbeat.errors import ConfigurationError

    found: list[str] = []
    for value in (_Probe(), -10**9):
        try:
            Config.from_values({name: value})
        except ConfigurationError as exc:
            prefix = f"leaderbeat_{name}={value!r} "
            for problem in exc.problems:
                if problem.startswith(prefix):
                    rule = problem[len(prefix):].replace(f"not {value!r}", "").strip().rstrip(",")
                    if rule not in found:
                        found.append(rule)
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(name: str, value: Any) -> str:
    if value is None:
        return DERIVED.get(name, "unset")
    if isinstance(value, dict):
        return "`{}`"
    return f"`{value!r}`"


def settings_table() -> list[str]:
    """The table as Markdown lines, one row per setting of ``config.DEFAULTS``."""
    from celery_leaderbeat.config import DEFAULTS

    rows = [("| setting (Django: `CELERY_` + upper case) | default | rule (from the code) | "
            "what it is for |"), "|---|---|---|---|"]
    for name, value in DEFAULTS.items():
        rule = "; ".join(rules(name)) or "any value"
        rows.append(f"| `leaderbeat_{name}` | {_cell(_default(name, value))} | {_cell(rule)} | "
                    f"{_cell(MEANING.get(name, ''))} |")
    return rows


def drift() -> list[str]:
    """Names the code and this file disagree on, each as a sentence."""
    from celery_leaderbeat.config import DEFAULTS

    said = [f"leaderbeat_{n} is a setting in config.DEFAULTS without a description in "
            "docs/_ext/leaderbeat_settings.py" for n in DEFAULTS if n not in MEANING]
    said += [f"docs/_ext/leaderbeat_settings.py describes leaderbeat_{n}, which config.DEFAULTS "
             "no longer has" for n in MEANING if n not in DEFAULTS]
    said += [f"docs/_ext/leaderbeat_settings.py says how leaderbeat_{n} is derived, but its "
             "default in config.DEFAULTS is not None" for n in DERIVED if DEFAULTS.get(n, 0)
             is not None]
    return said


def setup(app: Any) -> dict[str, Any]:
    """Register the directive (Sphinx is imported here, so the functions above can be
    used, and tested, without it)."""
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util import logging
    from sphinx.util.docutils import SphinxDirective

    logger = logging.getLogger(__name__)

    class SettingsTable(SphinxDirective):
        has_content = False

        def run(self) -> list[nodes.Node]:
            for sentence in drift():
                logger.warning(sentence, location=self.get_location())
            container = nodes.container()
            self.state.nested_parse(StringList(settings_table(), source="config.py"),
                                    self.content_offset, container)
            return container.children

    app.add_directive("leaderbeat-settings", SettingsTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
