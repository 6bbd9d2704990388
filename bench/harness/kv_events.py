"""The consumer side of KV-cache events, written from vLLM's published format, not from the server's code.

``decode`` reads a payload as vLLM's consumers do (llm-d's ``kvevents`` adapter reads the same
positions): a msgpack array ``[ts, events, data_parallel_rank?]``, each event an array whose first
element is its tag; ``BlockStored`` is ``[tag, block_hashes, parent_block_hash, token_ids,
block_size, lora_id?, medium?, lora_name?, ...]``, ``BlockRemoved`` ``[tag, block_hashes, medium?]``,
``AllBlocksCleared`` ``[tag]``. Trailing optional fields may be absent.

``Index`` applies decoded events as a vLLM-style subscriber does: per medium, the set of block hashes
held. ``Subscriber`` is a real pyzmq SUB socket on a thread that decodes and indexes every message.

Shared by the KV-event tests (tests/model/kv, tests/unit/kv) and the prefix router
(``bench.harness.prefix_router``: tests/model/scale/test_prefix_routing.py, bench/studies/prefix_routing.py).
It imports nothing of the server: a wrong reading of the format on either side shows as a disagreement.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq


@dataclass(frozen=True)
class Stored:
    hashes: tuple[int, ...]
    parent: int | None
    tokens: tuple[int, ...]
    block_size: int
    medium: str | None


@dataclass(frozen=True)
class Removed:
    hashes: tuple[int, ...]
    medium: str | None


@dataclass(frozen=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


def _at(fields: list[Any], i: int) -> Any:
    return fields[i] if i < len(fields) else None


def _hash(value: Any) -> int:
    assert isinstance(value, int) and 0 <= value < 1 << 64, f"a block hash is a uint64, got {value!r}"
    return value


def decode_event(fields: list[Any]) -> Event:
    assert isinstance(fields, list) and fields and isinstance(fields[0], str), f"not a tagged array: {fields!r}"
    tag = fields[0]
    if tag == "BlockStored":
        assert len(fields) >= 5, fields
        parent = None if fields[2] is None else _hash(fields[2])
        tokens = tuple(fields[3])
        assert all(isinstance(t, int) and t >= 0 for t in tokens)
        return Stored(tuple(map(_hash, fields[1])), parent, tokens, fields[4], _at(fields, 6))
    if tag == "BlockRemoved":
        assert len(fields) >= 2, fields
        return Removed(tuple(map(_hash, fields[1])), _at(fields, 2))
    assert tag == "AllBlocksCleared", f"unknown tag {tag!r}"
    return Cleared()


def decode(payload: bytes) -> tuple[float, list[Event]]:
    """A payload frame: (ts, events)."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    assert isinstance(batch, list) and len(batch) >= 2, f"a batch is an array [ts, events, ...]: {batch!r}"
    assert isinstance(batch[0], float), batch[0]
    return batch[0], [decode_event(e) for e in batch[1]]


@dataclass
class Index:
    """Per medium, the block hashes held, and every stored block's tokens and parent."""

    held: dict[str, set[int]] = field(default_factory=dict)
    tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)
    parent: dict[int, int | None] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        if isinstance(event, Cleared):
            self.held.clear()
        elif isinstance(event, Removed):
            self.held.setdefault(event.medium or "", set()).difference_update(event.hashes)
        else:
            bs = event.block_size
            assert len(event.tokens) == bs * len(event.hashes), "token_ids must be whole blocks, in order"
            parent = event.parent
            for i, h in enumerate(event.hashes):
                self.tokens[h], self.parent[h] = event.tokens[i * bs : (i + 1) * bs], parent
                parent = h
            self.held.setdefault(event.medium or "", set()).update(event.hashes)

    def get(self, medium: str) -> frozenset[int]:
        return frozenset(self.held.get(medium, ()))

    def chain_tokens(self, h: int) -> list[int]:
        """The tokens of the prefix ``h`` names, from its first block."""
        out: list[tuple[int, ...]] = []
        node: int | None = h
        while node is not None:
            out.append(self.tokens[node])
            node = self.parent[node]
        return [t for block in reversed(out) for t in block]


class Subscriber:
    """A SUB socket on ``endpoint`` (topic prefix ``topic``) whose thread applies every batch to ``index``
    in sequence order.

    With ``replay`` (the publisher's ROUTER endpoint) a gap in the sequence numbers (a late join, or
    messages ZMQ dropped) is filled by a replay request from the first missing number, as vLLM's
    subscriber example does; without it the gap is skipped (and counted in ``gaps``).
    """

    def __init__(self, endpoint: str, topic: bytes = b"", rcvhwm: int = 1000, replay: str = "") -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.dealer = None
        if replay:
            self.dealer = self.ctx.socket(zmq.DEALER)
            self.dealer.setsockopt(zmq.RCVTIMEO, 30_000)
            self.dealer.connect(replay)
        self.index = Index()
        self.messages: list[tuple[bytes, int, list[Event]]] = []  # (topic, seq, events), as applied
        self.next_seq: int | None = 0 if replay else None  # None: from the first message received
        self.gaps = 0
        self.replays = 0
        self._pending: dict[int, tuple[bytes, bytes]] = {}
        self.lock = threading.RLock()  # NOTE: a wait_for condition may read under it too
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(50):
                topic, seq, payload = self.sock.recv_multipart()
                self._pending[int.from_bytes(seq, "big")] = (topic, payload)
            if self.next_seq is None and self._pending:
                self.next_seq = min(self._pending)
            if self._pending and self.next_seq not in self._pending:
                self._fill_gap()
            self._apply_ready()

    def _fill_gap(self) -> None:
        assert self.next_seq is not None
        if self.dealer is not None:
            self.dealer.send_multipart([b"", self.next_seq.to_bytes(8, "big")])
            topic = next(iter(self._pending.values()))[0]
            try:
                while True:
                    _, seq, payload = self.dealer.recv_multipart()
                    if seq == (-1).to_bytes(8, "big", signed=True):
                        break
                    self._pending.setdefault(int.from_bytes(seq, "big"), (topic, payload))
                self.replays += 1
            except zmq.Again:  # no end marker within the receive timeout: what came is kept
                pass
        if self.next_seq not in self._pending:  # gone from the replay buffer too
            self.gaps += 1
            self.next_seq = min(self._pending)

    def _apply_ready(self) -> None:
        while self.next_seq is not None and self.next_seq in self._pending:
            topic, payload = self._pending.pop(self.next_seq)
            _, events = decode(payload)
            with self.lock:
                self.messages.append((topic, self.next_seq, events))
                for event in events:
                    self.index.apply(event)
            self.next_seq += 1
        for old in [seq for seq in self._pending if self.next_seq is not None and seq < self.next_seq]:
            del self._pending[old]  # a replayed batch received live as well

    def events(self) -> list[Event]:
        with self.lock:
            return [e for _, _, events in self.messages for e in events]

    def wait_for(self, condition: Any, timeout: float = 60.0, what: str = "a condition") -> None:
        """Wait until ``condition()`` holds (checked under the lock)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if condition():
                    return
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.ctx.destroy(linger=0)
