"""Chaos suite: N real beats, seeded random faults, exactly-once verdict.

- :mod:`.harness`: :class:`ChaosRun` (servers, proxies, beats, monitor,
  fault injector) and :func:`verdict` (duplicates, explained misses, failover).
- :mod:`.test_chaos`: a short run in the default test command (``slow``), and
  a soak enabled by ``LEADERBEAT_SOAK=<seconds>``.
- the soak's parts: :mod:`.amqp` (RabbitMQ topology of the run's own, a consumer
  recording every publish), :mod:`.soaktask` (the task recording each execution),
  :mod:`.soakschedule` (about 219 entries), :mod:`.figures` (published more than
  once, executed twice, lateness).
- :mod:`.pgrun`: the soak on RabbitMQ and PostgreSQL (no Redis process): a cluster of the
  run's own as the store, and its faults (stopped, crashed, sessions ended, frozen).

Replay a run with ``LEADERBEAT_CHAOS_SEED=<seed>``.
"""
