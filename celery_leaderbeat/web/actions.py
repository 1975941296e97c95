"""The CLI's actions, from a page: pause, resume, trigger, backfill, step down.

Each acts through :class:`~celery_leaderbeat.ops.cluster.Cluster`, as the CLI does, on
an existing entry named by the page (never a task, never arguments), and answers what
the CLI's ``--json`` prints. Before it acts, each writes an ``audit`` event into the
history: who asked, for what, through which view, and their note (the time is the
event's). Written first, so a request is on record even when the action's reply is
lost. What was done is recorded by the events that follow, the same as for the CLI
(``paused``, ``resumed``, ``released``; ``triggered`` and backfilled ``sent`` by the
leader): an audit event with none after it is a request that failed or never reached
the store.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..errors import BackfillRefused, LeaderbeatError
from ..ops.cluster import Cluster
from ..timing.iso import from_iso

#: the actions a page may ask for
ACTIONS = ("pause", "resume", "trigger", "backfill", "step-down")
#: a note longer than this is refused (it goes into the history and the pause record)
NOTE_MAX = 500
#: a backfill from a page sends at most this many slots (the CLI's --max default)
BACKFILL_MAX = 100
#: seconds step-down waits for the next leader (the CLI's --wait default)
STEP_DOWN_WAIT = 5.0


class ActionRefused(LeaderbeatError):
    """A page asked for something it may not: its message says which field and why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Operator:
    """Who acts, as the audit event names them: a user name and the view they used."""

    name: str
    via: str  # "web" or "django-admin"

    def node(self) -> str:
        return f"{self.via}:{self.name}@{socket.gethostname()}"


def run(cluster: Cluster, operator: Operator, action: str, form: Mapping[str, str]
        ) -> dict[str, Any]:
    """Carry out ``action`` with the fields of ``form``; the CLI's ``--json`` answer.

    Raises :class:`ActionRefused` for an unknown action or a bad field, and
    :class:`~celery_leaderbeat.errors.EntryNotFound` for a name that is no entry."""
    if action not in ACTIONS:
        raise ActionRefused(f"action {action!r} is not one of {', '.join(ACTIONS)}", 404)
    note = form.get("note", "").strip()
    if len(note) > NOTE_MAX:
        raise ActionRefused(f"note is {len(note)} characters: at most {NOTE_MAX}")
    if action == "step-down":
        return _step_down(cluster, operator, note)
    name = form.get("name", "")
    if not name:
        raise ActionRefused(f"{action} needs the field 'name': an entry's name")
    cluster.check_entry(name)
    if action == "backfill":
        return _backfill(cluster, operator, name, form, note)
    _audit(cluster, operator, action, name, note)
    if action == "pause":
        cluster.pause(name, note)
        return {"paused": name, "note": note}
    if action == "resume":
        return {"resumed": name, "was_paused": cluster.resume(name)}
    request = cluster.trigger(name, note)
    leader = cluster.leader()
    return {"triggered": name, "request": request.id, "leader": leader and leader["node"]}


def _step_down(cluster: Cluster, operator: Operator, note: str) -> dict[str, Any]:
    leader = cluster.leader()
    if leader is None:
        raise ActionRefused("no beat holds the lease: nothing to step down", 409)
    _audit(cluster, operator, "step-down", "", f"{leader['node']} (epoch {leader['epoch']})"
           + (f": {note}" if note else ""))
    old = cluster.step_down()
    if old is None:
        raise ActionRefused("the lease changed hands before it could be released: "
                            "look at the cluster page again", 409)
    new, took = cluster.wait_for_leader(old["token"], STEP_DOWN_WAIT)
    return {"released": old["node"], "epoch": old["epoch"],
            "new_leader": new and new["node"], "new_epoch": new and new["epoch"],
            "handover_ms": round(took * 1000, 1) if new else None}


def _backfill(cluster: Cluster, operator: Operator, name: str, form: Mapping[str, str],
              note: str) -> dict[str, Any]:
    start, end = _moment(form, "from"), _moment(form, "to")
    if start > end:
        raise ActionRefused(f"from {start.isoformat()} is after to {end.isoformat()}: "
                            "from must not be later")
    try:
        never, sent, horizon = cluster.backfill_slots(name, start, end)
    except BackfillRefused as exc:
        raise ActionRefused(str(exc), 409) from None
    if horizon is None or horizon > start:
        raise ActionRefused(f"the history only reaches back to "
                            f"{horizon.isoformat() if horizon else 'nothing'}: what was sent "
                            "before cannot be told; choose a 'from' after it", 409)
    if len(never) > BACKFILL_MAX:
        raise ActionRefused(f"{len(never)} slots of {name!r} were never sent, more than "
                            f"{BACKFILL_MAX}: narrow the range (or use the CLI's --max)", 409)
    if not never:
        return {"entry": name, "to_send": [], "already_sent": len(sent)}
    _audit(cluster, operator, "backfill", name,
           f"{len(never)} slot(s) {start.isoformat()} .. {end.isoformat()}"
           + (f": {note}" if note else ""))
    request = cluster.backfill(name, never, note)
    leader = cluster.leader()
    return {"entry": name, "request": request.id, "leader": leader and leader["node"],
            "to_send": [s.isoformat() for s in never], "already_sent": len(sent)}


def _moment(form: Mapping[str, str], field: str) -> datetime:
    """An ISO 8601 field as an aware datetime (UTC when it names no offset)."""
    raw = form.get(field, "").strip()
    try:
        moment = from_iso(raw)
    except ValueError:
        raise ActionRefused(f"{field} {raw!r} is not an ISO 8601 date-time "
                            "(e.g. 2026-01-31T09:00:00Z)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _audit(cluster: Cluster, operator: Operator, action: str, name: str, note: str) -> None:
    """Who asked for what, and why, into the history (the event's id is its time)."""
    cluster.store.admin.note({"event": "audit", "entry": name, "node": operator.node(),
                              "detail": f"{action} by {operator.name} via {operator.via}"
                                        + (f": {note}" if note else "")})


__all__ = ["ACTIONS", "ActionRefused", "Operator", "run"]
