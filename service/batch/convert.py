"""Conversions between batch protos and store records (pure functions)."""

from __future__ import annotations

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from inference.v1 import batch_pb2 as bpb
from inference.v1 import inference_pb2 as pb

from service.batch.store import DEFAULT_WINDOW_S, Job, JobSpec, JobState, StoredResult
from service.request.errors import BadRequest

STATES = {s: getattr(bpb, f"BATCH_STATE_{s.name}") for s in JobState}
FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "cancelled": pb.FINISH_REASON_CANCELLED,
          "closed": pb.FINISH_REASON_CLOSED}
TIME_FIELDS = {s.value: f"{s.value}_at" for s in JobState if s is not JobState.VALIDATING}
TIME_FIELDS[JobState.VALIDATING.value] = "created_at"
MAX_WINDOW_S = 30 * 24 * 3600
MAX_METADATA = 16
MAX_TEXT_BYTES = 256
MAX_METADATA_BYTES = 512


def spec_of(options: bpb.BatchOptions, tenant: str) -> JobSpec:
    """Validated job options; raises BadRequest."""
    if len(options.display_name.encode()) > MAX_TEXT_BYTES or len(options.idempotency_key.encode()) > MAX_TEXT_BYTES:
        raise BadRequest(f"display_name and idempotency_key are at most {MAX_TEXT_BYTES} bytes")
    if len(options.metadata) > MAX_METADATA:
        raise BadRequest(f"at most {MAX_METADATA} metadata entries")
    for k, v in options.metadata.items():
        if len(k.encode()) > MAX_METADATA_BYTES or len(v.encode()) > MAX_METADATA_BYTES:
            raise BadRequest(f"metadata keys and values are at most {MAX_METADATA_BYTES} bytes")
    window = options.completion_window_s or DEFAULT_WINDOW_S
    if window > MAX_WINDOW_S:
        raise BadRequest(f"completion_window_s is at most {MAX_WINDOW_S} (30 days)")
    if options.priority not in (pb.PRIORITY_UNSPECIFIED, pb.PRIORITY_INTERACTIVE, pb.PRIORITY_BATCH):
        raise BadRequest(f"priority {options.priority} is not a known Priority value (0, 1 or 2)")
    return JobSpec(
        tenant=tenant,
        display_name=options.display_name,
        metadata=dict(options.metadata),
        completion_window_s=window,
        priority=1 if options.priority == pb.PRIORITY_INTERACTIVE else 0,
        idempotency_key=options.idempotency_key,
    )


def _ts(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def job_proto(job: Job) -> bpb.Batch:
    s, c, u = job.spec, job.counts, job.usage
    out = bpb.Batch(
        id=job.id,
        state=STATES[job.state],
        options=bpb.BatchOptions(
            display_name=s.display_name,
            metadata=s.metadata,
            completion_window_s=s.completion_window_s,
            priority=pb.PRIORITY_INTERACTIVE if s.priority else pb.PRIORITY_BATCH,
            idempotency_key=s.idempotency_key,
        ),
        counts=bpb.BatchCounts(
            total=c.total, completed=c.completed, failed=c.failed, cancelled=c.cancelled,
            running=c.running, queued=c.queued,
        ),
        usage=pb.Usage(
            prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens, cached_tokens=u.cached_tokens,
            reasoning_tokens=u.reasoning_tokens,
        ),
        errors=[bpb.BatchError(line=e.line, custom_id=e.custom_id, status=e.status, message=e.message)
                for e in job.errors],
        error_count=job.error_count,
        failure=job.failure,
        expires_at=_ts(job.expires_at),
    )
    for state, when in job.times.items():
        getattr(out, TIME_FIELDS[state]).CopyFrom(_ts(when))
    if job.delete_at is not None:
        out.delete_at.CopyFrom(_ts(job.delete_at))
    return out


def result_proto(r: StoredResult) -> bpb.GetBatchResultsResponse:
    x = r.result
    out = bpb.GetBatchResultsResponse(
        custom_id=r.custom_id,
        cursor=r.cursor,
        text=x.text,
        finish_reason=FINISH.get(x.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
        usage=pb.Usage(
            prompt_tokens=x.prompt_tokens, completion_tokens=x.completion_tokens, cached_tokens=x.cached_tokens,
            reasoning_tokens=x.reasoning_tokens,
        ),
        timing=pb.Timing(queue_ms=x.queue_ms, ttft_ms=x.ttft_ms, total_ms=x.total_ms),
        attempts=r.attempts,
        reasoning=x.reasoning,
    )
    if x.error_status:
        code = grpc.StatusCode[x.error_status].value[0]
        out.error.CopyFrom(pb.Error(code=code, status=x.error_status, message=x.error_message))
    return out
