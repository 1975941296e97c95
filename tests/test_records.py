"""The guard's answers as every store builds them: known ones kept, an unknown one an error."""

from __future__ import annotations

import pytest

from celery_leaderbeat.errors import ScriptError
from celery_leaderbeat.store.records import DECISIONS, GuardDecision, guard_decision


@pytest.mark.parametrize("decision", sorted(DECISIONS))
def test_every_answer_of_a_guards_start_is_kept_with_its_reason_and_token(decision):
    assert guard_decision(decision, "why", 7) == GuardDecision(decision, "why", 7)


def test_an_answer_this_version_does_not_know_is_an_error_naming_it_not_a_skip():
    with pytest.raises(ScriptError, match=r"'skipped' \('held'\), not one of cancel, "
                                          r"duplicate, overlap, run, wait"):
        guard_decision("skipped", "held")
