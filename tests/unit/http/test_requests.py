"""Chat and completion bodies -> GenerateRequest protos: every bad or unsupported argument is a 400 naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from inference.v1 import inference_pb2 as pb

from service.api.input_limits import InputLimits
from service.http.errors import ApiError, from_status
from service.http.prompts import MAX_CHOICES, MAX_PROMPT_IDS
from service.http.requests import parse_chat, parse_completion, with_vocab

MODEL = "m"


def chat(**kw: Any) -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kw}
    return parse_chat(body, MODEL, kw.pop("_header", None))


def refused(call: Any, *args: Any, **kw: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args, **kw)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value


def test_chat_body_maps_sampling_fields_onto_the_proto() -> None:
    p = chat(temperature=0.5, top_p=0.9, seed=7, stop="END", n=2, max_completion_tokens=12, top_k=5, min_p=0.1)
    sp = p.request.sampling
    assert (round(sp.temperature, 3), round(sp.top_p, 3), sp.seed, list(sp.stop), sp.n, sp.max_tokens) == (
        0.5, 0.9, 7, ["END"], 2, 12)
    assert (sp.top_k, round(sp.min_p, 3)) == (5, 0.1)
    assert [(m.role, m.content) for m in p.request.messages] == [("user", "hi")]
    assert not p.output.stream and p.output.logprobs is None


@pytest.mark.parametrize("name", ["foo", "logprobz"])
def test_unknown_argument_is_refused_naming_it(name: str) -> None:
    assert refused(chat, **{name: 1}).param == name


def test_penalties_and_logit_bias_map_onto_the_proto() -> None:
    sp = chat(frequency_penalty=0.5, presence_penalty=-1.0, repetition_penalty=1.2,
              logit_bias={"50": 5, "7": -100, "0": 100.0}).request.sampling
    assert (sp.frequency_penalty, sp.presence_penalty, round(sp.repetition_penalty, 3)) == (0.5, -1.0, 1.2)
    assert dict(sp.logit_bias) == {50: 5.0, 7: -100.0, 0: 100.0}


def test_unset_and_neutral_penalties_leave_the_sampler_as_it_was() -> None:
    unset = chat().request.sampling
    assert not unset.HasField("frequency_penalty") and not unset.HasField("repetition_penalty")
    assert not unset.logit_bias
    neutral = chat(frequency_penalty=0, presence_penalty=0.0, repetition_penalty=1, logit_bias={}).request.sampling
    assert (neutral.frequency_penalty, neutral.presence_penalty, neutral.repetition_penalty) == (0, 0, 1)
    assert not neutral.logit_bias


@pytest.mark.parametrize(("name", "value"), [
    ("frequency_penalty", 2.5), ("frequency_penalty", -2.01), ("presence_penalty", -3), ("presence_penalty", "high"),
    ("repetition_penalty", 0), ("repetition_penalty", 10.5), ("repetition_penalty", -1),
    ("logit_bias", {"50": 101}), ("logit_bias", {"50": -100.5}), ("logit_bias", {"50": "up"}),
    ("logit_bias", {"50": True}), ("logit_bias", {"-1": 5}), ("logit_bias", {"hello": 5}),
    ("logit_bias", {"2147483648": 5}), ("logit_bias", [50, 5]), ("logit_bias", {str(i): 1 for i in range(1025)}),
])
def test_out_of_range_penalties_and_logit_bias_are_400_naming_them(name: str, value: Any) -> None:
    for parse in (chat, lambda **kw: parse_completion({"model": MODEL, "prompt": "hi", **kw}, MODEL, None)):
        assert refused(parse, **{name: value}).param == name


def test_a_logit_bias_token_outside_the_vocabulary_names_logit_bias() -> None:
    """The intake decides the vocabulary; its message names the field, and so does the HTTP error."""
    err = from_status("INVALID_ARGUMENT", "logit_bias token id 99999 is outside the vocabulary (0..49151)")
    assert (err.status, err.param) == (400, "logit_bias")
    assert from_status("INVALID_ARGUMENT", "prompt is empty").param is None
    assert from_status("UNAVAILABLE", "n is not a parameter here").param is None


@pytest.mark.parametrize(("kw", "param"), [
    ({"temperature": "hot"}, "temperature"), ({"temperature": 2.5}, "temperature"), ({"n": True}, "n"),
    ({"stop": 5}, "stop"), ({"stream": "yes"}, "stream"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
    ({"top_logprobs": 3}, "top_logprobs"), ({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
    ({"functions": [{}]}, "functions"), ({"audio": {}}, "audio"), ({"store": True}, "store"),
    ({"service_tier": "gold"}, "service_tier"), ({"priority": "urgent"}, "priority"), ({"model": 3}, "model"),
])
def test_wrong_types_and_ranges_are_refused_naming_the_parameter(kw: dict[str, Any], param: str) -> None:
    assert refused(chat, **kw).param == param


def test_image_content_part_is_refused_naming_the_message() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]
    err = refused(chat, messages=[{"role": "user", "content": parts}])
    assert err.param == "messages[0].content[1]"


def test_roles_map_onto_the_templates_four_roles_with_calls_and_results_as_fields() -> None:
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    got = chat(messages=messages).request.messages
    assert [(m.role, m.content) for m in got] == [("system", "be brief"), ("user", "weather?"), ("assistant", ""),
                                                  ("tool", "rain")]
    call = got[2].tool_calls[0]
    assert (call.id, call.name, call.arguments) == ("c1", "w", '{"city":"Oslo"}')
    assert (got[3].tool_call_id, got[3].name) == ("c1", "w")  # the name of the call it answers


def test_priority_comes_from_header_body_or_flex_tier() -> None:
    assert chat().request.priority == pb.PRIORITY_UNSPECIFIED
    assert chat(priority="batch").request.priority == pb.PRIORITY_BATCH
    assert chat(service_tier="flex").request.priority == pb.PRIORITY_BATCH
    header = parse_chat({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, MODEL, "batch")
    assert header.request.priority == pb.PRIORITY_BATCH
    with pytest.raises(ApiError):
        parse_chat({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "priority": "interactive"},
                   MODEL, "batch")


def test_response_format_json_schema_constrains_and_is_validated() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert json.loads(p.request.response_format.json_schema) == schema
    assert json.loads(p.output.schema or "") == schema
    obj = chat(response_format={"type": "json_object"})
    assert json.loads(obj.request.response_format.json_schema) == {"type": "object"}
    assert refused(chat, response_format={"type": "yaml"}).param == "response_format.type"


def test_logprobs_and_stream_options_reach_the_output_plan() -> None:
    p = chat(logprobs=True, top_logprobs=3, stream=True, stream_options={"include_usage": True})
    assert (p.request.sampling.logprobs, p.request.sampling.top_logprobs) == (True, 3)
    assert (p.output.stream, p.output.include_usage, p.output.logprobs) == (True, True, 3)


def test_the_body_a_load_tool_sends_is_served() -> None:
    """guidellm's chat body: vLLM's continuous_usage_stats (ignored), stop null, ignore_eos, content parts."""
    p = chat(messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": [
        {"type": "text", "text": "hi"}]}], stream=True, max_completion_tokens=7, stop=None, ignore_eos=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert (p.output.include_usage, p.request.sampling.max_tokens, p.request.sampling.ignore_eos) == (True, 7, True)
    assert refused(chat, stream=True, stream_options={"continuous_usage_stats": 1}).param == (
        "stream_options.continuous_usage_stats")


def test_completion_defaults_to_sixteen_tokens_and_takes_a_prompt_in_every_openai_shape() -> None:
    p = parse_completion({"model": MODEL, "prompt": ["Once"], "logprobs": 2, "echo": False}, MODEL, None)
    assert (p.request.prompt, p.request.sampling.max_tokens, p.request.sampling.top_logprobs) == ("Once", 16, 2)
    assert p.prompts == ("Once",)
    assert parse_completion({"model": MODEL, "prompt": [1, 2]}, MODEL, None).prompts == ((1, 2),)
    several = parse_completion({"model": MODEL, "prompt": ["a", "b"], "n": 2}, MODEL, None)
    assert several.prompts == ("a", "b") and several.output.n == 2
    ids = parse_completion({"model": MODEL, "prompt": [[1, 2], [3]], "echo": True}, MODEL, None)
    assert ids.prompts == ((1, 2), (3,)) and ids.request.prompt == ""
    assert refused(parse_completion, {"model": MODEL, "prompt": "a", "suffix": "z"}, MODEL, None).param == "suffix"
    assert refused(parse_completion, {"model": MODEL, "prompt": "a", "best_of": 3}, MODEL, None).param == "best_of"
    echo = parse_completion({"model": MODEL, "prompt": "Once", "echo": True}, MODEL, None)
    assert echo.output.echo == ("Once",) and not echo.output.score
    assert not echo.request.sampling.echo_prompt_logprobs


@pytest.mark.parametrize("prompt", [
    [], [[]], [1, "a"], [[1], "a"], [[1, 2], [True]], [1.5], {"text": "a"}, None, [["a"]], [[1], []],
    ["a"] * (MAX_CHOICES + 1), [[0] * (MAX_PROMPT_IDS // 2 + 1)] * 2,
], ids=lambda p: json.dumps(p)[:40])
def test_other_prompt_shapes_and_sizes_are_a_400_naming_prompt(prompt: Any) -> None:
    assert refused(parse_completion, {"model": MODEL, "prompt": prompt}, MODEL, None).param == "prompt"


def test_prompts_times_n_are_bounded() -> None:
    half = MAX_CHOICES // 2
    assert len(parse_completion({"model": MODEL, "prompt": ["a"] * half, "n": 2}, MODEL, None).prompts) == half
    assert refused(parse_completion, {"model": MODEL, "prompt": ["a"] * half, "n": 3}, MODEL, None).param == "n"


def test_echo_with_logprobs_scores_the_prompt_once() -> None:
    p = parse_completion({"model": MODEL, "prompt": "Once", "echo": True, "logprobs": 1}, MODEL, None)
    assert p.output.score and p.request.sampling.echo_prompt_logprobs and p.request.sampling.max_tokens == 16
    zero = parse_completion({"model": MODEL, "prompt": "Once", "echo": True, "logprobs": 0, "max_tokens": 0}, MODEL,
                            None)
    assert zero.request.sampling.HasField("max_tokens") and zero.request.sampling.max_tokens == 0
    assert refused(parse_completion, {"model": MODEL, "prompt": "a", "max_tokens": 0}, MODEL, None).param == \
        "max_tokens"  # generating nothing only makes sense when scoring
    assert refused(parse_completion, {"model": MODEL, "prompt": "a", "echo": True, "logprobs": 1, "n": 2}, MODEL,
                   None).param == "n"


def test_token_id_prompts_are_checked_against_the_vocabulary_and_echoed_as_text() -> None:
    vocab = [b"<s>", b"Hel", b"lo", b" \xf0\x9f", b"\x8e\x89"]
    p = parse_completion({"model": MODEL, "prompt": [[1, 2], [3, 4]], "echo": True}, MODEL, None)
    assert with_vocab(p, len(vocab), vocab).output.echo == ("Hello", " \U0001f389")
    bad = parse_completion({"model": MODEL, "prompt": [[1, 2], [3, 5]]}, MODEL, None)
    err = refused(with_vocab, bad, len(vocab), vocab)
    assert err.param == "prompt" and "prompt[1][1] = 5" in str(err)
    assert refused(with_vocab, parse_completion({"model": MODEL, "prompt": [-1]}, MODEL, None), 5, vocab).param == \
        "prompt"


def test_a_batch_line_takes_one_text_prompt() -> None:
    from service.http.batch_lines import parse_lines

    rows = [{"custom_id": c, "method": "POST", "url": "/v1/completions", "body": {"model": MODEL, "prompt": p}}
            for c, p in (("text", "a"), ("two", ["a", "b"]), ("ids", [1, 2]))]
    lines = parse_lines("\n".join(json.dumps(r) for r in rows).encode(), "/v1/completions", MODEL)
    assert not isinstance(lines[0], tuple) and lines[0].generate.prompt == "a"
    assert [line[0] for line in lines[1:] if isinstance(line, tuple)] == ["two", "ids"]


LIMITS = InputLimits(max_messages=3, max_tools=2, max_stop_strings=2, max_logit_bias=2)


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("param", "too_many", "limit", "flag"),
    [
        ("messages", [{"role": "user", "content": "hi"}] * 4, 3, "--max-messages"),
        ("tools", [_tool("f"), _tool("g"), _tool("h")], 2, "--max-tools"),
        ("stop", ["a", "b", "c"], 2, "--max-stop-strings"),
        ("logit_bias", {"1": 1, "2": 1, "3": 1}, 2, "--max-logit-bias"),
    ],
)
def test_counts_past_the_servers_limits_are_a_400_naming_the_param_and_the_flag(
    param: str, too_many: Any, limit: int, flag: str
) -> None:
    raw = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], param: too_many}
    err = refused(parse_chat, raw, MODEL, None, LIMITS)
    assert err.param == param
    assert str(err) == f"{param} has {len(too_many)} entries; at most {limit} are accepted (server flag {flag})"
    fewer = too_many[:-1] if isinstance(too_many, list) else dict(list(too_many.items())[:-1])
    parse_chat({**raw, param: fewer}, MODEL, None, LIMITS)  # at the limit: accepted


def test_tools_past_the_limit_are_refused_before_any_schema_is_checked() -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}  # an invalid schema
    err = refused(parse_chat, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                               "tools": [bad] * 3}, MODEL, None, LIMITS)
    assert err.param == "tools"


def test_the_intakes_messages_refusal_names_the_param() -> None:
    err = from_status("INVALID_ARGUMENT", "messages has 9 entries; at most 8 are accepted (server flag --max-messages)")
    assert (err.status, err.param) == (400, "messages")
