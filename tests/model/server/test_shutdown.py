"""Graceful shutdown of the real server process (``python -m service``) under load.

SIGTERM -> health NOT_SERVING -> new requests UNAVAILABLE -> in-flight requests
finish within --grace-seconds -> the rest end with an UNAVAILABLE error event
-> exit code 0. No accepted request may be lost: each gets a final event.
"""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.helpers import OpenStream, req
from tests.support.server import ServerProcess
from tests.support.waiting import scaled

pytestmark = pytest.mark.model
# NOTE: two drains, so that no verdict depends on how fast a machine decodes. With a grace far longer
# than any short request takes (never waited for: the drain ends when the last in-flight request does),
# the short requests must finish; with a grace of seconds, requests of 8,000 tokens (minutes even on an
# idle machine) must be cut when it ends, and new work is refused meanwhile. One drain that had to do
# both needed a grace that fits the short requests on the busiest machine, then waited all of it.
LONG_GRACE_S = 600.0
LONG_TOKENS, LONG_CTX = 8_000, 8_192  # the model was trained on 8,192
SHORT = [f"short-{i}" for i in range(3)]
LONG = [f"long-{i}" for i in range(3)]
SHORT_TOKENS = 200  # in flight when SIGTERM comes (it follows their first token), done within seconds


def _health(channel: grpc.Channel) -> int:
    request = health_pb2.HealthCheckRequest(service="")
    return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def _finals(stream: OpenStream, ids: set[str], timeout: float) -> dict[str, pb.GenerateResponse]:
    """Read events until every id in ``ids`` has its final (done or error) event."""
    finals: dict[str, pb.GenerateResponse] = {}
    end = time.monotonic() + timeout
    while set(finals) != ids:
        ev = stream.next_event(timeout=max(0.1, end - time.monotonic()))
        if ev.WhichOneof("event") != "delta":
            assert ev.request_id not in finals, f"two final events for {ev.request_id}"
            finals[ev.request_id] = ev
    return finals


def _server(grace_s: float, metrics_port: int) -> tuple[ServerProcess, str]:
    srv = ServerProcess("--grace-seconds", str(grace_s), "--prometheus-port", str(metrics_port),
                        "--ctx", str(LONG_CTX), env={"INFERENCE_LOG_FORMAT": "json"})
    listening = json.loads(srv.wait_for("listening on"))["msg"]
    srv.wait_for("SERVING after")
    return srv, listening.split()[2].rstrip(";")


def _records(srv: ServerProcess) -> list[dict[str, object]]:
    return [json.loads(line) for line in srv.log]  # every line is a JSON object


def test_sigterm_lets_in_flight_requests_finish_and_exits_zero() -> None:
    metrics_port = free_port()
    srv, target = _server(LONG_GRACE_S, metrics_port)
    try:
        with grpc.insecure_channel(target) as ch:
            assert _health(ch) == health_pb2.HealthCheckResponse.SERVING
            stream = OpenStream(ch)
            _start(stream, metrics_port, SHORT, "The capital of France is", SHORT_TOKENS)
            srv.proc.send_signal(signal.SIGTERM)
            finals = _finals(stream, set(SHORT), timeout=600)
            stream.close()
            stream.join(30)
        assert srv.proc.wait(120) == 0, "\n".join(srv.log)
    finally:
        srv.kill()
    for rid in SHORT:
        assert finals[rid].WhichOneof("event") == "done", finals[rid]
        assert finals[rid].done.usage.completion_tokens == SHORT_TOKENS
    assert any(r["msg"] == "stopped" for r in _records(srv))


def test_sigterm_refuses_new_work_and_cuts_what_still_runs_when_the_grace_period_ends() -> None:
    metrics_port, grace_s = free_port(), round(scaled(8), 1)  # room for the refusals below
    srv, target = _server(grace_s, metrics_port)
    try:
        with grpc.insecure_channel(target) as ch:
            stream = OpenStream(ch)
            _start(stream, metrics_port, LONG, "Tell me a very long story about dragons.", LONG_TOKENS)
            srv.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            _refuses_new_work(ch, stream, target)
            finals = _finals(stream, {*LONG, "late"}, timeout=grace_s + scaled(60))
            elapsed = time.monotonic() - t0
            stream.close()
            stream.join(30)
        assert srv.proc.wait(120) == 0, "\n".join(srv.log)
    finally:
        srv.kill()
    for rid in [*LONG, "late"]:
        assert finals[rid].WhichOneof("event") == "error", finals[rid]
        assert finals[rid].error.status == "UNAVAILABLE"
    assert "shutting down" in finals["late"].error.message
    assert all("grace period" in finals[rid].error.message for rid in LONG)
    # cut when the grace period ends, give or take how late a busy machine delivers the events
    assert grace_s - 0.5 < elapsed < grace_s + scaled(10), f"long requests were cancelled after {elapsed:.1f} s"
    records = _records(srv)
    failed = {r.get("request_id") for r in records if str(r["msg"]).startswith("request failed: UNAVAILABLE")}
    assert set(LONG) <= failed, "cancelled requests are logged with their request_id"
    assert any(r["msg"] == "stopped" for r in records)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepted(metrics_port: int) -> float:
    """inference_requests_accepted_total for the interactive tier, scraped from --prometheus-port."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return float(
        next(
            line
            for line in text.splitlines()
            if line.startswith("inference_requests_accepted_total{")
            and 'inference_priority="interactive"' in line
        ).split()[-1]
    )


def _start(stream: OpenStream, metrics_port: int, ids: list[str], prompt: str, tokens: int) -> None:
    """Requests ``ids`` generating, and counted by the Prometheus endpoint (its live figures)."""
    for rid in ids:
        stream.send(req(rid, prompt, tokens, ignore_eos=True))
    first = stream.next_event(timeout=600)
    assert first.WhichOneof("event") == "delta", first
    end = time.monotonic() + scaled(60)
    while _accepted(metrics_port) < len(ids):
        assert time.monotonic() < end, "Prometheus endpoint does not count the accepted requests"
        time.sleep(0.1)


def _refuses_new_work(ch: grpc.Channel, stream: OpenStream, target: str) -> None:
    """After SIGTERM: health NOT_SERVING, then new work refused on the open stream and as a new RPC."""
    end = time.monotonic() + scaled(30)
    while _health(ch) != health_pb2.HealthCheckResponse.NOT_SERVING:
        assert time.monotonic() < end, "health still SERVING after SIGTERM"
        time.sleep(0.02)
    stream.send(req("late", "Too late", 8))
    with grpc.insecure_channel(target) as fresh, pytest.raises(grpc.RpcError) as refused:
        list(pb_grpc.InferenceServiceStub(fresh).Generate(iter([req("new-rpc", "Hello", 8)]), timeout=10))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
