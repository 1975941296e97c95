"""django-celery-beat at a real site's scale: 5,000 rows, an edit storm, the leader killed.

    python bench/django_storm.py [--out bench/results/django_storm.jsonl]

A Django site on PostgreSQL (tests/support/djangosite, its own database) with
django-celery-beat wrapped by leaderbeat, 5,000 rows (4,000 every 60 s, 900 crontab every
minute or every five, 100 every 10 s, and one every second as a heartbeat), three
beats, a Redis broker. After two healthy 4,000-row bursts, an edit storm from the
ORM in 20 s: 300 rows disabled, 300 re-enabled (disabled before the second burst),
300 intervals changed (60 s to 30 s), 200 rows added (every 10 s), 200 deleted, 50
one-off rows a few seconds ahead; the leader is SIGKILLed 10 s into it. Then two
more bursts. Prints the table and appends one JSON line to ``--out``. Not a test:
it takes about five minutes and both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from bench._harness import Watch
from tests.support.beat import BeatProcess
from tests.support.postgres import HOST, PORT, USER, postgres_database
from tests.support.redis_server import RedisServer

UTC = timezone.utc
APP = "tests.support.djangosite"
SETTINGS = "tests.support.djangosite.settings"


def parse(raw: bytes, received: float) -> dict:
    data = json.loads(raw)
    h = data.get("headers") or {}
    return {"entry": h.get("leaderbeat_entry"), "slot": h.get("leaderbeat_slot"),
            "epoch": h.get("leaderbeat_epoch"), "received": received}


def ts(slot: str) -> float:
    return datetime.fromisoformat(slot).timestamp()


def xacts(dbname: str) -> int:
    import psycopg

    with psycopg.connect(host=HOST, port=PORT, user=USER, dbname="postgres") as conn:
        row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = %s", (dbname,)).fetchone()
    return int(row[0]) if row else 0


def leader_pid(client, prefix: str) -> int | None:
    raw = client.get("{" + prefix + "}:leader")
    return int(raw.decode().split("|")[0].split(":")[-2]) if raw else None


def wait_until(t: float) -> None:
    while time.time() < t:
        time.sleep(min(0.2, max(0.0, t - time.time())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/django_storm.jsonl")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lb-django-storm-"))
    rnd = random.Random(17)
    with postgres_database("lbstorm") as dbname:
        os.environ.update(LB_DJANGO_DB=dbname, DJANGO_SETTINGS_MODULE=SETTINGS)
        from tests.support.djangosite.testing import migrated

        with migrated(dbname), RedisServer(workdir=work / "state") as state, \
                RedisServer(workdir=work / "broker") as broker:
            run(dbname, state, broker, work, rnd, args.out)


def run(dbname, state, broker, work, rnd, out) -> None:
    from django_celery_beat.models import PeriodicTask

    _create_rows()
    prefix = "storm"
    env = {"LB_DJANGO_DB": dbname, "LB_BROKER_URL": broker.url_for(0),
           "LB_REDIS_URL": state.url, "LB_PREFIX": prefix, "DJANGO_SETTINGS_MODULE": SETTINGS}
    watch = Watch(broker.client())
    beats = [BeatProcess(APP, env, work / f"beat-{i}.log") for i in range(3)]
    for b in beats:
        watch.sample(b.pid)
    client = state.client()
    started = time.time()
    try:
        first_leader = leader_pid(client, prefix)
        while first_leader is None:
            time.sleep(0.1)
            first_leader = leader_pid(client, prefix)
        print(f"leader pid {first_leader}; waiting for two healthy 60 s bursts", flush=True)
        # the 60 s rows were saved together: one burst a minute, ~60 s after their save
        burst0 = min(r.date_changed for r in PeriodicTask.objects.filter(name="m0")).timestamp()
        burst1, burst2 = burst0 + 60, burst0 + 120
        wait_until(burst1 + 10)
        # the rows re-enabled in the storm: disabled before the second burst
        reenable = [f"m{i}" for i in range(300, 600)]
        disabled_at = _disable(reenable)
        x0, c0 = xacts(dbname), time.time()
        cpu0 = watch.cpu_at(first_leader, time.time())
        sent0 = watch.count
        wait_until(burst2 + 15)  # the storm starts once the burst is out, even on a busy host
        x1, c1 = xacts(dbname), time.time()
        cpu1 = watch.cpu_at(first_leader, c1)
        sent1 = watch.count
        storm = _storm(client, prefix, _storm_ops(reenable, rnd), rnd)
        assert storm.killed is not None and storm.elected is not None  # _storm waits for both
        new_leader = leader_pid(client, prefix)
        print(f"new leader pid {new_leader} {storm.elected - storm.killed[1]:.1f} s after the "
              "kill; two more bursts", flush=True)
        wait_until(burst2 + 120 + 15)
    finally:
        for b in beats:
            if b.alive:
                b.term()
        watch.close()
    msgs = [parse(raw, t) for t, raw in watch.raw]
    logs = "\n".join(b.log_text() for b in beats)
    (work / "beats.log").write_text(logs)
    (work / "messages.jsonl").write_text("".join(json.dumps(m) + "\n" for m in msgs))
    report(msgs, storm.at, disabled_at, storm.oneoff_due, storm.killed, storm.elected,
           storm.start, storm.end, (burst1, burst2), first_leader, new_leader,
           (x1 - x0) / (c1 - c0) * 60, (cpu1 - cpu0) / max(1, sent1 - sent0) * 1000,
           time.time() - started, out, work)


def _every(seconds):
    """The interval of ``seconds``, made the first time it is asked for."""
    from django_celery_beat.models import IntervalSchedule

    return IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")[0]


def _create_rows() -> None:
    """The site's 5,001 rows (see the module's docstring), saved together."""
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    minutely = CrontabSchedule.objects.get_or_create(minute="*", timezone="UTC")[0]
    five = CrontabSchedule.objects.get_or_create(minute="*/5", timezone="UTC")[0]
    rows = [PeriodicTask(name=f"m{i}", task="tests.noop", interval=_every(60))
            for i in range(4000)]
    rows += [PeriodicTask(name=f"c{i}", task="tests.noop",
                          crontab=minutely if i % 2 else five) for i in range(900)]
    rows += [PeriodicTask(name=f"t{i}", task="tests.noop", interval=_every(10))
             for i in range(100)]
    rows.append(PeriodicTask(name="heartbeat", task="tests.noop", interval=_every(1)))
    PeriodicTask.objects.bulk_create(rows, batch_size=1000)


def _disable(names: list[str]) -> dict[str, float]:
    """Disable the rows ``names``, one save each; the wall time of each save."""
    from django_celery_beat.models import PeriodicTask

    disabled_at = {}
    for name in names:
        r = PeriodicTask.objects.get(name=name)
        r.enabled = False
        r.save()
        disabled_at[name] = time.time()
    return disabled_at


def _storm_ops(reenable: list[str], rnd: random.Random) -> list[tuple[str, str]]:
    """The storm's edits, (op, row name), in a random order."""
    ops = ([("disable", f"m{i}") for i in range(300)]
           + [("enable", n) for n in reenable]
           + [("change", f"m{i}") for i in range(600, 900)]
           + [("add", f"new{i}") for i in range(200)]
           + [("delete", f"m{i}") for i in range(900, 1100)]
           + [("oneoff", f"once{i}") for i in range(50)])
    rnd.shuffle(ops)
    return ops


@dataclass
class Storm:
    """What the storm did: each row's edit, the one-offs' due times, the leader it killed."""

    start: float  # wall time
    at: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (op, saved at)
    oneoff_due: dict[str, float] = field(default_factory=dict)
    killed: tuple[int, float] | None = None  # the leader's pid, and when it was killed
    elected: float | None = None  # when another beat led
    end: float = 0.0

    def follow_leader(self, client, prefix: str) -> None:
        """SIGKILL the leader once the storm is 10 s old; then note when another leads."""
        if self.killed is None and time.time() >= self.start + 10:
            pid = leader_pid(client, prefix)
            if pid is not None:  # between two leases: the next edit tries again
                os.kill(pid, signal.SIGKILL)
                self.killed = (pid, time.time())
        if self.killed is not None and self.elected is None and leader_pid(
                client, prefix) not in (None, self.killed[0]):
            self.elected = time.time()

    def wait_for_election(self, client, prefix: str) -> None:
        """Wait until a beat other than the killed one leads."""
        assert self.killed is not None, "no leader to kill in the storm's second half"
        while self.elected is None:
            if leader_pid(client, prefix) not in (None, self.killed[0]):
                self.elected = time.time()
            time.sleep(0.05)


def _storm(client, prefix: str, ops: list[tuple[str, str]], rnd: random.Random) -> Storm:
    """The edits ``ops`` spread evenly over 20 s, the leader killed 10 s in; returns once
    another beat leads."""
    storm = Storm(start=time.time())
    thirty = _every(30)
    ten = _every(10)
    print(f"storm: {len(ops)} ORM edits in 20 s, leader killed at +10 s", flush=True)
    for k, (op, name) in enumerate(ops):
        wait_until(storm.start + 20.0 * k / len(ops))
        storm.follow_leader(client, prefix)
        _edit(op, name, rnd=rnd, ten=ten, thirty=thirty, oneoff_due=storm.oneoff_due)
        storm.at[name] = (op, time.time())
    storm.end = time.time()
    storm.wait_for_election(client, prefix)
    return storm


def _edit(op: str, name: str, *, rnd: random.Random, ten, thirty,
          oneoff_due: dict[str, float]) -> None:
    """One edit of the storm from the ORM: a row added (every 10 s), a one-off added a few
    seconds ahead (its due time into ``oneoff_due``), deleted, disabled, enabled, or its
    interval changed to 30 s."""
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    if op == "add":
        PeriodicTask.objects.create(name=name, task="tests.noop", interval=ten)
    elif op == "oneoff":
        due = datetime.now(UTC) + timedelta(seconds=rnd.uniform(3, 6))
        PeriodicTask.objects.create(
            name=name, task="tests.noop", one_off=True,
            clocked=ClockedSchedule.objects.create(clocked_time=due))
        oneoff_due[name] = due.timestamp()
    elif op == "delete":
        PeriodicTask.objects.get(name=name).delete()
    else:
        r = PeriodicTask.objects.get(name=name)
        if op == "disable":
            r.enabled = False
        elif op == "enable":
            r.enabled = True
        else:
            r.interval = thirty
        r.save()


def report(msgs, at, disabled_at, oneoff_due, killed, elected, storm_start, storm_end,
           bursts, first_leader, new_leader, sql_per_min, cpu_per_1000, wall, out, work):
    by = {}
    for m in msgs:
        by.setdefault(m["entry"], []).append(m)
    pairs = Counter((m["entry"], m["slot"]) for m in msgs)
    twice = sum(1 for n in pairs.values() if n > 1)
    late = sorted(m["received"] - ts(m["slot"]) for m in msgs)
    # one-offs: each exactly once
    once_ok = sum(1 for name in oneoff_due if len(by.get(name, [])) == 1)
    once_late = [m["received"] - oneoff_due[name] for name in oneoff_due
                 for m in by.get(name, [])]
    # re-enabled rows: a slot from their disabled stretch sent after the re-enable
    replays = 0
    for name, (op, saved) in at.items():
        if op == "enable":
            stretch = [m for m in by.get(name, [])
                       if disabled_at[name] + 2 < ts(m["slot"]) <= saved]
            replays += bool(stretch)
    # new rows: first slot sent, from the save (one slot is 10 s), and when it was sent
    live = sorted(min(ts(m["slot"]) for m in by[name]) - saved
                  for name, (op, saved) in at.items() if op == "add" and by.get(name))
    live_sent = sorted(min(m["received"] for m in by[name]) - saved
                       for name, (op, saved) in at.items() if op == "add" and by.get(name))
    added = sum(1 for op, _ in at.values() if op == "add")
    # changed rows (60 s -> 30 s): the first slot after the save, from the save (the next
    # slot on the 30 s grid is at most 30 s away), and whether every later step is 30 s
    changed, changed_ok = [], 0
    for name, (op, saved) in at.items():
        if op == "change":
            after = sorted(ts(m["slot"]) for m in by.get(name, []) if ts(m["slot"]) > saved)
            if after:
                changed.append(after[0] - saved)
            changed_ok += bool(after) and {round(b - a, 3) for a, b in
                                           itertools.pairwise(after)} <= {30.0}
    # disabled and deleted rows: the last slot sent after the save
    silent = [max((ts(m["slot"]) - saved for m in by.get(name, [])), default=-1)
              for name, (op, saved) in at.items() if op in ("disable", "delete")]
    # the leader's longest stall in the storm: the longest a due slot waited while its
    # leader sent nothing at all (from the slot's time, or the leader's previous send if
    # later, to its send); the takeover after the kill left out
    stall, hb_late = 0.0, 0.0
    for epoch in {m["epoch"] for m in msgs if m["epoch"]}:
        prev = float("-inf")
        for m in sorted((m for m in msgs if m["epoch"] == epoch), key=lambda m: m["received"]):
            due = ts(m["slot"])
            if storm_start <= due <= storm_end + 5 and not killed[1] - 1 <= due <= elected + 1:
                stall = max(stall, m["received"] - max(due, prev))
                if m["entry"] == "heartbeat":
                    hb_late = max(hb_late, m["received"] - due)
            prev = m["received"]
    # rescues per healthy burst (epoch 0: a standby's claim)
    rescues = [sum(1 for m in msgs if m["epoch"] == 0 and b - 1 <= ts(m["slot"]) <= b + 5
                   and (m["entry"] or "").startswith("m")) for b in bursts]
    burst_sent = [sum(1 for m in msgs if b - 1 <= ts(m["slot"]) <= b + 5
                      and (m["entry"] or "").startswith("m")) for b in bursts]
    q = statistics.quantiles(late, n=100)
    result = {
        "scenario": "django_storm", "rows": 5001, "beats": 3, "wall_s": round(wall, 1),
        "messages": len(msgs), "slots_twice": twice,
        "lateness_p50_s": round(q[49], 3), "lateness_p99_s": round(q[98], 3),
        "oneoffs_once": once_ok, "oneoffs": len(oneoff_due),
        "oneoff_late_max_s": round(max(once_late), 2) if once_late else None,
        "reenable_replays": replays, "reenabled": sum(1 for o, _ in at.values() if o == "enable"),
        "new_live": len(live), "new_added": added,
        "new_first_slot_after_save_p50_s": round(live[len(live) // 2], 2) if live else None,
        "new_first_slot_after_save_max_s": round(live[-1], 2) if live else None,
        "new_first_sent_after_save_max_s": round(live_sent[-1], 2) if live_sent else None,
        "changed_first_slot_after_save_max_s": round(max(changed), 2) if changed else None,
        "changed_on_30s_grid": changed_ok, "changed": len(changed),
        "disabled_deleted_last_slot_after_save_max_s": round(max(silent), 2),
        "leader_stall_storm_max_s": round(stall, 3),
        "heartbeat_late_storm_max_s": round(hb_late, 3),
        "takeover_s": round(elected - killed[1], 2),
        "rescues_per_healthy_burst": rescues, "healthy_burst_sent": burst_sent,
        "sql_xacts_per_min_steady": round(sql_per_min), "leader_cpu_s_per_1000": round(
            cpu_per_1000, 2),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "logs": str(work / "beats.log"),
    }
    print(json.dumps(result, indent=1))
    with open(out, "a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
