"""The KV cache's records: cell operations as data, blocks, prefix hits and counters.

``KVOp`` is what the block manager (``service.paged_kv``) queues and the runner applies to
llama.cpp's pool before the next decode; the scheduler carries them in its ``Plan``. ``Block``
and ``PrefixHit`` are the manager's own bookkeeping, here so that the manager module holds
only its policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from service.kv.host_prefixes import HostHit


@dataclass(frozen=True)
class KVOp:
    """A cell operation for the engine, applied in order before the next decode.

    ``rm``: remove lane's cells in [p0, p1); ``cp``: share src's cells in [p0, p1) into lane;
    ``save``: copy lane's cells in [p0, p1) to host memory under ``key``; ``load``: put the
    cells saved under ``key`` into the (empty) lane, keeping [p0, p1), or compute ``tokens``
    there when they are gone, the ones before ``pinned`` going to the pin lane too as they land;
    ``drop``: forget what was saved under ``key``.
    """

    kind: Literal["rm", "cp", "save", "load", "drop"]
    lane: int
    p0: int
    p1: int
    src: int = -1
    key: int = 0
    tokens: tuple[int, ...] = ()
    pinned: int = 0


def block_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """A full block's chain hash: its tokens and the chain hash of the block before it (0 first)."""
    return hash((parent, tokens))


@dataclass(eq=False)
class Block:
    id: int
    ref_count: int = 0
    hash: int | None = None  # set while registered in the prefix cache
    tokens: tuple[int, ...] = ()
    start: int = 0  # position of the block's first token
    holders: set[int] = field(default_factory=set)  # lanes whose cells hold this block
    last_used: int = 0
    parent: int = 0  # hash of the previous block in its chain (while registered)
    pinned: bool = False  # its cells are also the pin lane's (service.kv.window_pins)


@dataclass(frozen=True)
class PrefixHit:
    """What a new sequence can reuse: whole cached blocks, then part of one more.

    ::

        token_ids  [ b0 (16) | b1 (16) | t t t t t . . . ] [ rest to compute ]
                     shared blocks       ^^^^^^^^^ ``partial_len`` tokens whose cells are
                                         copied from cached ``partial``; the sequence
                                         gets its own block for this range
    """

    blocks: tuple[Block, ...] = ()
    partial: Block | None = None
    partial_len: int = 0
    num_tokens: int = 0
    host: HostHit | None = None  # instead of the above: a spilled chain, copied back into the lane


@dataclass
class KVStats:
    prompt_tokens: int = 0
    hit_tokens: int = 0  # of which host_hit_tokens came back from the host tier
    evictions: int = 0
    host_hit_tokens: int = 0
