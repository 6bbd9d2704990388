"""What the prefix cache tells the outside: which blocks it holds, as typed records.

The block manager (``service.paged_kv``) and the host tier (``service.kv.host_prefixes``) record
every change of what a prefix-aware router may route by: a full block registered in the prefix
index (``BlockStored``), one taken out of it (``BlockRemoved``), everything forgotten
(``AllBlocksCleared``). ``tier`` says where the block's cells are: ``pool`` (llama.cpp's KV pool,
shared at no cost) or ``host`` (the host tier: copied back into the pool on a hit).

Block hashes are the manager's own chain hashes (``service.kv.blocks.block_hash``: a block's
tokens and the hash of the block before it, 0 before the first), so a hash names a whole prefix.

``KVEventLog`` collects one engine step's records on the engine thread and hands them, as one
batch, to an ``EventOutlet`` that must never block (the publisher of ``service.kv_events``). A
batch the outlet refuses (its queue is full) is not lost silently: the next batch that fits is a
resynchronisation instead, ``AllBlocksCleared`` then the whole current index, so a subscriber
that applies every batch in order ends with the manager's index. Nothing here knows a wire
format or a socket.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

log = logging.getLogger("service.kv")
Tier = Literal["pool", "host"]


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks now held in ``tier``: ``hashes`` in chain order, their ``tokens`` (block_size each),
    ``parent`` the hash of the block before the first (0: they start the prompt)."""

    hashes: tuple[int, ...]
    parent: int
    tokens: tuple[int, ...]
    tier: Tier


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks no longer held in ``tier``."""

    hashes: tuple[int, ...]
    tier: Tier


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Nothing is held any more (a start, a stop, or the head of a resynchronisation)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One engine step's records, in the order they happened; ``ts`` is wall-clock seconds."""

    ts: float
    events: tuple[KVEvent, ...]
    block_size: int


class EventOutlet(Protocol):
    """Takes batches off the engine thread; implementations never block."""

    def offer(self, batch: EventBatch) -> bool:
        """Queue ``batch``; False when it was dropped (the queue was full)."""
        ...


class KVEventLog:
    """One step's records (engine thread only; see the module docstring)."""

    def __init__(self, outlet: EventOutlet, block_size: int) -> None:
        self.outlet = outlet
        self.block_size = block_size
        self._pending: list[KVEvent] = [AllBlocksCleared()]  # NOTE: a new replica holds nothing
        self._lost = False  # a batch was dropped: the next one is a resynchronisation

    def add(self, event: KVEvent) -> None:
        self._pending.append(event)

    def flush(self, snapshot: Callable[[], list[KVEvent]]) -> None:
        """Hand the step's records to the outlet; ``snapshot`` is the whole index as records, used
        (instead of the step's records) after a dropped batch."""
        if not self._pending and not self._lost:
            return
        events, self._pending = (snapshot() if self._lost else self._pending), []
        try:
            accepted = self.outlet.offer(EventBatch(time.time(), tuple(events), self.block_size))
        except Exception:  # NOTE: a broken outlet must not end the engine's loop
            log.exception("handing KV events to the publisher failed")
            accepted = False
        # NOTE: a snapshot already holds this step's changes, so nothing else is owed after it.
        self._lost = not accepted


def stored_runs(blocks: Iterable[tuple[int, int, tuple[int, ...]]], tier: Tier) -> list[KVEvent]:
    """``BlockStored`` records of blocks given as (hash, parent, tokens), parents before children:
    one record per run of blocks that each follow the one before it."""
    out: list[KVEvent] = []
    hashes: list[int] = []
    tokens: list[int] = []
    parent = 0
    for h, p, toks in blocks:
        if hashes and p != hashes[-1]:
            out.append(BlockStored(tuple(hashes), parent, tuple(tokens), tier))
            hashes, tokens = [], []
        if not hashes:
            parent = p
        hashes.append(h)
        tokens.extend(toks)
    if hashes:
        out.append(BlockStored(tuple(hashes), parent, tuple(tokens), tier))
    return out
