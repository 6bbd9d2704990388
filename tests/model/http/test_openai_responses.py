"""The official OpenAI SDK's Responses API against a real server (stateless): ``responses.create`` and
``responses.stream`` for text, a function-call round trip through ``function_call_output``, ``text.format``
json_schema through the SDK's parse helper, the stateless refusals; raw HTTP: the event framing and order
(sequence numbers, exactly one terminal event, also on failure), malformed bodies, a client that leaves."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from pydantic import BaseModel, Field

from tests.model.http.conftest import MODEL
from tests.support.http_streams import leave_mid_stream_and_see_it_cancelled, tenants_json
from tests.support.server import RunningServer, assert_kv_clean, free_port, start_server

pytestmark = pytest.mark.model
ADD = {"type": "function", "name": "add", "description": "Add two integers.", "strict": True,
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"], "additionalProperties": False}}
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
TOKEN = "tok-responses-http"


class City(BaseModel):
    name: str = Field(max_length=24)
    population: int = Field(ge=0, le=10**9)


@pytest.fixture()
def http(api_server: RunningServer) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=f"http://127.0.0.1:{api_server.server.http_port}", timeout=120) as c:
        yield c


def events_of(lines: Iterator[str]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a Responses stream read line by line; every event names its data's type."""
    out, name = [], ""
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
            assert data["type"] == name
            out.append((name, data))
    return out


def test_create_answers_a_response_object(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.", temperature=0,
                                max_output_tokens=12, metadata={"run": "1"})
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL and r.store is False
    assert r.status in ("completed", "incomplete") and r.output_text and r.error is None
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.instructions == "Be brief." and r.metadata == {"run": "1"}
    assert r.usage is not None and 1 <= r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"


def test_stream_helper_spells_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Say hello.", temperature=0, max_output_tokens=200) as s:
        deltas = [ev.delta for ev in s if ev.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas) and deltas


def test_function_call_round_trip_through_function_call_output(client: openai.OpenAI) -> None:
    ask: list[Any] = [{"role": "user", "content": "What is 3 plus 4?"}]
    first = client.responses.create(model=MODEL, input=ask, tools=[ADD], tool_choice="required", temperature=0,
                                    parallel_tool_calls=False)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1 and calls[0].name == "add"
    args = json.loads(calls[0].arguments)
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    history = [*ask, *first.output, {"type": "function_call_output", "call_id": calls[0].call_id,
                                     "output": str(args["a"] + args["b"])}]
    # NOTE: the answer's length depends on the machine's arithmetic (another CPU may run past 200
    # tokens), so the stream may end `incomplete` (max_output_tokens); either way it ends once.
    with client.responses.stream(model=MODEL, input=history, tools=[ADD], tool_choice="none", temperature=0,
                                 max_output_tokens=200) as s:
        terminal = [event for event in s if event.type in TERMINAL]
    assert [e.type for e in terminal] in (["response.completed"], ["response.incomplete"]), terminal
    final = terminal[0].response
    assert final.output_text and [item.type for item in final.output] == ["message"]


def test_text_format_json_schema_through_the_sdks_parse_helper(client: openai.OpenAI) -> None:
    r = client.responses.parse(model=MODEL, input="Describe Paris as JSON.", text_format=City, temperature=0,
                               max_output_tokens=128)
    assert r.status == "completed" and isinstance(r.output_parsed, City)


@pytest.mark.parametrize(("kw", "param"), [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0]"),
])
def test_stateful_and_unsupported_requests_are_bad_requests(client: openai.OpenAI, kw: dict[str, Any],
                                                            param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**{"model": MODEL, "input": "Hi", **kw})
    assert info.value.status_code == 400 and info.value.body["param"] == param


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="gpt-9", input="Hi")
    assert info.value.body["code"] == "model_not_found"


def test_stream_framing_numbers_every_event_and_ends_once(http: httpx2.Client) -> None:
    body = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 6, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert "[DONE]" not in raw and all(b.count("\n") == 1 for b in raw.removesuffix("\n\n").split("\n\n"))
    events = events_of(iter(raw.splitlines()))
    names = [n for n, _ in events]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    n = names.count("response.output_text.delta")
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * n, "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.incomplete"]
    final = events[-1][1]["response"]
    text = "".join(d["delta"] for name, d in events if name == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == text and final["usage"]["output_tokens"] == 6
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_stream_framing_of_a_function_call(http: httpx2.Client) -> None:
    body = {"model": MODEL, "input": "What is 3 plus 4?", "tools": [ADD], "tool_choice": "required",
            "parallel_tool_calls": False, "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/responses", json=body) as r:
        events = events_of(r.iter_lines())
    assert [n for n, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    done = events[-2][1]["item"]
    assert done["type"] == "function_call" and done["status"] == "completed" and done["name"] == "add"
    assert json.loads(done["arguments"]) == json.loads(events[4][1]["arguments"])


@pytest.mark.parametrize(("content", "param"), [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b"\xff\xfe\x00", None),
    (b"[" * 100000 + b"]" * 100000, None),
    (b'{"model": "%s"}' % MODEL.encode(), "input"),
    (b'{"model": "%s", "input": 5}' % MODEL.encode(), "input"),
    (b'{"model": "%s", "input": [{"type": "message", "role": "user", "content": 5}]}' % MODEL.encode(),
     "input[0].content"),
    (b'{"model": "%s", "input": "x", "tools": [{"type": "function"}]}' % MODEL.encode(), "tools[0].name"),
    (b'{"model": "%s", "input": "x", "max_output_tokens": "9"}' % MODEL.encode(), "max_output_tokens"),
    (b'{"model": "%s", "input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": 3}}}'
     % MODEL.encode(), "text.format.schema"),
    (b'{"model": "%s", "input": "x", "conversation": "conv_1"}' % MODEL.encode(), "conversation"),
])
def test_malformed_bodies_are_4xx_openai_errors(http: httpx2.Client, content: bytes, param: str | None) -> None:
    r = http.post("/v1/responses", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_client_leaving_mid_stream_cancels_its_request(api_server: RunningServer) -> None:
    body = {"model": MODEL, "input": "Tell a long story.", "max_output_tokens": 2000, "ignore_eos": True,
         "stream": True}
    leave_mid_stream_and_see_it_cancelled(api_server, "/v1/responses", body, b"response.output_text.delta")


# -- a server with tenants: a failure after the status line is response.failed ---------------------------------
@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    path = tmp_path_factory.mktemp("responses-auth") / "tenants.json"
    path.write_text(tenants_json(TOKEN))
    srv = start_server(http_port=free_port(), auth_tokens=str(path))
    yield srv, path
    srv.close()


def test_revoked_token_ends_a_running_stream_with_response_failed(secured: tuple[RunningServer, Path]) -> None:
    srv, path = secured
    url = f"http://127.0.0.1:{srv.server.http_port}/v1/responses"
    body = {"model": MODEL, "input": "Tell a long story.", "max_output_tokens": 3000, "ignore_eos": True,
            "stream": True}
    try:
        with httpx2.stream("POST", url, json=body, headers={"authorization": f"Bearer {TOKEN}"}, timeout=120) as r:
            lines = r.iter_lines()
            assert r.status_code == 200 and next(lines) == "event: response.created"
            path.write_text(tenants_json())  # the token is revoked while its request runs
            srv.server.tenancy.reload()
            events = events_of(itertools.chain(["event: response.created"], lines))
    finally:
        path.write_text(tenants_json(TOKEN))
        srv.server.tenancy.reload()
    names = [n for n, _ in events]
    assert [n for n in names if n in TERMINAL] == ["response.failed"] and names[-1] == "response.failed"
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "authentication_error"
    assert_kv_clean(srv)
