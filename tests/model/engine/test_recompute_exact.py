"""A preempted sequence is recomputed exactly: after it resumes, its logits are bit for bit those of the
same request never preempted (preemption by recompute adds nothing to batch numerics).

Setup: one sequence at a time (``max_running=1``), prefix cache and speculation off, so every KV cell of
the request is computed by the request itself, in order, and llama.cpp's result is reproducible bit for
bit (the spread of batching is 0 here; see docs/operations.md, *Preemption and numerics*). A batch
request is preempted by an interactive one after PREEMPT_AT tokens and recomputes more than 64 tokens:
in one step that would use llama.cpp's tiled attention kernel, whose results differ from the per-row
kernel its tokens were decoded with (service.scheduler.step_builder, ``_recompute_room``).
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
from inference.v1 import inference_pb2 as pb

from tests.support.helpers import OpenStream, req, run_stream
from tests.support.server import RunningServer, assert_kv_clean, start_server

pytestmark = pytest.mark.model
PROMPT = "Tell me a long story about a dragon who learns to cook."
TOKENS, PREEMPT_AT = 160, 100  # the recompute covers the prompt and about 100 generated tokens
CONFIG = dict(max_running=1, prefix_cache=False, speculative=False)


class Rows:
    """Engine logits hook: every row a token of ``victim`` was chosen from, in order (copies)."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []

    def __call__(self, seqs: list[Any], logits: np.ndarray) -> None:
        for seq, row in zip(seqs, logits, strict=True):
            if seq.request_id == "victim":
                self.rows.append(np.array(row, dtype=np.float32))


def victim() -> pb.GenerateRequest:
    return req("victim", PROMPT, TOKENS, ignore_eos=True, priority=pb.PRIORITY_BATCH)


def served(run: Any) -> tuple[Any, list[np.ndarray]]:
    """``run(server, channel)`` on a fresh server that records the victim's rows."""
    srv: RunningServer = start_server(**CONFIG)
    rows = Rows()
    srv.engine.logits_hook = rows
    try:
        with grpc.insecure_channel(srv.target) as ch:
            out = run(srv, ch)
        assert_kv_clean(srv)
    finally:
        srv.close()
    return out, rows.rows


def preempted(srv: RunningServer, ch: grpc.Channel) -> dict[str, pb.GenerateResponse]:
    stream = OpenStream(ch, timeout=600)
    stream.send(victim())
    tokens, finals = 0, {}
    while tokens < PREEMPT_AT:
        ev = stream.next_event()
        tokens += len(ev.delta.token_ids)
    stream.send(req("urgent", "Quick:", 8, ignore_eos=True))  # interactive: takes the only place
    while len(finals) < 2:
        ev = stream.next_event()
        if ev.WhichOneof("event") != "delta":
            finals[ev.request_id] = ev
    stream.close()
    stream.join()
    return finals


def test_a_preempted_request_resumes_with_the_logits_of_an_uninterrupted_run() -> None:
    alone, alone_rows = served(lambda srv, ch: run_stream(ch, [victim()], timeout=600)["victim"])
    finals, rows = served(preempted)
    done = finals["victim"].done
    assert done.preemptions == 1 and done.usage.completion_tokens == TOKENS, finals["victim"]
    assert alone.done is not None and len(rows) == len(alone_rows) == TOKENS
    drift = [float(np.abs(a - b).max()) for a, b in zip(alone_rows, rows, strict=True)]
    first = next((i for i, d in enumerate(drift) if d > 0), None)
    assert first is None, f"token {first}: logits off by {drift[first]:.4f} (preempted after ~{PREEMPT_AT})"
