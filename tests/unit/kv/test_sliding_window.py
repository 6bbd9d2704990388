"""Cached prefixes of a model with a sliding window (no model): pinned blocks keep every window cell.

llama.cpp's cache of a model's sliding-window layers hands out any cell that one sequence alone holds
outside that sequence's window; ``SlidingShadowKV`` takes such a cell at every write. Without the pin
lane a finished sequence's cached blocks lose their cells there, and a prefix shared from them lacks
the cells its window needs (the cause of S's llama_decode -1); with it they keep every cell.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis.stateful import invariant

from service.kv.host_prefixes import HostPrefixes
from service.kv.integrity import check_integrity
from service.paged_kv import KVBlockManager
from service.priority import PriorityPolicy
from service.request.sequence import Priority, SamplingParams, Sequence
from service.scheduler.scheduler import Scheduler
from tests.support.sim import SlidingShadowKV, append_token, drive, fake_forward
from tests.unit.kv.test_paged_kv import KVMachine, admit, seq

PIN = 5


def share_after_other_work(pin_lane: int | None) -> tuple[KVBlockManager, list[Sequence]]:
    """A finishes (its 4 blocks cached), B computes 6 tokens, C shares A's first 3 blocks."""
    kv, shadow = KVBlockManager(16, 2, 4, pin_lane=pin_lane), SlidingShadowKV(32, window=3)
    a = seq(list(range(1, 9)), "a")
    assert admit(kv, a, shadow)
    kv.free(a)
    b = seq(list(range(50, 56)), "b")
    assert admit(kv, b, shadow)
    c = seq([1, 2, 3, 4, 5, 6, 99], "c")
    assert admit(kv, c, shadow)
    shadow.assert_window(c.lane, c.token_ids)  # type: ignore[arg-type]
    return kv, [b, c]


def test_without_the_pin_a_shared_prefix_lacks_the_cells_its_window_needs() -> None:
    with pytest.raises(AssertionError, match=r"lacks window cells|llama_decode -1"):
        share_after_other_work(pin_lane=None)


def test_pinned_blocks_keep_their_window_cells_for_a_later_share() -> None:
    kv, (b, c) = share_after_other_work(pin_lane=PIN)
    assert c.num_cached == 6  # the prefix was reused, not computed again
    check_integrity(kv, [b, c])


def test_an_evicted_block_unpins_its_cells_and_keeps_the_other_blocks_at_its_start_pinned() -> None:
    kv, shadow = KVBlockManager(16, 2, 4, max_cached_blocks=3, pin_lane=PIN), SlidingShadowKV(32, window=2)
    for rid, tokens in (("x", [1, 2, 3]), ("y", [7, 8, 9])):
        s = seq(tokens, rid)
        assert admit(kv, s, shadow)
        kv.free(s)  # x's block 0 and y's block 0 are both cached at start 0
    z = seq([4, 4, 4, 4, 4], "z")
    assert admit(kv, z, shadow)
    kv.free(z)  # the cap of 3 evicts x's block (the least recently used)
    shadow.apply(kv.take_ops())
    pinned = sorted(p for p, _t, ls in shadow.swa.cells.values() if PIN in ls)
    held = {p: t for p, t, ls in shadow.cells.values() if PIN in ls}
    assert pinned == [0, 0, 1, 1, 2, 3] and [held[p] for p in (2, 3)] == [4, 4]  # y's and z's blocks only
    assert sorted(t for p, t, ls in shadow.cells.values() if PIN in ls and p < 2) == [4, 4, 7, 8]


class SlidingWindowKVMachine(KVMachine):
    """``KVMachine``'s random allocate/grow/finish/preempt for a model with a 4-token window: the
    cached blocks pinned, a cap of 2 cached blocks, every running lane holding its window's cells."""

    max_cached_blocks = 2

    def __init__(self) -> None:
        super().__init__()
        host = HostPrefixes(self.host_tokens, block_size=3, min_blocks=1) if self.host_tokens else None
        self.kv = KVBlockManager(12, 3, 5, max_cached_blocks=self.max_cached_blocks, host=host, pin_lane=PIN)
        self.shadow = SlidingShadowKV(36, window=4, pin_lane=PIN)

    @invariant()
    def integrity(self) -> None:
        super().integrity()
        assert isinstance(self.shadow, SlidingShadowKV)
        for s in self.running:
            if s.num_computed:
                self.shadow.assert_window(s.lane, s.token_ids[: s.num_computed])  # type: ignore[arg-type]


TestSlidingWindowKVMachine = SlidingWindowKVMachine.TestCase
TestSlidingWindowKVMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class SpillingSlidingWindowKVMachine(SlidingWindowKVMachine):
    """The same with a cap of 1 block and a host tier of 9 tokens: chains saved whole and loaded back
    whole or in part, their whole blocks pinned as they land."""

    max_cached_blocks = 1
    host_tokens = 9


TestSpillingSlidingWindowKVMachine = SpillingSlidingWindowKVMachine.TestCase
TestSpillingSlidingWindowKVMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("seed", range(8))
def test_scheduled_steps_keep_every_window_cell_under_shared_prefix_load(seed: int) -> None:
    """The scheduler's steps (chunked prefill, shared and partial prefixes, preemption under a tight
    pool, evictions past a small cache cap) against both caches: no lane ever lacks a window cell and
    no write breaks llama.cpp's batch check (without the pin the same load fails at every seed here)."""
    rng = random.Random(seed)
    kv = KVBlockManager(40, 4, 10, max_cached_blocks=6, pin_lane=11)
    sched = Scheduler(kv, PriorityPolicy(aging_s=10.0), max_running=4, step_tokens=16, append_token=append_token)
    shadow = SlidingShadowKV(40 * 4, window=6)
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randint(5, 22))] for _ in range(3)]
    for n in range(60):
        tail = [rng.randrange(1, 50) for _ in range(rng.randint(1, 6))]
        prio = rng.choice([Priority.INTERACTIVE, Priority.BATCH])
        params = SamplingParams(max_tokens=rng.randint(1, 14))
        sched.add(Sequence(request_id=f"r{n}", token_ids=rng.choice(prefixes) + tail, params=params, priority=prio))
        for _ in range(rng.randint(0, 4)):
            if sched.has_work():
                plan = sched.schedule()
                sched.update(plan, fake_forward(sched, shadow, plan))
                check_integrity(kv, sched.running)
    drive(sched, shadow)
    assert kv.stats.hit_tokens > 0 and not sched.running and not sched.waiting
