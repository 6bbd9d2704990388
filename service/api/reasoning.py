"""A reasoning model's chat request, for every front end: where its output starts, its thinking budget, the grammar
of thought + answer, and (gRPC) its events with the thought apart.

For a model whose template reasons in markers (``service.chat.thinking``)
``setup`` decides, from the request's template variables (``enable_thinking``,
``reasoning_effort``, ...), where the output starts
(``ChatTemplate.thought_start``) and how it is constrained:

* ``SamplingParams.thinking_budget_tokens``: the thought has at most that many
  tokens, then the family's end marker is forced; 0 turns thinking off, and a
  prompt that still opens the thought has it closed at once; ``reasoning_effort``
  is the template's variable of that name (``"none"`` is also a budget of 0).
  A budget or an effort sets ``enable_thinking`` (unless the request does): true,
  false for a budget of 0 or ``"none"``;
* a request with a constraint of its own (a JSON Schema, a Lark grammar: the
  tools' call syntax) has it applied to the answer after the thought: the
  output's grammar is the free thought up to the end marker, then the answer's
  grammar (``service.chat.thought.grammar``). NOTE: a JSON Schema becomes a
  ``%json`` item of that grammar, so the document is not closed within the budget
  (``json_finish``) there: it is generated under the schema and validated at the
  end as any other. A regex or GBNF constraint after a thought is refused.

A model that does not reason but whose text answers open with a header
(Functionary v3.2's ``all\\n``: ``Family.answer_open``) is set up the same way
with its ``Header`` row (``setup``'s ``header``: a plan whose output is the
answer, CLOSED) when no call reader reads the answer (no tools, or
``tool_choice`` none): its grammar is the header then the answer's own (free
text, the JSON Schema, the Lark grammar), its reader drops the header, so the
content (a JSON document too) is the text after it; nothing is counted as
reasoning. A regex or GBNF (which constrain the whole output, header and all)
and a JSON Schema that does not parse leave the request as it is, without a plan.

Two ways in: ``plan`` sets up a ``GenerateRequest`` whose constraint is all in
its ``response_format`` (the HTTP dialects, which write their tools' grammar
there first); a gRPC request is set up in the prepare stage's worker thread
(``ThoughtAsk``: ``setup`` before the render, ``compose`` once its tools'
grammar is planned: lazily triggered for ``auto``, after the thought), so
nothing whose cost grows with the input (a JSON Schema's parse, a probe render)
runs on the event loop. The HTTP dialects read each choice's output through
``ThoughtPlan.reader`` (``service.http.answer``); a gRPC ``Generate`` stream
through ``ThoughtEvents`` (``Delta.reasoning``, ``Usage.reasoning_tokens``; the
tools' calls are then read from the answer alone), ``GenerateJSON`` through
``split_deltas`` (``GenerateJSONResponse.reasoning``, the document alone in
``json``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.chat_input import MAX_KWARGS_BYTES
from service.api.proto_convert import response_format
from service.chat.syntax import json_rule
from service.chat.thinking import Start
from service.chat.thought import Reasoning, ThoughtReader
from service.request.errors import BadRequest
from service.request.events import Delta

StartOf = Callable[[Mapping[str, Any]], "Start | None"]


@dataclass(frozen=True)
class ThoughtPlan:
    """How one request's output is read: the model's reasoning and where its output starts."""

    reasoning: Reasoning
    start: Start
    budget: int | None = None  # the thought's tokens at most (None: no bound)

    def reader(self) -> ThoughtReader:
        return self.reasoning.reader(self.start)

    @property
    def headed(self) -> bool:
        """The plan of a family's answer header (a ``Header`` row: no thought markers), not of a thought."""
        return not self.reasoning.thinking.open

    def thought_tokens(self, ids: list[int], still: bool) -> int:
        """How many of a delta's token ids, read while in the thought, are the thought's (its markers
        included): all while it goes on (``still``); those up to the end marker when that is one token.
        NOTE: an end marker written as text ends a delta counted whole."""
        close = self.reasoning.markup.specials.get(self.reasoning.thinking.close)
        if still or close is None or close not in ids:
            return len(ids)
        return ids.index(close) + 1


def _answer_grammar(constraint: tuple[str, str] | None) -> str | None:
    """The Lark grammar of the answer under ``constraint`` ((kind, source) as ``Ask.fmt``; None: free text), None
    also for a JSON Schema that is not one; raises BadRequest for a constraint that cannot follow a thought."""
    if constraint is None:
        return None
    kind, source = constraint
    if kind == "lark":
        return source
    if kind == "json_schema":
        try:
            return f"start: {json_rule(json.loads(source), compact=True)}\n"
        except (ValueError, RecursionError, TypeError):
            return None
    raise BadRequest(f"a {kind} response_format cannot follow a reasoning model's thought: use json_schema or "
                     "lark_grammar")


def output_grammar(thought: ThoughtPlan, constraint: tuple[str, str] | None, framed: bool = False) -> str | None:
    """The Lark grammar of the whole output: the thought (at most its budget), or a header plan's header
    (``ThoughtPlan.headed``), then the answer under ``constraint`` (see ``_answer_grammar``; ``framed``: it is the
    tools' call syntax, which writes its own message headers: harmony's); None when ``constraint`` alone is the
    output's (the output starts in the answer, or neither a budget nor a constraint needs a grammar; a header
    before a regex or GBNF). Raises BadRequest.

    NOTE: a JSON Schema that does not parse keeps its own constraint, so that its compile refuses it with its own
    message rather than a thought followed by free text hiding it."""
    if thought.headed and constraint is not None and constraint[0] not in ("json_schema", "lark"):
        return None  # NOTE: a regex or GBNF constrains the whole output, header and all
    answer = _answer_grammar(constraint)
    if constraint is not None and answer is None:
        return None
    if not thought.headed and (thought.start is Start.CLOSED or (answer is None and thought.budget is None)):
        return None
    try:
        return thought.reasoning.grammar(thought.start, thought.budget, answer, framed=framed)
    except ValueError as exc:  # NOTE: a caller's Lark grammar without a start rule
        raise BadRequest(f"lark_grammar: {exc}") from None


def _composed(thought: ThoughtPlan, constraint: tuple[str, str] | None,
              framed: bool) -> tuple[ThoughtPlan | None, str | None]:
    """(the plan, the whole output's grammar: ``output_grammar``); a header plan whose header the grammar cannot
    write (a regex, GBNF, a JSON Schema that does not parse) is no plan: its reader would drop a header that may
    not be there. Raises BadRequest."""
    lark = output_grammar(thought, constraint, framed)
    return (None, None) if thought.headed and lark is None else (thought, lark)


def _variables(kwargs: str) -> dict[str, Any] | None:
    """The request's template variables; None when they are not a JSON object or are over the size limit
    (preparation refuses them with its own message, so they are left as they are)."""
    if len(kwargs) > MAX_KWARGS_BYTES:  # NOTE: the size first (characters <= bytes)
        return None
    try:
        value = json.loads(kwargs) if kwargs else {}
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def setup(kwargs: str, budget: int | None, chat: bool, reasoning: Reasoning | None,
          start_of: StartOf, header: Reasoning | None = None) -> tuple[ThoughtPlan | None, str]:
    """The thought plan of a request with template variables ``kwargs`` (JSON text), thinking budget ``budget``
    and a chat (``chat``) or a raw prompt, and the variables to render it with (``enable_thinking`` set, see the
    module doc); the plan is None when the model does not reason (and ``header`` is None) or the request is no
    chat. ``header``: the family's answer header of a model that does not reason (``RequestBuilder.header``),
    given when no call reader reads the answer. Raises BadRequest."""
    if budget is not None and not chat:
        raise BadRequest("thinking_budget_tokens needs chat messages (a raw prompt is text to continue)")
    if reasoning is None or not chat:
        # NOTE: a model that does not reason in markers: a budget has nothing to bound; its answer header (if
        # any) is read as the answer of an output that starts there
        return (ThoughtPlan(header, Start.CLOSED) if header is not None and chat else None), kwargs
    given = _variables(kwargs)
    variables = given if given is not None else {}
    effort = variables.get("reasoning_effort")
    if effort == "none" and budget is None:
        budget = 0  # NOTE: OpenAI's effort "none": no thought, for templates that know only enable_thinking
    if given is not None and "enable_thinking" not in variables and (budget is not None or effort is not None):
        # NOTE: a budget or an effort asks for a thought, "none" or a budget of 0 for none: for templates that
        # know only enable_thinking (DeepSeek R1's, Qwen3's)
        variables["enable_thinking"] = budget != 0
        kwargs = json.dumps(variables, ensure_ascii=False)
    start = start_of(variables)
    if start is None:
        return None, kwargs
    if budget == 0 and start is Start.MAYBE:
        start = Start.CLOSED  # NOTE: the answer's grammar alone: the output may not open a thought
    return ThoughtPlan(reasoning, start, budget), kwargs


def plan(request: pb.GenerateRequest, reasoning: Reasoning | None, start_of: StartOf,
         header: Reasoning | None = None) -> ThoughtPlan | None:
    """Set up ``request``, whose constraint is all in its ``response_format`` (the HTTP dialects put their tools'
    grammar there), for a reasoning model, or one whose answers open with ``header`` (see ``setup`` and the
    module doc; changes its variables, its budget's effect and its response format); the plan its answer is read
    by, None when the model does not reason (nor has a header) or the request has no messages. Raises BadRequest.
    A request whose tools' grammar is planned in preparation (gRPC) is set up there instead (``ThoughtAsk``)."""
    sp = request.sampling
    budget = sp.thinking_budget_tokens if sp.HasField("thinking_budget_tokens") else None
    calls = bool(request.tools) and request.tool_choice != pb.TOOL_CHOICE_NONE  # NOTE: "none" reads no calls
    thought, request.chat_template_kwargs = setup(request.chat_template_kwargs, budget, bool(request.messages),
                                                  reasoning, start_of, None if calls else header)
    if thought is None:
        return None
    constraint = response_format(request.response_format)
    if calls and constraint is None and thought.budget is not None and thought.start is not Start.CLOSED:
        # NOTE: the tools' grammar is not in the request: a thought's grammar here would stand in for it and the
        # calls would come back unread; refused rather than silently degraded
        raise BadRequest("thinking_budget_tokens with tools needs the tools' grammar as the response_format, or "
                         "the request set up in preparation (Ask.generate(..., reasons=True))")
    composed, lark = _composed(thought, constraint, framed=calls)
    if lark is not None:
        request.response_format.CopyFrom(pb.ResponseFormat(lark_grammar=lark))
        sp.ClearField("json_finish")
        sp.ClearField("json_repeat_penalty")
    return composed


@dataclass(eq=False)
class ThoughtAsk:
    """A request whose reasoning (or answer header) is set up in the prepare stage (gRPC ``Generate`` and
    ``GenerateJSON``): there, ``setup`` gives its plan and the variables it is rendered with, ``compose`` the
    grammar of its whole output once its own constraint or its tools' grammar is known. NOTE: written once by the
    prepare stage's worker thread, which the event loop awaits before any event of the request exists; the front
    end reads it from its events."""

    plan: ThoughtPlan | None = None
    lark: str = ""  # the whole output's grammar ("": the request's own constraint stands)

    def setup(self, kwargs: str, budget: int | None, chat: bool, reasoning: Reasoning | None,
              start_of: StartOf, header: Reasoning | None = None) -> str:
        """Worker thread: ``setup`` into ``plan``; the variables to render the request with."""
        self.plan, kwargs = setup(kwargs, budget, chat, reasoning, start_of, header)
        return kwargs

    def compose(self, constraint: tuple[str, str] | None, framed: bool = False) -> None:
        """Worker thread: the whole output's grammar, its answer under ``constraint`` (``framed``: the tools' call
        syntax, see ``output_grammar``); a header plan whose header it cannot write is dropped. Raises
        BadRequest."""
        if self.plan is not None:
            self.plan, lark = _composed(self.plan, constraint, framed)
            self.lark = lark or ""


@dataclass
class ThoughtSplit:
    """One choice's output read as thought and answer as it comes, and the thought's tokens counted."""

    plan: ThoughtPlan
    reader: ThoughtReader = field(init=False)
    tokens: int = 0

    def __post_init__(self) -> None:
        self.reader = self.plan.reader()

    def feed(self, text: str, ids: Sequence[int]) -> tuple[str, str]:
        """(new thought text, new answer text) of the next piece, whose token ids are ``ids``."""
        thinking = self.reader.thinking_now
        thought, answer = self.reader.feed(text)
        if thinking or thought:
            self.tokens += self.plan.thought_tokens(list(ids), self.reader.thinking_now)
        return thought, answer

    def close(self) -> tuple[str, str]:
        """The last (thought, answer) at the output's end."""
        return self.reader.close()


def split_deltas(ask: ThoughtAsk | None, deltas: Sequence[Delta]) -> tuple[str, str, int]:
    """(thought, answer, the thought's tokens) of one choice's deltas (``GenerateJSON``); without a thought plan
    the answer is the whole text."""
    if ask is None or ask.plan is None:
        return "", "".join(d.text for d in deltas), 0
    split = ThoughtSplit(ask.plan)
    pieces = [*(split.feed(d.text, d.token_ids) for d in deltas), split.close()]
    return "".join(p[0] for p in pieces), "".join(p[1] for p in pieces), split.tokens


@dataclass
class ThoughtEvents:
    """A gRPC request's events with each choice's thought apart: ``Delta.text`` the answer, ``Delta.reasoning``
    the thought, ``Usage.reasoning_tokens`` its tokens; text held at a choice's end is sent in one last delta
    before its ``done``. Events pass as they are when the request has no thought plan."""

    ask: ThoughtAsk
    splits: dict[int, ThoughtSplit] = field(default_factory=dict)

    def events(self, msg: pb.GenerateResponse) -> list[pb.GenerateResponse]:
        kind, plan = msg.WhichOneof("event"), self.ask.plan
        if plan is None or kind not in ("delta", "done"):
            return [msg]
        i = msg.delta.choice_index if kind == "delta" else msg.done.choice_index
        if i not in self.splits:
            self.splits[i] = ThoughtSplit(plan)
        split = self.splits[i]
        if kind == "delta":
            msg.delta.reasoning, msg.delta.text = split.feed(msg.delta.text, msg.delta.token_ids)
            return [msg]
        msg.done.usage.reasoning_tokens = split.tokens
        thought, text = split.close()
        if not thought and not text:
            return [msg]
        last = pb.GenerateResponse(request_id=msg.request_id,
                                   delta=pb.Delta(text=text, reasoning=thought, choice_index=i))
        return [last, msg]
