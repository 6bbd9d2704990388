"""The step clock charges each lap to its phase, and nothing outside a step."""

from __future__ import annotations

import pytest

from service.observability import step_clock
from service.observability.step_clock import PHASES, StepClock


def test_laps_charge_the_time_since_the_previous_lap_to_their_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(step_clock.time, "perf_counter", lambda: now[0])
    clock = StepClock()
    now[0] += 1.0
    clock.lap("plan")  # outside a step: not charged
    clock.start()
    now[0] += 0.25
    clock.lap("plan")
    clock.lap("batch")
    now[0] += 2.0
    clock.lap("decode")
    clock.stop()
    now[0] += 5.0
    clock.lap("emit")  # after the step: not charged
    t = clock.snapshot()
    assert t.steps == 1
    assert t.seconds == {**dict.fromkeys(PHASES, 0.0), "plan": 0.25, "decode": 2.0}
