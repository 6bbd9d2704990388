"""The Python client sends a request that a draining replica cut before any of its tokens to another
replica (a new Generate call, placed by the channel's load balancing), and reports a request that had
already streamed tokens as UNAVAILABLE with the reason "draining". Two real servers, sync and asyncio."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from inference_client import AsyncInferenceClient, Delta, Done, ErrorEvent, InferenceClient, RequestSpec

from tests.support.server import RunningServer, assert_kv_clean, start_server

pytestmark = pytest.mark.model
QUEUED_TOKENS = 8


def specs() -> list[RequestSpec]:
    """One long request that runs (max_running 1), and one that waits behind it."""
    return [
        RequestSpec(prompt="Tell me a long story.", max_tokens=3000, ignore_eos=True, temperature=0, request_id="running"),
        RequestSpec(prompt="Hello", max_tokens=QUEUED_TOKENS, ignore_eos=True, temperature=0, request_id="queued"),
    ]


@pytest.fixture()
def replicas() -> Iterator[tuple[RunningServer, RunningServer]]:
    a = start_server(max_running=1)
    b = start_server(max_running=1)
    yield a, b
    a.close()
    b.close()


def drain_the_one_running(servers: tuple[RunningServer, RunningServer]) -> tuple[RunningServer, RunningServer]:
    """Drain (grace 0.5 s, as on SIGTERM) the replica that runs the stream; return (drained, other)."""
    def waiting_on(srv: RunningServer) -> bool:
        return any(s.request_id == "queued" for s in srv.engine.scheduler.waiting)

    end = time.monotonic() + 60
    while not any(waiting_on(srv) for srv in servers):
        assert time.monotonic() < end, "the second request never queued"
        time.sleep(0.01)
    first, other = servers if waiting_on(servers[0]) else servers[::-1]
    assert [s.request_id for s in first.engine.scheduler.running] == ["running"]
    first.call(first.server.drain(0.5))
    return first, other


def check(finals: dict[str, Any], other: RunningServer) -> None:
    running, queued = finals["running"], finals["queued"]
    assert isinstance(queued, Done), queued  # it had no token: served by the other replica
    assert queued.usage.completion_tokens == QUEUED_TOKENS
    assert isinstance(running, ErrorEvent), running  # it had tokens: not retried
    assert running.error.code == grpc.StatusCode.UNAVAILABLE and running.error.reason == "draining"
    tiers = other.engine.metrics.snapshot()["tiers"].values()
    assert sum(t["requests"] for t in tiers) == sum(t["completed"] for t in tiers) == 1
    assert_kv_clean(other)


def test_sync_client_moves_an_unstarted_request_off_a_draining_replica(
    replicas: tuple[RunningServer, RunningServer],
) -> None:
    a, b = replicas
    finals: dict[str, Any] = {}
    with InferenceClient(f"ipv4:{a.target},{b.target}", timeout=300) as client:
        stream = client.generate_many(specs())
        events = iter(stream)
        rid, event = next(events)
        assert rid == "running" and isinstance(event, Delta)
        _, other = drain_the_one_running(replicas)
        for rid, event in events:
            if not isinstance(event, Delta):
                finals[rid] = event
    check(finals, other)


def test_async_client_moves_an_unstarted_request_off_a_draining_replica(
    replicas: tuple[RunningServer, RunningServer],
) -> None:
    a, b = replicas

    async def run() -> tuple[dict[str, Any], RunningServer]:
        finals: dict[str, Any] = {}
        async with AsyncInferenceClient(f"ipv4:{a.target},{b.target}", timeout=300) as client:
            events = client.generate_many(specs()).__aiter__()
            rid, event = await anext(events)
            assert rid == "running" and isinstance(event, Delta)
            _, other = await asyncio.to_thread(drain_the_one_running, replicas)
            async for rid, event in events:
                if not isinstance(event, Delta):
                    finals[rid] = event
        return finals, other

    finals, other = asyncio.run(run())
    check(finals, other)
