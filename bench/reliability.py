"""Reliability with real processes: faults that land in the middle of the protocol.

    python bench/reliability.py burst [--runs 3]       # Sentinel master SIGKILLed mid-burst
    python bench/reliability.py failover [--runs 3]    # leader SIGKILLed during a failover
    python bench/reliability.py restart [--runs 5]     # Redis restarted empty, 3 beats
    python bench/reliability.py django [--runs 3]      # django-celery-beat row 5 s -> 10 s
    python bench/reliability.py summary                # bench/results/reliability.md

Every run starts its own redis-server processes (the scheduler's state, and a
separate plain Redis as the broker, drained every 20 ms) and real ``celery
beat`` processes with Celery's defaults (beat_max_loop_interval 300 s, lease
ttl 10 s, rescue_after 2 s). The Sentinel set (tests/deployments/sentinel.py)
marks a master down after 1 s (``down-after-milliseconds 1000``), so a
failover fits a short run. Results go to bench/results/reliability-<scenario>.json;
the logs of a run that shows a duplicate or an unrecorded slot are kept under
bench/results/reliability-logs/<scenario>-<run>-<UTC time>/ (never overwritten).
"""

# ruff: noqa: I001 - _harness is imported first: it puts the repository on sys.path
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis

from _harness import entries, load, versions
from _audit import Drain, audit, by_source, history, pid_of, slot_ms

from tests.deployments.sentinel import MASTER, SentinelSet
from tests.support.beat import APP_MODULE, BeatProcess, beat_env
from tests.support.redis_server import RedisServer

RESULTS = Path(__file__).resolve().parent / "results"
LOGS = RESULTS / "reliability-logs"
PREFIX = "rel"


def leader_pid(client: Any, prefix: str = PREFIX) -> int | None:
    try:
        raw = client.get("{" + prefix + "}:leader")
    except redis.RedisError:  # down, or failing over: no answer
        return None
    return int(raw.decode().split("|")[0].split(":")[-2]) if raw else None


def start_beats(n: int, env: dict[str, str], work: Path, app: str = APP_MODULE
                ) -> list[BeatProcess]:
    return [BeatProcess(app, env, work / f"beat-{i}.log") for i in range(n)]


def keep_logs(work: Path, name: str) -> str:
    """Copy the run's logs (beats, Redis, Sentinels) to bench/results/reliability-logs."""
    dest = LOGS / name
    if dest.exists():
        shutil.rmtree(dest)
    for log in work.rglob("*.log"):
        target = dest / log.relative_to(work)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, target)
    return str(dest.relative_to(RESULTS.parent.parent))


def wait_leader(client_of: Any, beats: list[BeatProcess], other_than: int | None,
                timeout: float) -> tuple[int | None, float | None]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = leader_pid(client_of())
        if pid and pid != other_than and any(b.pid == pid for b in beats):
            return pid, time.time()
        time.sleep(0.02)
    return None, None


def finish(row: dict[str, Any], work: Path, name: str, always: bool = False
           ) -> dict[str, Any]:
    row["load_end"] = load()
    problem = row.get("slots_twice") or row.get("unrecorded")
    if problem:  # kept under a name of its own: a later run of the same number must not
        name = f"{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"  # overwrite it
    if always or problem:
        row["logs"] = keep_logs(work, name)
    shutil.rmtree(work, ignore_errors=True)
    return row


# -- 1. the Sentinel master SIGKILLed a third of the way into a 1,000-entry burst -------------

def burst(run: int, heal: bool, n: int = 1000, every: float = 30.0) -> dict[str, Any]:
    """``heal``: restart the killed master (empty) 3 s after the promotion, as a
    supervisor would; Sentinel makes it the new master's replica, so the next burst
    can meet ``min_replicas = 1`` again. Without it, nothing more can be sent."""
    work = Path(tempfile.mkdtemp(prefix="lb-rel-burst-"))
    row: dict[str, Any] = {"scenario": "burst", "run": run, "entries": n, "every": every,
                           "min_replicas": 1, "heal": heal, "load_start": load()}
    with SentinelSet(work / "sentinel") as sset, RedisServer(workdir=work / "broker") as broker:
        env = beat_env(work, broker_url=broker.url, redis_url=sset.url, prefix=PREFIX,
                       schedule=entries(n, every),
                       settings={"leaderbeat_redis_options": {"master_name": MASTER},
                                 "leaderbeat_min_replicas": 1})
        drain = Drain(broker.client())
        beats = start_beats(3, env, work)
        try:
            if not drain.wait_count(n, 3 * every):
                row["note"] = f"first batch incomplete: {drain.count}"
            # the second burst: kill the master once a third of it reached the broker
            if not drain.wait_count(n + n // 3, 2 * every):
                row["note"] = f"second batch did not start: {drain.count}"
                return finish(row, work, f"burst-{run}")
            old = sset.master()
            leader = leader_pid(old.client())
            t_kill = time.time()
            old.kill()
            row["published_at_kill"] = drain.count - n
            sset.wait_for_new_master(old.port)
            row["promoted_s"] = time.time() - t_kill
            if heal:
                time.sleep(3)
                old.restart()
            new_leader, _ = wait_leader(lambda: sset.master().client(), beats, None, 30)
            row["leader_before"], row["leader_after"] = leader, new_leader
            time.sleep(max(0.0, t_kill + every + 15 - time.time()))  # the next burst too
            t_end = time.time()
            for b in beats:
                b.term()
            msgs = drain.close()
            events = history(sset.master().client(), PREFIX)
        finally:
            drain.close()
            for b in beats:
                b.close()
        second = [m for m in msgs[n:] if m.received < t_kill + every / 2]
        row["second_burst"] = {"messages": len(second), "by_sender": dict(Counter(
            "leader" if pid_of(m) == leader else ("rescue" if m.epoch == 0 else "other")
            for m in second))}
        row.update(audit(msgs, events, every, until=t_end - 10))
        row["beats_alive_at_end"] = sum(1 for b in beats if b.returncode == 0)
    return finish(row, work, f"burst-{run}")


# -- 2. the leader SIGKILLed during a Sentinel failover ----------------------------------------

def failover(run: int, min_replicas: int = 0, heal: bool = False, n: int = 10,
             delay: float = 0.7) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="lb-rel-failover-"))
    row: dict[str, Any] = {"scenario": "failover", "run": run, "entries": n, "every": 1.0,
                           "min_replicas": min_replicas, "heal": heal,
                           "leader_kill_after_s": delay,
                           "load_start": load()}
    with SentinelSet(work / "sentinel") as sset, RedisServer(workdir=work / "broker") as broker:
        settings: dict[str, Any] = {"leaderbeat_redis_options": {"master_name": MASTER}}
        if min_replicas:
            settings["leaderbeat_min_replicas"] = min_replicas
        env = beat_env(work, broker_url=broker.url, redis_url=sset.url, prefix=PREFIX,
                       schedule=entries(n, 1.0), settings=settings)
        drain = Drain(broker.client())
        beats = start_beats(3, env, work)
        try:
            drain.wait_count(5 * n, 60)
            t_start = time.time()
            time.sleep(0.3)
            old = sset.master()
            leader = leader_pid(old.client())
            t_kill = time.time()
            old.kill()
            time.sleep(delay)
            victim = next(b for b in beats if b.pid == leader)
            victim.kill()
            row["leader_killed_s"] = time.time() - t_kill
            sset.wait_for_new_master(old.port)
            row["promoted_s"] = time.time() - t_kill
            if heal:  # a replica again, so min_replicas = 1 can be met
                old.restart()
            alive = [b for b in beats if b is not victim]
            _, t_led = wait_leader(lambda: sset.master().client(), alive, leader, 40)
            row["new_leader_s"] = t_led - t_kill if t_led else None
            first = drain.first_after(t_kill, 30)
            row["first_send_s"] = first.received - t_kill if first else None
            time.sleep(12)
            t_end = time.time()
            for b in alive:
                b.term()
            msgs = drain.close()
            events = history(sset.master().client(), PREFIX)
            (work / "history.log").write_text("".join(json.dumps(e) + "\n" for e in events))
        finally:
            drain.close()
            for b in beats:
                b.close()
        after = [m for m in msgs if m.received > t_kill]
        row["after_kill"] = dict(by_source(after))
        row["late_max_s"] = max((m.lateness for m in after), default=None)
        row.update(audit(msgs, events, 1.0, until=t_end - 5, since=t_start - 5))
    return finish(row, work, f"failover-r{min_replicas}-{run}", always=True)  # small logs


# -- 3. Redis (no persistence) restarted empty under three beats ---------------------------------

def restart(runs: int, n: int = 10, down: float = 3.0) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="lb-rel-restart-"))
    rows: list[dict[str, Any]] = []
    with RedisServer(workdir=work / "state") as state, \
            RedisServer(workdir=work / "broker") as broker:
        env = beat_env(work, broker_url=broker.url, redis_url=state.url, prefix=PREFIX,
                       schedule=entries(n, 1.0))
        drain = Drain(broker.client())
        beats = start_beats(3, env, work)
        try:
            drain.wait_count(5 * n, 60)
            time.sleep(2)
            for r in range(runs):
                leader = leader_pid(state.client())
                state.kill()
                t_down = time.time()
                time.sleep(down)
                state.restart()
                t_up = time.time()
                first = drain.first_after(t_up, 30)
                time.sleep(6)
                after = [m for m in drain.messages if m.received > t_up]
                first_leader = next((m for m in after if pid_of(m) == leader), None)
                # slots due from the kill to 4 s after Redis answered: sent, recorded or not
                gap = audit(drain.messages, history(state.client(), PREFIX), 1.0,
                            until=t_up + 4, since=t_down)
                rows.append({
                    "scenario": "restart", "run": r, "entries": n, "every": 1.0,
                    "down_s": round(t_up - t_down, 3),
                    "first_send_s": first.received - t_up if first else None,
                    "first_sender": ("same leader" if first and pid_of(first) == leader else
                                     "rescue" if first and first.epoch == 0 else "other"),
                    "first_send_by_leader_s": first_leader.received - t_up if first_leader
                    else None,
                    "first_slot_minus_up_s": slot_ms(first) / 1000 - t_up if first else None,
                    "same_leader_after": leader_pid(state.client()) == leader,
                    "t_up": t_up,
                    "after_up": dict(by_source(after)), "load": load(),
                    "outage_and_after": {k: gap[k] for k in (
                        "unrecorded", "recorded_not_published", "slots_twice")},
                    "unrecorded_after_up": sum(1 for u in gap["unrecorded_detail"]
                                               if u["slot"] > t_up * 1000)})
                print(rows[-1], flush=True)
            t_end = time.time()
            for b in beats:
                b.term()
            msgs = drain.close()
        finally:
            drain.close()
            for b in beats:
                b.close()
    total = audit(msgs, [], 1.0, until=t_end - 3)
    total = {k: total[k] for k in ("published", "slots_twice", "messages_twice", "twice_detail")}
    rows.append({"scenario": "restart", "run": "all", **total, "load_end": load()})
    rows[-1]["logs"] = keep_logs(work, "restart")  # small: who led after each restart
    shutil.rmtree(work, ignore_errors=True)
    return rows


# -- 4. django-celery-beat: an interval row changed 5 s -> 10 s through the ORM --------------------

def django(run: int, watch: float = 60.0) -> dict[str, Any]:
    import _django_site as site

    work = Path(tempfile.mkdtemp(prefix="lb-rel-django-"))
    row: dict[str, Any] = {"scenario": "django", "run": run, "load_start": load()}
    with site.database() as name, RedisServer(workdir=work / "state") as state, \
            RedisServer(workdir=work / "broker") as broker:
        site.add("probe", 5)
        env = site.env(name, broker.url, state.url, PREFIX)
        drain = Drain(broker.client())
        beats = start_beats(3, env, work, app=site.APP)
        try:
            probe = lambda: [m for m in drain.messages if m.entry == "probe"]
            deadline = time.monotonic() + 60
            while len(probe()) < 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(3)
            changed = site.change("probe", 10)
            row["changed_at"] = changed
            time.sleep(watch)
            for b in beats:
                b.term()
            msgs = drain.close()
        finally:
            drain.close()
            for b in beats:
                b.close()
    mine = sorted((m for m in msgs if m.entry == "probe"), key=slot_ms)
    after = [m for m in mine if slot_ms(m) / 1000 > changed]
    row["before_change_steps_s"] = sorted({round((slot_ms(b) - slot_ms(a)) / 1000, 3) for a, b in
                                           itertools.pairwise(mine) if slot_ms(b) / 1000 <= changed})
    row["after"] = [{"slot_from_change_s": round(slot_ms(m) / 1000 - changed, 3),
                     "source": "rescue" if m.epoch == 0 else "leader", "pid": pid_of(m)}
                    for m in after]
    row["steps_after_s"] = [round((slot_ms(b) - slot_ms(a)) / 1000, 3)
                            for a, b in itertools.pairwise(after)]
    for source in ("leader", "rescue"):
        own = [m for m in after if (m.epoch == 0) == (source == "rescue")]
        row[f"steps_after_{source}_s"] = [round((slot_ms(b) - slot_ms(a)) / 1000, 3)
                                          for a, b in itertools.pairwise(own)]
    ten = [i for i, s in enumerate(row["steps_after_s"]) if abs(s - 10) > 0.01]
    row["last_non_10s_step_ends_s"] = (round(slot_ms(after[ten[-1] + 1]) / 1000 - changed, 3)
                                       if ten else None)
    a = audit(mine, [], 5.0, until=0)
    row.update(slots_twice=a["slots_twice"], twice_detail=a["twice_detail"],
               published=len(mine))
    return finish(row, work, f"django-{run}", always=True)  # small: refusals are logged


# -- the command line -----------------------------------------------------------------------------

def save(scenario: str, rows: list[dict[str, Any]]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"reliability-{scenario}.json"
    old = json.loads(path.read_text()) if path.exists() else {"runs": []}
    old["runs"] += rows
    old["versions"] = versions()
    old["updated"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path.write_text(json.dumps(old, indent=1, default=str) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenario", choices=["burst", "failover", "restart", "django", "summary"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--min-replicas", type=int, default=0, help="failover only")
    parser.add_argument("--heal", action="store_true",
                        help="burst, failover: restart the killed master; Sentinel makes it "
                        "a replica")
    args = parser.parse_args(argv)
    if args.scenario == "summary":
        import _reliability_summary

        print(_reliability_summary.write(RESULTS))
        return
    for r in range(args.runs):
        if args.scenario == "restart":
            rows = restart(args.runs)
        elif args.scenario == "burst":
            rows = [burst(r, args.heal)]
        elif args.scenario == "failover":
            rows = [failover(r, args.min_replicas, args.heal)]
        else:
            rows = [django(r)]
        for row in rows:
            brief = {k: v for k, v in row.items() if not k.endswith("_detail") and k != "after"}
            print(json.dumps(brief, default=str), flush=True)
        save(args.scenario, rows)
        if args.scenario == "restart":
            break


if __name__ == "__main__":
    main()
