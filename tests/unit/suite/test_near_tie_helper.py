"""The near-tie comparison of greedy runs (tests/support/helpers.py ``ForceReference``), on made-up rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.support.helpers import ForceReference

REFERENCE = {"r": [5, 6, 7, 8]}
# The reference run's best logits per position: position 1 was a near-tie between 6 and 9 (0.2 apart),
# position 2 was clear (7 leads 3 by 4.0).
ROWS = {"r": [{5: 10.0, 1: 2.0}, {6: 10.0, 9: 9.8}, {7: 10.0, 3: 6.0}, {8: 10.0, 2: 1.0}]}


def step(force: ForceReference, position: int, best: int) -> int:
    """One sampled row whose best token is ``best``; returns the token greedy sampling then takes."""
    row = np.zeros(12, dtype=np.float32)
    row[best] = 1.0
    logits = row[None, :]
    force([SimpleNamespace(request_id="r", num_generated=position)], logits)
    return int(np.argmax(logits[0]))


def test_identical_runs_compare_every_token() -> None:
    force = ForceReference(REFERENCE, ROWS)
    assert [step(force, k, t) for k, t in enumerate(REFERENCE["r"])] == REFERENCE["r"]
    assert force.near_ties == [] and force.divergences == [] and force.compared == {"r": 4}
    force.check()


def test_a_near_tie_is_forced_to_the_reference_and_the_rest_is_still_compared() -> None:
    force = ForceReference(REFERENCE, ROWS)
    taken = [step(force, 0, 5), step(force, 1, 9), step(force, 2, 7), step(force, 3, 8)]
    assert taken == REFERENCE["r"]  # 9 at the near-tie became the reference's 6
    assert force.near_ties == [("r", 1, 6, 9)] and force.divergences == []
    force.check()


def test_a_divergence_after_a_near_tie_is_caught() -> None:
    force = ForceReference(REFERENCE, ROWS)
    for k, best in enumerate([5, 9, 3, 8]):  # the near-tie at 1, then a clear-cut difference at 2
        step(force, k, best)
    assert force.near_ties == [("r", 1, 6, 9)] and force.divergences == [("r", 2, 7, 3)]
    with pytest.raises(AssertionError, match=r"\('r', 2, 7, 3\)"):
        force.check()


def test_a_run_that_stopped_early_fails_a_complete_check_only() -> None:
    force = ForceReference(REFERENCE, ROWS)
    step(force, 0, 5)
    force.check(complete=False)
    with pytest.raises(AssertionError):
        force.check()
