"""A client that disconnects mid-stream frees its sequence within one engine step."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from service.http import run as run_module
from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model


def open_stream(port: int, body: dict[str, Any]) -> tuple[socket.socket, str]:
    """A raw HTTP/1.1 streaming request; returns the socket and the request id of its first chunk."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=600)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
    buf = b""
    while True:  # the body is chunked: find the first whole "data: {...}\n\n" event in the bytes
        buf += sock.recv(65536)
        begin = buf.find(b"data: {")
        if begin >= 0 and (end := buf.find(b"\n\n", begin)) >= 0:
            return sock, json.loads(buf[begin + 6 : end])["id"]


def wait_for(condition: Any, deadline: float) -> None:
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def test_disconnect_mid_stream_frees_the_sequence_within_one_step(api_server: RunningServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    engine, port = api_server.engine, api_server.server.http_port
    steps: list[tuple[int, set[str]]] = []  # (engine step count, request ids running after that step)
    inner = engine.step_hook

    def record(e: Any) -> None:
        steps.append((e.metrics.steps, {s.request_id for s in e.scheduler.running}))
        inner(e)

    aborted: dict[str, int] = {}  # request id -> engine step count when the server saw the disconnect
    real_abort = run_module.Run.abort

    def spy(self: run_module.Run) -> None:
        aborted.setdefault(self.request_id, engine.metrics.steps)
        real_abort(self)

    monkeypatch.setattr(run_module.Run, "abort", spy)
    cancelled0 = sum(t.cancelled for t in engine.metrics.tiers.values())
    engine.step_hook = record
    # NOTE: both requests are far longer than the test: neither can finish before the abort it is about.
    busy = {"model": MODEL, "max_tokens": 2000, "temperature": 0, "ignore_eos": True, "stream": True}
    keeper = None
    try:
        keeper, _ = open_stream(port, {**busy, "prompt": "Keep going:"})  # keeps the engine stepping
        deadline = time.monotonic() + 60
        sock, rid = open_stream(port, {**busy, "prompt": "Tell a long story:"})
        wait_for(lambda: any(rid in running for _, running in steps), deadline)  # its step hook runs after emit
        sock.close()
        wait_for(lambda: rid in aborted, deadline)
        at = aborted[rid]
        wait_for(lambda: any(n >= at + 2 for n, _ in steps), deadline)
        after = [running for n, running in steps if n >= at + 2]
        assert after and all(rid not in running for running in after), "still running two steps after the abort"
        assert sum(t.cancelled for t in engine.metrics.tiers.values()) == cancelled0 + 1
    finally:
        engine.step_hook = inner
        if keeper is not None:
            keeper.close()  # the keeper goes the same way
    assert_kv_clean(api_server)
