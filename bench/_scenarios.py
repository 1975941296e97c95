"""The scenarios of bench/compare.py; each returns plain dicts (one per measurement)."""

from __future__ import annotations

import itertools
import statistics
import subprocess
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone
from typing import Any

from _harness import LEASE_TTL, Msg, Rig, cpu_seconds, entries, load, log_events, rss_mib

FAR = 86400.0  # "far in the future": a daily interval
ELECTED = {"leaderbeat": r"elected leader", "redbeat": r"Acquired lock"}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _busy_schedule(n: int) -> dict[str, dict[str, Any]]:
    schedule = entries(min(n, 100), 1.0)
    if n > 100:
        schedule.update(entries(n - 100, FAR, start=100))
    return schedule


# -- 1. tick cost ---------------------------------------------------------------------------

def tick_busy(kind: str, n: int, window: float, start_cap: float = 240) -> dict[str, Any]:
    """100 entries due every second, the rest a day away: CPU per 1,000 sends and per tick."""
    row: dict[str, Any] = {"scenario": "busy", "kind": kind, "entries": n, "load0": load()}
    with Rig(kind, _busy_schedule(n)) as rig:
        t0 = time.time()
        beat = rig.start_beat()
        if not rig.watch.wait_count(1, start_cap):
            return {**row, "note": f"sent nothing within {start_cap:.0f} s of start"}
        row["startup_s"] = time.time() - t0
        time.sleep(3)
        cpu0, ticks0, sent0, t1 = cpu_seconds(beat.pid), rig.ticks(beat), rig.watch.count, time.time()
        time.sleep(window)
        cpu = cpu_seconds(beat.pid) - cpu0
        ticks, sent = rig.ticks(beat) - ticks0, rig.watch.count - sent0
        elapsed = time.time() - t1
        row.update(window_s=elapsed, sent=sent, expected=round(100 * elapsed), cpu_s=cpu,
                   ticks=ticks, cpu_per_1000=1000 * cpu / sent if sent else None,
                   cpu_per_tick=cpu / ticks if ticks else None, rss_mib=rss_mib(beat.pid),
                   load1=load())
        late = [m.lateness for m in rig.watch.messages()[sent0:] if m.lateness is not None]
        if late:
            row["late_p99_s"] = sorted(late)[int(0.99 * (len(late) - 1))]
            row["late_max_s"] = max(late)
    return row


def tick_idle(kind: str, n: int, window: float, start_cap: float = 240) -> dict[str, Any]:
    """Nothing due (every entry a day away), loop capped at 1 s: CPU per idle tick."""
    row: dict[str, Any] = {"scenario": "idle", "kind": kind, "entries": n, "load0": load()}
    with Rig(kind, entries(n, FAR)) as rig:
        beat = rig.start_beat()
        deadline = time.monotonic() + start_cap
        while rig.ticks(beat) < 2:
            if time.monotonic() > deadline or not beat.alive:
                return {**row, "note": f"no tick within {start_cap:.0f} s"}
            time.sleep(0.1)
        time.sleep(2)
        cpu0, ticks0, t1 = cpu_seconds(beat.pid), rig.ticks(beat), time.time()
        time.sleep(window)
        cpu, ticks = cpu_seconds(beat.pid) - cpu0, rig.ticks(beat) - ticks0
        row.update(window_s=time.time() - t1, cpu_s=cpu, ticks=ticks, sent=rig.watch.count,
                   cpu_per_tick=cpu / ticks if ticks else None, rss_mib=rss_mib(beat.pid),
                   load1=load())
    return row


def tick_all(kind: str, n: int, every: float, cap: float, start_cap: float = 240
             ) -> dict[str, Any]:
    """Every entry due at the same moment: the batch's CPU per 1,000 sends and its duration."""
    row: dict[str, Any] = {"scenario": "all", "kind": kind, "entries": n, "load0": load()}
    with Rig(kind, entries(n, every)) as rig:
        beat = rig.start_beat()
        if not rig.watch.wait_count(1, start_cap + every):
            return {**row, "note": f"sent nothing within {start_cap + every:.0f} s"}
        first = rig.watch.raw[0][0]
        last_count, last_change = 0, time.monotonic()
        while rig.watch.count < n and time.time() - first < cap:
            if rig.watch.count != last_count:
                last_count, last_change = rig.watch.count, time.monotonic()
            elif time.monotonic() - last_change > 5:
                break
            time.sleep(0.05)
        msgs = rig.watch.messages()[:n]
        last = msgs[-1].received
        cpu = rig.watch.cpu_at(beat.pid, last) - rig.watch.cpu_at(beat.pid, first - 0.001)
        row.update(sent=len(msgs), duration_s=last - first, cpu_s=cpu,
                   cpu_per_1000=1000 * cpu / len(msgs), capped=len(msgs) < n,
                   rss_mib=rss_mib(beat.pid) if beat.alive else None, load1=load())
        late = [m.lateness for m in msgs if m.lateness is not None]
        if late:
            row["late_max_s"] = max(late)
    return row


# -- 2. Redis commands ----------------------------------------------------------------------

def _client_pids(port: int) -> dict[int, int]:
    """Local port of each connection to ``port`` -> the pid owning it (from ``ss -tnp``)."""
    out = subprocess.run(["ss", "-tnpH", f"dport = :{port}"], capture_output=True,
                         text=True, check=False).stdout
    owners = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 6 and "pid=" in cols[-1]:
            local = int(cols[3].rsplit(":", 1)[1])
            owners[local] = int(cols[-1].split("pid=")[1].split(",")[0])
    return owners


def redis_commands(kind: str, n: int, every: float, window: float) -> list[dict[str, Any]]:
    """Commands the state Redis serves per batch and per 1,000 sends: leader, then +2 standbys.

    Counted twice: ``INFO commandstats`` deltas (everything, scripts' inner commands
    included) and a ``MONITOR`` capture attributed to each process by its
    connection, which separates round trips from the commands Lua runs inside.
    """
    rows = []
    with Rig(kind, entries(n, every)) as rig:
        leader = rig.start_beat()
        rig.watch.wait_count(1, 60)
        time.sleep(2)
        monitor_path = rig.work / "monitor.txt"
        with open(monitor_path, "wb") as out:
            monitor = subprocess.Popen(["redis-cli", "-p", str(rig.state.port), "monitor"],
                                       stdout=out, stderr=subprocess.DEVNULL)
        phases = []
        for phase in ("leader alone", "leader + 2 standbys"):
            if phase != "leader alone":
                standbys = [rig.start_beat() for _ in range(2)]
                time.sleep(6)  # up, and holding the slot states
            c0, s0, t0 = rig.command_counts(), rig.watch.count, time.time()
            time.sleep(window)
            phases.append((phase, t0, time.time(), rig.command_counts() - c0,
                           rig.watch.messages()[s0:]))
        owners = _client_pids(rig.state.port)
        monitor.terminate()
        monitor.wait(5)
        pids = {leader.pid: "leader"} | {b.pid: "standby" for b in standbys}
        by_phase = _parse_monitor(monitor_path.read_text(errors="replace"), owners, pids,
                                  [(p[1], p[2]) for p in phases])
        for i, (phase, t0, t1, stats, msgs) in enumerate(phases):
            sent = len(msgs)
            batches = len({round(m.received, 1) for m in msgs}) if kind != "leaderbeat" else \
                len({m.slot for m in msgs})
            stats.pop("info", None)
            rows.append({"scenario": "redis", "kind": kind, "entries": n, "every": every,
                         "phase": phase, "window_s": t1 - t0, "sent": sent, "batches": batches,
                         "commandstats": dict(stats), "total": sum(stats.values()),
                         "per_1000_sends": 1000 * sum(stats.values()) / max(sent, 1),
                         "monitor": by_phase[i], "load": load()})
    return rows


def _parse_monitor(text: str, owners: dict[int, int], roles: dict[int, str],
                   windows: list[tuple[float, float]]) -> list[dict[str, dict[str, int]]]:
    """Per phase, per role: round trips by command, and commands run inside Lua."""
    result: list[dict[str, Counter]] = [defaultdict(Counter) for _ in windows]
    last_role = "?"
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4 or not parts[0][0].isdigit():
            continue
        t, who, cmd = float(parts[0]), parts[2].rstrip("]"), parts[3].split(" ", 1)[0].strip('"').lower()
        phase = next((i for i, (a, b) in enumerate(windows) if a <= t < b), None)
        if who == "lua":
            role, key = last_role, f"lua:{cmd}"
        else:
            port = int(who.rsplit(":", 1)[1]) if ":" in who else -1
            role = roles.get(owners.get(port, -1), "other")
            last_role, key = role, cmd
        if phase is not None:
            result[phase][role][key] += 1
    return [{role: dict(c) for role, c in phase.items()} for phase in result]


# -- 3. failover ------------------------------------------------------------------------------

def failover(kind: str, mode: str, repeats: int, n: int = 10) -> list[dict[str, Any]]:
    """SIGKILL or SIGTERM the leader of three beats ``repeats`` times; entries every 1 s."""
    rows = []
    with Rig(kind, entries(n, 1.0)) as rig:
        beats = [rig.start_beat() for _ in range(3)]
        rig.watch.wait_count(1, 60)
        time.sleep(4)
        for r in range(repeats):
            recent = [m.pid for m in rig.watch.messages()[-n:]]
            leader_pid = Counter(recent).most_common(1)[0][0]
            leader = next(b for b in beats if b.pid == leader_pid)
            count = rig.watch.count
            rig.watch.wait_count(count + 1, 5)  # just after a batch: the next slot is ~1 s away
            time.sleep(0.1)
            t_sig = time.time()
            leader.kill() if mode == "kill" else leader.term()
            first = None
            deadline = time.monotonic() + 40
            while first is None and time.monotonic() < deadline:
                first = next((m for m in rig.watch.messages() if m.received > t_sig
                              and m.pid != leader_pid), None)
                time.sleep(0.02)
            elected = None
            while elected is None and time.monotonic() < deadline:
                found = [t for b in beats if b is not leader for t in
                         log_events(b, ELECTED[kind]) if t > t_sig]
                elected = min(found) if found else None
                time.sleep(0.05)
            time.sleep(2.5)
            msgs = rig.watch.messages()
            row = {"scenario": "failover", "kind": kind, "mode": mode, "repeat": r,
                   "first_send_s": first.received - t_sig if first else None,
                   "elected_s": elected - t_sig if elected else None, "load": load()}
            row.update(_lateness(msgs, t_sig, n))
            rows.append(row)
            beats.remove(leader)
            beats.append(rig.start_beat())
            time.sleep(4)  # the replacement is up and standing by
    return rows


def _lateness(msgs: list[Msg], t_sig: float, n: int) -> dict[str, Any]:
    """Worst lateness of the slots after ``t_sig``: by the slot header, and by the gaps.

    Gap lateness (any scheduler): per entry, the time between consecutive messages
    minus the 1 s interval, over the messages around the signal.
    """
    out: dict[str, Any] = {}
    after = [m for m in msgs if m.received > t_sig]
    late = [m.lateness for m in after if m.lateness is not None]
    if late:
        out["late_max_s"] = max(late)
    gaps = []
    per_entry: dict[str | None, list[float]] = defaultdict(list)
    for m in msgs:
        if m.received > t_sig - 3:
            per_entry[m.entry].append(m.received)
    for times in per_entry.values():
        times.sort()
        gaps += [b - a - 1.0 for a, b in itertools.pairwise(times) if b > t_sig]
    out["gap_late_max_s"] = max(gaps) if gaps else None
    slots = Counter((m.entry, m.slot) for m in msgs if m.slot is not None)
    out["duplicates"] = sum(1 for c in slots.values() if c > 1)
    return out


# -- 4. the paused leader -----------------------------------------------------------------------

def paused_leader(kind: str, repeats: int, n: int = 2000) -> list[dict[str, Any]]:
    """SIGSTOP the leader after ~200 messages of a 2,000-entry batch, past the ttl; SIGCONT."""
    rows: list[dict[str, Any]] = []
    for r in range(repeats):
        every = 45.0  # one batch in the window: it fires ~45 s after start, then at ~90 s
        with Rig(kind, entries(n, every)) as rig:
            beats = [rig.start_beat() for _ in range(3)]
            if not rig.watch.wait_count(200, 120):
                rows.append({"scenario": "pause", "kind": kind, "note": "no batch in 120 s"})
                continue
            leader_pid = Counter(m.pid for m in rig.watch.messages()[:200]).most_common(1)[0][0]
            leader = next(b for b in beats if b.pid == leader_pid)
            leader.stop()
            at_stop = rig.watch.count
            time.sleep(LEASE_TTL + 5)
            leader.cont()
            t_cont = time.time()
            time.sleep(15)
            msgs = rig.watch.messages()
            first = msgs[0].received
            batch = [m for m in msgs if m.slot == msgs[0].slot and m.received < first + every - 5]
            per = Counter((m.entry, m.slot) for m in batch)
            rows.append({
                "scenario": "pause", "kind": kind, "repeat": r, "entries": n,
                "sent_before_stop": at_stop, "messages": len(batch),
                "duplicates": sum(c - 1 for c in per.values() if c > 1),
                "lost": n - len({m.entry for m in batch}),
                "sent_by_paused_after_cont": sum(1 for m in batch if m.pid == leader_pid
                                                 and m.received > t_cont),
                "paused_alive": leader.alive, "beats_alive": sum(b.alive for b in beats),
                "load": load()})
    return rows


# -- 5. memory and reload -------------------------------------------------------------------------

def memory(n: int, repeats: int) -> list[dict[str, Any]]:
    """RSS of a leaderbeat leader and standby at ``n`` entries; SIGTERM takeover time."""
    rows = []
    with Rig("leaderbeat", _busy_schedule(n)) as rig:
        leader = rig.start_beat()
        rig.watch.wait_count(1, 300)
        for r in range(repeats):
            standby = rig.start_beat()
            time.sleep(20)  # imported, schedule built, slot states read
            row = {"scenario": "memory", "kind": "leaderbeat", "entries": n, "repeat": r,
                   "leader_rss_mib": rss_mib(leader.pid), "standby_rss_mib": rss_mib(standby.pid)}
            t_sig = time.time()
            leader.term()
            first = None
            deadline = time.monotonic() + 120
            while first is None and time.monotonic() < deadline:
                first = next((m for m in rig.watch.messages()[-300:] if m.received > t_sig
                              and m.pid == standby.pid), None)
                time.sleep(0.02)
            elected = [t for t in log_events(standby, ELECTED["leaderbeat"]) if t > t_sig]
            row.update(takeover_first_send_s=first.received - t_sig if first else None,
                       elected_s=elected[0] - t_sig if elected else None, load=load())
            rows.append(row)
            leader = standby
    return rows


# -- Redis restarted empty ---------------------------------------------------------------------------

def redis_restart(kind: str, repeats: int, n: int = 10) -> list[dict[str, Any]]:
    """Kill the state Redis, restart it empty on the same port: time to the next send."""
    rows = []
    with Rig(kind, entries(n, 1.0)) as rig:
        beats = [rig.start_beat() for _ in range(2)]
        rig.watch.wait_count(1, 60)
        time.sleep(3)
        for r in range(repeats):
            rig.state.kill()
            time.sleep(3)
            rig.state.restart()
            t_up = time.time()
            first = None
            deadline = time.monotonic() + 30
            while first is None and time.monotonic() < deadline and any(b.alive for b in beats):
                first = next((m for m in rig.watch.messages()[-50:] if m.received > t_up), None)
                time.sleep(0.02)
            time.sleep(3)
            rows.append({"scenario": "redis-restart", "kind": kind, "repeat": r,
                         "resume_s": first.received - t_up if first else None,
                         "beats_alive": sum(b.alive for b in beats), "load": load()})
            if not any(b.alive for b in beats):
                break
    return rows


def summary(values: list[float | None]) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "n/a"
    return f"median {statistics.median(vals):.3f}, max {max(vals):.3f} (n={len(vals)})"
