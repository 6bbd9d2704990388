"""Closed-loop streaming load on any OpenAI-compatible ``/v1/completions`` that takes ``ignore_eos``.

Used for this server's HTTP API and for llama.cpp's ``llama-server`` alike, with
the same body: greedy, ``max_tokens`` fixed by ``ignore_eos``, streamed, usage
in the last chunk (``stream_options.include_usage``). Tokens are the server's
``usage.completion_tokens`` (chunks may carry several tokens: this server's
speculative steps do), else the chunks that carried text; TTFT is the first
chunk with text. Prompt tokens and those served from a cache are recorded where
the server reports them (``usage``, or llama-server's ``timings``).

A keep-alive connection the server closed between two requests (llama-server
closes them after a few requests) fails the next request before any response:
that request is sent once more on a fresh connection, its time counted from
the first attempt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from bench.harness.grpc_load import ReqResult

ChunkSink = Callable[[int, float], None]  # (tokens, perf_counter time) of a streamed chunk


def _body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


async def _attempt(client: httpx.AsyncClient, body: dict[str, Any], start: float,
                   on_chunk: ChunkSink | None = None) -> ReqResult:
    first: float | None = None
    chunks, usage, timings, finish = 0, None, None, ""
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            why = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
            return ReqResult(False, start, time.perf_counter(), None, 0, error=why)
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
            for choice in event.get("choices") or ():
                if choice.get("text"):
                    chunks += 1
                    first = first if first is not None else time.perf_counter()
                    if on_chunk is not None:
                        on_chunk(1, time.perf_counter())
                finish = choice.get("finish_reason") or finish
    tokens = int(usage["completion_tokens"]) if usage else chunks
    if on_chunk is not None and tokens > chunks:  # NOTE: chunks of several tokens: the rest counted at the end
        on_chunk(tokens - chunks, time.perf_counter())
    ttft = (first - start) * 1000.0 if first is not None else None
    prompt, cached = _prompt_tokens(usage, timings)
    return ReqResult(True, start, time.perf_counter(), ttft, tokens, prompt, cached, finish=finish)


def _prompt_tokens(usage: dict[str, Any] | None, timings: dict[str, Any] | None) -> tuple[int, int]:
    """Prompt tokens and the part served from a cache: ``usage.prompt_tokens_details.cached_tokens``, else
    llama-server's ``timings.cache_n`` (0 when the server reports neither)."""
    prompt = int((usage or {}).get("prompt_tokens") or 0)
    details = (usage or {}).get("prompt_tokens_details") or {}
    if "cached_tokens" in details:
        return prompt, int(details["cached_tokens"] or 0)
    return prompt, int((timings or {}).get("cache_n") or 0)


async def one(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int,
              on_chunk: ChunkSink | None = None) -> ReqResult:
    """One streamed completion on ``client``; ``on_chunk`` sees every chunk's tokens as they arrive."""
    start = time.perf_counter()
    body = _body(model, prompt, max_tokens)
    for attempt in (1, 2):
        try:
            return await _attempt(client, body, start, on_chunk)
        except httpx.RemoteProtocolError as exc:  # a closed keep-alive connection (see the module docstring)
            if attempt == 2 or "without sending a response" not in str(exc):
                return ReqResult(False, start, time.perf_counter(), None, 0, error=f"{type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            return ReqResult(False, start, time.perf_counter(), None, 0, error=f"{type(exc).__name__}: {exc}")
    raise AssertionError("unreachable")


def client_for(base_url: str, connections: int, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    """An async client for ``connections`` concurrent streams (``headers`` on every request)."""
    n = connections + 4
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    timeout = httpx.Timeout(connect=30.0, read=600.0, write=30.0, pool=1800.0)
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout, headers=headers)


async def closed_loop(base_url: str, model: str, prompts: Sequence[Sequence[str]], max_tokens: int,
                      headers: dict[str, str] | None = None) -> list[ReqResult]:
    """One client (one keep-alive connection) per entry of ``prompts``; each sends its prompts in turn."""
    async with client_for(base_url, len(prompts), headers) as client:

        async def one_client(mine: Sequence[str]) -> list[ReqResult]:
            return [await one(client, model, p, max_tokens) for p in mine]

        groups = await asyncio.gather(*(one_client(p) for p in prompts))
    return [r for g in groups for r in g]
