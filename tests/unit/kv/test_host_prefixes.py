"""The host tier of the prefix cache (no model): spill on eviction, copy back on a hit, LRU budget.

``ShadowKV`` plays llama.cpp and the runner: a ``save`` needs the lane's cells, a ``load`` writes
them into an empty lane under the pool's capacity, so a wrong op order or range fails here.
"""

from __future__ import annotations

import pytest

from service.kv.blocks import KVOp
from service.kv.host_prefixes import HostPrefixes
from service.kv.integrity import check_integrity
from service.paged_kv import KVBlockManager
from service.request.sequence import SamplingParams, Sequence
from tests.support.sim import ShadowKV

BS = 4


def seq(tokens: list[int], rid: str = "s") -> Sequence:
    return Sequence(request_id=rid, token_ids=list(tokens), params=SamplingParams(max_tokens=8))


def run(kv: KVBlockManager, shadow: ShadowKV, s: Sequence) -> None:
    """Admit ``s``, compute its prompt, finish it (its full blocks stay cached, or are evicted)."""
    hit = kv.match_prefix(s)
    assert kv.allocate(s, hit, s.num_tokens - hit.num_tokens)
    shadow.apply(kv.take_ops())
    assert shadow.lane_tokens(s.lane) == s.token_ids[: s.num_computed]  # type: ignore[arg-type]
    for pos in range(s.num_computed, s.num_tokens):
        shadow.write(s.lane, pos, s.token_ids[pos])  # type: ignore[arg-type]
    s.num_computed = s.num_tokens
    kv.commit(s)
    kv.free(s)
    shadow.apply(kv.take_ops())
    check_integrity(kv, [])


def spilling(host_tokens: int = 64, cached_blocks: int = 0) -> tuple[KVBlockManager, ShadowKV]:
    host = HostPrefixes(host_tokens, BS, min_blocks=4)
    return KVBlockManager(32, BS, 4, max_cached_blocks=cached_blocks, host=host), ShadowKV(32 * BS)


def system(base: int, blocks: int = 5) -> list[int]:
    return list(range(base, base + blocks * BS))


def test_an_evicted_chain_is_saved_whole_and_copied_back_for_a_later_prompt_that_starts_with_it() -> None:
    kv, shadow = spilling()
    run(kv, shadow, seq([*system(100), 1, 2, 3]))  # 5 full blocks + 3 tokens; the cap (0) evicts them all
    assert kv.num_cached == 0 and list(shadow.saved) and len(shadow.saved[next(iter(shadow.saved))]) == 20
    later = seq([*system(100), 7, 8])
    hit = kv.match_prefix(later)
    assert hit.host is not None and hit.num_tokens == 20 and hit.blocks == ()
    assert kv.allocate(later, hit, later.num_tokens - 20)
    ops = kv.take_ops()
    assert ops[-1] == KVOp("load", later.lane, 0, 20, key=hit.host.key, tokens=tuple(system(100)))  # type: ignore[arg-type]
    shadow.apply(ops)
    assert shadow.lane_tokens(later.lane) == system(100)  # type: ignore[arg-type]
    assert later.num_computed == 20 and later.num_cached == 20 and kv.stats.host_hit_tokens == 20


def test_a_prompt_sharing_only_the_first_blocks_of_a_spilled_chain_gets_those_blocks() -> None:
    kv, shadow = spilling()
    run(kv, shadow, seq([*system(100), 1]))
    other = seq(system(100, blocks=4) + [9] * 9)  # the first 4 blocks, then different tokens
    hit = kv.match_prefix(other)
    assert hit.host is not None and hit.num_tokens == 16
    run(kv, shadow, other)  # the load keeps [0, 16) of the 20 saved cells
    assert kv.stats.host_hit_tokens == 16


def test_a_prompt_sharing_part_of_the_block_after_a_spilled_chains_whole_blocks_gets_those_tokens_too() -> None:
    kv, shadow = spilling()
    run(kv, shadow, seq([*system(100, blocks=6), 1]))  # saved: 6 blocks, tokens 100..123
    later = seq([*system(100, blocks=5), 120, 121, 9, 9])  # 5 whole blocks, then 2 tokens of the 6th
    hit = kv.match_prefix(later)
    assert hit.host is not None and hit.num_tokens == 22 and hit.host.tokens == tuple(range(100, 122))
    run(kv, shadow, later)  # the load keeps [0, 22) of the 24 saved cells (run() checks the lane)
    assert kv.stats.host_hit_tokens == 22
    same = seq(system(100, blocks=6))  # the whole chain again: all but its last token (always computed)
    assert kv.match_prefix(same).num_tokens == 23


def test_a_chain_is_saved_once_not_again_as_its_blocks_go_one_by_one_and_not_when_short() -> None:
    kv, shadow = spilling()
    run(kv, shadow, seq([*system(100), 1]))
    run(kv, shadow, seq([*system(500, blocks=3), 1]))  # 3 blocks: under min_blocks, recomputed
    assert len(shadow.saved) == 1 and len(kv.host) == 1  # type: ignore[arg-type]


def test_the_least_recently_used_chain_is_dropped_over_the_budget_and_its_bytes_forgotten() -> None:
    kv, shadow = spilling(host_tokens=40)  # room for two 20-token chains
    for base in (100, 200):
        run(kv, shadow, seq([*system(base), 1]))
    assert kv.match_prefix(seq([*system(100), 2])).host is not None
    run(kv, shadow, seq([*system(100), 2]))  # a hit: 100 is now more recent than 200
    run(kv, shadow, seq([*system(300), 1]))  # a third chain: 200 goes
    assert kv.match_prefix(seq([*system(200), 2])).host is None
    assert kv.match_prefix(seq([*system(100), 3])).host is not None
    assert len(shadow.saved) == 2  # the drop op removed 200's bytes


def test_a_pool_hit_is_kept_unless_the_spilled_chain_reaches_two_blocks_further() -> None:
    kv, shadow = spilling(cached_blocks=4)
    run(kv, shadow, seq([*system(100), 1]))  # the pool keeps 4 blocks of 5; the evicted tail spills all 5
    assert len(shadow.saved) == 1
    hit = kv.match_prefix(seq([*system(100), 2]))
    assert hit.host is None and hit.num_tokens == 16  # the pool's 4 blocks, shared, not a 5-block copy
    run(kv, shadow, seq([*system(900, blocks=1), 1]))  # one more block cached: the pool keeps 3 of 5
    hit = kv.match_prefix(seq([*system(100), 2]))
    assert hit.host is not None and hit.num_tokens == 20  # 2 blocks further: copied back


def test_a_load_finds_room_because_the_evictions_it_caused_are_applied_first() -> None:
    kv, shadow = spilling(host_tokens=200, cached_blocks=32)  # a full pool of cached chains
    for base in range(6):
        run(kv, shadow, seq([*system(1000 * (base + 1)), 1]))
    run(kv, shadow, seq([*system(50000, blocks=8), 1]))  # evicts (and spills) older chains
    late = seq(system(1000) + [5] * 40)
    hit = kv.match_prefix(late)
    assert hit.num_tokens == 20
    run(kv, shadow, late)  # ShadowKV fails if the load's cells would overflow the pool


def test_a_chain_adding_fewer_than_min_blocks_to_a_held_one_is_not_saved_again() -> None:
    kv, shadow = spilling(host_tokens=200)
    run(kv, shadow, seq([*system(100), 1]))  # 5 blocks saved
    run(kv, shadow, seq([*system(100), *range(900, 900 + 3 * BS), 1]))  # + 3 blocks: not worth a copy
    assert len(shadow.saved) == 1
    run(kv, shadow, seq([*system(100), *range(900, 900 + 4 * BS), 1]))  # + 4 blocks: a second entry
    assert len(shadow.saved) == 2 and kv.match_prefix(seq([*system(100), *range(900, 900 + 4 * BS), 2])).num_tokens == 36


@pytest.mark.parametrize("budget", [0, 15])
def test_no_chain_is_spilled_that_the_budget_cannot_hold(budget: int) -> None:
    kv, shadow = spilling(host_tokens=budget)
    run(kv, shadow, seq([*system(100), 1]))
    assert shadow.saved == {} and kv.match_prefix(seq([*system(100), 2])).num_tokens == 0


def test_a_hit_on_the_least_recently_used_chain_survives_the_spill_its_lane_reclaim_makes() -> None:
    """Every lane busy or holding a cached chain: admitting a prompt that hits the host tier's oldest
    chain takes a holder lane, whose chain spills and pushes the oldest chain out of a full tier. The
    hit is made the most recently used first (it used to be looked up after the spill: KeyError)."""
    host = HostPrefixes(39, BS, min_blocks=4)  # room for one chain of 20 tokens
    kv, shadow = KVBlockManager(32, BS, 2, max_cached_blocks=5, host=host), ShadowKV(32 * BS)
    run(kv, shadow, seq([*system(100), 1]))  # cached in the pool (5 blocks, the cap)
    run(kv, shadow, seq([*system(200), 1]))  # evicts the first chain: spilled
    busy = seq([5, 6, 7])
    assert kv.allocate(busy, kv.match_prefix(busy), 3)  # the other lane runs
    later = seq([*system(100), 7])
    hit = kv.match_prefix(later)
    assert hit.host is not None and hit.num_tokens == 20
    assert kv.allocate(later, hit, 1)  # reclaims the second chain's lane: it spills too
    shadow.apply(kv.take_ops())  # the load finds its bytes gone (pushed out after all): computed instead
    assert shadow.lane_tokens(later.lane) == system(100)  # type: ignore[arg-type]
    check_integrity(kv, [busy, later])
