"""The KV-event publisher (no model): real ZMQ sockets on ipc:// endpoints, real subscribers.

The engine's side (``offer``) never blocks: a full queue drops the batch and counts it. Messages
carry vLLM's three frames and consecutive sequence numbers; a ROUTER answers replay requests from
the buffer; ``close`` ends with ``AllBlocksCleared``.
"""

from __future__ import annotations

import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from bench.harness.kv_events import Cleared, Removed, Stored, Subscriber, decode
from service.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEventLog
from service.kv_events.config import KVEventsConfig
from service.kv_events.publisher import END_SEQ, KVEventPublisher


@pytest.fixture()
def ipc() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvev") as d:
        yield Path(d)


def publisher(ipc: Path, **settings: int) -> KVEventPublisher:
    config = KVEventsConfig(
        endpoint=f"ipc://{ipc}/pub", topic="kv@10.0.0.7:8000@m", replay_endpoint=f"ipc://{ipc}/replay", **settings
    )
    return KVEventPublisher(config)


def batch(n: int) -> EventBatch:
    return EventBatch(float(n), (BlockRemoved((n,), "pool"),), 16)


PROBE = Removed((0,), "cpu_host")


def subscribe(ipc: Path, pub: KVEventPublisher) -> Subscriber:
    """A subscriber known to be connected: one of the probe batches sent until then has reached it.

    NOTE: a PUB socket drops what it sends before a new subscriber's subscription has arrived.
    """
    sub = Subscriber(f"ipc://{ipc}/pub")
    for _ in range(100):
        pub.offer(EventBatch(0.0, (BlockRemoved((0,), "host"),), 16))
        try:
            sub.wait_for(lambda: sub.messages, timeout=0.5, what="a probe batch")
            return sub
        except AssertionError:
            continue
    raise AssertionError("the subscriber never received a probe")


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def received(sub: Subscriber) -> list[tuple[int, list[object]]]:
    """(seq, events) of every message but the probes."""
    with sub.lock:
        return [(seq, events) for _, seq, events in sub.messages if events != [PROBE]]


def replay(ipc: Path, start: int, count: int) -> list[list[bytes]]:
    """``count`` replies to a replay request from ``start`` (a DEALER, as vLLM's subscriber example uses)."""
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 30_000)
        dealer.connect(f"ipc://{ipc}/replay")
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        return [dealer.recv_multipart() for _ in range(count)]
    finally:
        ctx.destroy(linger=0)


def test_offer_drops_and_counts_past_the_queue_bound_without_blocking_and_the_rest_goes_out_in_order(
    ipc: Path,
) -> None:
    pub = publisher(ipc, max_queue=3)  # not started: nothing leaves the queue yet
    try:
        accepted = [pub.offer(batch(n)) for n in range(1, 8)]  # would hang here if offer blocked
        assert accepted == [True, True, True, False, False, False, False]
        assert pub.dropped == 4 and pub.published == 0
        pub.start()
        wait_until(lambda: pub.published == 3)  # NOTE: a replay asked earlier is answered with what is sent so far
        replies = replay(ipc, 0, 4)  # what was sent, in order, from the replay buffer
        assert [int.from_bytes(r[1], "big") for r in replies[:3]] == [0, 1, 2]
        assert [decode(r[2])[1] for r in replies[:3]] == [[Removed((n,), "cpu")] for n in (1, 2, 3)]
        assert replies[3][1:] == [END_SEQ, b""]
        assert pub.published == 3 and pub.dropped == 4
    finally:
        pub.close()


def test_messages_carry_the_topic_and_consecutive_sequence_numbers(ipc: Path) -> None:
    pub = publisher(ipc).start()
    sub = subscribe(ipc, pub)
    try:
        for n in range(1, 4):
            pub.offer(batch(n))
        sub.wait_for(lambda: len(received(sub)) == 3, what="three batches")
        seqs = [seq for seq, _ in received(sub)]
        assert seqs == list(range(seqs[0], seqs[0] + 3))
        assert [events for _, events in received(sub)] == [[Removed((n,), "cpu")] for n in (1, 2, 3)]
        assert {topic for topic, _, _ in sub.messages} == {b"kv@10.0.0.7:8000@m"}
    finally:
        pub.close()
        sub.close()


def test_a_dropped_batch_is_followed_by_a_resynchronisation_of_the_whole_index(ipc: Path) -> None:
    pub = publisher(ipc, max_queue=1)
    log = KVEventLog(pub, block_size=2)
    index = [BlockStored((1, 2), 0, (5, 6, 7, 8), "pool")]
    log.flush(lambda: [])  # the log's first batch (AllBlocksCleared) fills the queue
    log.add(BlockStored((1,), 0, (5, 6), "pool"))
    log.flush(lambda: [AllBlocksCleared(), *index])  # dropped: the queue is full
    assert pub.dropped == 1
    pub.start()
    wait_until(lambda: pub.published == 1)  # the first batch is gone before the subscriber joins
    sub = subscribe(ipc, pub)
    try:
        log.add(BlockStored((2,), 1, (7, 8), "pool"))  # this step's record is in the snapshot already
        log.flush(lambda: [AllBlocksCleared(), *index])
        sub.wait_for(lambda: received(sub), what="the resynchronisation")
        assert received(sub)[0][1] == [Cleared(), Stored((1, 2), None, (5, 6, 7, 8), 2, "cpu")]
        assert sub.index.get("cpu") == {1, 2}
        log.add(BlockRemoved((2,), "pool"))  # then the log is back to one step's records
        log.flush(lambda: [])
        sub.wait_for(lambda: len(received(sub)) == 2, what="the next step")
        assert received(sub)[1][1] == [Removed((2,), "cpu")]
    finally:
        pub.close()
        sub.close()


def test_a_replay_request_gets_the_buffered_batches_from_its_sequence_number_then_the_end_marker(ipc: Path) -> None:
    pub = publisher(ipc, buffer_steps=4, hwm=1)  # the replay is not bound by the PUB socket's mark
    try:
        for n in range(1, 7):
            pub.offer(batch(n))  # seq 0..5; the buffer keeps the last 4: seq 2..5
        pub.start()
        replies = replay(ipc, 3, 4)
        assert [r[0] for r in replies] == [b""] * 4
        assert [int.from_bytes(r[1], "big") for r in replies[:3]] == [3, 4, 5]
        assert [decode(r[2])[1] for r in replies[:3]] == [[Removed((n,), "cpu")] for n in (4, 5, 6)]
        assert replies[3][1:] == [END_SEQ, b""]
        assert [int.from_bytes(r[1], "big") for r in replay(ipc, 0, 4)] == [2, 3, 4, 5]  # seq 0, 1 are gone
        ctx = zmq.Context()
        try:
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.RCVTIMEO, 30_000)
            dealer.connect(f"ipc://{ipc}/replay")
            dealer.send_multipart([b"", b"\x01"])  # not an 8-byte sequence number
            assert dealer.recv_multipart() == [b"", END_SEQ, b""]
        finally:
            ctx.destroy(linger=0)
        assert pub.replays == 2
    finally:
        pub.close()


def test_close_sends_what_is_queued_then_all_blocks_cleared(ipc: Path) -> None:
    pub = publisher(ipc).start()
    sub = subscribe(ipc, pub)
    try:
        pub.offer(batch(1))
        pub.close()
        sub.wait_for(lambda: len(received(sub)) == 2, what="the last batches")
        assert [events for _, events in received(sub)] == [[Removed((1,), "cpu")], [Cleared()]]
    finally:
        sub.close()


def test_an_endpoint_that_cannot_be_bound_is_an_os_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        endpoint = f"tcp://*:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match=re.escape(endpoint)):
            KVEventPublisher(KVEventsConfig(endpoint=endpoint))
