"""bench/results/reliability.md from the bench/results/reliability-<scenario>.json files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _reasons(row: dict[str, Any]) -> str:
    reasons = row.get("recorded_not_published") or {}
    return "; ".join(f"{n}× {why}" for why, n in reasons.items()) or "–"


def _burst(runs: list[dict[str, Any]]) -> list[str]:
    out = ["## Sentinel master SIGKILLed a third of the way into a 1,000-entry burst",
           "", "3 beats, `leaderbeat_min_replicas = 1`, 1,000 entries every 30 s.", "",
           ("Healed: the killed master restarted (empty) 3 s after the promotion and "
           "made a replica by Sentinel; not healed: the new master has no replica, so no "
           "later chunk meets `min_replicas`."), "",
           ("| run | healed | published before the kill | promoted after (s) | slots twice | "
           "unrecorded | recorded, not published | load |"), "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        out.append(f"| {r['run']} | {'yes' if r.get('heal') else 'no'} | "
                   f"{_f(r.get('published_at_kill'))} | {_f(r.get('promoted_s'))} "
                   f"| {_f(r.get('slots_twice'))} | {_f(r.get('unrecorded'))} | {_reasons(r)} "
                   f"| {r.get('load_start')} |")
    return out


def _failover(runs: list[dict[str, Any]]) -> list[str]:
    out = ["## Leader SIGKILLed during a Sentinel failover", "",
           ("3 beats, 10 entries every 1 s; the master SIGKILLed, the leader ~0.7 s later; "
           "times from the master's kill; healed: the killed master restarted at the promotion."),
           "", ("| run | min_replicas | healed | promoted (s) | new leader (s) | first send (s) "
           "| worst lateness (s) | rescued | slots twice | unrecorded | recorded, not published "
           "| load |"), "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        out.append(f"| {r['run']} | {r.get('min_replicas')} | {'yes' if r.get('heal') else 'no'} "
                   f"| {_f(r.get('promoted_s'))} | {_f(r.get('new_leader_s'))} | "
                   f"{_f(r.get('first_send_s'))} | {_f(r.get('late_max_s'))} | "
                   f"{(r.get('after_kill') or {}).get('rescue', 0)} | "
                   f"{_f(r.get('slots_twice'))} | {_f(r.get('unrecorded'))} | {_reasons(r)} | "
                   f"{r.get('load_start')} |")
    return out


def _restart(runs: list[dict[str, Any]]) -> list[str]:
    out = ["## Redis (no persistence) restarted empty under 3 beats", "",
           "10 entries every 1 s; Redis SIGKILLed, restarted empty on the same port 3 s later.",
           ("Unrecorded: slots due from the kill to 4 s after Redis answered, neither "
           "published nor in the history (series b; series a ran before that audit)."), "",
           ("| series | restart | first send after Redis answers (s) | sent by | "
           "same leader after | unrecorded (of them after Redis answered) | recorded, not "
           "published | load |"), "|---|---|---|---|---|---|---|---|"]
    totals = []
    for r in runs:
        if r.get("run") == "all":
            totals.append(f"Series {r.get('series', 'b')}, whole run: {r.get('published')} "
                          f"messages, {r.get('slots_twice')} slots twice.")
        else:
            gap = r.get("outage_and_after") or {}
            unrec = (f"{gap.get('unrecorded')} ({r.get('unrecorded_after_up')})" if gap
                     else "–")
            out.append(f"| {r.get('series', 'b')} | {r['run']} | {_f(r.get('first_send_s'))} | "
                       f"{r.get('first_sender')} | {r.get('same_leader_after')} | {unrec} | "
                       f"{_reasons(gap) if gap else '–'} | {r.get('load')} |")
    return out + [""] + totals


def _django(runs: list[dict[str, Any]]) -> list[str]:
    out = ["## django-celery-beat: an interval row changed 5 s -> 10 s through the ORM", "",
           ("3 beats, PostgreSQL; steps between consecutive slots sent after the save "
           "(L leader, R rescue)."), "",
           ("| run | slots after the change (s from the save, source) | steps (s) | "
           "last non-10 s step ends (s after save) | slots twice | load |"),
           "|---|---|---|---|---|---|"]
    for r in runs:
        slots = ", ".join(f"{a['slot_from_change_s']:.1f}{a['source'][0].upper()}"
                          for a in r.get("after", []))
        out.append(f"| {r['run']} | {slots} | {', '.join(_f(s, 1) for s in r.get('steps_after_s', []))} "
                   f"| {_f(r.get('last_non_10s_step_ends_s'), 1)} | {r.get('slots_twice')} | "
                   f"{r.get('load_start')} |")
    return out


def write(results: Path) -> Path:
    parts = ["# Reliability: faults mid-protocol, real processes", "",
             ("Written by `python bench/reliability.py summary` from "
             "`bench/results/reliability-*.json`; how each is measured, and what the runs "
             "found: docs/benchmarks.md (Reliability)."), ""]
    for name, render in (("burst", _burst), ("failover", _failover), ("restart", _restart),
                         ("django", _django)):
        path = results / f"reliability-{name}.json"
        if path.exists():
            data = json.loads(path.read_text())
            parts += render(data["runs"]) + ["", f"Updated {data.get('updated')}.", ""]
    out = results / "reliability.md"
    out.write_text("\n".join(parts))
    return out
