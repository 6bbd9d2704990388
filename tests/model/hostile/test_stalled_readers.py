"""A client that stops reading is paused, then cancelled, whatever the client (issue #35 item 6).

Neither client here acknowledges anything: an SSE reader and a gRPC caller speaking HTTP/2 over a
raw socket, each with a 4 KiB receive buffer, read the start of their stream and then stop reading
the socket. The server sees only that its writes stop being taken. It must pause the request within
the bound docs/operations.md states ("Clients that stop reading"): what the client's receive window
took, at most ``UNSENT_LOWAT`` bytes unsent in the kernel (and ``TRANSPORT_HIGH`` in an HTTP
connection's buffer), then ``--stream-backlog`` events; generate nothing while paused; and cancel
the request once it stayed paused for ``--stream-stall-timeout-s``, while the client still holds its
connection. Then the client reads again and finds every event, the last one the cancellation.

Speculative decoding is off so that one event is one token. Verdicts wait on conditions (the
scheduler's pause, the ``vllm:num_requests_running`` and ``_waiting`` gauges) under generous ceilings; the engine may
run ahead of the event loop by a few steps on a busy machine (``LAG``).
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import h11
import httpx2
import pytest
from inference.v1 import inference_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

from service.api.unsent import TRANSPORT_HIGH, UNSENT_LOWAT
from tests.support.helpers import req, wait_for
from tests.support.raw_h2 import RawGrpcCall
from tests.support.server import RunningServer, assert_kv_clean, free_port, start_server

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct.Q4_1"
BACKLOG, STALL_S = 16, 3.0
MAX_TOKENS, TOP_LOGPROBS = 2000, 5  # log-probabilities make each event a few hundred bytes: a quick test
RCVBUF = 4096
SLACK = 4096  # the kernel may fill the segment it is building past UNSENT_LOWAT (measured: a few bytes)
LAG = 8  # events the engine may make after the crossing one before the pause reaches it (2 unloaded)
CEILING_S = 300.0


@pytest.fixture()
def srv() -> Iterator[RunningServer]:
    server = start_server(http_port=free_port(), stream_backlog=BACKLOG, stream_stall_timeout_s=STALL_S,
                          speculative=False)
    yield server
    server.close()


def metrics(srv: RunningServer) -> dict[str, float]:
    """The vLLM-named series the tests read, from GET /metrics."""
    r = httpx2.get(f"http://127.0.0.1:{srv.server.http_port}/metrics", timeout=60)
    assert r.status_code == 200
    wanted = ("vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:num_requests_waiting")
    return {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples if s.name in wanted}


def generated(srv: RunningServer) -> float:
    return metrics(srv)["vllm:generation_tokens_total"]


def left_the_engine(srv: RunningServer) -> bool:
    """No request running or waiting (a paused request may have been preempted into the queue)."""
    m = metrics(srv)
    return m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0


def paused_alone(srv: RunningServer) -> bool:
    """The stalled request is the engine's only one, and paused (its client does not read)."""
    seqs = srv.engine.scheduler.running + srv.engine.scheduler.waiting
    return len(seqs) == 1 and seqs[0].paused


def wait_paused(srv: RunningServer) -> None:
    """Until the stalled request is paused; fails at once if it ends instead (ran to max_tokens unpaused)."""
    assert wait_for(lambda: paused_alone(srv) or not srv.engine.scheduler.has_work(), timeout=CEILING_S)
    assert paused_alone(srv), "the request ended without being paused"


def most_events(rcvbuf: int, in_connection: int, smallest_event: int) -> int:
    """The bound of docs/operations.md: events made before the pause, for events of at least ``smallest_event``
    bytes on the wire (+1: the event the writer holds while it waits)."""
    return math.ceil((rcvbuf + UNSENT_LOWAT + SLACK + in_connection) / smallest_event) + 1 + BACKLOG + LAG


class StalledSseReader:
    """A streamed chat over a raw socket (h11 for the framing) that reads its first event, then nothing."""

    def __init__(self, port: int) -> None:
        body = json.dumps({
            "model": MODEL, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True, "temperature": 0,
            "logprobs": True, "top_logprobs": TOP_LOGPROBS,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
        }).encode()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # before connecting: the window
        self.sock.connect(("127.0.0.1", port))
        self.conn = h11.Connection(h11.CLIENT)
        head = h11.Request(method="POST", target="/v1/chat/completions", headers=[
            ("host", "x"), ("content-type", "application/json"), ("content-length", str(len(body)))])
        self.sock.sendall(self.conn.send(head) + self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage()))
        self.status = 0
        self.body = b""
        while b"\n\n" not in self.body:  # the first event, then the reader stops
            self._read()

    def _read(self) -> bool:
        """One more event from the connection; False at the end of the response."""
        event = self.conn.next_event()
        if event is h11.NEED_DATA:
            self.conn.receive_data(self.sock.recv(65536))
        elif isinstance(event, h11.Response):
            self.status = event.status_code
        elif isinstance(event, h11.Data):
            self.body += bytes(event.data)
        return not isinstance(event, h11.EndOfMessage | h11.ConnectionClosed)

    def read_rest(self) -> list[str]:
        """Reads again, to the end of the response: every event's data."""
        while self._read():
            pass
        return [e.removeprefix("data: ") for e in self.body.decode().split("\n\n") if e]


def test_sse_reader_that_stops_reading_is_paused_within_the_bound_then_cancelled(srv: RunningServer) -> None:
    before = generated(srv)
    reader = StalledSseReader(srv.server.http_port)
    try:
        assert reader.status == 200
        wait_paused(srv)
        at_pause = generated(srv)
        assert wait_for(lambda: left_the_engine(srv), timeout=CEILING_S)  # cancelled by the stall timer
        assert generated(srv) == at_pause  # nothing was generated while paused
        rcvbuf = reader.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        events = reader.read_rest()  # the client reads again: everything made, then the cancellation
    finally:
        reader.sock.close()
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable_error"
    assert error["message"] == f"cancelled: the client did not read its stream for {STALL_S:g} s"
    # the chunks with tokens (each token's log-probability; a role-only first chunk has none)
    deltas = [e for e in events[:-2] if json.loads(e)["choices"][0]["logprobs"]]
    made = at_pause - before
    assert sum(len(json.loads(e)["choices"][0]["logprobs"]["content"]) for e in deltas) == made < MAX_TOKENS
    smallest = min(len(f"data: {e}\n\n".encode()) for e in deltas)
    assert made <= most_events(rcvbuf, TRANSPORT_HIGH, smallest), (made, smallest)
    assert_kv_clean(srv)


def stalled_grpc_call(srv: RunningServer) -> RawGrpcCall:
    """A long greedy request with log-probabilities from a raw HTTP/2 client with a 4 KiB receive buffer."""
    request = req("stalled", "Tell me a long story.", MAX_TOKENS, ignore_eos=True, logprobs=True,
                  top_logprobs=TOP_LOGPROBS)
    return RawGrpcCall("127.0.0.1", srv.port, request, rcvbuf=RCVBUF)


def test_grpc_caller_that_stops_reading_is_paused_within_the_bound_then_cancelled(srv: RunningServer) -> None:
    before = generated(srv)
    call = stalled_grpc_call(srv)
    try:
        responses = call.responses()
        first = next(responses)
        assert first.WhichOneof("event") == "delta"
        wait_paused(srv)
        at_pause = generated(srv)
        neighbour = neighbour_answer(srv)  # another client is served meanwhile
        assert neighbour.done.usage.completion_tokens == 8
        assert wait_for(lambda: left_the_engine(srv), timeout=CEILING_S)  # cancelled by the stall timer
        assert generated(srv) == at_pause + 8  # the neighbour's tokens only: none for the paused request
        rcvbuf = call.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        rest = list(responses)  # the client reads again: everything made, then the cancellation
    finally:
        call.close()
    last = rest[-1]
    assert last.WhichOneof("event") == "error" and last.error.status == "CANCELLED"
    assert last.error.message == f"cancelled: the client did not read its stream for {STALL_S:g} s"
    deltas = [first, *rest[:-1]]
    made = at_pause - before
    assert all(m.WhichOneof("event") == "delta" for m in deltas) and len(deltas) == made < MAX_TOKENS
    # on the wire: a DATA frame's 9-byte header and gRPC's 5-byte prefix around each message
    smallest = min(m.ByteSize() for m in deltas) + 14
    assert made <= most_events(rcvbuf, 0, smallest), (made, smallest)
    assert_kv_clean(srv)


def neighbour_answer(srv: RunningServer) -> Any:
    """A short request on a connection of its own, read to its end."""
    with grpc.insecure_channel(srv.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        out = list(stub.Generate(iter([req("neighbour", "Hello", 8, ignore_eos=True)]), timeout=CEILING_S))
    assert out[-1].WhichOneof("event") == "done", out[-1]
    return out[-1]


@pytest.fixture()
def far_backlog() -> Iterator[RunningServer]:
    """A backlog bound the stream cannot reach (more than MAX_TOKENS): only a pending write can pause it."""
    server = start_server(http_port=free_port(), stream_backlog=4 * MAX_TOKENS, stream_stall_timeout_s=STALL_S,
                          speculative=False)
    yield server
    server.close()


def test_a_grpc_caller_whose_window_is_full_is_paused_by_the_pending_write_whatever_the_backlog(
        far_backlog: RunningServer) -> None:
    # issue #35: once the transport stops taking writes, the count of unread messages grows at the engine's
    # pace for the stream; the pause must not wait for it (--stream-write-pending-s, 1 s by default)
    srv = far_backlog
    before = generated(srv)
    call = stalled_grpc_call(srv)
    try:
        responses = call.responses()
        assert next(responses).WhichOneof("event") == "delta"
        wait_paused(srv)  # before MAX_TOKENS, with 4 x MAX_TOKENS allowed unread
        at_pause = generated(srv)
        assert wait_for(lambda: left_the_engine(srv), timeout=CEILING_S)  # cancelled by the stall timer
        assert generated(srv) == at_pause
        rest = list(responses)
    finally:
        call.close()
    assert rest[-1].WhichOneof("event") == "error" and rest[-1].error.status == "CANCELLED"
    assert len(rest) == at_pause - before < MAX_TOKENS  # the first delta, every other one, none after the pause
    assert_kv_clean(srv)

