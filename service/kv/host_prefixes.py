"""The host tier of the prefix cache: which evicted prefixes have their KV in host memory.

The KV pool keeps few idle prefixes (``--prefix-cache-tokens``), because idle
cells widen every running sequence's attention range in llama.cpp's unified
pool. When ``paged_kv`` evicts the last block of a cached chain, it *spills*
the chain instead of losing it: the engine copies the chain's cells out of the
pool into host memory (``KVOp`` ``save``), and a later request whose prompt
starts with that chain gets them copied back into its own lane (``load``)
instead of computing them again. Copying a 512-token prefix back takes about a
millisecond; computing it takes about a second on this hardware, and the
copied cells are the computed ones, bit for bit.

This module is only the index (keys, token counts, LRU under a token budget);
the bytes live with the model runner, which drops them when told (``drop``).
Pure bookkeeping: nothing here calls llama.cpp.

    chain in the pool        [ b0 | b1 | b2 | b3 ]  evicted tail first ->
    spilled entry            key = hash(b3), tokens = b0..b3, hashes = (h0, h1, h2, h3)
    new prompt               [ b0 | b1 | b2 | x ... ]  -> host hit of 3 blocks (h2 found)

With an event log (``service.kv.events``), the blocks the tier starts or stops holding are recorded
(tier ``host``): entries share their first blocks (every entry starts at position 0), so a block is
held while any entry holds it, and what an entry adds or releases is a tail of its chain.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from service.kv.events import BlockRemoved, BlockStored, KVEvent, KVEventLog

MIN_BLOCKS = 4  # NOTE: shorter chains are cheap to recompute; not worth a copy out and back


@dataclass(frozen=True)
class HostEntry:
    """One spilled chain: ``tokens`` (whole blocks from position 0) and each block's chain hash."""

    key: int  # the chain hash of its last block
    tokens: tuple[int, ...]
    hashes: tuple[int, ...]


@dataclass(frozen=True)
class HostHit:
    """A spilled chain's first ``num_tokens`` tokens match a new sequence's prompt."""

    key: int
    num_tokens: int
    tokens: tuple[int, ...]  # those tokens (what to compute if the bytes are gone)


class HostPrefixes:
    """Spilled chains under a budget of ``max_tokens``, least recently used dropped first."""

    def __init__(
        self, max_tokens: int, block_size: int, min_blocks: int = MIN_BLOCKS, events: KVEventLog | None = None
    ) -> None:
        """``events``: where the blocks held and released are recorded (None: nowhere)."""
        if max_tokens < 0 or block_size < 1 or min_blocks < 1:
            raise ValueError("max_tokens >= 0, block_size >= 1 and min_blocks >= 1 are required")
        self.max_tokens = max_tokens
        self.block_size = block_size
        self.min_blocks = min_blocks
        self.events = events
        self._entries: OrderedDict[int, HostEntry] = OrderedDict()  # LRU first
        self._by_hash: dict[int, set[int]] = {}  # chain hash -> keys of entries holding it
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def worth_spilling(self, hashes: Seq[int]) -> bool:
        """Is a chain with these block hashes worth a copy: it fits, and it adds at least
        ``min_blocks`` blocks to the longest of its prefixes already held?

        NOTE: a system prompt followed by a short user turn adds a block or two to a held prompt;
        copying all of it again for those would cost a save per request and crowd the budget.
        """
        held = _depth(hashes, self._by_hash)
        return len(hashes) - held >= self.min_blocks and len(hashes) * self.block_size <= self.max_tokens

    def add(self, entry: HostEntry) -> list[int]:
        """Index ``entry`` (most recently used); returns the keys dropped to stay within the budget."""
        assert entry.key not in self._entries and len(entry.tokens) == len(entry.hashes) * self.block_size
        if self.events is not None:
            held = _depth(entry.hashes, self._by_hash)
            if held < len(entry.hashes):
                self.events.add(self._stored(entry, held))
        self._entries[entry.key] = entry
        for h in entry.hashes:
            self._by_hash.setdefault(h, set()).add(entry.key)
        self.num_tokens += len(entry.tokens)
        dropped: list[int] = []
        while self.num_tokens > self.max_tokens:
            dropped.append(self._drop_lru())
        return dropped

    def match(self, token_ids: Seq[int], hashes: Seq[int], limit: int) -> HostHit | None:
        """The longest spilled prefix of a prompt whose full blocks hash to ``hashes`` (chain hashes),
        at most ``limit`` tokens: the deepest whole blocks found, then as many tokens of the entry's
        next block as the prompt shares.

        NOTE: the partial block matters: a prompt that repeats a long system prompt with a new
        user turn shares the block where the system prompt ends only in part, and without
        the part it would compute up to a block of tokens again on every request.
        """
        for depth in range(len(hashes), 0, -1):
            n = depth * self.block_size
            found = [
                entry
                for entry in map(self._entries.__getitem__, self._by_hash.get(hashes[depth - 1], ()))
                if entry.hashes[depth - 1] == hashes[depth - 1] and tuple(token_ids[:n]) == entry.tokens[:n]
            ]
            if found:
                tail = token_ids[n:limit]
                best = max(found, key=lambda e: shared_len(e.tokens[n:], tail))
                k = shared_len(best.tokens[n:], tail)
                return HostHit(best.key, n + k, best.tokens[: n + k])
        return None

    def use(self, key: int) -> None:
        """A hit is being loaded: it becomes the most recently used."""
        self._entries.move_to_end(key)

    def held(self) -> frozenset[int]:
        """The chain hashes of every block the tier holds."""
        return frozenset(self._by_hash)

    def records(self) -> list[KVEvent]:
        """What the tier holds, as ``BlockStored`` records (each block once, parents first)."""
        out: list[KVEvent] = []
        seen: set[int] = set()
        for entry in self._entries.values():
            done = _depth(entry.hashes, seen)
            if done < len(entry.hashes):
                out.append(self._stored(entry, done))
                seen.update(entry.hashes[done:])
        return out

    def _stored(self, entry: HostEntry, start: int) -> BlockStored:
        """The record of ``entry``'s blocks from ``start`` on."""
        bs = self.block_size
        parent = entry.hashes[start - 1] if start else 0
        return BlockStored(entry.hashes[start:], parent, entry.tokens[start * bs :], "host")

    def _drop_lru(self) -> int:
        key, entry = self._entries.popitem(last=False)
        released: list[int] = []
        for h in entry.hashes:
            keys = self._by_hash[h]
            keys.discard(key)
            if not keys:
                del self._by_hash[h]
                released.append(h)
        self.num_tokens -= len(entry.tokens)
        if self.events is not None and released:
            self.events.add(BlockRemoved(tuple(released), "host"))
        return key


def _depth(hashes: Seq[int], held: Container[int]) -> int:
    """How many leading blocks of a chain are held: the deepest block whose hash is in ``held``
    (a chain hash names its whole prefix)."""
    return next((d for d in range(len(hashes), 0, -1) if hashes[d - 1] in held), 0)


def shared_len(a: Seq[int], b: Seq[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    k = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        k += 1
    return k
