"""Client calls a test runs on its client host (``tests.support.client_host``): plain data in and out.

Each function opens its own channel to ``target`` (``host:port``, or ``ipv4:a:p,b:p`` for the
client library's round_robin over replicas), makes one call or stream, and returns what the test
asserts on: a status code name ("OK" when the call succeeded) and protos or tuples. Channels ping
every second (``KEEPALIVE``), so a stream to a replica whose link was cut ends within seconds.
A ``started`` file, when given, is created once a stream has delivered its first message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

T = TypeVar("T")
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
]
FINAL = {bpb.BATCH_STATE_COMPLETED, bpb.BATCH_STATE_FAILED, bpb.BATCH_STATE_CANCELLED, bpb.BATCH_STATE_EXPIRED}


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def _status(fn: Callable[[], T]) -> tuple[str, T | None]:
    """("OK", fn()) or (the gRPC status name, None)."""
    try:
        return "OK", fn()
    except grpc.RpcError as exc:
        return exc.code().name, None


def _batches(ch: grpc.Channel) -> Any:
    return bpb_grpc.BatchServiceStub(ch)


def wait_serving(target: str, service: str = "", timeout: float = 240.0) -> str:
    """Watch ``service``'s health on ``target`` until SERVING (waits for the server to listen)."""
    status = "UNKNOWN"
    with grpc.insecure_channel(target, KEEPALIVE) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=timeout, wait_for_ready=True)
        try:
            for msg in watch:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(msg.status)
                if status == "SERVING":
                    watch.cancel()
                    break
        except grpc.RpcError as exc:
            return f"{status} then {exc.code().name}: {exc.details()}"
    return status


def health(target: str, service: str = "") -> str:
    """One health check: SERVING, NOT_SERVING, or the call's status name."""
    with grpc.insecure_channel(target, KEEPALIVE) as ch:
        code, resp = _status(lambda: health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status) if resp is not None else code


def item(custom_id: str, prompt: str, max_tokens: int) -> bpb.BatchItem:
    sampling = pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return bpb.BatchItem(custom_id=custom_id, generate=pb.GenerateRequest(prompt=prompt, sampling=sampling))


def submit(target: str, token: str, ids: list[str], prompts: list[str], max_tokens: int, key: str = "") -> bpb.Batch:
    """Upload one job (items ``ids``, prompts taken in turn) in chunks of 64; the job as answered."""
    items = [item(cid, prompts[n % len(prompts)], max_tokens) for n, cid in enumerate(ids)]
    options = bpb.BatchOptions(display_name="netns", idempotency_key=key)
    msgs = [bpb.CreateBatchRequest(options=options, items=items[:64])]
    msgs += [bpb.CreateBatchRequest(items=items[i : i + 64]) for i in range(64, len(items), 64)]
    with grpc.insecure_channel(target, KEEPALIVE) as ch:
        return _batches(ch).CreateBatch(iter(msgs), timeout=600, metadata=_md(token)).batch


def get(target: str, token: str, job_id: str) -> tuple[str, bpb.Batch | None]:
    with grpc.insecure_channel(target, KEEPALIVE) as ch:
        req = bpb.GetBatchRequest(batch_id=job_id)
        return _status(lambda: _batches(ch).GetBatch(req, timeout=15, metadata=_md(token)).batch)


def cancel(target: str, token: str, job_id: str) -> tuple[str, bpb.Batch | None]:
    with grpc.insecure_channel(target, KEEPALIVE) as ch:
        req = bpb.CancelBatchRequest(batch_id=job_id)
        return _status(lambda: _batches(ch).CancelBatch(req, timeout=15, metadata=_md(token)).batch)


def list_ids(target: str, token: str) -> tuple[str, list[str] | None]:
    with grpc.insecure_channel(target, KEEPALIVE) as ch:
        req = bpb.ListBatchesRequest(page_size=100)
        return _status(lambda: [b.id for b in _batches(ch).ListBatches(req, timeout=15, metadata=_md(token)).batches])


def results(target: str, token: str, job_id: str) -> tuple[str, list[tuple[str, int, str, str]] | None]:
    """(custom_id, attempts, text, error status) of every result, by custom_id."""
    with grpc.insecure_channel(target, KEEPALIVE) as ch:
        req = bpb.GetBatchResultsRequest(batch_id=job_id)
        return _status(lambda: [
            (r.custom_id, r.attempts, r.text, r.error.status if r.HasField("error") else "")
            for r in _batches(ch).GetBatchResults(req, timeout=600, metadata=_md(token))
        ])


def _touch(started: str) -> None:
    if started:
        Path(started).touch()


def watch(target: str, token: str, job_id: str, started: str = "", timeout: float = 300.0) -> tuple[str, list[Any]]:
    """WatchBatch until the job is final or the stream fails: (status, [(state, completed, running, rate)])."""
    events: list[Any] = []
    with grpc.insecure_channel(target, KEEPALIVE) as ch:
        req = bpb.WatchBatchRequest(batch_id=job_id, min_interval_ms=100)

        def read() -> None:
            for ev in _batches(ch).WatchBatch(req, timeout=timeout, metadata=_md(token)):
                events.append((ev.batch.state, ev.batch.counts.completed, ev.batch.counts.running,
                               ev.items_per_second))
                _touch(started)

        code, _ = _status(read)
    return code, events


def watch_balanced(targets: list[str], token: str, job_id: str, started: str = "") -> tuple[str, list[Any]]:
    """The client library's watch over every replica (round_robin, retried after UNAVAILABLE)."""
    from inference_client import InferenceClient, InferenceError

    events: list[Any] = []
    with InferenceClient("ipv4:" + ",".join(targets), token=token or None, options=KEEPALIVE) as client:
        try:
            for ev in client.batches.watch(job_id, min_interval_ms=100):
                events.append((ev.batch.state, ev.batch.counts.completed, ev.batch.counts.running,
                               ev.items_per_second))
                _touch(started)
        except InferenceError as exc:
            return exc.code.name, events
    return "OK", events


def generate(target: str, token: str, prompt: str, max_tokens: int, started: str = "") -> tuple[str, int]:
    """One Generate stream: (status, delta messages received)."""
    sampling = pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    deltas = 0
    with grpc.insecure_channel(target, KEEPALIVE) as ch:

        def requests() -> Iterator[pb.GenerateRequest]:
            yield pb.GenerateRequest(request_id="g", prompt=prompt, sampling=sampling)

        def read() -> None:
            nonlocal deltas
            for msg in pb_grpc.InferenceServiceStub(ch).Generate(requests(), timeout=300, metadata=_md(token)):
                if msg.HasField("error"):
                    raise RuntimeError(msg.error.status)
                deltas += msg.HasField("delta")
                _touch(started)

        code, _ = _status(read)
    return code, deltas


def scrape(url: str) -> str:
    """A Prometheus /metrics page."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())
