"""Closed-loop streaming load against an OpenAI-compatible ``/v1/completions`` (llama_cpp.server).

llama-cpp-python's server has no ``ignore_eos``; ``min_tokens`` equal to
``max_tokens`` suppresses the EOS token until the length is reached, which is
the closest equivalent. Tokens are counted honestly as the streamed chunks
that carried text (llama-cpp-python streams one chunk per token, holding back
only incomplete UTF-8 bytes), so a request that stops early counts short.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence

import httpx

from bench.harness.grpc_load import ReqResult


async def _one(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> ReqResult:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
    }
    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    finish = ""
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:200]
                why = f"HTTP {resp.status_code}: {text}"
                return ReqResult(False, start, time.perf_counter(), None, 0, error=why)
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                if choice.get("text"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
                finish = choice.get("finish_reason") or finish
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}: {exc}"
        return ReqResult(False, start, time.perf_counter(), None, chunks, error=why)
    end = time.perf_counter()
    ttft = (first - start) * 1000.0 if first is not None else None
    return ReqResult(True, start, end, ttft, chunks, finish=finish)


async def closed_loop(base_url: str, prompts: Sequence[Sequence[str]], max_tokens: int) -> list[ReqResult]:
    """One client per entry of ``prompts``; each sends its prompts one after another."""
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=len(prompts) + 4)
    timeout = httpx.Timeout(connect=30.0, read=600.0, write=30.0, pool=1800.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:

        async def one_client(mine: Sequence[str]) -> list[ReqResult]:
            return [await _one(client, p, max_tokens) for p in mine]

        groups = await asyncio.gather(*(one_client(p) for p in prompts))
    return [r for g in groups for r in g]
