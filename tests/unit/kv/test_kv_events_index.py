"""The prefix index as KV-cache events (no model): what the block manager and its host tier record.

Every batch goes through vLLM's wire format (``service.kv_events.wire``) and an independent
decoder (``bench.harness.kv_events``) into a subscriber's index, which must equal the manager's
own (``KVBlockManager.indexed``) after every step, under random workloads, evictions, spills, host
drops and dropped batches (each followed by a resynchronisation).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from bench.harness.kv_events import Cleared, Event, Index, Removed, Stored, decode
from service.kv.blocks import block_hash
from service.kv.events import EventBatch, KVEventLog
from service.kv.host_prefixes import HostPrefixes
from service.kv_events.wire import encode
from service.paged_kv import KVBlockManager
from tests.support.sim import ShadowKV
from tests.unit.kv.test_host_prefixes import run, seq
from tests.unit.kv.test_paged_kv import SpillingKVMachine

BS = 4
U64 = 1 << 64


class Subscriber:
    """An event outlet that encodes each batch and indexes it as a subscriber would; ``full`` refuses."""

    def __init__(self) -> None:
        self.index = Index()
        self.batches: list[list[Event]] = []
        self.full = False

    def offer(self, batch: EventBatch) -> bool:
        if self.full:
            return False
        _, events = decode(encode(batch))
        self.batches.append(events)
        for event in events:
            self.index.apply(event)
        return True

    def take(self) -> list[Event]:
        out = [e for events in self.batches for e in events]
        self.batches = []
        return out


def manager(cached_blocks: int = 0, host_tokens: int = 0) -> tuple[KVBlockManager, ShadowKV, Subscriber]:
    sub = Subscriber()
    log = KVEventLog(sub, BS)
    host = HostPrefixes(host_tokens, BS, min_blocks=4, events=log) if host_tokens else None
    kv = KVBlockManager(32, BS, 4, max_cached_blocks=cached_blocks, host=host, events=log)
    return kv, ShadowKV(32 * BS), sub


def u64(*hashes: int) -> tuple[int, ...]:
    return tuple(h % U64 for h in hashes)


def agrees(kv: KVBlockManager, sub: Subscriber) -> bool:
    pool, host = kv.indexed()
    return sub.index.get("cpu") == set(u64(*pool)) and sub.index.get("cpu_host") == set(u64(*host))


def test_a_new_replica_starts_with_all_blocks_cleared() -> None:
    kv, _, sub = manager()
    kv.flush_events()
    assert sub.take() == [Cleared()]
    kv.flush_events()  # nothing changed: no batch
    assert sub.batches == []


def test_a_computed_prompt_stores_its_full_blocks_as_one_chain_and_a_sharer_stores_only_its_own_tail() -> None:
    kv, shadow, sub = manager(cached_blocks=32)
    kv.flush_events()
    sub.take()
    run(kv, shadow, seq([*range(100, 112), 1, 2]))  # 3 full blocks, 2 tokens left over
    kv.flush_events()
    h1 = block_hash(0, (100, 101, 102, 103))
    h2 = block_hash(h1, (104, 105, 106, 107))
    h3 = block_hash(h2, (108, 109, 110, 111))
    assert sub.take() == [Stored(u64(h1, h2, h3), None, tuple(range(100, 112)), BS, "cpu")]
    run(kv, shadow, seq([*range(100, 108), 7, 7, 7, 7, 9]))  # shares 2 blocks, then its own third
    kv.flush_events()
    assert sub.take() == [Stored(u64(block_hash(h2, (7, 7, 7, 7))), h2 % U64, (7, 7, 7, 7), BS, "cpu")]
    assert agrees(kv, sub)


def test_evicted_blocks_are_removed_and_a_spilled_chain_is_stored_in_the_host_tier() -> None:
    kv, shadow, sub = manager(cached_blocks=0, host_tokens=40)
    prompt = list(range(100, 120))  # 5 blocks
    run(kv, shadow, seq([*prompt, 1]))  # the cap (0) evicts them all: the chain spills first
    kv.flush_events()
    events = sub.take()
    hashes, parent = [], 0
    for i in range(5):
        parent = block_hash(parent, tuple(prompt[i * BS : (i + 1) * BS]))
        hashes.append(parent)
    assert Stored(u64(*hashes), None, tuple(prompt), BS, "cpu_host") in events
    removed = [h for e in events if isinstance(e, Removed) and e.medium == "cpu" for h in e.hashes]
    assert sorted(removed) == sorted(u64(*hashes))
    assert agrees(kv, sub) and sub.index.get("cpu") == set() and sub.index.get("cpu_host") == set(u64(*hashes))


def test_a_host_drop_removes_only_the_blocks_no_other_spilled_chain_holds() -> None:
    kv, shadow, sub = manager(cached_blocks=0, host_tokens=64)  # room for 16 blocks
    shared = list(range(100, 116))  # 4 blocks both chains start with
    run(kv, shadow, seq([*shared, *range(200, 216), 1]))  # chain A: 8 blocks
    run(kv, shadow, seq([*shared, *range(300, 316), 1]))  # chain B: A's first 4 (a host hit), then 4 more
    kv.flush_events()
    sub.take()
    run(kv, shadow, seq([*range(500, 520), 1]))  # chain C (5 blocks): A, the least recently used, goes
    kv.flush_events()
    host_removed = {h for e in sub.take() if isinstance(e, Removed) and e.medium == "cpu_host" for h in e.hashes}
    a_tail = block_hash(block_hash(block_hash(block_hash(0, (100, 101, 102, 103)), (104, 105, 106, 107)),
                                   (108, 109, 110, 111)), (112, 113, 114, 115))
    assert a_tail % U64 not in host_removed and a_tail % U64 in sub.index.get("cpu_host")  # B still holds it
    assert len(host_removed) == 4  # A's own 4 blocks
    assert agrees(kv, sub)


class EventsKVMachine(SpillingKVMachine):
    """Random arrivals, growth, finishes and preemptions over a spilling manager; after every step the
    subscriber's index equals the manager's, unless the last batch was dropped (then after the next)."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = Subscriber()
        log = KVEventLog(self.sub, self.kv.block_size)
        self.kv.events = log
        assert self.kv.host is not None
        self.kv.host.events = log

    @rule(full=st.booleans())
    def publisher_queue(self, full: bool) -> None:
        self.sub.full = full

    @invariant()
    def subscriber_agrees(self) -> None:
        self.kv.flush_events()
        if not self.sub.full:
            assert agrees(self.kv, self.sub)


TestEventsKVMachine = EventsKVMachine.TestCase
TestEventsKVMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
