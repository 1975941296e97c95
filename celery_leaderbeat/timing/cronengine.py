"""One cron engine for Celery ``crontab`` and our ``cron`` strings, with cron's DST rules.

Matching is done by croniter on *naive* wall-clock datetimes (croniter never sees a
time zone); this module maps each wall-clock match to real instants in the entry's
zone, following Vixie cron's and cronie's rules for fixed-time schedules
(``30 2 * * *``) and every-hour ones (``0 * * * *``); cron classifies a job by
whether its minute or hour field starts with ``*``, we by the hour field alone
(README.md, "DST rules", lists where that differs):

* A wall-clock time that occurs twice (fall-back) fires once, at its first
  occurrence, when the schedule has a fixed hour (its hour field is not all 24
  hours). A schedule whose hour field is every hour (``*``) fires on every real
  hour, so in both passes of the repeated hour.
* A wall-clock time that does not exist (spring-forward) fires once, at the first
  valid instant after the gap, for fixed-hour schedules (a daily 02:30 fires at
  03:00 in New York on the spring-forward day). Every-hour schedules just continue
  in real time: the missing wall-clock times produce nothing extra.

How ``next_after(t)`` stays cheap: with the UTC offset ``o`` at ``t``, the first
naive match ``m`` after ``t + o`` gives the candidate instant ``m - o``. Offsets only
change the answer through transitions within a few hours of ``t`` or of that
candidate (DST moves a clock by at most 3 hours), so the search walks from ``t`` one
constant-offset segment at a time, finds a transition exactly (by bisection on whole
seconds) only where one is that close, and jumps over long stretches, unless the
clock moved forward by more than 6 hours before the jump's end (a zone that skipped
a day, as Samoa did on 2011-12-30: its gap is then found and looked at). Assumption,
true of every IANA zone in use: at most one transition in any 12 hours.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone, tzinfo

from croniter import HOUR_FIELD, croniter

UTC = timezone.utc
_NEAR = timedelta(hours=6)  # more than any clock shift (3 h), so a fold or gap fits inside
_SECOND = timedelta(seconds=1)
_TINY = timedelta(microseconds=1)
_MAX_STEPS = 64
_MEMO = 512  # next_after answers kept per engine: a burst asks the same few instants

_shared: dict[tuple[object, ...], CronEngine] = {}
_shared_lock = threading.Lock()


def shared_engine(expr: str, tz: tzinfo, *, day_or: bool = True, hash_id: str | None = None,
                  second_at_beginning: bool = False) -> CronEngine:
    """The one engine of this expression in this zone, shared by every entry that has it.

    Entries on one schedule then share each next-fire computation (a burst of 10,000
    entries on one cron asks one engine the same instant 10,000 times: answered from
    its memo after the first).
    """
    key = (expr, tz, day_or, hash_id, second_at_beginning)
    engine = _shared.get(key)
    if engine is None:
        with _shared_lock:
            engine = _shared.get(key)
            if engine is None:
                engine = _shared[key] = CronEngine(expr, tz, day_or=day_or, hash_id=hash_id,
                                                   second_at_beginning=second_at_beginning)
    return engine


class CronEngine:
    """Next cron instant strictly after a UTC instant, in one zone, with cron's DST rules."""

    def __init__(
        self,
        expr: str,
        tz: tzinfo,
        *,
        day_or: bool = True,
        hash_id: str | None = None,
        second_at_beginning: bool = False,
    ) -> None:
        self.expr = expr
        self.tz = tz
        seed = None if hash_id is None else hash_id.encode()  # croniter.expand() wants bytes
        self._iter = croniter(
            expr,
            datetime(2000, 1, 1),
            ret_type=datetime,
            day_or=day_or,
            hash_id=seed,
            second_at_beginning=second_at_beginning,
        )
        hours = croniter.expand(
            expr, hash_id=seed, second_at_beginning=second_at_beginning
        )[0][HOUR_FIELD]
        self.fixed_hour = not (hours == ["*"] or set(hours) >= set(range(24)))
        self._lock = threading.Lock()
        self._memo: dict[datetime, datetime] = {}

    # -- wall clock -------------------------------------------------------------

    def _offset(self, instant: datetime) -> timedelta:
        offset = instant.astimezone(self.tz).utcoffset()
        assert offset is not None
        return offset

    def _match(self, naive: datetime, inclusive: bool) -> datetime:
        """The first naive wall-clock match after ``naive`` (or at it, when inclusive)."""
        with self._lock:
            self._iter.set_current(naive - _TINY if inclusive else naive, force=True)
            result: datetime = self._iter.get_next(datetime)
        return result

    def _transition(self, lo: datetime, hi: datetime) -> datetime:
        """The first instant in (lo, hi] whose offset differs from lo's (one must exist)."""
        base = self._offset(lo)
        lo_s = int(lo.timestamp() // 1)
        hi_s = int(-(-hi.timestamp() // 1))
        while hi_s - lo_s > 1:
            mid = (lo_s + hi_s) // 2
            if self._offset(datetime.fromtimestamp(mid, UTC)) == base:
                lo_s = mid
            else:
                hi_s = mid
        return datetime.fromtimestamp(hi_s, UTC)

    def _fall_back_end(self, s: datetime, offset: timedelta) -> datetime | None:
        """If ``s`` is in the second pass of a repeated hour, the wall time where it ends."""
        before = s - _NEAR
        prev = self._offset(before)
        if prev <= offset:
            return None
        at = self._transition(before, s)
        end = (at + prev).replace(tzinfo=None)  # naive wall time where the repeat ends
        return end

    def _leap(self, s: datetime, offset: timedelta, candidate: datetime) -> tuple[datetime, bool]:
        """Where the search goes on from ``s`` when the candidate is far: (instant, True
        when it is a transition whose gap must be looked at)."""
        if self._offset(s + _NEAR) != offset:
            return self._transition(s, s + _NEAR), True
        jump = candidate - 2 * _NEAR
        if self._offset(jump) - offset <= _NEAR:
            # No transition near s, and none before the jump moves the wall clock past
            # the match: only a transition near the candidate can matter.
            return jump, False
        # The clock moved forward by more than any DST shift (Samoa skipped 2011-12-30):
        # the match may be in that gap, which jumping would step over.
        return self._transition(s, jump), True

    # -- the search -------------------------------------------------------------

    def next_after(self, t: datetime) -> datetime:
        """The first instant strictly after ``t`` (aware) at which the schedule fires, in UTC.

        Answers are remembered (a pure function of ``t``): entries sharing this engine
        ask for the same instants.
        """
        # Keyed by the UTC instant: two aware datetimes of one zone compare and hash by
        # wall time, ignoring fold, so 01:00 EDT and 01:00 EST would share one answer.
        instant = t.astimezone(UTC)
        found = self._memo.get(instant)
        if found is None:
            found = self._search(instant)
            if len(self._memo) >= _MEMO:
                self._memo.clear()
            self._memo[instant] = found
        return found

    def _search(self, t: datetime) -> datetime:
        s, inclusive = t.astimezone(UTC), False
        for _ in range(_MAX_STEPS):
            offset = self._offset(s)
            start = (s + offset).replace(tzinfo=None)
            if self.fixed_hour:
                end = self._fall_back_end(s, offset)
                if end is not None and start < end:
                    # Second pass of a repeated hour: fixed-hour schedules already fired.
                    start, inclusive = end, True
            match = self._match(start, inclusive)
            candidate = (match - offset).replace(tzinfo=UTC)
            if candidate - s > 2 * _NEAR:
                boundary, at_transition = self._leap(s, offset, candidate)
                if not at_transition:
                    s, inclusive = boundary, False
                    continue
            elif self._offset(candidate) == offset:
                return candidate
            else:
                boundary = self._transition(s, candidate)
            after = self._offset(boundary)
            gap_end = (boundary + after).replace(tzinfo=None)
            if after > offset and self.fixed_hour and match < gap_end:
                # The match does not exist on this day: fire at the first instant after the gap.
                return boundary
            s, inclusive = boundary, True
        raise RuntimeError(f"cron {self.expr!r}: no next time found after {t.isoformat()}")
