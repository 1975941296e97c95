"""The sweep's scenario: 3 nodes, a burst of 200 entries, a crash, rescues, a handover.

Virtual timeline (every entry runs every 4 s on one phase; default lease ttl
10 s, rescue_after 2 s, standby_poll 1 s; every node ticks every 0.2 s):

- 0 s: nodes a, b, c start; a leads and anchors the 200 entries 5 s ahead
  (their slots fall at 9.1 s, 13.1 s, ...);
- 10.4 s: the leader (a) crashes after its first burst; b and c rescue the
  bursts due meanwhile, 2 s late, until a's lease expires and b is elected;
- 24.4 s: a starts again, as a standby;
- 28.4 s: the leader shuts down gracefully (releases): another takes over at once;
- 36.4 s: the faults stop (the seam is switched off); 12 s more let every node
  settle, then the invariants are checked up to 3 s before the end.

:func:`play` runs it on a :class:`Sim` whose seam may carry a fault plan; the
same calls come in the same order on every replay up to the first fault.
"""

from __future__ import annotations

from typing import Any

from .sim import TASK, Sim

ENTRIES = 200
INTERVAL = 4.0
NODES = ("a", "b", "c")
#: virtual seconds between two rounds of ticks
STEP = 0.2
#: virtual seconds after the last fault during which nothing is injected
SETTLE = 12.0
#: the invariants are checked up to this many seconds before the end
HORIZON_MARGIN = 3.0


def schedule() -> dict[str, dict[str, Any]]:
    return {f"e{i:03d}": {"task": TASK, "schedule": INTERVAL} for i in range(ENTRIES)}


def intervals() -> dict[str, float]:
    return {name: INTERVAL for name in schedule()}


def play(sim: Sim) -> None:
    """Run the scenario, then settle with the seam off."""
    sim.step_seconds = STEP
    for node_id in NODES:
        sim.start(node_id)
    sim.run(10.4)
    _crash_leader(sim)
    sim.run(14)
    if "a" not in sim.nodes:
        sim.start("a")
    sim.run(4)
    leader = sim.leader()
    if leader is not None:
        sim.stop(leader)
    sim.run(8)
    sim.seam.enabled = False
    for node_id in NODES:  # a node the faults made exit comes back, as a supervisor would
        if node_id not in sim.nodes:
            sim.start(node_id)
    sim.run(SETTLE)


def _crash_leader(sim: Sim) -> None:
    leader = sim.leader()
    if leader is not None:
        sim.crash(leader)


def check(sim: Sim) -> list[str]:
    """I1 and I2 (see :mod:`tests.faults.invariants`) for a finished :func:`play`."""
    horizon = int((sim.clock.time() - HORIZON_MARGIN) * 1000)
    return sim.violations(intervals(), horizon)
