"""The OpenAI Agents SDK runs an agent with two function tools to completion against a real server, through its
default model (the Responses API, stateless: no ``store``, no ``previous_response_id``), streamed and not.

The run finishes by construction, whatever the 135M model picks: the first turn must call a tool
(``tool_choice="required"``; every call is generated under the tools' schemas, so it is valid), the SDK then
resets the choice to ``auto`` and sends the call and its output back; the second turn answers text, or calls a
tool again, whose output then ends the run (``tool_use_behavior``). So exactly two model turns."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    FunctionToolResult,
    ModelSettings,
    RunConfig,
    RunContextWrapper,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    ToolsToFinalOutputResult,
    function_tool,
)
from agents.models.openai_provider import OpenAIProvider

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


REAL = {"add": lambda a, b: a + b, "multiply": lambda a, b: a * b}


def second_tool_use_ends_the_run(_ctx: RunContextWrapper[Any], results: list[FunctionToolResult]) -> \
        ToolsToFinalOutputResult:
    second = _ctx.context["tool_uses"] = _ctx.context.get("tool_uses", 0) + 1
    if second >= 2:
        return ToolsToFinalOutputResult(is_final_output=True, final_output=str(results[-1].output))
    return ToolsToFinalOutputResult(is_final_output=False)


class Recorded:
    """The SDK's requests as the server received them (path and JSON body)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def hook(self, request: Any) -> None:
        self.requests.append((request.url.path, json.loads(request.content)))


@pytest.fixture()
async def recorded(api_server: RunningServer) -> AsyncIterator[tuple[RunConfig, Recorded]]:
    rec = Recorded()
    http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [rec.hook]})
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{api_server.server.http_port}/v1", api_key="unused",
                                  max_retries=0, timeout=120, http_client=http) as client:
        yield RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True), rec


def agent() -> Agent[Any]:
    return Agent(name="calculator", model=MODEL, tools=[add, multiply],
                 instructions="You are a calculator. Use a tool, then answer with the number.",
                 model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64,
                                              parallel_tool_calls=False),
                 tool_use_behavior=second_tool_use_ends_the_run)


def check_run(result: Any, rec: Recorded) -> None:
    assert isinstance(result.final_output, str) and result.final_output
    assert len(result.raw_responses) == 2 and [p for p, _ in rec.requests] == ["/v1/responses"] * 2
    calls = [i.raw_item for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert 1 <= len(calls) == len(outputs) <= 2
    for call, output in zip(calls, outputs, strict=True):
        args = json.loads(call.arguments)
        assert call.name in REAL and set(args) == {"a", "b"}
        assert output == REAL[call.name](args["a"], args["b"])  # the tool ran on the generated arguments
    first, second = (body for _, body in rec.requests)
    assert first["tool_choice"] == "required" and "store" not in first and "previous_response_id" not in second
    sent = [item for item in second["input"] if item.get("type") == "function_call_output"]
    assert [item["call_id"] for item in sent] == [calls[0].call_id]


async def test_agent_with_two_tools_runs_to_completion(recorded: tuple[RunConfig, Recorded],
                                                       api_server: RunningServer) -> None:
    config, rec = recorded
    result = await Runner.run(agent(), "What is 3 plus 4?", context={}, max_turns=2, run_config=config)
    check_run(result, rec)
    assert_kv_clean(api_server)


async def test_streamed_agent_run_reaches_the_same_end(recorded: tuple[RunConfig, Recorded],
                                                       api_server: RunningServer) -> None:
    config, rec = recorded
    result = Runner.run_streamed(agent(), "What is 6 times 7?", context={}, max_turns=2, run_config=config)
    kinds = {event.type async for event in result.stream_events()}
    assert "raw_response_event" in kinds and result.is_complete
    check_run(result, rec)
    assert all(body.get("stream") is True for _, body in rec.requests)
    assert_kv_clean(api_server)
