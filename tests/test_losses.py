"""Loss detection is an optional store capability; the roles' side of it is one object.

A store declares the capability by its ``loss`` (store/base.py); ``Losses``
(roles/loss.py) asks it, and with a store that has none it asks nothing and
reports nothing. The in-memory store here is a real one (the reference
implementation): what a node reports is what the store then answers.
"""

from __future__ import annotations

from types import SimpleNamespace

from celery_leaderbeat.config import Config
from celery_leaderbeat.roles.loss import Losses
from celery_leaderbeat.roles.memory import SentMemory
from celery_leaderbeat.store.base import loss_detection
from celery_leaderbeat.store.memory import MemoryStore
from celery_leaderbeat.store.memory_state import MemoryState
from celery_leaderbeat.store.types import SlotState, SlotStatus


def _store(node: str = "a") -> tuple[MemoryStore, Config]:
    config = Config.from_values({"redis_url": "memory://", "key_prefix": "lb",
                                 "node_id": node})
    return MemoryStore(MemoryState(), config, "lb"), config


def _behind() -> tuple[dict[str, SlotState], SentMemory]:
    """A stored slot older than one this node sent: the store lost writes."""
    memory = SentMemory()
    memory.note("e", 5000)
    return {"e": SlotState(1000, 1, SlotStatus.SENT)}, memory


def test_a_store_declares_loss_detection_by_its_loss_and_one_without_has_none():
    store, _ = _store()
    assert loss_detection(store) is store.loss
    bare = SimpleNamespace(lease=store.lease, ledger=store.ledger)  # no ``loss``
    assert loss_detection(bare) is None


def test_a_node_reports_a_stored_slot_behind_its_memory_to_a_store_that_detects_losses():
    store, config = _store()
    losses = Losses(config, loss_detection(store))
    stored, memory = _behind()
    losses.report_behind(stored, ["e"], memory)
    assert store.loss.lost_reports() == {"e": 5000}


def test_without_loss_detection_a_node_reports_nothing_and_reads_no_loss():
    store, config = _store()
    losses = Losses(config)  # the store's detection not handed over: none at all
    stored, memory = _behind()
    losses.report_behind(stored, ["e"], memory)
    losses.report({"e": 5000})
    losses.check_generation("a|1", 1)  # no lease held: a store's check would refuse it
    assert losses.lost_at() is None
    assert store.loss.lost_reports() == {}
