"""A real server (default model) with its HTTP API on a free port, and OpenAI SDK clients for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from tests.support.server import RunningServer, free_port, start_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def api_server() -> Iterator[RunningServer]:
    srv = start_server(http_port=free_port())
    yield srv
    srv.close()


def base_url(srv: RunningServer) -> str:
    return f"http://127.0.0.1:{srv.server.http_port}/v1"


@pytest.fixture()
def client(api_server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url(api_server), api_key="unused", max_retries=0, timeout=600) as c:
        yield c


@pytest.fixture()
async def aclient(api_server: RunningServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=base_url(api_server), api_key="unused", max_retries=0, timeout=600) as c:
        yield c
