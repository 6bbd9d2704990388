"""A cached prefix of a model with a sliding window keeps its cells in llama.cpp (real runner).

The model: Gemma 3's architecture at a tiny size, written here with seeded weights, whose first layer
attends to the last 16 positions. Its cells live in a second cache where llama.cpp gives a new token
any cell that one sequence alone holds outside that sequence's window. The steps below make it do so
to a finished sequence's cached blocks; a prefix then shared from them must give the logits a fresh
computation gives (it did not before the pin lane: S's llama_decode -1 and silently wrong answers).
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp as L
import numpy as np
import pytest

from service.kv.blocks import KVOp
from service.model.runner import ModelRunner
from service.paged_kv import KVBlockManager
from service.request.sequence import SamplingParams, Sequence
from tests.support.tiny_vocab import build

BS = 16


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("swa") / "tiny-gemma3.gguf", add_bos=True, weights=7, window=16)


def step(runner: ModelRunner, kv: KVBlockManager, seq: Sequence) -> np.ndarray:
    """Apply the queued cell operations and compute ``seq``'s uncomputed tokens; the last one's logits."""
    runner.apply_kv_ops(kv.take_ops())
    start, n = seq.num_computed, seq.num_uncomputed
    want = np.zeros(n, dtype=np.int8)
    want[-1] = 1
    lanes = np.full(n, seq.lane)
    logits = runner.decode(np.asarray(seq.token_ids[start:]), np.arange(start, start + n), lanes, want)[0].copy()
    seq.num_computed += n
    kv.commit(seq)
    return logits


def admit(runner: ModelRunner, kv: KVBlockManager, rid: str, tokens: list[int]) -> tuple[Sequence, np.ndarray]:
    seq = Sequence(request_id=rid, token_ids=list(tokens), params=SamplingParams(max_tokens=1))
    hit = kv.match_prefix(seq)
    assert kv.allocate(seq, hit, seq.num_tokens - hit.num_tokens)
    return seq, step(runner, kv, seq)


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_a_prefix_shared_after_llama_cpp_reused_window_cells_gives_fresh_logits(gemma3: Path, pinned: bool) -> None:
    """Pinned: every cell of the shared prefix is there and the logits equal a fresh computation's.
    Unpinned (the control, proving the steps reach llama.cpp's reuse): the first cells are gone."""
    runner = ModelRunner(gemma3, n_ctx=1024, step_tokens=128, n_lanes=8, n_threads=2)
    try:
        assert runner.sliding_window == 16
        kv = KVBlockManager(1024 // BS, BS, 6, pin_lane=runner.pin_lane if pinned else None)  # lane 6: fresh
        rng = np.random.default_rng(3)
        words = lambda n: [int(t) for t in rng.integers(10, 400, n)]  # noqa: E731
        filler, _ = admit(runner, kv, "filler", words(BS - 1))  # its cells come first; no full block
        a, _ = admit(runner, kv, "a", words(4 * BS))  # 4 blocks, registered as they complete
        other, _ = admit(runner, kv, "other", words(4 * BS))
        kv.free(a)  # a's blocks stay cached: its lane holds them
        kv.free(filler)  # the first cells go free: llama.cpp's next search starts there
        other.token_ids += words(40)
        assert kv.append_slots(other, 40)
        step(runner, kv, other)  # 15 free cells, then a's cells outside its window are taken
        c, shared = admit(runner, kv, "c", a.token_ids[: 2 * BS] + words(1))
        assert c.num_cached == 2 * BS  # the prefix was shared, not computed
        first = L.llama_memory_seq_pos_min(runner.mem, c.lane)  # c's first cell in the window cache
        n = c.num_tokens
        want = np.zeros(n, dtype=np.int8)
        want[-1] = 1
        fresh = runner.decode(np.asarray(c.token_ids), np.arange(n), np.full(n, 6), want)[0].copy()
    finally:
        runner.close()
    if pinned:
        assert first == 0
        assert float(np.abs(shared - fresh).max()) < 1e-2
    else:
        assert first > 0, "the steps no longer make llama.cpp reuse a cached cell: the pinned case proves nothing"


def test_a_prefix_back_from_the_host_tier_in_part_gives_fresh_logits(gemma3: Path) -> None:
    """A 64-token chain saved (in window-long pieces), its first 40 tokens loaded into another lane:
    every cell is back in the window cache and the next token's logits equal a fresh computation's."""
    runner = ModelRunner(gemma3, n_ctx=1024, step_tokens=128, n_lanes=8, n_threads=2)
    try:
        tokens = [int(t) for t in np.random.default_rng(5).integers(10, 400, 64)]
        last = lambda n: np.r_[np.zeros(n - 1, np.int8), 1].astype(np.int8)  # noqa: E731
        runner.decode(np.asarray(tokens), np.arange(64), np.zeros(64), last(64))
        runner.apply_kv_ops([KVOp("save", 0, 0, 64, key=7), KVOp("rm", 0, -1, -1)])
        assert runner.spilled_bytes > 0
        runner.apply_kv_ops([KVOp("load", 1, 0, 40, key=7, tokens=tuple(tokens), pinned=32)])
        window_cells = (L.llama_memory_seq_pos_min(runner.mem, 1), L.llama_memory_seq_pos_max(runner.mem, 1))
        pin = runner.pin_lane
        pinned = (L.llama_memory_seq_pos_min(runner.mem, pin), L.llama_memory_seq_pos_max(runner.mem, pin))
        back = runner.decode(np.asarray(tokens[40:41]), np.arange(40, 41), np.ones(1), last(1))[0].copy()
        fresh = runner.decode(np.asarray(tokens[:41]), np.arange(41), np.full(41, 2), last(41))[0].copy()
    finally:
        runner.close()
    assert window_cells == (0, 39) and pinned == (0, 31)
    assert float(np.abs(back - fresh).max()) < 1e-2
