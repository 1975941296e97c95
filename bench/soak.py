"""Chaos soak outside pytest: N beats under seeded random faults, then the verdict.

    python bench/soak.py --seconds 300 --nodes 5 [--seed 1234] [--workdir DIR]

The same code as ``tests/chaos`` (``LEADERBEAT_SOAK=300 python -m pytest
tests/chaos -k soak`` is equivalent). Prints the seed first, every fault as it
happens, the summary at the end; exits 1 when the verdict fails. Logs, the
fault list (chaos-report.json), the copied history and the leader-key timeline
stay in the work directory (kept, and printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.harness import ChaosRun, seed_from_env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float,
                        default=float(os.environ.get("LEADERBEAT_SOAK") or 300))
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None,
                        help="default: LEADERBEAT_CHAOS_SEED, else random")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else seed_from_env(os.environ)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"lb-soak-{seed}-"))
    print(f"chaos seed={seed} (replay: --seed {seed} or LEADERBEAT_CHAOS_SEED={seed})",
          flush=True)
    report = ChaosRun(workdir, seed=seed, nodes=args.nodes, duration=args.seconds,
                      log=lambda line: print(line, flush=True)).run()
    if not report.ok:
        print(report.failure_text(), flush=True)
    print(f"work directory: {workdir}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
