"""vLLM's KV-event wire format: one msgpack batch per engine step, each struct a positional array.

vLLM defines the events as msgspec structs with ``array_like=True, omit_defaults=True`` and the
events ``tag=True`` (``vllm/distributed/kv_events.py``), so a batch on the wire is::

    [ts, [event, ...], data_parallel_rank]
    BlockStored       ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
                       lora_id, medium, lora_name]
    BlockRemoved      ["BlockRemoved", block_hashes, medium]
    AllBlocksCleared  ["AllBlocksCleared"]

``ts`` is a float64 (seconds since the epoch); ``lora_id``, ``medium`` and ``lora_name`` have no
default in vLLM and are always present, the later fields (``extra_keys``, ``group_idx``, ...) are
defaults and omitted. This is the layout llm-d's ``kvevents`` decoder reads positionally.

NOTE: vLLM PR #42892 (June 2026) dropped ``array_like`` from the event structs: newer vLLM sends
each event as a map with the tag under ``"type"``. llm-d's decoder accepts both since v0.9; older
consumers and every other one we know read only arrays, so this server sends arrays.

Hashes are the block manager's chain hashes as unsigned 64-bit integers (vLLM's integer
``ExternalBlockHash``); the parent of a prompt's first block is nil, as vLLM sends it.
"""

from __future__ import annotations

import msgpack

from service.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent, Tier

U64 = (1 << 64) - 1
# NOTE: the pool is llama.cpp's KV cache in host RAM (vLLM's GPU tier plays its part); the host tier
# holds evicted chains outside it (as vLLM's CPU offloading does). llm-d lower-cases the medium.
MEDIUM: dict[Tier, str] = {"pool": "cpu", "host": "cpu_host"}
DATA_PARALLEL_RANK = 0


def event_fields(event: KVEvent, block_size: int) -> list[object]:
    """One event as vLLM's positional array, its tag first."""
    if isinstance(event, BlockStored):
        parent = event.parent & U64 if event.parent else None
        hashes = [h & U64 for h in event.hashes]
        return ["BlockStored", hashes, parent, event.tokens, block_size, None, MEDIUM[event.tier], None]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", [h & U64 for h in event.hashes], MEDIUM[event.tier]]
    assert isinstance(event, AllBlocksCleared)
    return ["AllBlocksCleared"]


def encode(batch: EventBatch) -> bytes:
    """A batch as the payload frame of one message."""
    events = [event_fields(e, batch.block_size) for e in batch.events]
    return msgpack.packb([batch.ts, events, DATA_PARALLEL_RANK], use_bin_type=True)
