"""The prefix cache's host tier with the real model: an evicted prefix comes back from host memory.

The server keeps no idle prefix in the KV pool (``--prefix-cache-tokens 0``), so every finished
request's prefix is evicted, and spilled to host memory (``--prefix-host-cache-mib``, default on).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
import pytest

from tests.support.helpers import MarginRecorder, assert_same_greedy, req, run_stream, wait_for
from tests.support.server import RunningServer, assert_kv_clean, start_server, wait_idle

pytestmark = pytest.mark.model

SYSTEM = (
    "You are a meticulous assistant for a shipping company. Answer questions about parcels, tracking "
    "numbers, delivery windows, customs forms and refunds. Always be polite, concise and precise. "
) * 3
BLOCK = 16


@pytest.fixture(scope="module")
def spilling() -> Iterator[RunningServer]:
    srv = start_server(prefix_cache_tokens=0)
    yield srv
    srv.close()


def ask(srv: RunningServer, rid: str, question: str, rec: MarginRecorder, system: str = SYSTEM) -> object:
    srv.engine.logits_hook = rec
    try:
        with grpc.insecure_channel(srv.target) as ch:
            result = run_stream(ch, [req(rid, system + question, 24, ignore_eos=True)])[rid]
    finally:
        srv.engine.logits_hook = None
    wait_idle(srv)
    return result


def test_an_evicted_prefix_is_copied_back_from_host_memory_and_gives_the_same_output(
    spilling: RunningServer,
) -> None:
    kv, runner, rec = spilling.engine.kv, spilling.engine.runner, MarginRecorder()
    hits_before = kv.stats.host_hit_tokens
    cold = ask(spilling, "cold", "Where is my parcel?", rec)
    assert kv.num_cached == 0 and len(kv.host) >= 1  # evicted, spilled
    warm = ask(spilling, "warm", "Where is my parcel?", rec)
    prompt = warm.done.usage.prompt_tokens  # type: ignore[attr-defined]
    # every prompt token but the last (always computed): whole blocks, then part of the next one
    assert warm.done.usage.cached_tokens == prompt - 1  # type: ignore[attr-defined]
    assert kv.stats.host_hit_tokens - hits_before == prompt - 1 and runner.spilled_bytes > 0
    assert_same_greedy(cold.token_ids, warm.token_ids, rec.rows["cold"])  # type: ignore[attr-defined]
    assert_kv_clean(spilling)


def test_a_spilled_prefix_whose_bytes_are_gone_is_computed_again_with_the_same_output(
    spilling: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    kv, runner, rec = spilling.engine.kv, spilling.engine.runner, MarginRecorder()
    cold = ask(spilling, "cold2", "How do refunds work?", rec)
    with grpc.insecure_channel(spilling.target) as ch:  # a step: the spill queued when cold2 finished
        run_stream(ch, [req("flush", "Hi.", 1)])
    wait_idle(spilling)
    assert runner.spilled_bytes > 0
    runner._spilled.clear()  # the engine is idle (wait_idle): as if the bytes had been dropped
    with caplog.at_level(logging.WARNING, logger="service.llama"):
        warm = ask(spilling, "warm2", "How do refunds work?", rec)
    assert any("could not be restored; computing its" in r.getMessage() for r in caplog.records)
    assert warm.done.usage.cached_tokens >= 4 * BLOCK  # type: ignore[attr-defined]  # counted as a hit
    assert_same_greedy(cold.token_ids, warm.token_ids, rec.rows["cold2"])  # type: ignore[attr-defined]
    assert_kv_clean(spilling)
    assert len(kv.host) >= 1


def test_a_finished_requests_prefix_is_copied_out_while_the_engine_is_idle(spilling: RunningServer) -> None:
    """Not in the next request's first step: that request would wait for the copy (~10 ms per 1,000 tokens)."""
    runner, rec = spilling.engine.runner, MarginRecorder()
    saved = len(runner._spilled)
    other = "You catalogue rare books for a university library and answer questions about them. " * 4
    ask(spilling, "alone", "Which editions do you hold?", rec, system=other)  # a new chain: worth a copy
    assert wait_for(lambda: len(runner._spilled) > saved, timeout=600), "the spill waited for a next step"
    assert_kv_clean(spilling)
