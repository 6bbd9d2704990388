"""The KV-event publisher: vLLM's ZMQ protocol, on a thread of its own that the engine never waits on.

Every message on the PUB socket is three frames, as vLLM's ``ZmqEventPublisher`` sends them::

    [topic, seq (8 bytes, big-endian, from 0), payload (service.kv_events.wire)]

The engine thread only calls ``offer``: a ``put_nowait`` on a bounded queue. A full queue drops
the batch and counts it (``dropped``); the engine's event log then sends a resynchronisation
(``service.kv.events``). The PUB socket never blocks either: past ``hwm`` queued messages for a
slow (or stalled) subscriber, ZMQ drops that subscriber's messages, which it sees as a gap in seq.

Replay (``replay_endpoint``): a ROUTER socket. A request ``[b"", start_seq (8 bytes)]`` from a
DEALER (a REQ socket adds the empty frame itself) is answered, from the last ``buffer_steps``
batches, with one ``[b"", seq, payload]`` per batch from ``start_seq`` on, then
``[b"", -1 (8 bytes, signed), b""]``. A malformed request gets only the end marker.

On ``close`` the thread sends what is queued and then ``AllBlocksCleared``: the replica's cache is
gone with it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import zmq

from service.kv.events import AllBlocksCleared, EventBatch
from service.kv_events.config import KVEventsConfig
from service.kv_events.wire import encode

log = logging.getLogger("service.kv_events")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
POLL_S = 0.05  # how often an idle publisher looks at the replay socket
LINGER_MS = 1000  # how long close() lets queued messages (the last AllBlocksCleared) leave


def binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard, IPv6 or local endpoint, connect to anything else."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KVEventPublisher:
    """Publishes ``EventBatch``es (see the module docstring); ``offer`` from the engine thread."""

    def __init__(self, config: KVEventsConfig) -> None:
        """Opens the sockets (OSError when an endpoint cannot be bound); ``start`` starts the thread.

        NOTE: until then ``offer`` queues (and, past ``max_queue``, drops) without anything sent."""
        self.config = config
        self.published = 0  # batches sent on the PUB socket
        self.dropped = 0  # batches the engine could not queue (the queue was full)
        self.replays = 0  # replay requests answered
        self._queue: queue.Queue[EventBatch] = queue.Queue(maxsize=config.max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self._seq = 0
        self._closing = threading.Event()
        self._ctx = zmq.Context()
        try:
            self._pub = self._socket(zmq.PUB, config.endpoint, config.hwm)
            # NOTE: a ROUTER drops what passes its high-water mark: room for a whole buffer and its end marker
            replay = config.replay_endpoint
            self._router = self._socket(zmq.ROUTER, replay, config.buffer_steps + 1) if replay else None
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise OSError(f"KV events: cannot open {exc}") from None
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def start(self) -> KVEventPublisher:
        """Start the publisher thread; returns the publisher."""
        self._thread.start()
        log.info("publishing KV-cache events on %s (topic %r)", self.config.endpoint, self.config.topic)
        return self

    def _socket(self, kind: int, endpoint: str, hwm: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        try:
            if kind == zmq.ROUTER or binds(endpoint):
                sock.bind(endpoint)
            else:
                sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise zmq.ZMQError(exc.errno, f"{endpoint}: {exc.strerror}") from None
        return sock

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    # -- the engine's side -------------------------------------------------------------------
    def offer(self, batch: EventBatch) -> bool:
        """Queue ``batch`` without blocking; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    # -- the publisher thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not (self._closing.is_set() and self._queue.empty()):
            try:
                if self._router is not None:
                    self._answer_replays(self._router)
                try:
                    batch = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                self._send(encode(batch))
            except Exception:  # NOTE: one bad batch or socket error must not end the thread
                log.exception("publishing KV events failed")
                time.sleep(POLL_S)
        self._send(encode(EventBatch(time.time(), (AllBlocksCleared(),), 0)))

    def _send(self, payload: bytes) -> None:
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.published += 1

    def _answer_replays(self, router: zmq.Socket[bytes]) -> None:
        """Answer every waiting replay request (see the module docstring)."""
        while router.poll(0):
            frames = router.recv_multipart(zmq.NOBLOCK)
            identity = frames[0]
            if len(frames) != 3 or frames[1] or len(frames[2]) != 8:
                log.debug("malformed KV-event replay request (%d frames)", len(frames))
                router.send_multipart((identity, b"", END_SEQ, b""))
                continue
            start = int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    router.send_multipart((identity, b"", seq.to_bytes(8, "big"), payload))
            router.send_multipart((identity, b"", END_SEQ, b""))
            self.replays += 1

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued and a final ``AllBlocksCleared``, then close the sockets."""
        self._closing.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("KV-event publisher still busy after %.0f s; closing its sockets anyway", timeout)
        self._ctx.destroy(linger=LINGER_MS)
