"""Chaos: N real beats under seeded random faults; zero duplicates, every miss explained.

- ``test_chaos_short``: about 60 s, 3 beats, one "bag" of faults (every kind once,
  SIGTERM twice: a standby and the leader); part of the default test command (``slow``).
- ``test_chaos_soak``: ``LEADERBEAT_SOAK=<seconds>`` of chaos (skipped otherwise) with
  5 beats, 3 prefork workers (``acks_late``, ``leaderbeat_guard = True``), RabbitMQ,
  about 219 entries, default settings (lease ttl 10 s), every fault kind, one every
  5-7 s; it also fails on a slot executed twice. ``python bench/soak.py --workers 3
  --broker amqp --guard`` runs the same outside pytest.
- ``test_chaos_soak_postgres``: ``LEADERBEAT_PG_SOAK=<seconds>`` of the same on RabbitMQ and
  PostgreSQL (no Redis process), 2 workers, the PostgreSQL faults (``tests/chaos/pgrun.py``);
  ``python bench/soak.py --store postgres --workers 2 --broker amqp --guard`` outside pytest.

Every run prints its seed first and its summary last (to the terminal, not captured);
replay one with ``LEADERBEAT_CHAOS_SEED=<seed>``. Logs, the fault list, the copied
history and the leader-key timeline stay in the test's ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.support.rabbitmq import require_rabbitmq

from .amqp import AMQP_URL
from .harness import PG_SOAK_KINDS, SOAK_KINDS, ChaosRun, seed_from_env
from .pgrun import PgChaosRun
from .soakschedule import soak_schedule

SHORT_FAULTS = 7  # one bag: every kind of FAULT_KINDS once, term_node twice
SHORT_CHAOS_SECONDS = 70.0  # a safety cap; the bag takes about 45 s


def run_chaos(tmp_path, capsys, *, nodes: int, duration: float, max_faults: int | None = None,
              runner: type[ChaosRun] = ChaosRun, **options):
    seed = seed_from_env(os.environ)
    with capsys.disabled():
        print(f"\nchaos seed={seed} (replay: LEADERBEAT_CHAOS_SEED={seed})", flush=True)
    lines: list[str] = []
    options.setdefault("gap", (1.5, 4.0))
    run = runner(tmp_path / "chaos", seed=seed, nodes=nodes, duration=duration,
                 max_faults=max_faults, log=lines.append, **options)
    report = run.run()
    with capsys.disabled():
        print(report.summary(), flush=True)
    print("\n".join(lines))  # captured: shown with a failure
    if not report.ok:  # pytest keeps only the last few tmp dirs: keep the evidence
        kept = tempfile.mkdtemp(prefix=f"leaderbeat-chaos-{seed}-")
        shutil.copytree(run.workdir, kept, dirs_exist_ok=True)
        report.info.append(f"logs kept in {kept}")
        with capsys.disabled():
            print(f"chaos seed={seed} FAILED: logs kept in {kept}", flush=True)
    assert report.ok, f"chaos run FAILED; replay with LEADERBEAT_CHAOS_SEED={seed}\n" \
                      f"{report.failure_text()}"
    return report


@pytest.mark.slow
@pytest.mark.xdist_group("heavy")  # CPU-heavy: never beside another heavy test
def test_chaos_short(tmp_path, capsys):
    run_chaos(tmp_path, capsys, nodes=3, duration=SHORT_CHAOS_SECONDS, max_faults=SHORT_FAULTS)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("LEADERBEAT_SOAK"),
                    reason="set LEADERBEAT_SOAK=<seconds> for the chaos soak")
def test_chaos_soak(tmp_path, capsys):
    require_rabbitmq(AMQP_URL)
    run_chaos(tmp_path, capsys, nodes=5, duration=float(os.environ["LEADERBEAT_SOAK"]),
              workers=3, broker="amqp", guard=True, schedule=soak_schedule(), settings={},
              kinds=SOAK_KINDS, gap=(5.0, 7.0), steady=25.0)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("LEADERBEAT_PG_SOAK"),
                    reason="set LEADERBEAT_PG_SOAK=<seconds> for the PostgreSQL chaos soak")
def test_chaos_soak_postgres(tmp_path, capsys):
    require_rabbitmq(AMQP_URL)
    run_chaos(tmp_path, capsys, nodes=5, duration=float(os.environ["LEADERBEAT_PG_SOAK"]),
              runner=PgChaosRun, workers=2, broker="amqp", guard=True,
              schedule=soak_schedule(), settings={}, kinds=PG_SOAK_KINDS, gap=(5.0, 7.0),
              steady=25.0)
