"""The prefix router's arithmetic and choice (no model, no server): bench/harness/prefix_router.py.

Its block hashes must be the server's prefix-cache keys as the events send them, and its choice the
replica holding the most consecutive blocks, ties to the least loaded. The indexes are fed decoded
events directly (the subscriptions point at ports nobody serves; ZMQ retries them quietly).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.harness.kv_events import Stored
from bench.harness.prefix_router import Endpoint, PrefixRouter, chain_hashes
from service.kv.blocks import block_hash

BS = 4
U64 = 1 << 64
PROMPT = list(range(100, 117))  # 17 tokens: 4 whole blocks before the last token


def server_chain(tokens: list[int], blocks: int) -> list[int]:
    out, parent = [], 0
    for i in range(blocks):
        parent = block_hash(parent, tuple(tokens[i * BS : (i + 1) * BS]))
        out.append(parent % U64)
    return out


@pytest.fixture
def router() -> Iterator[PrefixRouter]:
    endpoints = [Endpoint(f"r{i}", "http://127.0.0.1:9", f"tcp://127.0.0.1:{19 + i}") for i in range(3)]
    r = PrefixRouter(endpoints, block_size=BS)
    try:
        yield r
    finally:
        r.close()


def hold(router: PrefixRouter, replica: int, tokens: list[int], blocks: int, medium: str = "cpu") -> None:
    """Replica ``replica`` stored the first ``blocks`` blocks of ``tokens`` (as its events would say)."""
    hashes = tuple(server_chain(tokens, blocks))
    sub = router.subs[replica]
    with sub.lock:
        sub.index.apply(Stored(hashes, None, tuple(tokens[: blocks * BS]), BS, medium))


def test_chain_hashes_are_the_servers_block_hashes_as_uint64_up_to_the_block_before_the_last_token() -> None:
    assert chain_hashes(PROMPT, BS) == server_chain(PROMPT, 4)
    assert chain_hashes(PROMPT[:16], BS) == server_chain(PROMPT, 3)  # the 16th token is computed: block 4 is not reused
    assert chain_hashes(PROMPT[:4], BS) == []


def test_the_replica_with_the_longest_consecutive_prefix_wins_over_a_less_loaded_one(router: PrefixRouter) -> None:
    hold(router, 0, PROMPT, 1)
    hold(router, 2, PROMPT, 3, medium="cpu_host")
    router.in_flight[2] = 5
    decision = router.choose(PROMPT)
    assert (decision.replica, decision.blocks, decision.scores) == (2, 3, (1, 0, 3))


def test_a_block_held_after_a_missing_one_does_not_count(router: PrefixRouter) -> None:
    hashes = server_chain(PROMPT, 4)
    sub = router.subs[1]
    with sub.lock:
        sub.index.apply(Stored(tuple(hashes[1:]), hashes[0], tuple(PROMPT[BS:16]), BS, "cpu"))
    hold(router, 0, PROMPT, 1)
    assert router.choose(PROMPT).scores == (1, 0, 0)


def test_ties_go_to_the_fewest_in_flight_then_the_fewest_blocks_held_then_the_fewest_routed(router: PrefixRouter) -> None:
    other, third = list(range(500, 517)), list(range(900, 917))
    router.in_flight[:] = [1, 0, 0]
    hold(router, 1, other, 2)
    decision = router.choose(PROMPT)
    assert decision.replica == 2  # r0 is busier, r1 holds more blocks
    router.done(decision)
    router.in_flight[:] = [0, 0, 0]
    hold(router, 0, third, 2)
    hold(router, 2, other, 2)
    router.routed[:] = [4, 2, 3]
    assert router.choose(PROMPT).replica == 1  # all idle, 2 blocks each: the fewest routed


def test_a_request_in_flight_holds_its_chain_on_its_replica_until_done(router: PrefixRouter) -> None:
    first = router.choose(PROMPT)
    assert first.blocks == 0 and first.chain == tuple(chain_hashes(PROMPT, BS))
    second = router.choose(PROMPT)  # its blocks are not in any event yet: they are being computed
    assert (second.replica, second.blocks) == (first.replica, 4)
    router.done(first)
    router.done(second)
    assert router.in_flight == [0, 0, 0] and router.choose(PROMPT).blocks == 0
