"""Mixed load over HTTP (any OpenAI ``/v1/completions`` with ``ignore_eos``): batch streams and interactive requests.

Used by scenario T (this server vs llama.cpp's ``llama-server``). Tokens of the
batch streams are counted as their chunks arrive inside a ``WindowMeter``
window; interactive requests go out on a timer (open loop) or one after another
(alone). The tier rides on the ``x-priority`` header of each client; a server
without tiers ignores it. Idle waits poll our GetMetrics, or llama-server's
``/slots``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import httpx

from bench.harness import sse_load
from bench.harness.grpc_load import ReqResult, channel, get_metrics
from bench.harness.mixed_load import WindowMeter

BATCH_HEADERS = {"x-priority": "batch"}
INTERACTIVE_HEADERS = {"x-priority": "interactive"}


async def batch_streams(base_url: str, model: str, prompts: Sequence[Sequence[str]], max_tokens: int,
                        meter: WindowMeter, hold: asyncio.Event | None = None) -> int:
    """One closed-loop stream per entry of ``prompts`` until the meter's end and ``hold`` is set, then
    cancelled; returns the requests completed. Tokens arriving inside the window go to ``meter``.

    NOTE: ``hold`` keeps the batch load on until the last interactive answer of the window is in,
    so no interactive request finishes on a server the batch work has left.
    """
    done = 0
    async with sse_load.client_for(base_url, len(prompts), BATCH_HEADERS) as client:

        async def loop(mine: Sequence[str]) -> None:
            nonlocal done
            i = 0
            while True:
                res = await sse_load.one(client, model, mine[i % len(mine)], max_tokens, meter.add)
                done += res.ok
                i += 1

        tasks = [asyncio.create_task(loop(p)) for p in prompts]
        await asyncio.sleep(max(0.0, meter.end - time.perf_counter()))
        if hold is not None:
            await hold.wait()
        for t in tasks:
            t.cancel()  # NOTE: closing the connection mid-stream cancels the request on both servers
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
    return done


async def interactive_timer(base_url: str, model: str, prompts: Sequence[str], max_tokens: int,
                            interval_s: float, start: float, end: float) -> list[ReqResult]:
    """Open loop: a request every ``interval_s`` from ``start`` until ``end`` (prompts in turn); all awaited."""
    async with sse_load.client_for(base_url, 8, INTERACTIVE_HEADERS) as client:
        tasks = []
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        i = 0
        while time.perf_counter() < end:
            tasks.append(asyncio.create_task(sse_load.one(client, model, prompts[i % len(prompts)], max_tokens)))
            i += 1
            await asyncio.sleep(max(0.0, start + i * interval_s - time.perf_counter()))
        return list(await asyncio.gather(*tasks))


async def interactive_alone(base_url: str, model: str, prompts: Sequence[str], max_tokens: int) -> list[ReqResult]:
    """The same interactive requests one after another on an otherwise idle server."""
    async with sse_load.client_for(base_url, 1, INTERACTIVE_HEADERS) as client:
        return [await sse_load.one(client, model, p, max_tokens) for p in prompts]


async def wait_idle_ours(grpc_target: str, timeout_s: float = 60.0) -> None:
    """Until our server has nothing running or waiting (cancelled streams leave at the next step)."""
    end = time.monotonic() + timeout_s
    async with channel(grpc_target) as ch:
        while time.monotonic() < end:
            m = await get_metrics(ch)
            if m.running == 0 and m.waiting == 0:
                return
            await asyncio.sleep(0.1)


async def wait_idle_peer(base_url: str, timeout_s: float = 60.0) -> None:
    """Until no llama-server slot is processing (``/slots``; a short pause when that endpoint is off)."""
    end = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base_url, timeout=5.0) as client:
        while time.monotonic() < end:
            resp = await client.get("/slots")
            if resp.status_code != 200:
                await asyncio.sleep(2.0)
                return
            if not any(s.get("is_processing") for s in resp.json()):
                return
            await asyncio.sleep(0.1)
