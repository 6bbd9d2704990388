"""Prompt-lookup speculation on the real default model: same greedy output, exact limits, clean KV.

Comparisons run the speculative request first (the reference, rows recorded) and the plain one
second with near-ties forced (helpers.forced_to): drafts are verified before a logits hook could force
them, so the forced side is the one without speculation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from inference.v1 import inference_pb2 as pb

from service.engine.spec_payoff import PayoffConfig, SpecPayoff
from service.engine.speculator import SpecConfig
from tests.support.helpers import forced_to, recording, req, run_stream
from tests.support.server import RunningServer, assert_kv_clean, wait_idle

pytestmark = pytest.mark.model

RECORD = (
    "Order 7731: 3 x blue ceramic mug, 1 x walnut tray, shipped to 14 Harbour Lane, Portsmouth. "
    "Order 7732: 2 x green linen napkin, shipped to 9 Mill Road, Cambridge. "
)
PROMPT = f"Copy the records exactly.\nRecords: {RECORD}\nCopy: {RECORD[:40]}"
# Copied once already: the greedy copy goes on to "Cambridge" with drafts accepted on the way (the
# prompt above drifts before it).
COPIED = f"Copy the records exactly.\nRecords: {RECORD}\nCopy: {RECORD}\nCopy: {RECORD[:40]}"


@pytest.fixture()
def spec(server: RunningServer) -> Iterator[RunningServer]:
    """The shared server with speculation on and the payoff measure out of the way; restored afterwards.

    NOTE: these tests are about what drafts do (same greedy output, stop strings, limits), not
    whether they pay. The payoff measure (spec_payoff.py, tested on its own in
    tests/unit/engine/test_spec_payoff.py) compares wall-clock step rates: on a loaded CI machine,
    or after earlier tests on this shared server, it can judge drafting slower and let through one
    1-token probe in 32 steps, so a 60-token copy accepted no draft at all (a CI run did).
    A measure that never reaches a verdict leaves only the per-sequence rules, which are
    deterministic."""
    speculator = server.engine.speculator
    saved, saved_payoff = speculator.config, speculator.payoff
    speculator.config = SpecConfig(enabled=True, tokens=7, max_running=2)
    speculator.payoff = SpecPayoff(PayoffConfig(min_samples=2**62))
    yield server
    speculator.config, speculator.payoff = saved, saved_payoff


def _run(server: RunningServer, channel: grpc.Channel, enabled: bool, rid: str, prompt: str = PROMPT, **kw: object):  # type: ignore[no-untyped-def]
    server.engine.speculator.config = SpecConfig(enabled=enabled, tokens=7, max_running=2)
    wait_idle(server)
    return run_stream(channel, [req(rid, prompt, **kw)])[rid]  # type: ignore[arg-type]


def _fast_then_plain(server: RunningServer, channel: grpc.Channel, prompt: str = PROMPT, **kw: object):  # type: ignore[no-untyped-def]
    """The request with speculation (rows recorded: the reference), then without it, compared token
    by token with near-ties forced (helpers.forced_to); (fast, plain, drafts accepted, comparer)."""
    before = server.engine.speculator.snapshot()
    with recording(server.engine) as rec:
        fast = _run(server, channel, True, "r", prompt, **kw)
    accepted = server.engine.speculator.snapshot().accepted - before.accepted
    wait_idle(server)
    with forced_to(server.engine, {"r": fast.token_ids}, rec.rows) as force:
        plain = run_stream(channel, [req("r", prompt, **kw)])["r"]  # type: ignore[arg-type]
    return fast, plain, accepted, force


def test_greedy_output_is_the_same_with_and_without_speculation(
    spec: RunningServer, channel: grpc.Channel
) -> None:
    fast, plain, accepted, force = _fast_then_plain(spec, channel, max_tokens=48, ignore_eos=True)
    assert accepted > 0, "the copy task should accept drafts"
    force.check()  # all 48 tokens compared
    assert len(fast.token_ids) == 48 == fast.done.usage.completion_tokens
    assert plain.token_ids == fast.token_ids
    assert_kv_clean(spec)


def test_stop_string_inside_accepted_drafts_ends_the_output_there(
    spec: RunningServer, channel: grpc.Channel
) -> None:
    fast, plain, accepted, force = _fast_then_plain(spec, channel, COPIED, max_tokens=60, stop=["Cambridge"])
    assert accepted > 0, "the copy task should accept drafts before the stop string"
    assert fast.done.finish_reason == pb.FINISH_REASON_STOP, (fast.text, fast.done)
    assert "Cambridge" not in fast.text and "Portsmouth" in fast.text, fast.text
    force.check(complete=False)
    assert plain.done.finish_reason == pb.FINISH_REASON_STOP and plain.text == fast.text
    assert_kv_clean(spec)


def test_sampled_requests_speculate_within_max_tokens(spec: RunningServer, channel: grpc.Channel) -> None:
    # NOTE: two identical seeded runs are not compared token for token: logits move slightly with
    # the KV cells in use (summation order, see helpers.assert_same_greedy), and in the full suite
    # the first draw of seed 5 most likely fell near a boundary: the runs differed from the first token on
    # (with speculation on in both). The sampled distribution is checked exactly by
    # tests/unit/engine/test_speculative_unit.py::test_rejection_sampling_leaves_the_output_distribution_unchanged.
    before = spec.engine.speculator.snapshot()
    res = _run(spec, channel, True, "s", max_tokens=37, temperature=0.7, seed=5, ignore_eos=True)
    after = spec.engine.speculator.snapshot()
    assert res.error is None and len(res.token_ids) == 37 == res.done.usage.completion_tokens
    assert after.steps > before.steps
    assert_kv_clean(spec)


def test_speculation_stays_off_when_many_sequences_run(
    spec: RunningServer, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No step verifies a draft while more sequences run than ``SpecConfig.max_running`` (2)."""
    speculator = spec.engine.speculator
    steps: list[tuple[int, int]] = []  # (running sequences, drafted items) per engine step
    verify = speculator.verify

    def recording_verify(drafted: Any) -> Any:
        steps.append((len([s for s in spec.engine.scheduler.running if not s.paused]), len(drafted)))
        return verify(drafted)

    monkeypatch.setattr(speculator, "verify", recording_verify)
    out = run_stream(channel, [req(f"m{i}", PROMPT, 24, ignore_eos=True) for i in range(6)])
    assert all(r.done is not None and len(r.token_ids) == 24 for r in out.values())
    assert max(n for n, _ in steps) == 6, steps  # the six did run together
    speculated = [(n, d) for n, d in steps if d]
    assert all(n <= 2 for n, _ in speculated), speculated
    assert_kv_clean(spec)
