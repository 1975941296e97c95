"""Signals, Celery-style, for alerting on what the beats do (Slack, Sentry, pagers).

    from celery_leaderbeat import signals

    @signals.leader_elected.connect
    def on_elected(sender, node_id, epoch, **kwargs):
        notify(f"{node_id} leads beat (epoch {epoch})")

``sender`` is the Scheduler. A receiver that raises is logged and never breaks
the tick (Celery's dispatcher catches it; :func:`send` guards once more).

- ``leader_elected(node_id, epoch)``: this process now leads.
- ``leader_lost(node_id, epoch, reason)``: this process stopped leading.
- ``slot_sent(entry, slot, task_id, epoch, rescued)``: a slot was published
  (``rescued``: by a standby; ``epoch`` is then 0).
- ``slot_missed(entry, slot, reason)``: a slot passed over by the catch-up policy.
- ``slot_skipped(entry, slot, reason)``: not sent on purpose (``paused``, claimed
  by another node, ...).
"""

from __future__ import annotations

import logging
from typing import Any

from celery.utils.dispatch import Signal

logger = logging.getLogger(__name__)

leader_elected = Signal(name="leader_elected", providing_args={"node_id", "epoch"})
leader_lost = Signal(name="leader_lost", providing_args={"node_id", "epoch", "reason"})
slot_sent = Signal(name="slot_sent",
                   providing_args={"entry", "slot", "task_id", "epoch", "rescued"})
slot_missed = Signal(name="slot_missed", providing_args={"entry", "slot", "reason"})
slot_skipped = Signal(name="slot_skipped", providing_args={"entry", "slot", "reason"})


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` when anyone listens; nothing a receiver does can stop the caller."""
    if not signal.receivers:
        return
    try:
        signal.send(sender=sender, **kwargs)
    except Exception:
        logger.exception("leaderbeat: a %s receiver failed", signal.name)
