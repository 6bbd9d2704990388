"""A reasoning model's request set up without a model (``service.api.reasoning``): the template variables a budget
or an effort sets, the grammar of thought + answer that a budget or a constraint needs (and none otherwise), a
budget of 0 with a template that cannot turn thinking off, the constraints that cannot follow a thought, a gRPC
request set up in preparation (its tools' grammar after the thought), and a gRPC stream's deltas (and GenerateJSON's,
a cache hit's one replayed delta too) split into thought and answer with the thought's tokens counted."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from inference.v1 import inference_pb2 as pb

from service.api.chat_input import MAX_KWARGS_BYTES
from service.api.reasoning import ThoughtAsk, ThoughtEvents, ThoughtPlan, output_grammar, plan, split_deltas
from service.chat.markup import Markup
from service.chat.thinking import MARKERS, Start
from service.chat.thought import Reasoning
from service.request.errors import BadRequest
from service.request.events import Delta

THINK = next(m for m in MARKERS if m.name == "think")
CLOSE_ID = 7
SPECIAL = Reasoning(THINK, Markup({"<think>": 6, "</think>": CLOSE_ID}))
PLAIN = Reasoning(THINK, Markup())


def request(budget: int | None = None, kwargs: dict[str, Any] | None = None, **fmt: str) -> pb.GenerateRequest:
    req = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="Hi")])
    if budget is not None:
        req.sampling.thinking_budget_tokens = budget
    if kwargs:
        req.chat_template_kwargs = json.dumps(kwargs)
    if fmt:
        req.response_format.CopyFrom(pb.ResponseFormat(**fmt))
    return req


class Template:
    """A template that opens the thought unless ``enable_thinking`` is false (and then writes an empty one), or
    one that cannot turn it off (``off`` False); it records the variables it was asked about."""

    def __init__(self, start: Start = Start.INSIDE, off: bool = True) -> None:
        self.start, self.off = start, off
        self.asked: list[dict[str, Any]] = []

    def __call__(self, variables: Mapping[str, Any]) -> Start:
        self.asked.append(dict(variables))
        return Start.CLOSED if self.off and variables.get("enable_thinking") is False else self.start


def test_a_model_that_does_not_reason_and_a_raw_prompt_are_left_alone() -> None:
    req = request(5)
    assert plan(req, None, Template()) is None
    raw = pb.GenerateRequest(prompt="Once upon a time")
    assert plan(raw, SPECIAL, Template()) is None and not raw.HasField("response_format")
    raw.sampling.thinking_budget_tokens = 5
    with pytest.raises(BadRequest, match="thinking_budget_tokens needs chat messages"):
        plan(raw, SPECIAL, Template())


def test_no_budget_and_no_constraint_need_no_grammar() -> None:
    req = request()
    got = plan(req, SPECIAL, Template())
    assert got == ThoughtPlan(SPECIAL, Start.INSIDE) and not req.HasField("response_format")
    assert req.chat_template_kwargs == ""


def test_a_budget_asks_for_a_thought_and_bounds_it_in_the_grammar() -> None:
    req = request(5)
    got = plan(req, SPECIAL, Template())
    assert got is not None and got.start is Start.INSIDE
    assert json.loads(req.chat_template_kwargs) == {"enable_thinking": True}
    grammar = req.response_format.lark_grammar
    assert "rsn_text[max_tokens=5]" in grammar and "<[7]>" in grammar and grammar.startswith("start: rsn_thought")


@pytest.mark.parametrize("req", [request(0), request(kwargs={"reasoning_effort": "none"})], ids=["budget-0", "none"])
def test_a_budget_of_zero_or_effort_none_turns_thinking_off(req: pb.GenerateRequest) -> None:
    got = plan(req, SPECIAL, Template())
    assert got is not None and got.start is Start.CLOSED and not req.HasField("response_format")
    assert json.loads(req.chat_template_kwargs)["enable_thinking"] is False


def test_a_template_that_cannot_turn_thinking_off_has_the_thought_closed_at_once() -> None:
    req = request(0)
    got = plan(req, SPECIAL, Template(off=False))
    assert got is not None and got.start is Start.INSIDE
    assert "rsn_text[max_tokens=0]" in req.response_format.lark_grammar
    maybe = request(0)
    got = plan(maybe, SPECIAL, Template(Start.MAYBE, off=False))
    assert got is not None and got.start is Start.CLOSED  # the model may not open one: the answer alone


def test_variables_that_are_not_an_object_are_left_for_preparation_to_refuse() -> None:
    req = request(5)
    req.chat_template_kwargs = "{not json"
    assert plan(req, SPECIAL, Template()) is not None and req.chat_template_kwargs == "{not json"


def test_variables_over_the_size_limit_are_not_parsed_here_but_left_for_preparation_to_refuse() -> None:
    req = request(5)
    big = json.dumps({"enable_thinking": True, "pad": "x" * MAX_KWARGS_BYTES})
    req.chat_template_kwargs = big
    template = Template()
    assert plan(req, SPECIAL, template) is not None and req.chat_template_kwargs == big
    assert template.asked == [{}]  # the probe render saw none of the request's variables


def test_plan_refuses_a_budget_with_tools_whose_grammar_is_not_in_the_request() -> None:
    req = request(5)
    req.tools.add(name="get_weather", parameters='{"type": "object"}')
    with pytest.raises(BadRequest, match="thinking_budget_tokens with tools needs the tools' grammar"):
        plan(req, SPECIAL, Template())
    without = request()
    without.tools.add(name="get_weather", parameters='{"type": "object"}')
    assert plan(without, SPECIAL, Template()) is not None and not without.HasField("response_format")


CALLS = 'start: "<tool_call>" /[a-z]+/ "</tool_call>"\n'  # a stand-in for a family's call grammar (its start rule)


def test_a_request_set_up_in_preparation_has_its_tools_grammar_after_a_budgeted_thought() -> None:
    ask = ThoughtAsk()
    kwargs = ask.setup("", 5, True, SPECIAL, Template())
    assert json.loads(kwargs) == {"enable_thinking": True}
    assert ask.plan == ThoughtPlan(SPECIAL, Start.INSIDE, 5)
    ask.compose(("lark", CALLS))
    assert ask.lark.startswith("start: rsn_thought rsn_answer\n") and "rsn_text[max_tokens=5]" in ask.lark
    assert 'rsn_answer: "<tool_call>" /[a-z]+/ "</tool_call>"' in ask.lark


def test_calls_follow_an_unbounded_thought_too_and_a_free_answer_needs_no_grammar() -> None:
    calls, free = ThoughtAsk(), ThoughtAsk()
    for ask in (calls, free):
        assert ask.setup("", None, True, SPECIAL, Template()) == ""
    calls.compose(("lark", CALLS))
    free.compose(None)
    assert calls.lark.startswith("start: rsn_thought rsn_answer") and "max_tokens" not in calls.lark
    assert free.lark == ""  # the request's own (no) constraint stands


def test_a_budget_of_zero_leaves_the_tools_grammar_alone_and_a_raw_prompt_has_no_plan() -> None:
    off = ThoughtAsk()
    assert json.loads(off.setup("", 0, True, SPECIAL, Template())) == {"enable_thinking": False}
    off.compose(("lark", CALLS))
    assert off.plan is not None and off.plan.start is Start.CLOSED and off.lark == ""
    raw = ThoughtAsk()
    assert raw.setup('{"x": 1}', None, False, SPECIAL, Template()) == '{"x": 1}' and raw.plan is None
    with pytest.raises(BadRequest, match="thinking_budget_tokens needs chat messages"):
        ThoughtAsk().setup("", 5, False, SPECIAL, Template())


def test_a_json_schema_that_does_not_parse_keeps_its_own_constraint_for_its_compile_to_refuse() -> None:
    thought = ThoughtPlan(SPECIAL, Start.INSIDE, 5)
    assert output_grammar(thought, ("json_schema", "{nope")) is None
    assert "rsn_answer: %json" in (output_grammar(thought, ("json_schema", '{"type": "object"}')) or "")


def test_the_request_own_variables_win() -> None:
    req = request(5, {"enable_thinking": False})
    template = Template()
    assert plan(req, SPECIAL, template) is not None
    assert template.asked == [{"enable_thinking": False}]


def test_a_json_schema_applies_to_the_answer_after_the_thought() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = request(json_schema=json.dumps(schema))
    req.sampling.json_finish = pb.JSON_FINISH_CLOSE_WITHIN_BUDGET
    assert plan(req, PLAIN, Template()) is not None
    grammar = req.response_format.lark_grammar
    assert grammar.index("rsn_thought:") < grammar.index("rsn_answer: %json")
    assert req.sampling.json_finish == pb.JSON_FINISH_UNSPECIFIED


@pytest.mark.parametrize("fmt", [{"regex": "[a-z]+"}, {"gbnf_grammar": 'root ::= "a"'}])
def test_a_regex_or_gbnf_constraint_cannot_follow_a_thought(fmt: dict[str, str]) -> None:
    with pytest.raises(BadRequest, match="cannot follow a reasoning model's thought"):
        plan(request(**fmt), SPECIAL, Template())


def delta(text: str, ids: list[int], choice: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(request_id="r", delta=pb.Delta(text=text, token_ids=ids, choice_index=choice))


def test_a_grpc_streams_deltas_carry_the_thought_apart_and_its_tokens_are_counted() -> None:
    split = ThoughtEvents(ThoughtAsk(ThoughtPlan(SPECIAL, Start.INSIDE)))
    out = [m for msg in (delta("Let me ", [1, 2]), delta("see.</think>", [3, CLOSE_ID]), delta("\n\nYes", [4, 5]))
           for m in split.events(msg)]
    assert [(m.delta.reasoning, m.delta.text) for m in out] == [("Let me ", ""), ("see.", ""), ("", "Yes")]
    done = pb.GenerateResponse(request_id="r", done=pb.Done(choice_index=0))
    (end,) = split.events(done)
    assert end.done.usage.reasoning_tokens == 4  # the thought's 3, and the end marker's token


def test_text_held_at_a_choices_end_goes_out_before_its_done() -> None:
    split = ThoughtEvents(ThoughtAsk(ThoughtPlan(PLAIN, Start.INSIDE)))
    assert [m.delta.reasoning for m in split.events(delta("cut off </thi", [1, 2]))] == ["cut off "]
    last, done = split.events(pb.GenerateResponse(request_id="r", done=pb.Done(choice_index=0)))
    assert (last.delta.reasoning, last.delta.text) == ("</thi", "") and done.WhichOneof("event") == "done"


def test_events_pass_as_they_are_when_preparation_planned_no_thought() -> None:
    split = ThoughtEvents(ThoughtAsk())
    (msg,) = split.events(delta("<think>x</think>y", [6, 1, CLOSE_ID, 2]))
    assert (msg.delta.reasoning, msg.delta.text) == ("", "<think>x</think>y")


def test_generate_json_deltas_and_a_cache_hits_one_replayed_delta_split_alike() -> None:
    ask = ThoughtAsk(ThoughtPlan(SPECIAL, Start.INSIDE, 3))
    streamed = [Delta("Let me ", (1, 2)), Delta("see.</think>", (3, CLOSE_ID)), Delta('\n\n{"ok":', (4, 5)),
                Delta("true}", (8,))]
    replayed = [Delta("".join(d.text for d in streamed), tuple(t for d in streamed for t in d.token_ids))]
    expected = ("Let me see.", '{"ok":true}', 4)
    assert split_deltas(ask, streamed) == split_deltas(ask, replayed) == expected
    assert split_deltas(None, streamed)[:2] == ("", 'Let me see.</think>\n\n{"ok":true}')
