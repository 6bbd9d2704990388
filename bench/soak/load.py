"""The mixed load of ``make soak`` (bench/soak/run.py) and how its outcomes are counted.

Each worker loops until the end time, one action at a time (weights in ``ACTIONS``):

  stream         1-3 concurrent requests on the worker's long-lived Generate stream
  cancel_msg     a request on that stream, then a cancel message after 0-1.5 s (a third of them
                 with a json_schema, some cancelled at once: while the grammar is being prepared)
  json_stream    a Generate request with a json_schema response_format
  close          a new Generate stream with 1-2 requests, closed abruptly after 0.1-2 s
  deadline       a new Generate stream with a 0.2-1.5 s deadline and a request too long for it
  json           GenerateJSON with one of ``SCHEMAS``; max_tokens sometimes too small (OUT_OF_RANGE)
  json_deadline  GenerateJSON with a 0.1-1 s deadline
  json_cancel    GenerateJSON cancelled by the client after 0.05-1 s

A request's outcome is its finish reason (STOP, LENGTH, CANCELLED), OK for GenerateJSON,
``aborted`` when the client ended the call itself, or the status of its error. An outcome
outside ``EXPECTED[action]`` is an unexpected error, kept with its message; so is an event for
a request id that is not in flight (a second terminal event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from bench.harness.grpc_load import ABORTED, BATCH, INTERACTIVE, ReqResult, Stream, next_id

REQUEST_TIMEOUT_S = 300.0  # no answer by then is a hang (not slowness on a busy machine): unexpected
MAX_UNEXPECTED_KEPT = 200
# NOTE: a request the client gives up on after REQUEST_TIMEOUT_S is "slow", not an error: on an
# oversubscribed 2-core machine llama.cpp's spinning threads can slow steps ~100x. It becomes an
# unexpected NO_ANSWER only if its terminal event never arrives before its stream ends (a hang).
SLOW = "SLOW"
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
            "active": {"type": "boolean"},
        },
        "required": ["name", "age", "tags", "active"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "score": {"type": "number"}},
        "required": ["color", "score"],
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["id", "ok"],
        },
        "minItems": 1,
        "maxItems": 4,
    },
    {  # recursive: only max_tokens bounds it
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "child": {"$ref": "#/$defs/node"},
                },
                "required": ["name"],
            }
        },
        "$ref": "#/$defs/node",
    },
]
ACTIONS = {
    "stream": 30,
    "cancel_msg": 12,
    "json_stream": 8,
    "close": 8,
    "deadline": 6,
    "json": 20,
    "json_deadline": 6,
    "json_cancel": 6,
}
_DONE = {"STOP", "LENGTH"}
_SHED = {"RESOURCE_EXHAUSTED"}  # queues full: allowed anywhere
_LATE_OK = _SHED | {"CANCELLED", "DEADLINE_EXCEEDED"}  # statuses a late answer may carry
EXPECTED: dict[str, set[str]] = {
    "stream": _DONE | _SHED,
    "cancel_msg": _DONE | _SHED | {"CANCELLED"},
    "json_stream": _DONE | _SHED,
    "close": _DONE | _SHED | {"aborted"},
    "deadline": _DONE | _SHED | {"DEADLINE_EXCEEDED"},
    "json": {"OK", "OUT_OF_RANGE"} | _SHED,
    "json_deadline": {"OK", "OUT_OF_RANGE", "DEADLINE_EXCEEDED"} | _SHED,
    "json_cancel": {"OK", "OUT_OF_RANGE", "aborted"} | _SHED,
}


@dataclass
class Tally:
    """Outcomes per action, and every unexpected one with its message (the first ``MAX_UNEXPECTED_KEPT``)."""

    t0: float = field(default_factory=time.monotonic)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    unexpected: list[dict[str, Any]] = field(default_factory=list)
    unexpected_total: int = 0
    slow: list[dict[str, Any]] = field(default_factory=list)  # given up on after REQUEST_TIMEOUT_S

    def add(self, action: str, outcome: str, message: str = "") -> None:
        self.counts[(action, outcome)] += 1
        if outcome == SLOW:
            self.slow.append(
                {"t_s": round(time.monotonic() - self.t0, 1), "action": action, "message": message}
            )
        elif outcome not in EXPECTED.get(action, set()):
            self.flag(action, outcome, message)

    def flag(self, action: str, status: str, message: str) -> None:
        self.unexpected_total += 1
        if len(self.unexpected) < MAX_UNEXPECTED_KEPT:
            t_s = round(time.monotonic() - self.t0, 1)
            self.unexpected.append({"t_s": t_s, "action": action, "status": status, "message": message})

    def add_result(self, action: str, res: ReqResult) -> None:
        self.add(action, *outcome_of(res))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def outcome_of(res: ReqResult) -> tuple[str, str]:
    """(outcome, message) of a Generate request as ``Stream`` reports it."""
    if res.ok:
        return res.finish.removeprefix("FINISH_REASON_"), ""
    err = res.error
    if err == ABORTED:
        return "aborted", ""
    if err.startswith("stream ended: "):
        return err.removeprefix("stream ended: "), "the Generate RPC failed with the request in flight"
    if err == "stream closed":
        return "STREAM_CLOSED", "the server ended the Generate stream with the request in flight"
    if err.startswith("no answer in"):  # judged when the stream ends: a late answer or none (a hang)
        return SLOW, err
    status, _, message = err.partition(": ")
    return status, message


@dataclass(frozen=True)
class Workload:
    """Prompts (4 .. ~1,000 tokens) shared by the workers; ``seed`` seeds each worker's choices."""

    prompts: list[str]
    json_prompts: list[str]
    seed: int


class Worker:
    """One closed-loop client: a long-lived Generate stream plus short-lived calls."""

    def __init__(self, ch: grpc.aio.Channel, work: Workload, tally: Tally, index: int) -> None:
        self.ch = ch
        self.stub = pb_grpc.InferenceServiceStub(ch)
        self.work = work
        self.tally = tally
        self.rng = random.Random(work.seed * 1000 + index)
        self.stream: Stream | None = None

    async def run(self, until: float) -> None:
        names, weights = list(ACTIONS), list(ACTIONS.values())
        try:
            while time.monotonic() < until:
                action = self.rng.choices(names, weights)[0]
                try:
                    await getattr(self, "_" + action)()
                except (grpc.RpcError, asyncio.InvalidStateError) as exc:  # a write on an ended call
                    self.tally.flag(action, "CALL_ENDED", f"{type(exc).__name__}: {exc}")
                    if self.stream is not None:
                        self.stream.abort()  # replaced by _own_stream
        finally:
            if self.stream is not None:
                await self._retire(self.stream)

    # -- requests ----------------------------------------------------------------------------------
    def _sampling(self, max_tokens: int, stop: bool = False) -> pb.SamplingParams:
        r = self.rng
        return pb.SamplingParams(
            max_tokens=max_tokens,
            temperature=r.choice([0.0, 0.7, 1.0]),
            seed=r.randrange(1 << 31),
            ignore_eos=r.random() < 0.5,
            stop=[r.choice([".", "\n", " the"])] if stop and r.random() < 0.2 else [],
        )

    def _generate(self, schema: bool = False, max_tokens: int | None = None) -> pb.GenerateRequest:
        r = self.rng
        prompt = r.choice(self.work.json_prompts if schema else self.work.prompts)
        if r.random() < 0.5:
            prompt += f" {r.randrange(10**6)}"  # a partial prefix-cache hit
        n = max_tokens or int(2 ** r.uniform(0, 7.3))  # 1 .. ~160, log-uniform
        req = pb.GenerateRequest(
            request_id=next_id(),
            sampling=self._sampling(n, stop=not schema),
            priority=pb.Priority.Name(r.choice([INTERACTIVE, INTERACTIVE, BATCH])),
        )
        if r.random() < 0.2:
            req.messages.append(pb.ChatMessage(role="user", content=prompt))
        else:
            req.prompt = prompt
        if schema:
            req.response_format.json_schema = json.dumps(r.choice(SCHEMAS))
        return req

    def _json_request(self) -> pb.GenerateJSONRequest:
        r = self.rng
        return pb.GenerateJSONRequest(
            prompt=r.choice(self.work.json_prompts),
            json_schema=json.dumps(r.choice(SCHEMAS)),
            sampling=self._sampling(r.choice([24, 64, 160])),
        )

    async def _own_stream(self) -> Stream:
        if self.stream is not None and not self.stream.alive:
            await self._retire(self.stream)
            self.stream = None
        if self.stream is None:
            self.stream = Stream(self.ch)
        return self.stream

    async def _retire(self, stream: Stream) -> None:
        await stream.close(REQUEST_TIMEOUT_S if stream.late else 30.0)  # slow requests may still finish
        for rid, seconds, msg in stream.late_answers:
            end = f"{msg.error.status}: {msg.error.message}" if msg.error.status else msg.WhichOneof("event")
            if msg.error.status and msg.error.status not in _LATE_OK:
                self.tally.flag("late_answer", msg.error.status, f"request {rid}: {msg.error.message}")
            self.tally.slow.append(
                {"action": "late_answer", "message": f"request {rid} ended after {seconds:.0f} s: {end}"}
            )
        for rid in stream.late:
            self.tally.flag(
                "stream", "NO_ANSWER", f"request {rid}: no terminal event before its stream ended"
            )
        for msg in stream.stray:
            kind = msg.WhichOneof("event")
            detail = f"{msg.error.status}: {msg.error.message}" if kind == "error" else kind
            self.tally.flag("stray_event", kind or "?", f"request {msg.request_id}: {detail}")

    # -- actions -------------------------------------------------------------------------------------
    async def _stream(self) -> None:
        stream = await self._own_stream()
        reqs = [self._generate() for _ in range(self.rng.randint(1, 3))]
        for res in await asyncio.gather(*(stream.send(q, REQUEST_TIMEOUT_S) for q in reqs)):
            self.tally.add_result("stream", res)

    async def _json_stream(self) -> None:
        stream = await self._own_stream()
        self.tally.add_result(
            "json_stream", await stream.send(self._generate(schema=True), REQUEST_TIMEOUT_S)
        )

    async def _cancel_msg(self) -> None:
        stream = await self._own_stream()
        req = self._generate(schema=self.rng.random() < 0.33, max_tokens=self.rng.randint(32, 160))
        fut = await stream.start(req)
        await asyncio.sleep(self.rng.choice([0.0, self.rng.uniform(0.0, 1.5)]))
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await stream.cancel(req.request_id)
        self.tally.add_result("cancel_msg", await stream.result(req.request_id, fut, REQUEST_TIMEOUT_S))

    async def _close(self) -> None:
        stream = Stream(self.ch)
        tasks = [
            asyncio.create_task(stream.send(self._generate(), REQUEST_TIMEOUT_S))
            for _ in range(self.rng.randint(1, 2))
        ]
        await asyncio.wait(tasks, timeout=self.rng.uniform(0.1, 2.0))
        stream.abort()
        for t in tasks:
            self.tally.add_result("close", await t)

    async def _deadline(self) -> None:
        stream = Stream(self.ch, timeout=self.rng.uniform(0.2, 1.5))
        try:
            res = await stream.send(self._generate(max_tokens=256), REQUEST_TIMEOUT_S)
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:  # the deadline hit before the write
            code = exc.code().name if isinstance(exc, grpc.RpcError) else "DEADLINE_EXCEEDED"
            self.tally.add("deadline", code, str(exc))
        else:
            self.tally.add_result("deadline", res)
        await stream.close()

    async def _json_call(self, action: str, timeout: float, cancel_after: float | None = None) -> None:
        call = self.stub.GenerateJSON(self._json_request(), timeout=timeout)
        task: asyncio.Task[pb.GenerateJSONResponse] = asyncio.ensure_future(call)
        if cancel_after is not None:
            await asyncio.wait([task], timeout=cancel_after)
            if not task.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                    await task
                self.tally.add(action, "aborted")
                return
        try:
            await task
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            if code == "DEADLINE_EXCEEDED" and timeout >= REQUEST_TIMEOUT_S:
                code = SLOW  # our hang limit, not a short deadline (a stuck sequence fails the idle check)
            self.tally.add(action, code, exc.details() or "")
        except asyncio.CancelledError:
            self.tally.add(action, "aborted")
        else:
            self.tally.add(action, "OK")

    async def _json(self) -> None:
        await self._json_call("json", REQUEST_TIMEOUT_S)

    async def _json_deadline(self) -> None:
        await self._json_call("json_deadline", self.rng.uniform(0.1, 1.0))

    async def _json_cancel(self) -> None:
        await self._json_call("json_cancel", REQUEST_TIMEOUT_S, cancel_after=self.rng.uniform(0.05, 1.0))
