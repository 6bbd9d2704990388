"""The OpenAI batch formats <-> the BatchService's protos (pure functions).

* an input line ``{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body": {...}}``
  becomes a ``BatchItem`` whose ``generate`` request is what the live endpoint
  would build from ``body`` (``service.http.requests``); a line that cannot
  (bad JSON, nested too deeply, a lone surrogate, wrong url, streaming, tools,
  logprobs, n > 1) is refused with its reason and ends up in the error file. A
  reasoning model's line (a thinking budget, ``reasoning_effort``) is planned
  when it runs, as a ``Generate`` request is (``service.batch.items``);
* a result becomes an output line ``{"id", "custom_id", "response": {"status_code",
  "request_id", "body"}, "error": null}``: the body is the endpoint's response
  object as the live endpoint renders it (``service.http.render``: a reasoning
  model's thought is the message's ``reasoning_content``), or OpenAI's error
  object for a failed, cancelled or expired item;
* a ``Batch`` becomes OpenAI's batch object; the endpoint and the input file
  are kept in the job's metadata under ``openai.*`` keys (hidden from callers).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from inference.v1 import batch_pb2 as bpb
from inference.v1 import inference_pb2 as pb

from service.api.input_limits import DEFAULTS, InputLimits
from service.http.body import check_json
from service.http.errors import ApiError, from_status
from service.http.render import FINISH, Choices, Json
from service.http.requests import Output, parse_chat, parse_completion

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
KEY_ENDPOINT, KEY_INPUT = "openai.endpoint", "openai.input_file_id"
TIMES = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
         "expired_at", "cancelling_at", "cancelled_at")
TERMINAL = (bpb.BATCH_STATE_COMPLETED, bpb.BATCH_STATE_FAILED, bpb.BATCH_STATE_CANCELLED, bpb.BATCH_STATE_EXPIRED)
Line = bpb.BatchItem | tuple[str, str]


def _item(raw: Any, endpoint: str, model: str, limits: InputLimits) -> Line:
    if not isinstance(raw, dict) or not isinstance(raw.get("custom_id"), str):
        return ("", "a line must be a JSON object with a string custom_id")
    cid = raw["custom_id"]
    if raw.get("method", "POST") != "POST" or raw.get("url") != endpoint:
        return (cid, f"method must be POST and url {endpoint} (the batch's endpoint)")
    body = raw.get("body")
    if not isinstance(body, dict):
        return (cid, "body must be a JSON object")
    try:
        parsed = (parse_chat if endpoint == ENDPOINTS[0] else parse_completion)(body, model, None, limits)
        if body.get("model") != model:
            return (cid, f"model must be {model!r}")
    except ApiError as exc:
        return (cid, str(exc))
    if parsed.output.stream or parsed.output.tools is not None:
        return (cid, "batch lines cannot stream or call tools")
    if len(parsed.prompts) > 1 or (parsed.prompts and not isinstance(parsed.prompts[0], str)):
        return (cid, "a batch line takes one text prompt (several prompts or token ids: one line each, as text)")
    return bpb.BatchItem(custom_id=cid, generate=parsed.request)


def parse_lines(data: bytes, endpoint: str, model: str, limits: InputLimits = DEFAULTS) -> list[Line]:
    """Every non-empty JSONL line as an item or a refusal (custom_id, why; counts past ``limits`` too)."""
    out: list[Line] = []
    for n, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError):
            out.append(("", f"line {n} is not valid JSON"))
            continue
        out.append(_unusable(raw, text, n) or _item(raw, endpoint, model, limits))
    return out


def _unusable(raw: Any, text: str, n: int) -> tuple[str, str] | None:
    """A refusal for a line nested too deeply or holding a lone surrogate (``check_json``), else None."""
    try:
        check_json(raw, text.encode())
    except ApiError as exc:
        cid = raw.get("custom_id") if isinstance(raw, dict) else None
        usable = isinstance(cid, str) and not (exc.param or "").startswith("custom_id")
        return (cid if usable and isinstance(cid, str) else "", f"line {n}: {exc}")
    return None


def _digest(text: str) -> str:
    """A stable id part for a result (the same line always gets the same ids)."""
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _body(r: bpb.GetBatchResultsResponse, endpoint: str, model: str, created: int) -> Json:
    """The endpoint's response object of a result, rendered as the live endpoint renders its answer
    (``service.http.render``): a reasoning model's chat (``reasoning`` set) with its usage's thought tokens."""
    chat = endpoint == ENDPOINTS[0]
    rid = ("chatcmpl-" if chat else "cmpl-") + _digest(f"{r.cursor}/{created}")
    choices = Choices(Output(chat, model), rid, created, thought_usage=chat and r.HasField("reasoning"))
    choices.add_delta(pb.Delta(text=r.text))
    finish = r.finish_reason if r.finish_reason in FINISH else pb.FINISH_REASON_STOP
    choices.add_done(pb.Done(finish_reason=finish, usage=r.usage)).reasoning = r.reasoning
    choices.reasoning_tokens = r.usage.reasoning_tokens
    return choices.response()


def output_line(r: bpb.GetBatchResultsResponse, batch: bpb.Batch, model: str) -> tuple[bool, bytes]:
    """(failed?, the JSONL line) of one item's result."""
    endpoint = batch.options.metadata.get(KEY_ENDPOINT, ENDPOINTS[0])
    rid = f"{batch.id}/{r.custom_id}"
    if r.HasField("error"):
        err = from_status(r.error.status, r.error.message)
        response = {"status_code": err.status, "request_id": rid, "body": err.body()}
    else:
        body = _body(r, endpoint, model, int(batch.in_progress_at.seconds))
        response = {"status_code": 200, "request_id": rid, "body": body}
    line = {"id": "batch_req_" + _digest(rid), "custom_id": r.custom_id, "response": response,
            "error": None}
    return r.HasField("error"), json.dumps(line, ensure_ascii=False).encode() + b"\n"


def batch_object(b: bpb.Batch) -> dict[str, Any]:
    """OpenAI's batch object of a job."""
    meta = dict(b.options.metadata)
    c = b.counts
    done = b.state in TERMINAL
    out: dict[str, Any] = {
        "id": b.id, "object": "batch", "endpoint": meta.pop(KEY_ENDPOINT, ""),
        "input_file_id": meta.pop(KEY_INPUT, ""),
        "completion_window": f"{b.options.completion_window_s // 3600}h",
        "status": bpb.BatchState.Name(b.state).removeprefix("BATCH_STATE_").lower(),
        "output_file_id": f"file-out-{b.id}" if done and c.completed else None,
        "error_file_id": f"file-err-{b.id}" if done and (c.failed or c.cancelled) else None,
        "errors": {"object": "list", "data": [
            {"code": e.status.lower(), "message": e.message, "param": None, "line": e.line} for e in b.errors
        ]} if b.errors else None,
        "request_counts": {"total": c.total, "completed": c.completed, "failed": c.failed + c.cancelled},
        "metadata": meta or None,
    }
    for name in TIMES:
        out[name] = getattr(b, name).seconds if b.HasField(name) else None
    return out
