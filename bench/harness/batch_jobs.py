"""BatchService calls of the benchmarks (scenario J): submit a job, watch it, read its results.

Blocking (grpc, not grpc.aio) calls on a fresh plaintext channel each, to a server's ``target``.
"""

from __future__ import annotations

from typing import Any

import grpc
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb

FINAL = {
    bpb.BATCH_STATE_COMPLETED,
    bpb.BATCH_STATE_FAILED,
    bpb.BATCH_STATE_CANCELLED,
    bpb.BATCH_STATE_EXPIRED,
}


def item(cid: str, prompt: str, tokens: int) -> bpb.BatchItem:
    """A greedy Generate item of exactly ``tokens`` tokens (ignore_eos)."""
    sp = pb.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    return bpb.BatchItem(custom_id=cid, generate=pb.GenerateRequest(prompt=prompt, sampling=sp))


def submit(target: str, items: list[bpb.BatchItem], key: str) -> str:
    """CreateBatch with ``items`` (64 per message) under idempotency ``key``; the batch id."""
    msgs = [bpb.CreateBatchRequest(options=bpb.BatchOptions(idempotency_key=key), items=items[:64])]
    msgs += [bpb.CreateBatchRequest(items=items[i : i + 64]) for i in range(64, len(items), 64)]
    with grpc.insecure_channel(target) as ch:
        return str(bpb_grpc.BatchServiceStub(ch).CreateBatch(iter(msgs), timeout=600).batch.id)


def get(target: str, batch_id: str) -> bpb.Batch:
    """GetBatch: the batch's state and counts now."""
    with grpc.insecure_channel(target) as ch:
        return (
            bpb_grpc.BatchServiceStub(ch).GetBatch(bpb.GetBatchRequest(batch_id=batch_id), timeout=30).batch
        )


def wait(
    target: str, batch_id: str, until: Any = lambda b: b.state in FINAL, timeout_s: float = 3600
) -> bpb.Batch:
    """Block on WatchBatch (server push every 200 ms at most; one channel, no polling) until ``until``."""
    req = bpb.WatchBatchRequest(batch_id=batch_id, min_interval_ms=200)
    with grpc.insecure_channel(target) as ch:
        for ev in bpb_grpc.BatchServiceStub(ch).WatchBatch(req, timeout=timeout_s):
            if until(ev.batch):
                return ev.batch
    raise TimeoutError(f"batch {batch_id}: the watch ended before the condition held")


def all_results(target: str, batch_id: str) -> list[bpb.GetBatchResultsResponse]:
    """Every result of the batch (GetBatchResults, streamed)."""
    with grpc.insecure_channel(target) as ch:
        req = bpb.GetBatchResultsRequest(batch_id=batch_id)
        return list(bpb_grpc.BatchServiceStub(ch).GetBatchResults(req, timeout=600))
