""":mod:`tests.support.beatapp` with a ``slot_sent`` receiver that can hang beat's main loop.

``celery -A tests.support.stuckapp beat`` runs the same app; while the file named by
``LB_STUCK_FILE`` exists, the receiver of leaderbeat's ``slot_sent`` signal (called from
the main loop, after a slot went out) does not return. The process, its heartbeat and
its HTTP thread run on; only the main loop is stuck, as under a receiver that hangs on a
network call. Removing the file lets the loop go on.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery_leaderbeat import signals
from tests.support.beatapp import app, noop, record, sleepy  # noqa: F401 - the app and its tasks


def _hang_while_the_file_exists(sender: Any = None, **kwargs: Any) -> None:
    path = os.environ.get("LB_STUCK_FILE")
    while path and os.path.exists(path):
        time.sleep(0.05)


signals.slot_sent.connect(_hang_while_the_file_exists, weak=False)
