"""Prompt-lookup speculation on the real default model: same greedy output, exact limits, clean KV."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from service.engine.speculator import SpecConfig
from tests.support.helpers import MarginRecorder, assert_same_greedy, req, run_stream
from tests.support.server import RunningServer, assert_kv_clean, wait_idle

pytestmark = pytest.mark.model

RECORD = (
    "Order 7731: 3 x blue ceramic mug, 1 x walnut tray, shipped to 14 Harbour Lane, Portsmouth. "
    "Order 7732: 2 x green linen napkin, shipped to 9 Mill Road, Cambridge. "
)
PROMPT = f"Copy the records exactly.\nRecords: {RECORD}\nCopy: {RECORD[:40]}"


@pytest.fixture()
def spec(server: RunningServer) -> Iterator[RunningServer]:
    """The shared server with speculation on; restored afterwards."""
    saved = server.engine.speculator.config
    server.engine.speculator.config = SpecConfig(enabled=True, tokens=7, max_running=2)
    yield server
    server.engine.speculator.config = saved


def _run(server: RunningServer, channel: grpc.Channel, enabled: bool, rid: str, **kw: object):  # type: ignore[no-untyped-def]
    server.engine.speculator.config = SpecConfig(enabled=enabled, tokens=7, max_running=2)
    wait_idle(server)
    return run_stream(channel, [req(rid, PROMPT, **kw)])[rid]  # type: ignore[arg-type]


def _run_plain_recorded(server: RunningServer, channel: grpc.Channel, rid: str, **kw: object):  # type: ignore[no-untyped-def]
    """A run without speculation, with each sampled row's best logits recorded (near-tie reference)."""
    rec = MarginRecorder()
    server.engine.logits_hook = rec
    try:
        return _run(server, channel, False, rid, **kw), rec.rows[rid]
    finally:
        server.engine.logits_hook = None


def test_greedy_output_is_the_same_with_and_without_speculation(
    spec: RunningServer, channel: grpc.Channel
) -> None:
    plain, rows = _run_plain_recorded(spec, channel, "plain", max_tokens=48, ignore_eos=True)
    before = spec.engine.speculator.snapshot()
    fast = _run(spec, channel, True, "fast", max_tokens=48, ignore_eos=True)
    after = spec.engine.speculator.snapshot()
    assert after.accepted - before.accepted > 0, "the copy task should accept drafts"
    assert len(fast.token_ids) == len(plain.token_ids) == 48 == fast.done.usage.completion_tokens
    assert_same_greedy(plain.token_ids, fast.token_ids, rows)
    assert_kv_clean(spec)


def test_stop_string_inside_accepted_drafts_ends_the_output_there(
    spec: RunningServer, channel: grpc.Channel
) -> None:
    plain, rows = _run_plain_recorded(spec, channel, "p", max_tokens=60, stop=["Portsmouth"])
    fast = _run(spec, channel, True, "f", max_tokens=60, stop=["Portsmouth"])
    assert "Portsmouth" not in fast.text and "Portsmouth" not in plain.text
    n = min(len(plain.token_ids), len(fast.token_ids))
    if plain.token_ids[:n] != fast.token_ids[:n]:  # a near-tie flip (KV placement): allowed there only
        assert_same_greedy(plain.token_ids[:n], fast.token_ids[:n], rows)
    else:
        assert fast.text == plain.text and fast.done.finish_reason == plain.done.finish_reason
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


def test_speculation_stays_off_when_many_sequences_run(spec: RunningServer, channel: grpc.Channel) -> None:
    before = spec.engine.speculator.snapshot()
    out = run_stream(channel, [req(f"m{i}", PROMPT, 24, ignore_eos=True) for i in range(6)])
    assert all(r.done is not None and len(r.token_ids) == 24 for r in out.values())
    after = spec.engine.speculator.snapshot()
    # Six requests start together: speculation waits until at most two run (their tails).
    assert after.steps - before.steps < 6 * 24 / 2
    assert_kv_clean(spec)
