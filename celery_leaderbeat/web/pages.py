"""The pages, as HTML strings: every value through :func:`esc`, no template engine.

Each page is a live part (``<div id="live">``: what the poll replaces every second or
two) and the rest (headings, the action forms, which a poll must not wipe while
someone types a note). The standalone app wraps them in :func:`document`; the Django
admin puts them inside its own page. URLs come from a :class:`Links`, so both serve
the same markup under their own paths.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from ..timing.iso import from_iso
from .model import STATE_FILTERS, Page

#: what a page says after an action it redirected from (``?done=<action>``)
DONE = {"pause": "Paused: its slots are skipped until it is resumed.",
        "resume": "Resumed: it is sent again from its next slot.",
        "trigger": "Trigger queued: the leader sends it once, within about a second.",
        "backfill": "Backfill queued: the leader sends the slots never sent, oldest first.",
        "step-down": "The leader released its lease; the page shows who leads now."}


def esc(value: Any) -> str:
    """Any value as HTML text; none (None or empty) as '-'."""
    return "-" if value is None or value == "" else html.escape(str(value), quote=True)


def attr(value: Any) -> str:
    """Any value as an HTML attribute's value (quotes escaped; None as empty)."""
    return "" if value is None else html.escape(str(value), quote=True)


class Links(Protocol):
    """Where each page and action lives, for one way of serving them."""

    def cluster(self) -> str: ...
    def entries(self, **params: Any) -> str: ...
    def entry(self, name: str) -> str: ...
    def history(self) -> str: ...
    def action(self, action: str) -> str: ...


@dataclass(frozen=True)
class Viewer:
    """What the person looking may do: act (and the CSRF field that proves the form is
    this site's), and what they are called."""

    #: may this viewer take ``action``? (or one bool for every action)
    can_act: Callable[[str], bool] | bool
    csrf_field: str = "csrf"
    csrf_token: str = ""
    name: str = ""

    def may(self, action: str) -> bool:
        return bool(self.can_act(action) if callable(self.can_act) else self.can_act)


def when(iso: str | None) -> str:
    """An ISO time as ``<time>``, to the second, with how long ago or ahead."""
    if not iso:
        return "-"
    moment = from_iso(iso)
    delta = (moment - datetime.now(timezone.utc)).total_seconds()
    ago = f"in {_span(delta)}" if delta > 0 else f"{_span(-delta)} ago"
    return (f'<time datetime="{attr(iso)}" title="{attr(ago)}">'
            f'{esc(moment.replace(microsecond=0).isoformat())}</time>')


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """Rows of cells already HTML (escape before)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (f'<table class="{attr(cls)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


# -- the cluster page ------------------------------------------------------------------

def cluster_live(overview: dict[str, Any]) -> str:
    leader, store = overview["leader"], overview["store"]
    if leader:
        lead = (f'<p class="lead ok">Leader <strong id="leader-node">{esc(leader["node"])}'
                f'</strong>, epoch <strong id="leader-epoch">{esc(leader["epoch"])}</strong>, '
                f'lease <span id="lease-left">{leader["lease_ms_left"] / 1000:.1f}</span> s left'
                f'; leading since {when(leader.get("since"))}</p>')
    else:
        lead = ('<p class="lead bad"><strong id="leader-node">No leader</strong>: no beat '
                "holds the lease; nothing is sent until one does.</p>")
    nodes = table(["node", "role", "version", "host", "pid", "last heartbeat", "clock skew"], (
        [esc(n.get("node")), _role(n), esc(n.get("version")), esc(n.get("host")),
         esc(n.get("pid")), "-" if n.get("seen_ago") is None else f"{esc(n['seen_ago'])} s ago",
         "-" if n.get("clock_skew") is None else f"{n['clock_skew']:+.3f} s"]
        for n in overview["nodes"]), "nodes")
    health = ("ok" if store["ok"] else "bad")
    warnings = "".join(f"<li>{esc(w)}</li>" for w in store["warnings"])
    store_html = (f'<p class="store {health}">Store {esc(store["redis"])}, prefix '
                  f'<code>{esc(store["prefix"])}</code>: '
                  + (f'answers in {esc(store["ping_ms"])} ms' if store["ok"]
                     else f'unreachable ({esc(store["error"])})') + "</p>"
                  + (f"<ul class=warnings>{warnings}</ul>" if warnings else ""))
    return f"{lead}<h2>Nodes</h2>{nodes}<h2>Store</h2>{store_html}"


def _role(node: dict[str, Any]) -> str:
    role = node.get("role") or "?"
    cls = "gone" if node.get("gone") else ("leader" if role == "leader" else "standby")
    return f'<span class="role {cls}">{esc(role)}</span>'


def step_down_form(links: Links, viewer: Viewer) -> str:
    if not viewer.may("step-down"):
        return ""
    return (f'<h2>Step down</h2><form method="post" action="{attr(links.action("step-down"))}"'
            ' class="action" id="step-down-form">' + _csrf(viewer)
            + '<label>Note <input name="note" maxlength="500"></label> '
            '<button type="submit" id="step-down">Step down the leader</button>'
            "<p class=hint>The leader releases its lease (fenced: it sends nothing more); a "
            "standby leads at once.</p></form>")


# -- the entries page ------------------------------------------------------------------

def entries_live(page: Page, links: Links, query: str, state: str) -> str:
    rows = []
    for row in page.entries:
        paused = row["paused"]
        rows.append([
            f'<a href="{attr(links.entry(row["entry"]))}">{esc(row["entry"])}</a>'
            + ("" if row["configured"] else " <small>(not configured)</small>"),
            esc(row["source"]), esc(page.schedules.get(row["entry"])), when(row["next_due"]),
            when(row["last_slot"]),
            f'<span class="state {attr(row["state"])}">{esc(row["state"])}</span>',
            esc(row["rescued_by"]), esc(row["run"]),
            (f'<span class="paused">paused</span> {esc(paused.get("note"))}' if paused
             else "")])
    first = page.offset + 1 if page.entries else 0
    summary = (f'<p class="summary" id="entries-summary">Entries {first}–'
               f'{page.offset + len(page.entries)} of {page.total}</p>')
    grid = table(["entry", "source", "schedule", "next slot", "last slot", "outcome", "rescued by",
                  "run", "paused"], rows, "entries")
    return summary + grid + _pager(page, links, query, state)


def _pager(page: Page, links: Links, query: str, state: str) -> str:
    def link(offset: int, text: str, rel: str) -> str:
        return (f'<a rel="{rel}" href="'
                f'{attr(links.entries(offset=offset, limit=page.limit, q=query, state=state))}">'
                f"{text}</a>")
    parts = []
    if page.offset > 0:
        parts.append(link(max(0, page.offset - page.limit), "← previous", "prev"))
    if page.offset + page.limit < page.total:
        parts.append(link(page.offset + page.limit, "next →", "next"))
    return f'<nav class="pager">{" ".join(parts)}</nav>'


def entries_filter(links: Links, query: str, state: str, limit: int) -> str:
    options = "".join(f'<option value="{attr(s)}"{" selected" if s == state else ""}>'
                      f"{esc(s) if s else 'any'}</option>" for s in ("", *STATE_FILTERS))
    return (f'<form method="get" action="{attr(links.entries())}" class="filter">'
            f'<label>Name contains <input name="q" value="{attr(query)}">'
            f'</label> <label>Outcome <select name="state">{options}</select></label> '
            f'<input type="hidden" name="limit" value="{limit}">'
            '<button type="submit">Filter</button></form>')


# -- one entry -------------------------------------------------------------------------

def entry_live(detail: dict[str, Any]) -> str:
    row = detail["entry"]
    paused = row["paused"]
    facts = [("source", esc(row["source"])), ("schedule", esc(detail["schedule"])),
             ("next slot", when(row["next_due"])),
             ("last slot", when(row["last_slot"])), ("its outcome", esc(row["state"])),
             ("rescued by", esc(row["rescued_by"])), ("epoch", esc(row["epoch"])),
             ("task id", esc(row["task_id"])), ("run", esc(row["run"])),
             ("paused", (f'<span class="paused" id="paused">yes</span>: '
                         f'{esc(paused.get("note"))} (at {esc(paused.get("at"))}, from '
                         f'{esc(paused.get("by"))})') if paused else '<span id="paused">no</span>')]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts)
    slots = table(["slot", "outcome", "why / detail", "sent by", "epoch", "recorded"], (
        [when(s["slot"]), f'<span class="state {attr(s["outcome"])}">{esc(s["outcome"])}</span>',
         esc(s["detail"]), esc(s["node"]), esc(s["epoch"]), when(s["time"])]
        for s in detail["slots"]), "slots")
    events = history_table(reversed(detail["history"]), show_entry=False)
    return (f'<dl class="facts">{dl}</dl><h2>Slots</h2>{slots}'
            f"<h2>Every event, newest first</h2>{events}")


def history_table(rows: Iterable[Mapping[str, Any]], show_entry: bool = True) -> str:
    headers = ["recorded", "event", *(["entry"] if show_entry else []), "slot", "node",
               "epoch", "detail"]
    return table(headers, ([when(r.get("time")), esc(r.get("event")),
                            *([esc(r.get("entry"))] if show_entry else []),
                            when(r.get("slot")), esc(r.get("node")), esc(r.get("epoch")),
                            esc(r.get("detail"))] for r in rows), "history")


def entry_forms(name: str, links: Links, viewer: Viewer) -> str:
    """The actions on one entry this viewer may take; none in read-only mode."""
    hidden = _csrf(viewer) + f'<input type="hidden" name="name" value="{attr(name)}">'
    forms = {
        "pause": '<label>Note <input name="note" maxlength="500"></label> '
                 '<button type="submit" id="pause">Pause</button>',
        "resume": '<button type="submit" id="resume">Resume</button>',
        "trigger": '<label>Note <input name="note" maxlength="500"></label> '
                   '<button type="submit" id="trigger">Trigger now</button>',
        "backfill": '<label>From <input name="from" placeholder="2026-01-31T09:00:00Z" '
                    'required></label> <label>To <input name="to" required></label> '
                    '<label>Note <input name="note" maxlength="500"></label> '
                    '<button type="submit" id="backfill">Backfill</button>',
    }
    shown = [f'<form method="post" action="{attr(links.action(action))}" class="action" '
             f'id="{action}-form">{hidden}{fields}</form>'
             for action, fields in forms.items() if viewer.may(action)]
    return ("<h2>Act</h2>" + "".join(shown)) if shown else ""


def _csrf(viewer: Viewer) -> str:
    return (f'<input type="hidden" name="{attr(viewer.csrf_field)}" '
            f'value="{attr(viewer.csrf_token)}">')


def message(done: str) -> str:
    text = DONE.get(done)
    return f'<p class="done" id="done">{esc(text)}</p>' if text else ""


# -- the standalone document -------------------------------------------------------------

def document(title: str, body: str, *, base: str, live_url: str, every_ms: int,
             viewer: Viewer) -> str:
    """A whole page of the standalone view; the script polls ``live_url``."""
    mode = ("actions enabled" + (f", signed in as {esc(viewer.name)}" if viewer.name else "")
            if viewer.may("pause") else "read-only")
    nav = "".join(f'<a href="{attr(base)}{path}">{label}</a>' for path, label in
                  (("/", "Cluster"), ("/entries", "Entries"), ("/history", "History")))
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)} · leaderbeat</title>"
            f'<link rel="stylesheet" href="{attr(base)}/static/web.css"></head>'
            f'<body><header><nav>{nav}</nav><span class="mode">{mode}</span></header>'
            f'<main data-live="{attr(live_url)}" data-every="{every_ms}">'
            f"<h1>{esc(title)}</h1>{body}</main>"
            f'<script src="{attr(base)}/static/web.js" defer></script></body></html>')


def live(content: str) -> str:
    """The part of a page the poll replaces."""
    return f'<div id="live" aria-live="polite">{content}</div>'


def quoted(name: str) -> str:
    """An entry's name as one path segment."""
    return quote(name, safe="")


def query_string(**params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return ("?" + urlencode(kept)) if kept else ""
