"""Switching compute threads on a live context (real model): same tokens, and the server wires it."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest

from service.assembly import build_engine
from service.model.runner import ModelRunner
from tests.support.helpers import req, run_stream
from tests.support.server import DEFAULT_MODEL, RunningServer, server_config

pytestmark = pytest.mark.model


def _greedy(
    runner: ModelRunner, ids: list[int], steps: int, threads: list[int]
) -> tuple[list[int], list[Any]]:
    """Greedy decode on lane 0, switching to ``threads[i % len]`` before each step."""
    runner.clear_kv()
    n = len(ids)
    out, rows = [], []
    tok_arr, pos = np.asarray(ids), np.arange(n)
    want = np.r_[np.zeros(n - 1), 1]
    for i in range(steps):
        runner.set_threads(threads[i % len(threads)])
        logits = runner.decode(tok_arr, pos, np.zeros(len(tok_arr)), want)
        rows.append(logits[0].copy())
        out.append(int(np.argmax(logits[0])))
        tok_arr, pos, want = np.asarray([out[-1]]), np.asarray([n + i]), np.ones(1)
    return out, rows


def test_switching_threads_between_steps_keeps_greedy_tokens_and_logits() -> None:
    runner = ModelRunner(DEFAULT_MODEL, n_ctx=512, step_tokens=64, n_lanes=2, n_threads=2)
    try:
        ids = runner.vocab.tokenize("The capital of France is Paris. The capital of Italy is")
        fixed, fixed_rows = _greedy(runner, ids, 12, [2])
        switching, switching_rows = _greedy(runner, ids, 12, [1, 2, 2, 1])
        assert runner.n_threads == 1
    finally:
        runner.close()
    assert switching == fixed
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(fixed_rows, switching_rows, strict=True))
    assert worst < 1e-3, f"logits moved by {worst} when the thread count changed"


def test_adaptive_threads_are_built_only_when_asked_and_with_more_than_one_thread() -> None:
    for overrides, wanted in (
        ({}, True),
        ({"adaptive_threads": False, "batch_rows_with_interactive": 8}, False),
        ({"threads": 1}, False),
    ):
        engine = build_engine(server_config(**overrides))
        try:
            assert (engine.thread_control is not None) is wanted, overrides
            # the interactive-tail cap is off unless asked for
            assert (engine.scheduler.batch_rows is not None) is ("batch_rows_with_interactive" in overrides)
        finally:
            engine.runner.close()


def test_a_serving_engine_feeds_the_governor_every_step(server: RunningServer, channel: grpc.Channel) -> None:
    control = server.engine.thread_control
    assert control is not None
    metrics = server.engine.metrics
    before, steps_before = control.governor.steps, metrics.steps
    results = run_stream(channel, [req(f"t{i}", "Count: one two three", max_tokens=12) for i in range(3)])
    assert all(r.done is not None for r in results.values())
    # NOTE: not a count derived from max_tokens: how the three requests share steps and how many
    # tokens a draft adds per step depend on their timing; the engine's own step count does not.
    # The governor skips a step that computed nothing (no tokens), which the engine still counts.
    ran, observed = metrics.steps - steps_before, control.governor.steps - before
    assert 2 <= observed <= ran, (observed, ran)
    assert control.threads in (1, 2)
