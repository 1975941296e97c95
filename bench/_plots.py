"""docs/img/*.png and the markdown tables of docs/benchmarks.md, from bench/results/*.jsonl."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
KINDS = ("leaderbeat", "stock", "redbeat")
LABEL = {"leaderbeat": "celery_leaderbeat", "stock": "stock PersistentScheduler",
         "redbeat": "RedBeat 2.4.2"}


def rows(results: Path, name: str) -> list[dict[str, Any]]:
    path = results / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spread(values: Sequence[float | None]) -> str:
    """'median (min–max, n)' of repeated measurements (None: not measured in that run)."""
    vals = [v for v in values if v is not None]
    if vals and all(isinstance(v, int) for v in vals):
        return "/".join(str(v) for v in vals)
    if not vals:
        return "–"
    med = statistics.median(vals)
    if len(vals) == 1:
        return f"{med:.3g}"
    return f"{med:.3g} ({min(vals):.3g}–{max(vals):.3g}, n={len(vals)})"


def tick_plot(results: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(results, "tick")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, scenario, title in ((axes[0], "busy", "100 entries due per tick, the rest a day away"),
                                (axes[1], "all", "every entry due at once")):
        for kind in KINDS:
            by_n: dict[int, list[float]] = defaultdict(list)
            for r in data:
                if r["scenario"] == scenario and r["kind"] == kind and r.get("cpu_per_1000"):
                    by_n[r["entries"]].append(r["cpu_per_1000"])
            if not by_n:
                continue
            ns = sorted(by_n)
            med = [statistics.median(by_n[n]) for n in ns]
            lo = [m - min(by_n[n]) for n, m in zip(ns, med)]
            hi = [max(by_n[n]) - m for n, m in zip(ns, med)]
            ax.errorbar(ns, med, yerr=[lo, hi], marker="o", capsize=3, label=LABEL[kind])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("entries in the schedule")
        ax.set_ylabel("beat CPU s per 1,000 sends")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Tick cost (median, bars: min–max of the runs; capped runs: what was sent)",
                 fontsize=10)
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG / "tick-cost.png", dpi=110)


def failover_plot(results: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(results, "failover")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, mode, title in ((axes[0], "kill", "SIGKILL of the leader"),
                            (axes[1], "term", "SIGTERM of the leader")):
        labels, series = [], []
        for kind in ("leaderbeat", "redbeat"):
            sel = [r for r in data if r["kind"] == kind and r["mode"] == mode]
            if not sel:
                continue
            key = "late_max_s" if kind == "leaderbeat" else "gap_late_max_s"
            series.append([r.get(key) or 0.0 for r in sel])
            labels.append(f"{LABEL[kind]}\n({'slot header' if kind == 'leaderbeat' else 'gap'})")
        if not series:
            continue
        ax.boxplot(series, tick_labels=labels, showfliers=True)
        for i, vals in enumerate(series, 1):
            ax.scatter([i] * len(vals), vals, s=12, alpha=0.6)
        ax.set_ylabel("worst slot lateness per failover, s")
        ax.set_title(title + " (stock beat: no HA, nobody takes over)", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG / "failover-lateness.png", dpi=110)


def main(results: Path) -> None:
    tick_plot(results)
    failover_plot(results)
    print(tables(results))
    print(more_tables(results))
    print(f"wrote {IMG / 'tick-cost.png'} and {IMG / 'failover-lateness.png'}")


HEAD = {"cpu_per_1000": "CPU s per 1,000 sends", "cpu_per_tick": "CPU s per tick",
        "sent_ratio": "sent / expected", "startup_s": "startup s", "rss_mib": "VmRSS MiB",
        "duration_s": "batch s", "late_max_s": "worst lateness s (slot header)"}


def _f(v: Any, fmt: str = ".3g") -> str:
    return "–" if v is None else format(v, fmt)


def tables(results: Path) -> str:
    """The headline tables, as markdown (pasted into docs/benchmarks.md)."""
    out = []
    tick = rows(results, "tick")
    for scenario, title, cols in (
            ("busy", "100 due per tick (every 1 s), the rest a day away",
             ("cpu_per_1000", "cpu_per_tick", "sent_ratio", "startup_s", "rss_mib")),
            ("idle", "nothing due, loop capped at 1 s", ("cpu_per_tick",)),
            ("all", "every entry due at once", ("cpu_per_1000", "duration_s", "sent", "late_max_s"))):
        out.append(f"\n**{title}**\n")
        out.append("| entries | scheduler | " + " | ".join(HEAD.get(c, c) for c in cols) + " | load |")
        out.append("|---|---|" + "---|" * (len(cols) + 1))
        groups: dict[tuple[int, str], list[dict]] = defaultdict(list)
        for r in tick:
            if r["scenario"] == scenario:
                groups[(r["entries"], r["kind"])].append(r)
        for (n, kind), sel in sorted(groups.items(), key=lambda x: (x[0][0], KINDS.index(x[0][1]))):
            cells = []
            for c in cols:
                if c == "sent_ratio":
                    cells.append(spread([r["sent"] / r["expected"] for r in sel if r.get("expected")]))
                else:
                    cells.append(spread([r.get(c) for r in sel]))
            notes = "; ".join(sorted({r["note"] for r in sel if r.get("note")}))
            loads = ", ".join(sorted({(r.get("load1") or r.get("load0", "")).split()[1] for r in sel}))
            out.append(f"| {n:,} | {kind} | " + " | ".join(cells) + f" | {loads} {notes}|")
    return "\n".join(out)


def more_tables(results: Path) -> str:
    """The other tables of docs/benchmarks.md, as markdown: one for each results file found."""
    out: list[str] = []
    for table in (_target_table, _redis_table, _failover_table, _pause_table, _memory_table,
                  _restart_table):
        out += table(results)
    return "\n".join(out)


def _target_table(results: Path) -> list[str]:
    target = [r for r in rows(results, "target") if r["scenario"] == "target"]
    if not target:
        return []
    out = ["\n**One leader, 2,000 entries every 5 s (steady state)**\n",
           "| scheduler | sent / expected | CPU s per 1,000 sends | worst lateness s | load |",
           "|---|---|---|---|---|"]
    for r in target:
        out.append(f"| {r['kind']} | {r['sent']} / {r['expected']} | {r['cpu_per_1000']:.3f} "
                   f"| {_f(r.get('late_max_s'))} | {r['load'].split()[1]} |")
    return out


def _redis_table(results: Path) -> list[str]:
    redis = rows(results, "redis")
    if not redis:
        return []
    out = ["\n**Redis commands at the state server, 2,000 entries every 5 s, 30 s per phase**\n",
           ("| scheduler | phase | sends | all commands per 1,000 sends (commandstats) "
            "| leader round trips per 1,000 sends | leader commands run inside Lua per 1,000 sends "
            "| each standby: round trips per 30 s (of which per due batch) | load |"),
           "|---|---|---|---|---|---|---|---|"]
    for r in redis:
        k = 1000 / max(r["sent"], 1)
        lead = r["monitor"].get("leader", {})
        lua = sum(v for c, v in lead.items() if c.startswith("lua:"))
        top = ", ".join(f"{c} {v * k:.0f}" for c, v in sorted(lead.items(), key=lambda kv: -kv[1])[:5])
        out.append(f"| {r['kind']} | {r['phase']} | {r['sent']} | {r['per_1000_sends']:.0f} | "
                   f"{_round_trips(lead) * k:.1f} | {lua * k:.0f} | {_standby_cell(r)} | "
                   f"{r['load'].split()[1]} |")
        out.append(f"|  | leader's top commands per 1,000 sends | {top} ||||||")
    return out


def _round_trips(lead: dict[str, int]) -> int:
    """The leader's round trips to Redis, from its commands (those inside Lua are not)."""
    if "exec" in lead:  # RedBeat: MULTI ... EXEC pipelines, one round trip each
        tx = {"multi", "exec", "hget", "hset", "zadd", "zrangebyscore"}
        return lead["exec"] + sum(v for c, v in lead.items()
                                  if c not in tx and not c.startswith("lua:"))
    return sum(v for c, v in lead.items() if not c.startswith("lua:"))


def _standby_cell(r: dict[str, Any]) -> str:
    """Each standby's round trips per 30 s (two standbys), with leaderbeat's HMGETs per batch."""
    sb = r["monitor"].get("standby", {})
    sb_rt = sum(v for c, v in sb.items() if not c.startswith("lua:")) / 2
    per_batch = (sb.get("hmget", 0) / 2 / max(r["batches"], 1)) if r["kind"] == "leaderbeat" else None
    if not sb:
        return "–"
    if per_batch is None:
        return f"{sb_rt:.0f}"
    return f"{sb_rt:.0f} ({_f(per_batch, '.1f')} HMGET per batch)"


def _failover_table(results: Path) -> list[str]:
    fail = rows(results, "failover")
    if not fail:
        return []
    out = ["\n**Failover (3 beats, 10 entries every 1 s)**\n",
           ("| scheduler | signal | first send by another beat, s | new leader, s "
            "| worst lateness (slot header), s | worst lateness (gap), s | duplicates | load |"),
           "|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in fail:
        groups[(r["kind"], r["mode"])].append(r)
    for (kind, mode), sel in sorted(groups.items()):
        loads = sorted(float(r["load"].split()[1]) for r in sel)
        out.append(f"| {kind} | SIG{mode.upper()} | {spread([r['first_send_s'] for r in sel])} | "
                   f"{spread([r['elected_s'] for r in sel])} | "
                   f"{spread([r.get('late_max_s') for r in sel])} | "
                   f"{spread([r.get('gap_late_max_s') for r in sel])} | "
                   f"{sum(r['duplicates'] for r in sel)} | {loads[0]:.2f}–{loads[-1]:.2f} |")
    return out


def _pause_table(results: Path) -> list[str]:
    pause = rows(results, "pause")
    if not pause:
        return []
    out = ["\n**Paused leader (SIGSTOP after ~200 of 2,000 due at once, 15 s > ttl 10 s)**\n",
           "| scheduler | run | sent before stop | duplicates | lost | sent by the paused one after SIGCONT | paused process alive | beats alive of 3 |",
           "|---|---|---|---|---|---|---|---|"]
    for r in pause:
        if r.get("note"):
            out.append(f"| {r['kind']} | – | {r['note']} |||||")
            continue
        out.append(f"| {r['kind']} | {r['repeat']} | {r['sent_before_stop']} | {r['duplicates']} | "
                   f"{r['lost']} | {r['sent_by_paused_after_cont']} | {r['paused_alive']} | "
                   f"{r['beats_alive']} |")
    return out


def _memory_table(results: Path) -> list[str]:
    mem = rows(results, "memory")
    if not mem:
        return []
    out = ["\n**100,000 entries: memory and takeover (SIGTERM of the leader)**\n",
           "| run | leader VmRSS MiB | standby VmRSS MiB | new leader elected, s | first send by it, s | load |",
           "|---|---|---|---|---|---|"]
    for r in mem:
        out.append(f"| {r['repeat']} | {r['leader_rss_mib']:.0f} | {r['standby_rss_mib']:.0f} | "
                   f"{_f(r['elected_s'])} | {_f(r['takeover_first_send_s'])} | {r['load'].split()[1]} |")
    return out


def _restart_table(results: Path) -> list[str]:
    restart = rows(results, "restart")
    if not restart:
        return []
    out = ["\n**State Redis killed, restarted empty 3 s later (2 beats, 10 entries every 1 s)**\n",
           "| scheduler | run | next send after Redis answers, s | beats alive of 2 |",
           "|---|---|---|---|"]
    for r in restart:
        out.append(f"| {r['kind']} | {r['repeat']} | {_f(r['resume_s'])} | {r['beats_alive']} |")
    return out
