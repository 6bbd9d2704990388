"""A family's answer header without a model (Functionary v3.2's ``all\\n``, which its prompt's ``>>>`` makes every
answer start with): the reader drops it in every split of the output and reads text without one as it is; a request
with no call reader (no tools, ``tool_choice`` none) is planned with the header then its own answer in the grammar,
one with calls is left to the call reader; a gRPC stream's text comes without it and nothing counts as reasoning; and
the grammar over a tiny Llama 3 vocabulary makes the output start with the header, before free text or a JSON
document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance as llg
import pytest
from inference.v1 import inference_pb2 as pb

from service.api.call_plan import CallAsk
from service.api.input_limits import DEFAULTS
from service.api.reasoning import ThoughtAsk, ThoughtEvents, ThoughtPlan, plan, split_deltas
from service.chat.conversation import Caps
from service.chat.families import FAMILIES, GENERIC
from service.chat.markup import Markup, bind
from service.chat.thinking import Start
from service.chat.thought import Reasoning, ThoughtReader
from service.chat.tool_format import ToolFormat
from service.model.runner import Vocab
from service.request.errors import BadRequest
from service.request.events import Delta
from tests.support.chat_templates import chat_template
from tests.support.tiny_vocab import Family as VocabFamily
from tests.support.tiny_vocab import build

FUNCTIONARY = next(f for f in FAMILIES if f.name == "functionary-v3.2")
ROW = FUNCTIONARY.header()
assert ROW is not None
HEADER = Reasoning(ROW, Markup())
TOOL = pb.Tool(name="get_weather", parameters='{"type": "object", "properties": {"city": {"type": "string"}}}')
SCHEMA = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
LLAMA = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>"]


def never(_variables: Any) -> Start | None:
    raise AssertionError("a model that does not reason is never asked where its thought starts")


def read(text: str, step: int) -> str:
    """The answer of ``text`` fed ``step`` characters at a time; the pieces' concatenation is checked against
    the reader's whole answer."""
    reader = ThoughtReader(ROW, Start.CLOSED)
    pieces = [reader.feed(text[i:i + step]) for i in range(0, len(text), step)] + [reader.close()]
    assert all(thought == "" for thought, _ in pieces) and reader.thought == ""
    assert "".join(answer for _, answer in pieces) == reader.answer
    return reader.answer


def test_only_the_families_that_name_a_recipient_first_have_a_header() -> None:
    assert (ROW.answer_open, ROW.start("anything>>>"), ROW.matches(">>>all\n")) == ("all\n", Start.CLOSED, False)
    assert [f.name for f in FAMILIES if f.header() is not None] == ["functionary-v3.2"]
    assert GENERIC.header() is None


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 100])
def test_the_header_is_dropped_in_every_split_of_the_output(step: int) -> None:
    assert read("all\nSunny in Oslo.", step) == "Sunny in Oslo."
    assert read("all\nall\n", step) == "all\n"  # NOTE: only the first is the header


@pytest.mark.parametrize("text", ["Sunny.", "al", "a", "alt\nx", "{\"n\": 1}", ""])
def test_text_without_the_header_is_read_as_it_is(text: str) -> None:
    assert {read(text, step) for step in (1, 2, 100)} == {text}


def request(tools: list[pb.Tool] | None = None, choice: int = pb.TOOL_CHOICE_UNSPECIFIED,
            **fmt: str) -> pb.GenerateRequest:
    req = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="Hi")], tools=tools or [],
                             tool_choice=choice)  # type: ignore[arg-type]
    if fmt:
        req.response_format.CopyFrom(pb.ResponseFormat(**fmt))
    return req


def test_a_request_without_tools_gets_the_header_then_free_text_in_its_grammar() -> None:
    req = request()
    assert plan(req, None, never, HEADER) == ThoughtPlan(HEADER, Start.CLOSED)
    assert req.response_format.lark_grammar == ('start: rsn_answer\nrsn_answer: "all\\n" rsn_body\n'
                                                'rsn_body: /(?s:.*)/\n')


def test_a_json_schema_follows_the_header_and_the_json_options_are_cleared() -> None:
    req = request(json_schema=SCHEMA)
    req.sampling.json_finish = pb.JSON_FINISH_CLOSE_WITHIN_BUDGET
    assert plan(req, None, never, HEADER) == ThoughtPlan(HEADER, Start.CLOSED)
    lark = req.response_format.lark_grammar
    assert lark.startswith('start: rsn_answer\nrsn_answer: "all\\n" rsn_body\nrsn_body: %json')
    doc = json.loads(lark[lark.index("%json") + len("%json"):])
    assert {k: v for k, v in doc.items() if k != "x-guidance"} == json.loads(SCHEMA)
    assert req.sampling.json_finish == pb.JSON_FINISH_UNSPECIFIED


def test_tool_choice_none_is_planned_and_its_call_ask_takes_the_grammar() -> None:
    req = request([TOOL], pb.TOOL_CHOICE_NONE)
    assert plan(req, None, never, HEADER) == ThoughtPlan(HEADER, Start.CLOSED)
    ask = CallAsk.of(req)
    assert ask is not None and ask.rendered_only
    ask.prepare((), ToolFormat(FUNCTIONARY, Markup(), Caps()), DEFAULTS)  # NOTE: "none" leaves the tools out
    assert ask.plan is None and ask.lark == ""


@pytest.mark.parametrize("choice", [pb.TOOL_CHOICE_UNSPECIFIED, pb.TOOL_CHOICE_AUTO, pb.TOOL_CHOICE_REQUIRED])
def test_a_request_whose_calls_are_read_is_left_to_the_call_reader(choice: int) -> None:
    req = request([TOOL], choice)
    assert plan(req, None, never, HEADER) is None and not req.HasField("response_format")


@pytest.mark.parametrize("req", [pb.GenerateRequest(prompt="Once"), request(regex="[a-z]+"),
                                 request(json_schema="{not json")], ids=["raw prompt", "regex", "bad schema"])
def test_a_raw_prompt_a_regex_and_a_schema_preparation_refuses_are_left_alone(req: pb.GenerateRequest) -> None:
    before = req.SerializeToString()
    assert plan(req, None, never, HEADER) is None and req.SerializeToString() == before


def test_a_lark_grammar_without_a_start_rule_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="no start rule"):
        plan(request(lark_grammar='rule: "x"\n'), None, never, HEADER)


def test_a_grpc_stream_has_the_text_after_the_header_and_no_reasoning_tokens() -> None:
    split = ThoughtEvents(ThoughtAsk(ThoughtPlan(HEADER, Start.CLOSED)))
    pieces = ("al", "l", "\nSun", "ny.")
    out = [m for i, text in enumerate(pieces)
           for m in split.events(pb.GenerateResponse(request_id="r", delta=pb.Delta(text=text, token_ids=[i])))]
    assert [(m.delta.reasoning, m.delta.text) for m in out] == [("", ""), ("", ""), ("", "Sun"), ("", "ny.")]
    (done,) = split.events(pb.GenerateResponse(request_id="r", done=pb.Done()))
    assert done.done.usage.reasoning_tokens == 0


def test_a_request_set_up_in_preparation_gets_the_grammar_plan_gives() -> None:
    for fmt, constraint in (({}, None), ({"json_schema": SCHEMA}, ("json_schema", SCHEMA))):
        ask, req = ThoughtAsk(), request(**fmt)
        assert ask.setup("", None, True, None, never, HEADER) == "" and ask.plan == ThoughtPlan(HEADER, Start.CLOSED)
        ask.compose(constraint)
        plan(req, None, never, HEADER)
        assert ask.lark == req.response_format.lark_grammar and ask.lark.startswith('start: rsn_answer\n')


@pytest.mark.parametrize("constraint", [("regex", "[a-z]+"), ("gbnf", 'root ::= "x"'), ("json_schema", "{nope")])
def test_a_constraint_the_header_cannot_precede_drops_the_plan_in_preparation(constraint: tuple[str, str]) -> None:
    ask = ThoughtAsk()
    ask.setup("", None, True, None, never, HEADER)
    ask.compose(constraint)
    assert ask.plan is None and ask.lark == ""


def test_no_header_without_a_chat_or_without_one_given() -> None:
    raw, plain = ThoughtAsk(), ThoughtAsk()
    assert raw.setup('{"x": 1}', None, False, None, never, HEADER) == '{"x": 1}' and raw.plan is None
    plain.setup("", None, True, None, never)
    assert plain.plan is None


def test_a_generate_json_document_is_the_text_after_the_header() -> None:
    ask = ThoughtAsk(ThoughtPlan(HEADER, Start.CLOSED))
    deltas = [Delta(text=t, token_ids=(i,)) for i, t in enumerate(("a", "ll\n{", '"n":', "12}"))]
    assert split_deltas(ask, deltas) == ("", '{"n":12}', 0)


class Tiny:
    """A tiny vocabulary with Llama 3's control tokens and Functionary v3.2's template, its llguidance tokenizer
    and the header's markup."""

    def __init__(self, path: Path) -> None:
        family = VocabFamily("functionary-tiny", LLAMA, "<|begin_of_text|>", "<|eot_id|>",
                             chat_template("meetkai-functionary-medium-v3.2"))
        self.vocab = Vocab.load(build(path, family=family))
        self.ll = self.vocab.ll_tokenizer()
        self.header = Reasoning(ROW, bind(ROW.markers(), lambda t: self.vocab.tokenize(t, False, True),
                                          self.ll.is_special_token,
                                          lambda t: self.vocab.piece(t, True).decode("utf-8", "replace")))

    def accepts(self, source: str, text: str) -> bool:
        ids = self.vocab.tokenize(text, add_special=False, parse_special=True)
        m = llg.LLMatcher(self.ll, llg.LLMatcher.grammar_from_lark(source))
        assert not m.is_error(), m.get_error()
        return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return Tiny(tmp_path_factory.mktemp("functionary") / "vocab.gguf")


def test_the_grammar_makes_the_output_name_its_recipient_first(tiny: Tiny) -> None:
    free, doc = request(), request(json_schema=SCHEMA)
    plan(free, None, never, tiny.header)
    plan(doc, None, never, tiny.header)
    assert tiny.header.markup.specials == {}  # NOTE: all\n is text in Functionary's vocabulary
    assert tiny.accepts(free.response_format.lark_grammar, "all\nSunny in Oslo.")
    assert not tiny.accepts(free.response_format.lark_grammar, "Sunny in Oslo.")
    # NOTE: the document in the layout of every JSON output (json_grammar.JSON_OPTIONS)
    assert tiny.accepts(doc.response_format.lark_grammar, 'all\n{"n":12}')
    assert not tiny.accepts(doc.response_format.lark_grammar, '{"n":12}')
    assert not tiny.accepts(doc.response_format.lark_grammar, 'all\nSunny.')
