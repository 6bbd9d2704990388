"""KV block manager unit tests (no model): allocate, free, share, evict, preempt, integrity."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from service.kv.host_prefixes import HostPrefixes
from service.kv.integrity import check_integrity
from service.paged_kv import KVBlockManager
from service.request.sequence import SamplingParams, Sequence
from tests.support.sim import ShadowKV


def seq(tokens: list[int], rid: str = "s") -> Sequence:
    return Sequence(request_id=rid, token_ids=list(tokens), params=SamplingParams(max_tokens=8))


def admit(kv: KVBlockManager, s: Sequence, shadow: ShadowKV | None = None) -> bool:
    hit = kv.match_prefix(s)
    ok = kv.allocate(s, hit, s.num_tokens - hit.num_tokens)
    if ok and shadow is not None:
        compute(kv, s, shadow, s.num_tokens - s.num_computed)
    elif ok:
        s.num_computed = s.num_tokens
        kv.commit(s)
    return ok


def compute(kv: KVBlockManager, s: Sequence, shadow: ShadowKV, n: int) -> None:
    shadow.apply(kv.take_ops())
    for pos in range(s.num_computed, s.num_computed + n):
        shadow.write(s.lane, pos, s.token_ids[pos])  # type: ignore[arg-type]
    s.num_computed += n
    kv.commit(s)
    assert shadow.lane_tokens(s.lane) == s.token_ids[: s.num_computed]  # type: ignore[arg-type]


def test_allocate_takes_blocks_on_demand_and_free_returns_them() -> None:
    kv = KVBlockManager(num_blocks=8, block_size=4, num_lanes=4)
    s = seq(list(range(6)))
    assert admit(kv, s)
    assert len(s.block_table) == 2 and kv.num_used == 2  # 6 tokens: nothing reserved for max_tokens
    check_integrity(kv, [s])
    kv.free(s)
    assert kv.num_used == 0 and kv.num_cached == 1  # the full block [0..3] stays cached
    check_integrity(kv, [])


def test_cached_blocks_are_capped_lru_first_and_their_cells_removed() -> None:
    kv, shadow = KVBlockManager(16, 4, 8, max_cached_blocks=3), ShadowKV(64)
    old, new = seq(list(range(100, 108)), "old"), seq(list(range(200, 208)), "new")
    assert admit(kv, old, shadow) and admit(kv, new, shadow)
    old_lane = old.lane
    kv.free(old)
    kv.free(new)  # 4 full blocks now unreferenced; the cap keeps the 3 most recent
    assert kv.num_cached == 3 and kv.num_free == 13
    shadow.apply(kv.take_ops())
    assert shadow.lane_tokens(old_lane) == list(range(100, 104))  # old's tail block went first
    assert kv.match_prefix(seq(list(range(200, 209)))).num_tokens == 8  # the newest survive
    assert kv.match_prefix(seq(list(range(100, 109)))).num_tokens == 4
    check_integrity(kv, [])


def test_prefix_is_shared_zero_copy_and_counted() -> None:
    kv, shadow = KVBlockManager(16, 4, 4), ShadowKV(64)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    assert admit(kv, a, shadow)
    b = seq([1, 2, 3, 4, 5, 6, 7, 8, 42, 43], "b")
    hit = kv.match_prefix(b)
    assert [h.id for h in hit.blocks] == a.block_table[:2] and hit.partial is None
    assert kv.allocate(b, hit, 2)
    assert b.num_computed == 8 and b.num_cached == 8
    ops = kv.take_ops()
    assert [(o.kind, o.src, o.lane, o.p0, o.p1) for o in ops] == [("cp", a.lane, b.lane, 0, 8)]
    shadow.apply(ops)
    compute(kv, b, shadow, 2)
    assert len(shadow.cells) == 9 + 2  # shared cells are not copied
    check_integrity(kv, [a, b])


def test_last_prompt_token_is_always_computed() -> None:
    kv = KVBlockManager(16, 4, 4)
    a = seq(list(range(8)), "a")
    admit(kv, a)
    kv.free(a)
    b = seq(list(range(8)), "b")  # identical, block-aligned prompt
    hit = kv.match_prefix(b)
    assert len(hit.blocks) == 1 and hit.partial_len == 3  # the last token is recomputed so logits exist


def test_eviction_is_lru_tail_first() -> None:
    kv, shadow = KVBlockManager(4, 2, 4), ShadowKV(8)
    a = seq([1, 2, 3, 4, 5], "a")
    admit(kv, a, shadow)
    kv.free(a)  # blocks [1,2] and [3,4] cached, partial [5] freed
    assert kv.num_cached == 2
    b = seq([9, 8, 7, 6, 5], "b")  # needs 3 blocks: 2 free + evict one
    assert admit(kv, b, shadow)
    assert kv.stats.evictions == 1
    c = seq([1, 2, 7], "c")
    assert len(kv.match_prefix(c).blocks) == 1, "the head of a's chain must survive, its tail evicted first"
    check_integrity(kv, [b])


def test_partial_block_is_reused_token_by_token() -> None:
    kv, shadow = KVBlockManager(16, 4, 4), ShadowKV(64)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    assert admit(kv, a, shadow)
    a_lane = a.lane
    kv.free(a)
    shadow.apply(kv.take_ops())
    b = seq([1, 2, 3, 4, 5, 6, 99], "b")  # diverges inside the second block
    hit = kv.match_prefix(b)
    assert len(hit.blocks) == 1 and hit.partial is not None and hit.partial_len == 2 and hit.num_tokens == 6
    assert kv.allocate(b, hit, 1)
    assert b.num_cached == 6 and len(b.block_table) == 2  # its own block for the partly shared range
    ops = kv.take_ops()
    assert [(o.kind, o.src, o.p0, o.p1) for o in ops] == [("cp", a_lane, 0, 6)]  # one merged copy
    shadow.apply(ops)
    compute(kv, b, shadow, 1)  # checks the lane sees exactly b's tokens
    check_integrity(kv, [b])
    lane = b.lane
    kv.free(b)
    shadow.apply(kv.take_ops())
    held = sorted(p for p, _t, ls in shadow.cells.values() if lane in ls)
    assert held == [0, 1, 2, 3]  # only b's full, cached block stays; the partial range is gone


def test_allocation_returns_false_when_memory_is_short() -> None:
    kv = KVBlockManager(4, 4, 4)
    a = seq(list(range(12)), "a")
    assert admit(kv, a)
    b = seq(list(range(100, 108)), "b")
    assert not admit(kv, b)
    assert b.lane is None and not b.block_table
    check_integrity(kv, [a])
    assert not kv.append_slots(a, 8)
    assert kv.append_slots(a, 4)


def test_holder_lanes_are_bounded_and_reclaimed() -> None:
    kv, shadow = KVBlockManager(64, 2, 3), ShadowKV(128)
    for i in range(6):  # more finished prefixes than lanes
        s = seq([i * 10 + k for k in range(5)], f"s{i}")
        assert admit(kv, s, shadow)
        kv.free(s)
        check_integrity(kv, [])
    assert kv.num_holder_lanes <= 3


def test_preempt_then_resume_reuses_own_cached_blocks() -> None:
    kv, shadow = KVBlockManager(16, 4, 4), ShadowKV(64)
    s = seq(list(range(10)), "s")
    admit(kv, s, shadow)
    kv.free(s)
    s.reset_for_recompute()
    assert admit(kv, s, shadow)
    assert s.preemptions == 1 and s.num_cached == 0  # cached_tokens reports the first admission only
    check_integrity(kv, [s])


class KVMachine(RuleBasedStateMachine):
    """Random allocate/grow/finish/preempt sequences; integrity and cell checks after each."""

    max_cached_blocks: int | None = None
    host_tokens = 0  # the host tier's budget (0: none)

    def __init__(self) -> None:
        super().__init__()
        host = HostPrefixes(self.host_tokens, block_size=3, min_blocks=1) if self.host_tokens else None
        self.kv = KVBlockManager(
            num_blocks=12, block_size=3, num_lanes=5, max_cached_blocks=self.max_cached_blocks, host=host
        )
        self.shadow = ShadowKV(36)
        self.running: list[Sequence] = []
        self.n = 0

    @rule(
        prefix=st.sampled_from([[], [1, 2, 3], [1, 2, 3, 4, 5, 6], [7, 7, 7]]),
        tail=st.lists(st.integers(0, 9), min_size=1, max_size=8),
    )
    def arrive(self, prefix: list[int], tail: list[int]) -> None:
        self.n += 1
        s = seq(prefix + tail, f"r{self.n}")
        if admit(self.kv, s, self.shadow):
            self.running.append(s)

    @rule(data=st.data(), n=st.integers(1, 4))
    def grow(self, data: st.DataObject, n: int) -> None:
        if not self.running:
            return
        s = data.draw(st.sampled_from(self.running))
        s.token_ids.extend(range(20, 20 + n))
        if self.kv.append_slots(s, n):
            compute(self.kv, s, self.shadow, n)
        else:
            s.token_ids[-n:] = []

    @rule(data=st.data(), preempt=st.booleans())
    def leave(self, data: st.DataObject, preempt: bool) -> None:
        if not self.running:
            return
        s = data.draw(st.sampled_from(self.running))
        self.running.remove(s)
        self.kv.free(s)
        if preempt:
            s.reset_for_recompute()
            if admit(self.kv, s, self.shadow):
                self.running.append(s)
        self.shadow.apply(self.kv.take_ops())

    @invariant()
    def integrity(self) -> None:
        check_integrity(self.kv, self.running)
        if self.max_cached_blocks is not None:
            assert self.kv.num_cached <= self.max_cached_blocks
        for s in self.running:
            assert self.shadow.lane_tokens(s.lane) == s.token_ids[: s.num_computed]  # type: ignore[arg-type]


TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class CappedKVMachine(KVMachine):
    """The same, with a prefix cache capped at 2 blocks (evictions on free)."""

    max_cached_blocks = 2


TestCappedKVMachine = CappedKVMachine.TestCase
TestCappedKVMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


class SpillingKVMachine(KVMachine):
    """The same, capped at 1 block, evicted chains spilled to a host tier of 9 tokens and copied back."""

    max_cached_blocks = 1
    host_tokens = 9


TestSpillingKVMachine = SpillingKVMachine.TestCase
TestSpillingKVMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
