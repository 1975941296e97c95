"""A controllable clock for in-process nodes, and Redis key expiry that follows it.

How time works in these tests:

- Every ``celery_leaderbeat`` module reads time through its module-level ``time``
  name (``time.time()``, ``time.monotonic()``); :func:`install_clock` replaces that
  name in each module with :class:`FakeTime`, which answers from one shared
  :class:`FakeClock` and passes everything else to the real ``time`` module.
  ``Lease`` binds ``time.monotonic`` as a default argument when the module is
  imported, so the harness also sets ``lease.clock`` on every lease it builds.
- Virtual time only moves when the test calls :meth:`FakeClock.advance`: a
  scenario is a sequence of ticks at chosen virtual times, the same on every
  replay, however loaded the machine is.
- Redis runs in real time. Two things there depend on its clock:
  * key expiry (the lease's PX ttl, the guard's keys): :class:`RedisExpiry`
    keeps every ttl under the test's key prefix in virtual time, so a lease
    expires in Redis when the virtual clock says it does, on every replay;
  * ``TIME`` (skew measurement, and rescue.lua's "rescue only once Redis TIME >=
    fire time + rescue_after"): the virtual wall clock starts
    :data:`BEHIND_REDIS` seconds behind the real one and runs faster than it, so
    it stays behind Redis for the length of any scenario. Redis therefore always
    finds a rescue late enough: the standby's own rescue_after wait (virtual) is
    what times rescues here, and nodes are configured with a ``max_clock_skew``
    larger than the offset. The skew checks are not what these tests test.
"""

from __future__ import annotations

import sys
import time as _real_time
from typing import Any

import redis

#: seconds the virtual wall clock starts behind Redis TIME (see the module docstring)
BEHIND_REDIS = 3600.0  # at least; START rounds down to the hour

#: a ``leaderbeat_max_clock_skew`` that tolerates :data:`BEHIND_REDIS` for a day of virtual time
SKEW_TOLERANCE = 2 * BEHIND_REDIS + 86400.0


#: where every FakeClock starts, fixed once per process so replays see the same slot times:
#: a whole hour (slots of round intervals fall on round virtual times), 1-2 h behind Redis
START = float(int(_real_time.time() - BEHIND_REDIS) // 3600 * 3600)


class FakeClock:
    """One virtual clock: ``time()`` (wall, epoch seconds) and ``monotonic()`` move together."""

    def __init__(self, wall: float | None = None) -> None:
        self._wall0 = START if wall is None else wall
        self._mono0 = 1000.0
        self.elapsed = 0.0
        self.listeners: list[Any] = []  # called with each advance, e.g. RedisExpiry.advance

    def time(self) -> float:
        return self._wall0 + self.elapsed

    def monotonic(self) -> float:
        return self._mono0 + self.elapsed

    def advance(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self.elapsed = round(self.elapsed + seconds, 6)
        for listener in self.listeners:
            listener(seconds)


class FakeTime:
    """Stands in for the ``time`` module inside ``celery_leaderbeat`` modules."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def time(self) -> float:
        return self._clock.time()

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def sleep(self, seconds: float) -> None:
        self._clock.advance(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)


def install_clock(monkeypatch: Any, clock: FakeClock) -> list[str]:
    """Point the ``time`` name of every loaded ``celery_leaderbeat`` module at ``clock``."""
    import celery_leaderbeat  # noqa: F401  (its modules must be loaded first)
    from celery_leaderbeat import scheduler  # noqa: F401
    from celery_leaderbeat.roles import (  # noqa: F401
        agenda,
        batch,
        degraded,
        leader,
        shared,
        standby,
    )
    from celery_leaderbeat.store import lease, ledger, registry  # noqa: F401

    fake = FakeTime(clock)
    patched = []
    for name, module in sorted(sys.modules.items()):
        if name.startswith("celery_leaderbeat") and getattr(module, "time", None) is _real_time:
            monkeypatch.setattr(module, "time", fake)
            patched.append(name)
    return patched


_ADVANCE = """
local now, prev, cushion, side = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
for _, key in ipairs(redis.call('KEYS', ARGV[1])) do
  local left = redis.call('PTTL', key)
  if left > 0 then
    local deadline
    if left > cushion / 2 then
      deadline = tonumber(redis.call('HGET', side, key) or now)
    else
      deadline = prev + math.ceil(left / 1000) * 1000
    end
    if deadline <= now then
      redis.call('DEL', key)
      redis.call('HDEL', side, key)
    else
      redis.call('PEXPIRE', key, deadline - now + cushion)
      redis.call('HSET', side, key, deadline)
    end
  end
end
return 0
"""


class RedisExpiry:
    """Makes Redis key expiry follow the virtual clock for keys matching ``pattern``.

    Registered as a clock listener. Redis itself counts ttls in real time, and a
    scenario's virtual seconds pass in milliseconds of real time (or, on a loaded
    machine, the other way round), so Redis must never expire a key by itself:
    at each virtual advance one script call (on the test's own client, outside
    the fault seam) gives every key with a ttl its *virtual* deadline, kept in a
    side hash, and a real ttl of that plus :data:`CUSHION_MS`. A ttl the code
    set since the last advance (at most a lease ttl, far below the cushion) was
    set at the previous virtual time, so its deadline is that time plus the ttl
    rounded up to whole seconds: the real time it already drained (up to a second
    on a loaded machine) is put back. The harness's nodes use whole-second ttls
    (Celery's defaults: lease ttl 10 s, guard ttls in seconds). A key
    whose virtual deadline has come is deleted, as Redis would have: the same
    keys expire at the same virtual times on every replay.
    """

    #: real ms added to every virtual ttl so that Redis never expires a key by itself
    CUSHION_MS = 10 ** 9

    def __init__(self, client: redis.Redis, pattern: str, clock: FakeClock) -> None:
        self.client = client
        self.pattern = pattern
        self.clock = clock
        self.side = f"vexp:{pattern}"  # does not match the pattern
        self._script = client.register_script(_ADVANCE)
        self._prev_ms = self._now_ms()

    def _now_ms(self) -> int:
        return round(self.clock.time() * 1000)

    def __call__(self, seconds: float) -> None:
        now = self._now_ms()
        try:
            self._script(args=[self.pattern, now, self._prev_ms, self.CUSHION_MS, self.side])
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # Redis is down: nothing in it expires
        self._prev_ms = now

    def virtual_pttl(self, key: bytes | str) -> int:
        """The ms ``key`` has left in virtual time (-1: no ttl, -2: no key)."""
        left = int(self.client.pttl(key))
        if left <= self.CUSHION_MS // 2:
            return left
        deadline = self.client.hget(self.side, key)
        return int(deadline) - self._now_ms() if deadline is not None else -1


_AGE = """
local val = redis.call('GET', KEYS[1])
if not val then return 0 end
local now, half = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local written = tonumber(redis.call('HGET', KEYS[2], 'written') or now)
if redis.call('HGET', KEYS[2], 'value') ~= val then
  written = now
  redis.call('HSET', KEYS[2], 'written', now)
end
local aged = real - (now - written) - half
redis.call('SET', KEYS[1], aged, 'KEEPTTL')
redis.call('HSET', KEYS[2], 'value', tostring(aged))
return 1
"""


class RedisTimeValue:
    """Keeps a key that holds a Redis ``TIME`` (ms) aged in virtual time.

    lead.lua stores the leader's latest claim as Redis TIME and a rescue asks how
    recent it is by Redis TIME: real milliseconds, while the scenario's seconds are
    virtual. Called just before and just after every claim call (the only writer
    and reader), this rewrites the value as "now by Redis TIME minus the virtual
    time since it was written, minus half a step": the rescue then sees the
    virtual age (half a step older, so a comparison never falls on a step's edge),
    whatever the real time a round took.
    """

    def __init__(self, client: redis.Redis, key: str, clock: FakeClock, step: Any) -> None:
        self.client = client
        self.keys = [key, f"vtime:{key}"]
        self.clock = clock
        self.step = step  # a callable: the harness's current step, in seconds
        self._script = client.register_script(_AGE)

    def __call__(self) -> None:
        now = round(self.clock.time() * 1000)
        try:
            self._script(keys=self.keys, args=[now, int(self.step() * 500)])
        except (redis.ConnectionError, redis.TimeoutError):
            pass
