"""Chaos suite: N real beats, seeded random faults, exactly-once verdict.

- :mod:`.harness`: :class:`ChaosRun` (servers, proxies, beats, monitor,
  fault injector) and :func:`verdict` (duplicates, explained misses, failover).
- :mod:`.test_chaos`: a short run in the default test command (``slow``), and
  a soak enabled by ``LEADERBEAT_SOAK=<seconds>``.

Replay a run with ``LEADERBEAT_CHAOS_SEED=<seed>``.
"""
