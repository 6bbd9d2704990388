"""Block-based KV cache manager with shared-prefix reuse over llama.cpp's unified pool.

llama.cpp owns the physical KV cells; this module owns the *accounting* and
decides which cells live. The pool of ``n_ctx`` cells is split into
``num_blocks`` blocks of ``block_size`` tokens. A sequence takes blocks as it
grows; nothing is reserved for ``max_tokens``. Because every block accounts for
``block_size`` cells while holding at most that many, llama.cpp can never run
out of cells as long as allocation here succeeds.

Lanes are llama.cpp sequence ids (``0 .. num_lanes-1``). A running sequence
owns one lane. A cell may belong to several lanes at once, so sharing a cached
prefix is zero-copy: ``llama_memory_seq_cp(holder, lane, p0, p1)``::

    prompt A  [ sys sys sys | sys sys sys | A A A ]      lane 3 (finished)
    prompt B  [ sys sys sys | sys sys sys | B B ]        lane 7 (running)
                 block 12     block 40      block 51 / block 9
                 ^^^^^^^^^^^^^^^^^^^^^^^^ cells in lanes {3, 7}: cp(3 -> 7, 0, 2*bs)

When a sequence finishes, its full blocks stay cached (their lanes become
*holder* lanes) until memory is needed or the cache exceeds ``max_cached_blocks``;
then blocks are evicted LRU, tail first, and their cells removed from every
holder lane. A lane is reused only when it holds no cells. This module never
calls llama.cpp: it queues ``KVOp``s that the engine applies before the next
decode.

NOTE: cached cells are not free to keep. With a unified pool llama.cpp attends
(and builds masks) over every cell up to the highest one in use, and new cells
land in the holes between cached ones. Measured on Gemma 3 270M: a 1,100-token
prefill takes ~1.8 s beside an empty cache and 2.1-2.2 s beside ~2,000 cached
cells of other prefixes; batch-16 decode steps pay 0-6% for 1,700-5,000 idle
cells. The cap bounds that tax; the host tier (``service.kv.host_prefixes``) keeps
the chains it evicts, outside the pool.

NOTE: for a model with a sliding window (Gemma 3) ``pin_lane`` must be set: llama.cpp
would otherwise hand a cached block's cells to new tokens once they are outside its
holder's window, and a prefix shared from there would lack them (wrong attention, or
llama_decode -1 when the copy's last cell went); see ``service.kv.window_pins``.
"""

from __future__ import annotations

from service.kv.blocks import Block, KVOp, KVStats, PrefixHit, block_hash
from service.kv.events import AllBlocksCleared, BlockRemoved, KVEvent, KVEventLog, stored_runs
from service.kv.host_prefixes import HostEntry, HostHit, HostPrefixes, shared_len
from service.kv.window_pins import WindowPins
from service.observability.views import KVSnapshot
from service.request.sequence import Sequence

HOST_GAIN_BLOCKS = 2  # a spilled chain must reach this many blocks past the pool's hit to be used


class KVBlockManager:
    """Allocates blocks and lanes; see the module docstring for the model."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_lanes: int,
        prefix_cache: bool = True,
        max_cached_blocks: int | None = None,
        host: HostPrefixes | None = None,
        events: KVEventLog | None = None,
        pin_lane: int | None = None,
    ) -> None:
        """``max_cached_blocks``: most unreferenced blocks kept for reuse (None = no cap);
        ``host``: where evicted chains are spilled (None = they are lost); ``events``: where the
        blocks registered in and taken out of the prefix index are recorded (None: nowhere; the host
        tier records its own, given the same log); ``pin_lane``: a sequence id outside the lanes
        that also holds every full block's cells (None: none; see the module's last NOTE)."""
        if num_blocks < 1 or block_size < 1 or num_lanes < 1:
            raise ValueError("num_blocks, block_size and num_lanes must be positive")
        if max_cached_blocks is not None and max_cached_blocks < 0:
            raise ValueError("max_cached_blocks must be >= 0")
        self.max_cached_blocks = num_blocks if max_cached_blocks is None else max_cached_blocks
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_lanes = num_lanes
        self.prefix_cache = prefix_cache
        self.host = host if prefix_cache else None
        self.events = events
        if pin_lane is not None and 0 <= pin_lane < num_lanes:
            raise ValueError("pin_lane must not be one of the lanes")
        self.pins = WindowPins(pin_lane, block_size) if pin_lane is not None else None
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._cache: dict[int, Block] = {}  # hash -> registered block
        self._children: dict[int, set[int]] = {}  # parent hash -> registered block ids
        self._evictable: dict[int, Block] = {}  # registered blocks with ref_count 0
        self._free_lanes: list[int] = list(range(num_lanes - 1, -1, -1))
        self._running_lanes: set[int] = set()
        self._lane_blocks: dict[int, set[int]] = {lane: set() for lane in range(num_lanes)}
        self._lane_used: dict[int, int] = {}
        self._ops: list[KVOp] = []
        self._tick = 0
        self.stats = KVStats()

    # -- queries -----------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free) - len(self._evictable)

    @property
    def num_holder_lanes(self) -> int:
        return sum(1 for lane, b in self._lane_blocks.items() if b and lane not in self._running_lanes)

    def view(self) -> KVSnapshot:
        """The pool's block states and prefix-cache counters, for metrics (any thread: plain reads,
        each consistent on its own, as GetMetrics has always read them)."""
        stats = self.stats
        return KVSnapshot(
            blocks_total=self.num_blocks,
            blocks_used=self.num_used,
            blocks_cached=self.num_cached,
            blocks_free=self.num_free,
            block_size=self.block_size,
            holder_lanes=self.num_holder_lanes,
            host_prefixes=len(self.host) if self.host is not None else 0,
            prefix_hit_tokens=stats.hit_tokens,
            prompt_tokens=stats.prompt_tokens,
            host_hit_tokens=stats.host_hit_tokens,
            evictions=stats.evictions,
        )

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def take_ops(self) -> list[KVOp]:
        """Return and clear the cell operations queued since the last call."""
        ops, self._ops = self._ops, []
        return ops

    # -- prefix cache ----------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> PrefixHit:
        """Longest cached prefix of ``seq`` (whole blocks, then a partial one), leaving >= 1 token to compute."""
        if not self.prefix_cache:
            return PrefixHit()
        hits: list[Block] = []
        parent = 0
        bs = self.block_size
        last = seq.num_tokens - 1  # the last token is always computed (its logits are needed)
        for i in range(last // bs):
            toks = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = block_hash(parent, toks)
            block = self._cache.get(h)
            if block is None or block.tokens != toks:
                break
            hits.append(block)
            parent = h
        start = len(hits) * bs
        partial, k = self._best_child(parent, seq.token_ids[start : min(start + bs, last)])
        spilled = self._match_host(seq, last, [b.hash for b in hits if b.hash is not None])
        # NOTE: a spilled chain replaces the pool's hit only when it reaches HOST_GAIN_BLOCKS further:
        # sharing pool cells is free, copying back is not, and it duplicates the common part's cells.
        if spilled is not None and spilled.num_tokens >= start + k + HOST_GAIN_BLOCKS * bs:
            return PrefixHit(num_tokens=spilled.num_tokens, host=spilled)
        return PrefixHit(tuple(hits), partial, k, start + k)

    def _match_host(self, seq: Sequence, limit: int, hashes: list[int]) -> HostHit | None:
        """The longest spilled chain that starts ``seq``, at most its first ``limit`` tokens;
        ``hashes``: the chain hashes of its first blocks, already found in the pool (extended here)."""
        if self.host is None or not len(self.host):
            return None
        parent, bs = hashes[-1] if hashes else 0, self.block_size
        for i in range(len(hashes), limit // bs):
            parent = block_hash(parent, tuple(seq.token_ids[i * bs : (i + 1) * bs]))
            hashes.append(parent)
        return self.host.match(seq.token_ids, hashes, limit)

    def _best_child(self, parent: int, want: list[int]) -> tuple[Block | None, int]:
        """The cached block after ``parent`` sharing the most leading tokens with ``want``."""
        best, best_k = None, 0
        for bid in self._children.get(parent, ()):
            block = self.blocks[bid]
            k = shared_len(block.tokens, want)
            if k > best_k:
                best, best_k = block, k
        return best, best_k

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's newly completed full blocks in the prefix cache."""
        if not self.prefix_cache:
            return
        bs = self.block_size
        stored: list[tuple[int, int, tuple[int, ...]]] = []
        for i in range(len(seq.block_hashes), seq.num_computed // bs):
            toks = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = block_hash(seq.block_hashes[-1] if seq.block_hashes else 0, toks)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self._cache:
                parent = seq.block_hashes[-2] if len(seq.block_hashes) > 1 else 0
                block.hash, block.tokens, block.parent = h, toks, parent
                self._cache[h] = block
                self._children.setdefault(parent, set()).add(block.id)
                self._pin(block, seq.lane)
                stored.append((h, parent, toks))
            elif block.hash is None and self.pins is not None:
                self._adopt(seq, i, self._cache[h])
        if stored and self.events is not None:
            for event in stored_runs(stored, "pool"):
                self.events.add(event)

    # -- the prefix index seen from outside -------------------------------------------
    def flush_events(self) -> None:
        """Engine thread, once per step: hand the step's records to the event outlet (if any)."""
        if self.events is not None:
            self.events.flush(self._index_records)

    def _index_records(self) -> list[KVEvent]:
        """The whole prefix index as records (a resynchronisation after a dropped batch)."""
        pool = sorted(self._cache.values(), key=lambda b: b.start)  # NOTE: depth order: parents first
        out: list[KVEvent] = [AllBlocksCleared()]
        out += stored_runs(((b.hash, b.parent, b.tokens) for b in pool if b.hash is not None), "pool")
        return out + (self.host.records() if self.host is not None else [])

    def indexed(self) -> tuple[frozenset[int], frozenset[int]]:
        """The chain hashes in the prefix index: of the pool's registered blocks, and of the host
        tier's (engine thread, or a quiescent engine)."""
        return frozenset(self._cache), self.host.held() if self.host is not None else frozenset()

    # -- allocation ---------------------------------------------------------------
    def allocate(self, seq: Sequence, hit: PrefixHit, num_new_tokens: int) -> bool:
        """Admit ``seq``: give it a lane, reuse ``hit`` and take blocks for ``num_new_tokens`` more.

        Returns False (and changes nothing) when memory or lanes are short; the
        caller then preempts or leaves the sequence waiting.
        """
        assert not seq.block_table and seq.lane is None, "sequence already holds KV"
        if hit.host is not None:
            return self._allocate_spilled(seq, hit.host, num_new_tokens)
        need = self.blocks_for(hit.num_tokens + num_new_tokens) - len(hit.blocks)
        reusable = sum(1 for b in hit.blocks if b.ref_count == 0)
        if need > len(self._free) + len(self._evictable) - reusable:
            return False
        keep = {b.id for b in hit.blocks} | ({hit.partial.id} if hit.partial else set())
        lane = self._take_lane(exclude=keep)
        if lane is None:
            return False
        self._running_lanes.add(lane)
        seq.lane = lane
        self._share(seq, list(hit.blocks))
        if hit.partial is not None:
            # NOTE: the copied cells are then covered by the sequence's own block for
            # this range (allocated below), so evicting ``partial`` later is safe; the
            # copy is queued before any eviction's removal, and ops apply in order.
            p = hit.partial
            self._merge_op(KVOp("cp", lane, p.start, p.start + hit.partial_len, min(p.holders)))
        self._count_hit(seq, hit.num_tokens)
        return self._grow(seq, hit.num_tokens + num_new_tokens)

    def _allocate_spilled(self, seq: Sequence, hit: HostHit, num_new_tokens: int) -> bool:
        """``allocate`` for a spilled chain: own blocks for it, its cells copied back into the lane."""
        assert self.host is not None
        if self.blocks_for(hit.num_tokens + num_new_tokens) > len(self._free) + len(self._evictable):
            return False
        # NOTE: most recently used before any eviction (taking a lane may evict too): the chains those
        # spill push others out of the host tier, not this one
        self.host.use(hit.key)
        lane = self._take_lane(exclude=set())
        if lane is None:
            return False
        self._running_lanes.add(lane)
        seq.lane = lane
        self.stats.host_hit_tokens += self._count_hit(seq, hit.num_tokens)
        ok = self._grow(seq, hit.num_tokens + num_new_tokens)
        pinned = 0
        if self.pins is not None:  # NOTE: the whole blocks loaded are pinned as they land (see _adopt's NOTE)
            pinned = hit.num_tokens // self.block_size * self.block_size
            for bid in seq.block_table[: pinned // self.block_size]:
                self.pins.track(self.blocks[bid])
        # NOTE: queued after the growth's evictions, so their cells are free when the copy lands.
        self._ops.append(KVOp("load", lane, 0, hit.num_tokens, key=hit.key, tokens=hit.tokens, pinned=pinned))
        return ok

    def _count_hit(self, seq: Sequence, num_tokens: int) -> int:
        """Start ``seq`` after ``num_tokens`` reused tokens; returns the prompt tokens counted as hits."""
        seq.num_computed = num_tokens
        if not seq.num_prompt_tokens or seq.preemptions:
            return 0
        seq.num_cached = min(num_tokens, seq.num_prompt_tokens)
        self.stats.prompt_tokens += seq.num_prompt_tokens
        self.stats.hit_tokens += seq.num_cached
        return seq.num_cached

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more computed tokens; False if memory is short."""
        need = self.blocks_for(seq.num_computed + num_new_tokens) - len(seq.block_table)
        if need > len(self._free) + len(self._evictable):
            return False
        return self._grow(seq, seq.num_computed + num_new_tokens)

    def forget_cells(self, seq: Sequence, p0: int, p1: int) -> None:
        """Queue removal of the running ``seq``'s cells in [p0, p1) (rejected speculative tokens).

        NOTE: only positions past ``num_computed``, so never inside a registered (shared) block;
        the blocks stay in the table and are written again by the next tokens.
        """
        assert seq.lane is not None and p0 >= seq.num_computed
        self._ops.append(KVOp("rm", seq.lane, p0, p1))

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks and lane. Full registered blocks stay cached."""
        self._tick += 1
        for bid in reversed(seq.block_table):
            block = self.blocks[bid]
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.hash is not None:
                block.last_used = self._tick
                self._evictable[bid] = block
            else:
                self._drop_cells(block)
                self._free.append(bid)
        lane = seq.lane
        seq.block_table = []
        seq.block_hashes = []
        seq.lane = None
        if lane is not None:
            self._running_lanes.discard(lane)
            self._lane_used[lane] = self._tick
            if not self._lane_blocks[lane]:
                self._free_lanes.append(lane)
        while len(self._evictable) > self.max_cached_blocks:
            self._evict(self._lru_victim())

    # -- internals ------------------------------------------------------------------
    def _share(self, seq: Sequence, hits: list[Block]) -> None:
        """Take references on cached blocks and copy their cells into the sequence's lane."""
        assert seq.lane is not None
        self._tick += 1
        src = -1
        for block in hits:
            if block.ref_count == 0:
                del self._evictable[block.id]
            block.ref_count += 1
            block.last_used = self._tick
            if src not in block.holders:
                src = min(block.holders)
            self._merge_op(KVOp("cp", seq.lane, block.start, block.start + self.block_size, src))
            block.holders.add(seq.lane)
            self._lane_blocks[seq.lane].add(block.id)
            seq.block_table.append(block.id)
            assert block.hash is not None
            seq.block_hashes.append(block.hash)

    def _merge_op(self, op: KVOp) -> None:
        last = self._ops[-1] if self._ops else None
        if last and (last.kind, last.lane, last.src, last.p1) == (op.kind, op.lane, op.src, op.p0):
            self._ops[-1] = KVOp(op.kind, op.lane, last.p0, op.p1, op.src)
        else:
            self._ops.append(op)

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        assert seq.lane is not None
        while len(seq.block_table) < self.blocks_for(num_tokens):
            bid = self._take_block()
            if bid is None:  # pragma: no cover - callers check capacity first
                return False
            block = self.blocks[bid]
            block.ref_count = 1
            block.start = len(seq.block_table) * self.block_size
            block.holders = {seq.lane}
            self._lane_blocks[seq.lane].add(bid)
            seq.block_table.append(bid)
        return True

    def _take_block(self) -> int | None:
        if not self._free and self._evictable:
            self._evict(self._lru_victim())
        return self._free.pop() if self._free else None

    def _lru_victim(self) -> Block:
        # NOTE: LRU, and within one chain the tail first (larger start), so a
        # surviving prefix stays reachable through its hash chain.
        return min(self._evictable.values(), key=lambda b: (b.last_used, -b.start))

    def _evict(self, block: Block) -> None:
        del self._evictable[block.id]
        assert block.hash is not None
        self._spill(block)
        del self._cache[block.hash]
        if self.events is not None:
            self.events.add(BlockRemoved((block.hash,), "pool"))
        self._children[block.parent].discard(block.id)
        if not self._children[block.parent]:
            del self._children[block.parent]
        block.hash, block.tokens, block.parent = None, (), 0
        self._drop_cells(block)
        self._free.append(block.id)
        self.stats.evictions += 1

    def _pin(self, block: Block, lane: int | None) -> None:
        if self.pins is not None and lane is not None and (op := self.pins.pin(block, lane)) is not None:
            self._merge_op(op)

    def _adopt(self, seq: Sequence, i: int, cached: Block) -> None:
        """With pins: ``seq`` computed its ``i``-th block as the index already holds it; it takes the
        cached block's cells instead and frees its own.

        NOTE: its own copy would be held by its lane alone, and when llama.cpp gives such a cell to a
        new token outside the window it purges the lane from every cell before it, cached blocks' too.
        """
        assert seq.lane is not None
        own, src = self.blocks[seq.block_table[i]], min(cached.holders)
        if cached.ref_count == 0:
            del self._evictable[cached.id]
        cached.ref_count += 1
        own.ref_count = 0
        self._drop_cells(own)
        self._free.append(own.id)
        self._merge_op(KVOp("cp", seq.lane, cached.start, cached.start + self.block_size, src))
        cached.holders.add(seq.lane)
        self._lane_blocks[seq.lane].add(cached.id)
        seq.block_table[i] = cached.id

    def _spill(self, block: Block) -> None:
        """Before the last block of a cached chain goes, save the whole chain to the host tier.

        Only a chain whose every block is still cached and held by one lane (the lane whose cells
        are saved), and that adds enough to what the host tier holds (``worth_spilling``).
        """
        assert block.hash is not None
        if self.host is None or self._children.get(block.hash):
            return
        chain = [block]
        while chain[-1].parent:
            parent = self._cache.get(chain[-1].parent)
            if parent is None:
                return
            chain.append(parent)
        chain.reverse()
        lanes = set.intersection(*(b.holders for b in chain))
        starts_ok = all(b.start == i * self.block_size for i, b in enumerate(chain))
        hashes = tuple(b.hash for b in chain if b.hash is not None)
        if not lanes or not starts_ok or not self.host.worth_spilling(hashes):
            return
        entry = HostEntry(block.hash, tuple(t for b in chain for t in b.tokens), hashes)
        self._ops.append(KVOp("save", min(lanes), 0, len(entry.tokens), key=entry.key))
        self._ops += [KVOp("drop", -1, 0, 0, key=key) for key in self.host.add(entry)]

    def _drop_cells(self, block: Block) -> None:
        if self.pins is not None:  # NOTE: first, while the other pinned blocks' holders are as recorded
            self._ops += self.pins.unpin(block, lambda bid: min(self.blocks[bid].holders))
        for lane in sorted(block.holders):
            self._merge_op(KVOp("rm", lane, block.start, block.start + self.block_size))
            held = self._lane_blocks[lane]
            held.discard(block.id)
            if not held and lane not in self._running_lanes and lane not in self._free_lanes:
                self._free_lanes.append(lane)
        block.holders = set()

    def _take_lane(self, exclude: set[int]) -> int | None:
        """A lane with no cells; reclaims the least recently used holder lane if needed.

        A holder lane is reclaimable unless it is the only holder of a block in
        ``exclude`` (blocks about to be shared); then the next one is tried.
        """
        if self._free_lanes:
            return self._free_lanes.pop()
        holders = sorted(
            (lane for lane, held in self._lane_blocks.items() if held and lane not in self._running_lanes),
            key=lambda ln: self._lane_used.get(ln, 0),
        )
        for lane in holders:
            held = self._lane_blocks[lane]
            if any(len(self.blocks[b].holders) == 1 and b in exclude for b in held):
                continue
            for bid in sorted(held, key=lambda i: -self.blocks[i].start):
                block = self.blocks[bid]
                if len(block.holders) > 1:
                    self._merge_op(KVOp("rm", lane, block.start, block.start + self.block_size))
                    block.holders.discard(lane)
                    held.discard(bid)
                else:
                    self._evict(block)  # frees the lane when its last block goes
            if lane not in self._free_lanes:
                self._free_lanes.append(lane)
            return self._free_lanes.pop()
        return None
