"""Redis restored from a snapshot that still holds the leader's lease: the leader carries on.

Real ``celery beat`` processes with Celery's and leaderbeat's defaults (300 s beat
loop, 10 s lease), ten entries every second, the broker a second Redis drained
every 20 ms (the harness of ``test_restore_election.py``). The snapshot is taken
and Redis is put back to it two seconds later, well within the lease ttl, so
the leader key comes back holding the leader's own token: nobody is elected.
The leader's next claim finds the generation counter lower than it has seen;
it led all along (its lease was proved every renewal, nothing of its was late),
so it writes back the newest slot of each entry it sent and carries on, on the
same phase, with no margin: no slot recorded ``missed``, none sent twice, none
left out.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import datetime
from itertools import pairwise

import pytest

from tests.test_restore_election import (
    events_since,
    leader_pid,
    put_back,
    sender,
    take_snapshot,
    three_beats_sending,
)

pytestmark = pytest.mark.slow

REPEATS = {"reload": 3, "restart": 2}
#: seconds between the snapshot and the restore: the lease in it is still valid
SNAPSHOT_AGE = 2.0


def slots_by_entry(messages) -> dict[str, list[datetime]]:
    out: dict[str, list[datetime]] = defaultdict(list)
    for m in messages:
        out[m.entry].append(datetime.fromisoformat(str(m.slot)))
    return out


@pytest.mark.parametrize("how", ["reload", "restart"])
def test_redis_restored_from_a_snapshot_holding_the_leaders_lease_the_leader_carries_on(
        tmp_path, make_redis_server, key_prefix, how):
    snapshot = tmp_path / "snapshot.rdb"
    measured = []
    with three_beats_sending(tmp_path, make_redis_server, key_prefix) as (state, recorder,
                                                                         cluster):
        for _ in range(REPEATS[how]):
            time.sleep(2)
            led = leader_pid(state.client(), key_prefix)
            take_snapshot(state, snapshot)
            time.sleep(SNAPSHOT_AGE)
            assert leader_pid(state.client(), key_prefix) == led
            up = put_back(state, snapshot, how)
            assert leader_pid(state.client(), key_prefix) == led  # the lease came back
            time.sleep(6)
            events = events_since(state.client(), key_prefix, up - 0.5)
            elected = [e for e in events if e["event"] == "elected"]
            missed = [e for e in events if e["event"] == "missed"]
            messages = list(recorder.messages)
            first = next((m for m in messages if m.received > up), None)
            measured.append((first.received - up if first else None, len(missed)))
            assert elected == [], elected
            assert first is not None and sender(first) == led, (first, led)
            # the leader notices at its next claim (a slot every second) and carries on
            # at once; one that started every entry again would wait the margin (2 s)
            assert first.received - up < 1.5, measured
            assert missed == [], missed
            by_entry = slots_by_entry(messages)
            for name, slots in by_entry.items():
                twice = sorted({s for s in slots if slots.count(s) > 1})
                assert twice == [], (name, twice)
                # none left out around the restore: every second, sent
                recent = sorted(s for s in slots if s.timestamp() > up - 8)
                gaps = [(a, b) for a, b in pairwise(recent)
                        if (b - a).total_seconds() != 1.0]
                assert gaps == [], (name, gaps)
            assert all(b.alive for b in cluster)
    print(f"{how}: (first send s after Redis answered, missed) "
          + ", ".join(f"({f:.2f}, {n})" for f, n in measured))
