"""Test harness for celery_leaderbeat: real Redis servers, a TCP proxy, real beat processes.

- :mod:`tests.support.redis_server`: ``RedisServer``, ``find_redis_server``.
- :mod:`tests.support.proxy`: ``TcpProxy`` (forward / drop / blackhole / delay).
- :mod:`tests.support.beat`: ``BeatProcess``, ``BeatCluster``, ``beat_env``.
- :mod:`tests.support.recorder`: ``Recorder``, ``Message``, ``duplicates``, ``slots_by_entry``.
- :mod:`tests.support.beatapp`: the env-configured Celery app the beats run.
"""
