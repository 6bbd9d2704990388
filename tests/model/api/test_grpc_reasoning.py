"""A reasoning model's thought kept apart on gRPC, for real: the tiny GGUFs of reasoning families that
``tests/model/http/test_reasoning_models.py`` builds (the tiny vocabulary with the family's tokens, its real chat
template, seeded random weights), served with the response cache on and called through the generated stubs. The
thought is forced to run to the budget (the end marker's logit lowered; a template that leaves the opening to the
model has ``<think>`` raised). ``GenerateJSON`` returns the document alone in ``json`` and the thought in
``reasoning``, closed at exactly the budget; a cache hit replays both; ``Generate`` with tools (forced, or ``auto``:
its lazy call grammar after the thought) and a budget returns calls that validate, read from the answer after the
thought; the CLI's ``json`` prints the thought on stderr."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from inference_client.cli import main as cli_main

from tests.model.http.test_reasoning_models import BUDGET, CASES, SCHEMA, USER_TOKENS, think_ids
from tests.support.family_models import family_server
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model
QUESTION = "Is 2 less than 3?"
ASK = [pb.ChatMessage(role="user", content=QUESTION)]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
           "additionalProperties": False}
Served = tuple[str, RunningServer, pb_grpc.InferenceServiceStub]
TOOLS = [pb.Tool(name="get_weather", description="Current weather of a city", parameters=json.dumps(WEATHER))]


@pytest.fixture(scope="module", params=sorted(CASES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """(the template's name, its server, a stub of it)."""
    name = request.param
    control, bos, eos, _vars, _opens = CASES[name]
    path = tmp_path_factory.mktemp("grpc-reasoning") / f"{name}.gguf"
    with family_server(path, name, control, bos, eos, USER_TOKENS, 11, response_cache_bytes=1 << 20) as srv, \
            grpc.insecure_channel(srv.target) as channel:
        yield name, srv, pb_grpc.InferenceServiceStub(channel)


def sampling(name: str, budget: int = BUDGET, **extra: Any) -> pb.SamplingParams:
    """Greedy, the thought run to ``budget`` (see the module doc)."""
    open_id, close_id = think_ids(name)
    bias = {close_id: -100.0, **({} if CASES[name][4] else {open_id: 100.0})}
    fields = {"max_tokens": 48, "temperature": 0.0, **extra}
    return pb.SamplingParams(logit_bias=bias, thinking_budget_tokens=budget, **fields)


def thought_tokens(name: str) -> int:
    """The thought's tokens at the budget, its markers included: the model's own <think> where it opens it."""
    return BUDGET + (1 if CASES[name][4] else 2)


def test_generate_json_returns_the_document_in_json_and_the_thought_closed_at_the_budget_in_reasoning(
        served: Served) -> None:
    name, srv, stub = served
    resp = stub.GenerateJSON(pb.GenerateJSONRequest(messages=ASK, json_schema=json.dumps(SCHEMA),
                                                         sampling=sampling(name, logprobs=True)), timeout=600)
    assert resp.finish_reason == pb.FINISH_REASON_STOP and json.loads(resp.json) == {"ok": True}
    assert resp.reasoning and "<think>" not in resp.reasoning and "</think>" not in resp.reasoning
    assert "think>" not in resp.json and not resp.json.startswith((" ", "\n"))
    assert resp.usage.reasoning_tokens == thought_tokens(name)
    tokens = [e.token for e in resp.logprobs]  # every generated token (bytes), the thought's too
    opened = 0 if CASES[name][4] else 1
    assert tokens[:opened] == [b"<think>"] * opened and tokens.index(b"</think>") == opened + BUDGET, tokens
    assert len(tokens) == resp.usage.completion_tokens
    assert_kv_clean(srv)


def test_a_generate_json_cache_hit_replays_the_same_thought_and_document_and_the_budget_is_in_the_key(
        served: Served) -> None:
    name, _srv, stub = served

    def call(budget: int) -> pb.GenerateJSONResponse:  # a bare prompt: rendered as a chat turn, so it reasons
        req = pb.GenerateJSONRequest(prompt=QUESTION, json_schema=json.dumps(SCHEMA), sampling=sampling(name, budget),
                                     pretty=True)
        return stub.GenerateJSON(req, timeout=600)

    first, again = call(BUDGET), call(BUDGET)
    assert again.cache_hit and not first.cache_hit
    assert (again.reasoning, again.json, again.usage.reasoning_tokens) == \
        (first.reasoning, first.json, first.usage.reasoning_tokens)
    assert first.reasoning and first.json == '{\n  "ok": true\n}' and first.usage.reasoning_tokens == thought_tokens(name)
    shorter = call(BUDGET - 2)
    assert not shorter.cache_hit and shorter.usage.reasoning_tokens == thought_tokens(name) - 2
    assert json.loads(shorter.json) == {"ok": True}


def generate(stub: pb_grpc.InferenceServiceStub, **fields: Any) -> list[pb.GenerateResponse]:
    return list(stub.Generate(iter([pb.GenerateRequest(request_id="r", **fields)]), timeout=600))


@pytest.mark.parametrize("choice", [pb.TOOL_CHOICE_REQUIRED, pb.TOOL_CHOICE_FUNCTION])
def test_generate_with_tools_and_a_budget_returns_valid_calls_read_after_the_thought(
        served: Served, choice: int) -> None:
    name, srv, stub = served
    named = {"tool_choice_function": "get_weather"} if choice == pb.TOOL_CHOICE_FUNCTION else {}
    events = generate(stub, messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                      sampling=sampling(name, max_tokens=200), **named)
    assert [e.WhichOneof("event") for e in events][-1] == "done" and sum(e.HasField("done") for e in events) == 1
    done = events[-1].done
    assert done.finish_reason == pb.FINISH_REASON_TOOL_CALLS and len(done.tool_calls) == 1, events[-3:]
    call = done.tool_calls[0]
    assert call.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    deltas = [e.delta for e in events if e.HasField("delta")]
    assert [c for d in deltas for c in d.tool_calls] == [call]
    thought = "".join(d.reasoning for d in deltas)
    assert thought and "</think>" not in thought and "get_weather" not in thought
    assert "get_weather" not in "".join(d.text for d in deltas)  # the call syntax is held back
    assert done.usage.reasoning_tokens == thought_tokens(name)
    assert_kv_clean(srv)


def test_generate_with_auto_tools_and_a_budget_compiles_the_lazy_call_grammar_after_the_thought(
        served: Served) -> None:
    """``auto``: free text after the thought until the family's trigger, then calls; whatever the random weights
    answer, the thought is closed at the budget and apart, and any call validates."""
    name, _srv, stub = served
    events = generate(stub, messages=ASK, tools=TOOLS, sampling=sampling(name, max_tokens=64))
    assert [e.WhichOneof("event") for e in events][-1] == "done", events[-1]
    done = events[-1].done
    assert done.usage.reasoning_tokens == thought_tokens(name)
    thought = "".join(e.delta.reasoning for e in events if e.HasField("delta"))
    assert thought and "</think>" not in thought
    for call in done.tool_calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_generate_with_tools_and_a_budget_of_zero_calls_without_a_thought(served: Served) -> None:
    name, _srv, stub = served
    events = generate(stub, messages=ASK, tools=TOOLS, tool_choice=pb.TOOL_CHOICE_REQUIRED, parallel_tool_calls=False,
                      sampling=sampling(name, 0, max_tokens=200))
    done = events[-1].done
    assert done.finish_reason == pb.FINISH_REASON_TOOL_CALLS and len(done.tool_calls) == 1, events[-3:]
    jsonschema.validate(json.loads(done.tool_calls[0].arguments), WEATHER)
    assert not any(e.delta.reasoning for e in events if e.HasField("delta")) and done.usage.reasoning_tokens == 0


@pytest.mark.parametrize("served", [next(n for n, case in CASES.items() if case[4])], indirect=True)
def test_the_cli_json_command_prints_the_document_on_stdout_and_the_thought_on_stderr(
        served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The family whose prompt opens the thought: the CLI has no logit_bias to make a model open one."""
    _name, srv, _stub = served
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    code = cli_main(["--target", srv.target, "json", "--schema", str(schema), QUESTION, "--max-tokens", "48",
                     "--temperature", "0", "--thinking-budget", str(BUDGET), "--compact"])
    out = capsys.readouterr()
    assert code == 0 and json.loads(out.out) == {"ok": True}
    assert "</think>" not in out.err and "reasoning=" in out.err
