"""What this process tells the outside: signals and metrics, from one place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import signals
from ..store.types import Event
from ..timing.slots import from_ms, slot_id
from .health import Health
from .metrics import Metrics, NullMetrics, SendPath
from .metrics import start as start_metrics

_SLOT_SIGNALS = {"sent": signals.slot_sent, "missed": signals.slot_missed,
                 "skipped": signals.slot_skipped}


class Telemetry:
    """Signals (sender: the Scheduler) and metrics (when a port is set) of one beat process."""

    def __init__(self, sender: Any, prefix: str) -> None:
        self.sender = sender
        self.prefix = prefix
        self.metrics: NullMetrics = NullMetrics()

    def serve(self, port: int | None, health: Health | None = None,
              send_path: SendPath | None = None) -> bool:
        """Start serving ``/metrics`` (and ``health``'s probes) once; True when it started now."""
        if port is None or isinstance(self.metrics, Metrics):
            return False
        self.metrics = start_metrics(port, health, send_path)
        return True

    def elected(self, node_id: str, epoch: int | None) -> None:
        self.metrics.leading(True, epoch)
        self.metrics.leadership_changed()
        signals.send(signals.leader_elected, self.sender, node_id=node_id, epoch=epoch)

    def lost(self, node_id: str, epoch: int | None, why: str) -> None:
        self.metrics.leading(False, None)
        self.metrics.leadership_changed()
        signals.send(signals.leader_lost, self.sender, node_id=node_id, epoch=epoch, reason=why)

    def slots(self, events: Sequence[Event], entries: int, epoch: Callable[[], int | None]
              ) -> None:
        """What became of slots: counted, and told to signal receivers."""
        if not events:
            return
        self.metrics.slots(events, entries)
        if not any(signal.receivers for signal in _SLOT_SIGNALS.values()):
            return
        for ev in events:
            signal = _SLOT_SIGNALS.get(ev.event)
            if signal is None:
                continue
            slot = from_ms(ev.slot_ms)
            if ev.event == "sent":
                rescued = ev.detail == "rescued"
                signals.send(signal, self.sender, entry=ev.name, slot=slot,
                             task_id=slot_id(self.prefix, ev.name, slot),
                             epoch=0 if rescued else epoch(), rescued=rescued)
            else:
                signals.send(signal, self.sender, entry=ev.name, slot=slot, reason=ev.detail)
