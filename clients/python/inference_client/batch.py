"""Batch jobs (inference.v1.BatchService) for the sync client.

Items may be given as ``BatchItem`` protos, as OpenAI batch-input lines (dicts
with ``custom_id`` and ``body``: ``prompt`` or ``messages``, ``max_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop``, ``response_format``), or as
simple dicts (``custom_id`` plus ``prompt``/``messages`` and sampling fields
at the top level). ``InferenceClient.submit_batch``/``wait_batch``/
``batch_results`` wrap the functions here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb

from .errors import InferenceError
from .retry import RetryPolicy, call_with_retry

SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "ignore_eos")
PRIORITY = {"interactive": pb.PRIORITY_INTERACTIVE, "batch": pb.PRIORITY_BATCH}
FINAL = {
    bpb.BATCH_STATE_COMPLETED, bpb.BATCH_STATE_FAILED, bpb.BATCH_STATE_CANCELLED, bpb.BATCH_STATE_EXPIRED
}
CHUNK = 64  # items per upload message


def _sampling(body: Mapping[str, Any]) -> pb.SamplingParams:
    sp = pb.SamplingParams()
    for key in SAMPLING_KEYS:
        value = body.get(key)
        if value is None:
            continue
        if key == "stop":
            sp.stop.extend([value] if isinstance(value, str) else value)
        else:
            setattr(sp, key, value)
    return sp


def _schema(fmt: Mapping[str, Any] | None) -> str | None:
    """The JSON Schema of an OpenAI ``response_format`` (``json_object``: any object), or None."""
    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return json.dumps({"type": "object"})
    if fmt["type"] == "json_schema":
        inner = fmt.get("json_schema", {})
        return json.dumps(inner.get("schema", inner))
    raise ValueError(f"response_format type {fmt['type']!r} is not supported")


def to_item(item: bpb.BatchItem | Mapping[str, Any]) -> bpb.BatchItem:
    """A ``BatchItem`` from a proto, an OpenAI batch-input line or a simple dict; raises ValueError."""
    if isinstance(item, bpb.BatchItem):
        return item
    if "custom_id" not in item:
        raise ValueError("every item needs a custom_id")
    body = item.get("body", item)
    messages = [pb.ChatMessage(role=m["role"], content=_content(m["content"])) for m in body.get("messages", ())]
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):  # OpenAI allows a list of prompts; one item is one prompt
        raise ValueError(f"{item['custom_id']}: prompt must be one string")
    sampling = _sampling(body)
    schema = _schema(body.get("response_format")) or body.get("json_schema")
    if schema is not None:
        schema = schema if isinstance(schema, str) else json.dumps(schema)
        # NOTE: OpenAI's "prompt" (the completions API) is text to continue, as Generate treats it;
        # GenerateJSON would otherwise render it as a chat turn (GenerateJSONRequest.raw_prompt).
        req = pb.GenerateJSONRequest(
            prompt=prompt, messages=messages, json_schema=schema, sampling=sampling, raw_prompt=bool(prompt)
        )
        return bpb.BatchItem(custom_id=str(item["custom_id"]), generate_json=req)
    gen = pb.GenerateRequest(prompt=prompt, messages=messages, sampling=sampling)
    return bpb.BatchItem(custom_id=str(item["custom_id"]), generate=gen)


def _content(content: Any) -> str:
    """OpenAI message content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def read_jsonl(lines: Iterable[str]) -> Iterator[bpb.BatchItem]:
    """Items of an OpenAI batch-input (or simple) JSONL file; blank lines are skipped."""
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield to_item(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"line {n}: {exc}") from None


class BatchApi:
    """The BatchService calls, with the client's retry policy, deadline and metadata."""

    def __init__(self, channel: grpc.Channel, retry: RetryPolicy, metadata: Any, timeout: float | None) -> None:
        self.stub = bpb_grpc.BatchServiceStub(channel)
        self.retry, self.metadata, self.timeout = retry, metadata, timeout

    def _call(self, fn: Callable[[float | None], Any], timeout: float | None) -> Any:
        return call_with_retry(fn, self.retry, self.timeout if timeout is None else timeout)

    def submit(
        self,
        items: Iterable[bpb.BatchItem | Mapping[str, Any]],
        *,
        display_name: str = "",
        metadata: Mapping[str, str] | None = None,
        completion_window_s: int = 0,
        priority: str = "batch",
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> bpb.Batch:
        """Upload a job; returns it (VALIDATING is over: IN_PROGRESS, or FAILED when every item was bad).

        A retried upload reuses one idempotency key (a fresh uuid unless given), so it never makes two jobs.
        """
        options = bpb.BatchOptions(
            display_name=display_name,
            metadata=dict(metadata or {}),
            completion_window_s=completion_window_s,
            priority=PRIORITY[priority],
            idempotency_key=idempotency_key or uuid.uuid4().hex,
        )
        all_items = [to_item(i) for i in items]
        chunks = [all_items[i : i + CHUNK] for i in range(0, len(all_items), CHUNK)] or [[]]
        messages = [bpb.CreateBatchRequest(options=options, items=chunks[0])]
        messages += [bpb.CreateBatchRequest(items=c) for c in chunks[1:]]
        resp = self._call(lambda t: self.stub.CreateBatch(iter(messages), timeout=t, metadata=self.metadata), timeout)
        return resp.batch

    def get(self, batch_id: str, *, timeout: float | None = None) -> bpb.Batch:
        req = bpb.GetBatchRequest(batch_id=batch_id)
        return self._call(lambda t: self.stub.GetBatch(req, timeout=t, metadata=self.metadata), timeout).batch

    def cancel(self, batch_id: str, *, timeout: float | None = None) -> bpb.Batch:
        req = bpb.CancelBatchRequest(batch_id=batch_id)
        return self._call(lambda t: self.stub.CancelBatch(req, timeout=t, metadata=self.metadata), timeout).batch

    def list(self, page_size: int = 20, page_token: str = "") -> bpb.ListBatchesResponse:
        req = bpb.ListBatchesRequest(page_size=page_size, page_token=page_token)
        return self._call(lambda t: self.stub.ListBatches(req, timeout=t, metadata=self.metadata), None)

    def watch(self, batch_id: str, min_interval_ms: int = 500) -> Iterator[bpb.WatchBatchResponse]:
        """Progress events until the job is final; a broken stream is reopened (events are snapshots)."""
        while True:
            req = bpb.WatchBatchRequest(batch_id=batch_id, min_interval_ms=min_interval_ms)
            try:
                for ev in self.stub.WatchBatch(req, metadata=self.metadata):
                    yield ev
                    if ev.batch.state in FINAL:
                        return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise InferenceError.from_rpc_error(exc) from None
                self.get(batch_id)  # waits (with retries) until the server answers again

    def wait(
        self, batch_id: str, on_progress: Callable[[bpb.WatchBatchResponse], None] | None = None
    ) -> bpb.Batch:
        """Block until the job is final; ``on_progress`` gets every progress event."""
        last = None
        for ev in self.watch(batch_id):
            last = ev.batch
            if on_progress is not None:
                on_progress(ev)
        assert last is not None
        return last

    def results(
        self, batch_id: str, *, order: str = "custom_id", cursor: str = ""
    ) -> Iterator[bpb.GetBatchResultsResponse]:
        """Finished items' results; a broken stream resumes after the last result received."""
        by = bpb.RESULT_ORDER_COMPLETION if order == "completion" else bpb.RESULT_ORDER_CUSTOM_ID
        while True:
            req = bpb.GetBatchResultsRequest(batch_id=batch_id, order=by, cursor=cursor)
            try:
                for r in self.stub.GetBatchResults(req, metadata=self.metadata):
                    cursor = r.cursor
                    yield r
                return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise InferenceError.from_rpc_error(exc) from None
                self.get(batch_id)


def result_to_dict(r: bpb.GetBatchResultsResponse) -> dict[str, Any]:
    """One results-file line: custom_id, text, reasoning (a reasoning model's thought, else None), finish_reason,
    usage, timing, attempts, error (or None)."""
    out: dict[str, Any] = {
        "custom_id": r.custom_id,
        "text": r.text,
        "reasoning": r.reasoning if r.HasField("reasoning") else None,
        "finish_reason": pb.FinishReason.Name(r.finish_reason).removeprefix("FINISH_REASON_").lower()
        if r.finish_reason
        else None,
        "usage": MessageToDict(r.usage, preserving_proto_field_name=True, always_print_fields_with_no_presence=True),
        "timing": MessageToDict(r.timing, preserving_proto_field_name=True),
        "attempts": r.attempts,
        "error": None,
    }
    if r.HasField("error"):
        out["error"] = {"status": r.error.status, "message": r.error.message}
    return out


def batch_to_dict(b: bpb.Batch) -> dict[str, Any]:
    return MessageToDict(b, preserving_proto_field_name=True, always_print_fields_with_no_presence=False)
