"""Async (grpc.aio) load generation against our server.

``Stream`` is one bidirectional Generate stream that multiplexes requests: a
closed-loop client sends its next request when the previous one is done, an
open-loop source sends requests on a timer without waiting. Every request's
time to first token is measured on the client, from ``write`` to the first
delta carrying tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from bench.harness.stats import latency_summary

INTERACTIVE = pb.PRIORITY_INTERACTIVE
BATCH = pb.PRIORITY_BATCH
_ids = itertools.count()
TokenSink = Callable[[int, float], None]
FirstTokenSink = Callable[[float, float], None]
REQUEST_TIMEOUT_S = 600.0  # a stalled server fails the request instead of hanging the suite
ABORTED = "aborted by the client"  # the error of requests in flight on a stream the client cancelled


def next_id() -> str:
    """A request id unique in this process."""
    return f"r{next(_ids)}"


@dataclass
class ReqResult:
    """The outcome of one request as the client saw it."""

    ok: bool
    start: float
    end: float
    ttft_ms: float | None
    tokens: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    server_ttft_ms: float = 0.0
    finish: str = ""
    error: str = ""

    @property
    def e2e_ms(self) -> float:
        return (self.end - self.start) * 1000.0


def gen_request(
    rid: str, prompt: str, max_tokens: int, priority: int = INTERACTIVE, ignore_eos: bool = True
) -> pb.GenerateRequest:
    """A greedy request that (with ignore_eos) produces exactly ``max_tokens`` tokens."""
    sampling = pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
    return pb.GenerateRequest(
        request_id=rid, prompt=prompt, sampling=sampling, priority=pb.Priority.Name(priority)
    )


class Stream:
    """One Generate stream; ``request`` may be awaited concurrently from many tasks."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        on_tokens: TokenSink | None = None,
        on_first: FirstTokenSink | None = None,
        timeout: float | None = None,
    ) -> None:
        self._call = pb_grpc.InferenceServiceStub(channel).Generate(timeout=timeout)
        self._on_tokens = on_tokens  # (tokens, perf_counter time) of every delta
        self._on_first = on_first  # (request start, first token time) of every request, as it happens
        self._pending: dict[str, tuple[asyncio.Future[ReqResult], list[Any]]] = {}
        self._write_lock = asyncio.Lock()  # one write at a time on the call
        self.stray: list[pb.GenerateResponse] = []  # events for ids not in flight (a second terminal event)
        self.late: dict[str, float] = {}  # ids given up on by ``result`` -> their start (perf_counter)
        self.late_answers: list[tuple[str, float, pb.GenerateResponse]] = []  # (id, seconds, terminal event)
        self._reader = asyncio.create_task(self._read())

    @property
    def alive(self) -> bool:
        """False once the RPC has ended (its reader stopped)."""
        return not self._reader.done()

    async def _read(self) -> None:
        try:
            while True:
                msg = await self._call.read()
                if msg is grpc.aio.EOF:
                    break
                self._on_message(msg)
        except grpc.RpcError as exc:
            self._fail_all(f"stream ended: {exc.code().name}")
        self._fail_all("stream closed")

    def _on_message(self, msg: pb.GenerateResponse) -> None:
        entry = self._pending.get(msg.request_id)
        if entry is None and msg.request_id in self.late:  # answered after ``result`` gave up on it
            if msg.WhichOneof("event") != "delta":
                start = self.late.pop(msg.request_id)
                self.late_answers.append((msg.request_id, time.perf_counter() - start, msg))
            return
        if entry is None:
            if len(self.stray) < 100:
                self.stray.append(msg)
            return
        fut, st = entry  # st = [start, first_token_time, tokens]
        kind = msg.WhichOneof("event")
        if kind == "delta":
            n, now = len(msg.delta.token_ids), time.perf_counter()
            if n and st[1] is None:
                st[1] = now
                if self._on_first is not None:
                    self._on_first(st[0], now)
            st[2] += n
            if self._on_tokens is not None:
                self._on_tokens(n, now)
            return
        del self._pending[msg.request_id]
        now = time.perf_counter()
        ttft = (st[1] - st[0]) * 1000.0 if st[1] is not None else None
        if kind == "done":
            d = msg.done
            res = ReqResult(
                True,
                st[0],
                now,
                ttft,
                st[2],
                d.usage.prompt_tokens,
                d.usage.cached_tokens,
                d.preemptions,
                d.timing.ttft_ms,
                pb.FinishReason.Name(d.finish_reason),
            )
        else:
            res = ReqResult(False, st[0], now, ttft, st[2], error=f"{msg.error.status}: {msg.error.message}")
        if not fut.done():
            fut.set_result(res)

    def _fail_all(self, why: str) -> None:
        now = time.perf_counter()
        for fut, st in self._pending.values():
            if not fut.done():
                fut.set_result(ReqResult(False, st[0], now, None, st[2], error=why))
        self._pending.clear()

    async def request(self, prompt: str, max_tokens: int, priority: int = INTERACTIVE) -> ReqResult:
        return await self.send(gen_request(next_id(), prompt, max_tokens, priority))

    async def send(self, req: pb.GenerateRequest, timeout_s: float = REQUEST_TIMEOUT_S) -> ReqResult:
        """Send ``req`` (its ``request_id`` unique on this stream) and wait for its terminal event."""
        return await self.result(req.request_id, await self.start(req), timeout_s)

    async def start(self, req: pb.GenerateRequest) -> asyncio.Future[ReqResult]:
        """Write ``req``; the future completes with its result (see ``result``)."""
        fut: asyncio.Future[ReqResult] = asyncio.get_running_loop().create_future()
        self._pending[req.request_id] = (fut, [time.perf_counter(), None, 0])
        async with self._write_lock:
            await self._call.write(req)
        return fut

    async def result(self, rid: str, fut: asyncio.Future[ReqResult], timeout_s: float) -> ReqResult:
        """The result of a ``start``-ed request; a failed one after ``timeout_s`` without an answer."""
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            start = self._pending.pop(rid, (fut, [time.perf_counter(), None, 0]))[1]
            self.late[rid] = start[0]
            now = time.perf_counter()
            return ReqResult(False, start[0], now, None, start[2], error=f"no answer in {timeout_s:.0f} s")

    async def cancel(self, rid: str) -> None:
        """Send a cancel message for ``rid`` (its terminal event still arrives through ``send``)."""
        async with self._write_lock:
            await self._call.write(pb.GenerateRequest(request_id=rid, cancel=True))

    def abort(self) -> None:
        """Cancel the stream: the server aborts its in-flight requests, which end as failed here."""
        self._call.cancel()
        self._fail_all(ABORTED)

    async def close(self, timeout_s: float = 30.0) -> None:
        """Half-close and wait up to ``timeout_s`` for the server to end the stream; then cancel it."""
        try:
            await self._call.done_writing()
            await asyncio.wait_for(self._reader, timeout=timeout_s)
        except (grpc.RpcError, TimeoutError, asyncio.CancelledError):
            self._call.cancel()


async def get_metrics(channel: grpc.aio.Channel) -> pb.GetMetricsResponse:
    return await pb_grpc.InferenceServiceStub(channel).GetMetrics(pb.GetMetricsRequest(), timeout=10)


async def closed_loop(
    channel: grpc.aio.Channel,
    prompts: Sequence[Sequence[str]],
    max_tokens: int,
    priority: int = INTERACTIVE,
    until: float | None = None,
) -> list[ReqResult]:
    """One client per entry of ``prompts``; each sends its prompts one after another.

    With ``until`` (a ``time.perf_counter`` value) a client stops starting new
    requests at that time, cycling through its prompts until then.
    """

    async def client(mine: Sequence[str]) -> list[ReqResult]:
        stream = Stream(channel)
        out: list[ReqResult] = []
        try:
            for i in itertools.count():
                if until is None and i >= len(mine):
                    break
                if until is not None and time.perf_counter() >= until:
                    break
                out.append(await stream.request(mine[i % len(mine)], max_tokens, priority))
        finally:
            await stream.close()
        return out

    groups = await asyncio.gather(*(client(p) for p in prompts))
    return [r for g in groups for r in g]


@dataclass(frozen=True)
class Metered:
    """A closed-loop run between two GetMetrics snapshots."""

    results: list[ReqResult]
    wall_s: float
    before: pb.GetMetricsResponse
    after: pb.GetMetricsResponse


async def metered_closed_loop(target: str, prompts: Sequence[Sequence[str]], max_tokens: int) -> Metered:
    """``closed_loop`` on a fresh channel to ``target``, with GetMetrics taken just before and after."""
    async with channel(target) as ch:
        before = await get_metrics(ch)
        t0 = time.perf_counter()
        results = await closed_loop(ch, prompts, max_tokens)
        wall = time.perf_counter() - t0
        return Metered(results, wall, before, await get_metrics(ch))


def summarize(results: list[ReqResult], wall_s: float) -> dict[str, Any]:
    """Aggregate throughput and client-side latency of a set of requests."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "tokens": tokens,
        "wall_s": round(wall_s, 3),
        "tok_s": tokens / wall_s if wall_s > 0 else None,
        "req_s": len(ok) / wall_s if wall_s > 0 else None,
        "ttft": latency_summary([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "e2e": latency_summary([r.e2e_ms for r in ok]),
        "preemptions": sum(r.preemptions for r in ok),
    }


def channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
