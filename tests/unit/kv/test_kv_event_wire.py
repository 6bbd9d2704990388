"""KV-cache events on the wire (no model): vLLM's positional msgpack layout, read back by an independent decoder."""

from __future__ import annotations

import struct

import msgpack

from bench.harness.kv_events import Cleared, Removed, Stored, decode
from service.kv.blocks import block_hash
from service.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from service.kv_events.wire import encode

U64 = 1 << 64


def test_a_stored_chain_decodes_to_its_hashes_parent_tokens_block_size_and_medium() -> None:
    first = block_hash(0, (1, 2, 3, 4))
    second = block_hash(first, (5, 6, 7, 8))
    third = block_hash(second, (9, 10, 11, 12))
    batch = EventBatch(1700000000.25, (BlockStored((second, third), first, tuple(range(5, 13)), "pool"),), 4)
    ts, events = decode(encode(batch))
    assert ts == 1700000000.25
    assert events == [Stored((second % U64, third % U64), first % U64, tuple(range(5, 13)), 4, "cpu")]


def test_the_first_block_of_a_prompt_has_a_nil_parent_and_negative_hashes_travel_as_uint64() -> None:
    negative = -(2**62) - 12345  # Python's hash() is signed; vLLM's integer hashes are unsigned 64-bit
    _, events = decode(encode(EventBatch(1.0, (BlockStored((negative,), 0, (7, 7), "host"),), 2)))
    assert events == [Stored((negative + U64,), None, (7, 7), 2, "cpu_host")]


def test_removed_and_cleared_decode_with_their_mediums() -> None:
    batch = EventBatch(2.0, (BlockRemoved((5, 6), "pool"), BlockRemoved((7,), "host"), AllBlocksCleared()), 16)
    _, events = decode(encode(batch))
    assert events == [Removed((5, 6), "cpu"), Removed((7,), "cpu_host"), Cleared()]


def test_every_struct_is_a_positional_array_with_the_tag_first_and_vllms_fields_in_order() -> None:
    batch = EventBatch(3.5, (BlockStored((9,), 0, (1, 2), "pool"), BlockRemoved((9,), "pool"), AllBlocksCleared()), 2)
    raw = msgpack.unpackb(encode(batch), raw=False)
    assert raw == [
        3.5,
        [
            # tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name
            ["BlockStored", [9], None, [1, 2], 2, None, "cpu", None],
            ["BlockRemoved", [9], "cpu"],  # tag, block_hashes, medium
            ["AllBlocksCleared"],
        ],
        0,  # data_parallel_rank
    ]


def test_the_timestamp_is_a_float64_as_msgspec_writes_a_python_float() -> None:
    payload = encode(EventBatch(1.5, (), 16))
    assert payload[0] == 0x93  # fixarray of 3
    assert payload[1] == 0xCB and struct.unpack(">d", payload[2:10])[0] == 1.5  # float 64
