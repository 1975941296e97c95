"""Reading ``beat_schedule``: per-entry leaderbeat options and schedule strings.

An entry may carry its own catch-up policy, jitter and time zone under the
key ``leaderbeat`` (in the entry itself, or in its ``options``)::

    "report": {
        "task": "proj.tasks.report",
        "schedule": "30 2 * * *",           # a cron string becomes celery_leaderbeat.cron
        "leaderbeat": {"catchup": "all", "max_catchup": 10, "jitter": 30,
                       "tz": "Europe/Berlin", "catchup_window": 3600, "overlap": "skip"},
    }

``overlap`` (kept by the worker guard): ``skip``, ``buffer_one``, ``buffer_all``,
``cancel_other`` or ``allow_all`` (Kubernetes' ``Forbid``, ``Replace`` and ``Allow``,
and ``allow``, are other names of ``skip``, ``cancel_other`` and ``allow_all``).

These options are removed before the entry is built, so they never reach
``apply_async`` or the broker message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .config import OVERLAP_RULE, Config, overlap_policy
from .errors import ConfigurationError
from .timing.policy import CatchupPolicy, catchup_problems

ENTRY_OPTIONS = ("catchup", "catchup_window", "max_catchup", "jitter", "tz", "overlap")


@dataclass(frozen=True)
class EntryOptions:
    """The leaderbeat options of one entry, defaults filled from the settings."""

    policy: CatchupPolicy
    jitter: float | None
    tz: tzinfo | None
    #: what the worker guard does with a slot due while the previous run still runs
    overlap: str = "allow_all"

    @classmethod
    def defaults(cls, config: Config) -> EntryOptions:
        """The options of an entry that sets none of its own."""
        return cls(policy=_policy(config, {}), jitter=None, tz=None, overlap=config.overlap)


def split_entries(
    schedule: Mapping[str, Any], config: Config, kind: str = "beat_schedule entry",
) -> tuple[dict[str, dict[str, Any]], dict[str, EntryOptions]]:
    """Split each entry into what Celery builds an entry from, and our options.

    Every problem in every entry is collected and raised together, each naming the
    entry as ``kind`` (a runtime entry is checked here too).
    """
    problems: list[str] = []
    celery_entries: dict[str, dict[str, Any]] = {}
    options: dict[str, EntryOptions] = {}
    for name, raw in (schedule or {}).items():
        if not isinstance(raw, Mapping):
            problems.append(f"{kind} {name!r}={raw!r} must be a dict")
            continue
        entry, parsed = _split_one(name, raw, config, kind, problems)
        if parsed is not None:
            options[name] = parsed
        celery_entries[name] = entry
    if problems:
        raise ConfigurationError(problems)
    config.say_notes()
    return celery_entries, options


def _split_one(name: str, raw: Mapping[str, Any], config: Config, kind: str,
               problems: list[str]) -> tuple[dict[str, Any], EntryOptions | None]:
    """One entry: what Celery builds it from (its schedule parsed), and our options
    (None: they had a problem); each problem appended to ``problems``."""
    from .timing.schedules import parse_entry_schedule  # late: schedules imports celery

    entry = dict(raw)
    ours = dict(entry.pop("leaderbeat", None) or {})
    celery_options = entry.get("options")
    if isinstance(celery_options, Mapping) and "leaderbeat" in celery_options:
        entry["options"] = celery_options = dict(celery_options)
        ours.update(celery_options.pop("leaderbeat") or {})
    headers = celery_options.get("headers") if isinstance(celery_options, Mapping) else None
    parsed = _entry_options(name, ours, config, problems, kind, headers)
    if "task" not in entry:
        problems.append(f"{kind} {name!r} has no 'task'")
    if "schedule" not in entry:
        problems.append(f"{kind} {name!r} has no 'schedule'")
    else:
        try:
            entry["schedule"] = parse_entry_schedule(
                name, entry["schedule"], parsed.tz if parsed else None)
        except ConfigurationError as exc:
            problems.extend(exc.problems)
    if parsed is None:
        return entry, None
    return entry, _cron_deadline(parsed, entry.get("schedule"), ours, config)


def _cron_deadline(parsed: EntryOptions, schedule: Any, ours: Mapping[str, Any],
                   config: Config) -> EntryOptions:
    """Celery's ``beat_cron_starting_deadline``: a crontab slot older than it does not run.

    Applied as the catch-up window of crontab and cron string entries that have none of
    their own and when ``leaderbeat_catchup_window`` is not set (it wins, said at start-up).
    """
    from celery.schedules import crontab

    from .timing.schedules import cron

    deadline = config.cron_starting_deadline
    if (deadline is None or "catchup_window" in ours or config.catchup_window is not None
            or not isinstance(schedule, (crontab, cron))):
        return parsed
    policy = dataclasses.replace(parsed.policy, window=timedelta(seconds=deadline))
    return dataclasses.replace(parsed, policy=policy)




def _policy(config: Config, ours: Mapping[str, Any]) -> CatchupPolicy:
    window = ours.get("catchup_window", config.catchup_window)
    if isinstance(window, timedelta):
        window = window.total_seconds()
    return CatchupPolicy(
        mode=ours.get("catchup", config.catchup),
        window=None if window is None else timedelta(seconds=window),
        max_catchup=ours.get("max_catchup", config.max_catchup),
    )


def _header_problems(name: str, headers: Any, kind: str) -> list[str]:
    """A ``leaderbeat_overlap`` header of the entry's own (it wins over the option) checked."""
    if not isinstance(headers, Mapping) or "leaderbeat_overlap" not in headers:
        return []
    value = headers["leaderbeat_overlap"]
    if overlap_policy(value) is not None:
        return []
    rule = f"options['headers']['leaderbeat_overlap']={value!r} {OVERLAP_RULE}"
    return [f"{kind} {name!r}: {rule}"]


def _entry_options(name: str, ours: dict[str, Any], config: Config,
                   problems: list[str], kind: str,
                   raw_headers: Any = None) -> EntryOptions | None:
    before = len(problems)
    where = f"{kind} {name!r}: leaderbeat option"
    for key in sorted(set(ours) - set(ENTRY_OPTIONS)):
        problems.append(f"{where} {key!r} is unknown (known: {', '.join(ENTRY_OPTIONS)})")
    problems += catchup_problems(ours.get("catchup", config.catchup),
                                 ours.get("catchup_window", config.catchup_window),
                                 ours.get("max_catchup", config.max_catchup),
                                 named=lambda key: f"{where} {key}")
    jitter = ours.get("jitter")
    if isinstance(jitter, timedelta):
        jitter = ours["jitter"] = jitter.total_seconds()
    if jitter is not None and (isinstance(jitter, bool) or not isinstance(jitter, (int, float))
                               or jitter < 0):
        problems.append(f"{where} jitter={jitter!r} must be a number of seconds >= 0")
    overlap = overlap_policy(ours.get("overlap", config.overlap))
    if overlap is None:
        problems.append(f"{where} overlap={ours['overlap']!r} {OVERLAP_RULE}")
    problems += _header_problems(name, raw_headers, kind)
    tz = None
    if ours.get("tz") is not None:
        tz = ours["tz"]
        if isinstance(tz, str):
            try:
                tz = ZoneInfo(tz)
            except (ZoneInfoNotFoundError, ValueError):
                problems.append(f"{where} tz={ours['tz']!r} is not an IANA time zone name")
                tz = None
        elif not isinstance(tz, tzinfo):
            problems.append(f"{where} tz={tz!r} must be an IANA time zone name")
            tz = None
    if len(problems) > before:
        return None
    return EntryOptions(policy=_policy(config, ours), jitter=ours.get("jitter") or None, tz=tz,
                        overlap=overlap or config.overlap)
