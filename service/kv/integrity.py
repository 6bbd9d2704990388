"""The KV block manager's invariants, checked from outside: a white-box audit for tests and simulations.

Every block is in exactly one state (free, used, cached); the prefix tree and the cache agree;
each lane and block agree on who holds which cells; given the running sequences, the reference
counts equal their block-table entries. The suite runs this after every engine step of its
servers (``tests/support/server.py``) and of its simulations.

NOTE: it reads the manager's private fields on purpose: the audit must see the accounting itself,
not a summary the manager computes (which would share the manager's bugs). ``KVAccounting`` names
those fields, read-only; ``service.paged_kv.KVBlockManager`` has them, so the audit sits below the
manager it audits and never imports it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from collections.abc import Sequence as Seq
from collections.abc import Set as AbstractSet
from typing import Protocol

from service.kv.blocks import Block
from service.request.sequence import Sequence


class KVAccounting(Protocol):
    """What the audit reads of a block manager (``KVBlockManager``): its blocks and its own bookkeeping."""

    @property
    def num_blocks(self) -> int: ...

    @property
    def blocks(self) -> Seq[Block]: ...

    @property
    def _free(self) -> Seq[int]: ...  # free block ids (a stack)

    @property
    def _evictable(self) -> Mapping[int, Block]: ...  # cached: registered blocks with ref_count 0

    @property
    def _cache(self) -> Mapping[int, Block]: ...  # chain hash -> registered block

    @property
    def _children(self) -> Mapping[int, Collection[int]]: ...  # parent hash -> registered block ids

    @property
    def _free_lanes(self) -> Seq[int]: ...

    @property
    def _running_lanes(self) -> AbstractSet[int]: ...

    @property
    def _lane_blocks(self) -> Mapping[int, AbstractSet[int]]: ...  # lane -> ids of the blocks it holds cells of

    def blocks_for(self, num_tokens: int) -> int: ...


def check_integrity(kv: KVAccounting, running: list[Sequence] | None = None) -> None:
    """Assert ``kv``'s accounting invariants (and, given the running sequences, their block
    tables); raise AssertionError naming the first broken one."""
    free, cached = set(kv._free), set(kv._evictable)
    used = {b.id for b in kv.blocks if b.ref_count > 0}
    assert len(free) == len(kv._free), "a block is on the free list twice"
    assert not (free & cached) and not (free & used) and not (cached & used), "a block is in two states"
    assert len(free) + len(used) + len(cached) == kv.num_blocks, (
        f"free {len(free)} + used {len(used)} + cached {len(cached)} != total {kv.num_blocks}"
    )
    for h, block in kv._cache.items():
        assert block.hash == h, f"block {block.id} registered under a stale hash"
        assert block.id in kv._children.get(block.parent, ()), f"block {block.id} missing from its parent"
    assert sum(map(len, kv._children.values())) == len(kv._cache), "stale prefix-tree entries"
    for block in kv.blocks:
        if block.id in free:
            assert not block.holders and block.hash is None, f"free block {block.id} still holds cells"
        else:
            assert block.holders, f"block {block.id} in use but held by no lane"
        for lane in block.holders:
            assert block.id in kv._lane_blocks[lane], f"lane {lane} lost track of block {block.id}"
    _check_lanes(kv)
    if running is not None:
        _check_tables(kv, running)


def _check_lanes(kv: KVAccounting) -> None:
    free_lanes = set(kv._free_lanes)
    assert len(free_lanes) == len(kv._free_lanes), "a lane is free twice"
    assert not (free_lanes & kv._running_lanes), "a lane is both free and running"
    for lane, held in kv._lane_blocks.items():
        for bid in held:
            assert lane in kv.blocks[bid].holders, f"lane {lane} claims block {bid} it does not hold"
        if lane in free_lanes:
            assert not held, f"free lane {lane} still holds cells"
        elif lane not in kv._running_lanes:
            assert held, f"lane {lane} is neither free, running nor holding"


def _check_tables(kv: KVAccounting, running: list[Sequence]) -> None:
    refs: dict[int, int] = {}
    for seq in running:
        assert seq.lane in kv._running_lanes, f"{seq.request_id} runs without its lane"
        assert len(seq.block_table) >= kv.blocks_for(seq.num_computed), f"{seq.request_id} lacks blocks"
        for bid in seq.block_table:
            refs[bid] = refs.get(bid, 0) + 1
            assert seq.lane in kv.blocks[bid].holders, f"{seq.request_id} block {bid} not in its lane"
    for block in kv.blocks:
        assert block.ref_count == refs.get(block.id, 0), (
            f"block {block.id} ref_count {block.ref_count} != {refs.get(block.id, 0)} table references"
        )
        if refs.get(block.id, 0) > 1:
            assert block.hash is not None, f"unregistered block {block.id} is shared"
    assert len(kv._running_lanes) == len(running), "running lanes do not match running sequences"
