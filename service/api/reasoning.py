"""A reasoning model's chat request, for every front end: where its output starts, its thinking budget, the grammar
of thought + answer, and (gRPC) its events with the thought apart.

For a model whose template reasons in markers (``service.chat.thinking``)
``plan`` decides, from the request's template variables (``enable_thinking``,
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

The HTTP dialects read each choice's output through ``ThoughtPlan.reader``
(``service.http.answer``); a gRPC ``Generate`` stream through ``ThoughtEvents``
(``Delta.reasoning``, ``Usage.reasoning_tokens``). Runs on the event loop for
gRPC: its cost is bounded (the variables are at most ``MAX_KWARGS_BYTES``; the
probe render is cached per set of variables).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.chat_input import MAX_KWARGS_BYTES
from service.chat.syntax import json_rule
from service.chat.thinking import Start
from service.chat.thought import Reasoning, ThoughtReader
from service.request.errors import BadRequest

StartOf = Callable[[Mapping[str, Any]], "Start | None"]


@dataclass(frozen=True)
class ThoughtPlan:
    """How one request's output is read: the model's reasoning and where its output starts."""

    reasoning: Reasoning
    start: Start

    def reader(self) -> ThoughtReader:
        return self.reasoning.reader(self.start)

    def thought_tokens(self, ids: list[int], still: bool) -> int:
        """How many of a delta's token ids, read while in the thought, are the thought's (its markers
        included): all while it goes on (``still``); those up to the end marker when that is one token.
        NOTE: an end marker written as text ends a delta counted whole."""
        close = self.reasoning.markup.specials.get(self.reasoning.thinking.close)
        if still or close is None or close not in ids:
            return len(ids)
        return ids.index(close) + 1


def _answer_grammar(fmt: pb.ResponseFormat) -> str | None:
    """The request's own constraint as the Lark grammar of the answer (None: free text)."""
    kind = fmt.WhichOneof("format")
    if kind is None:
        return None
    if kind == "lark_grammar":
        return fmt.lark_grammar
    if kind == "json_schema":
        try:
            return f"start: {json_rule(json.loads(fmt.json_schema))}\n"
        except (ValueError, RecursionError, TypeError):
            return None  # NOTE: not a schema: preparation refuses it with its own message
    raise BadRequest(f"a {kind} response_format cannot follow a reasoning model's thought: use json_schema or "
                     "lark_grammar")


def _variables(kwargs: str) -> dict[str, Any] | None:
    """The request's template variables; None when they are not a JSON object or are over the size limit
    (preparation refuses them with its own message, so they are left as they are)."""
    if len(kwargs) > MAX_KWARGS_BYTES:  # NOTE: on the event loop: the size first (characters <= bytes)
        return None
    try:
        value = json.loads(kwargs) if kwargs else {}
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def plan(request: pb.GenerateRequest, reasoning: Reasoning | None, start_of: StartOf) -> ThoughtPlan | None:
    """Set up ``request`` for a reasoning model (see the module doc; changes its variables, its budget's
    effect and its response format); the plan its answer is read by, None when the model does not reason or
    the request has no messages. Raises BadRequest."""
    sp = request.sampling
    budget = sp.thinking_budget_tokens if sp.HasField("thinking_budget_tokens") else None
    if budget is not None and not request.messages:
        raise BadRequest("thinking_budget_tokens needs chat messages (a raw prompt is text to continue)")
    if reasoning is None or not request.messages:
        return None  # NOTE: a model that does not reason in markers: a budget has nothing to bound
    given = _variables(request.chat_template_kwargs)
    variables = given if given is not None else {}
    effort = variables.get("reasoning_effort")
    if effort == "none" and budget is None:
        budget = 0  # NOTE: OpenAI's effort "none": no thought, for templates that know only enable_thinking
    if given is not None and "enable_thinking" not in variables and (budget is not None or effort is not None):
        # NOTE: a budget or an effort asks for a thought, "none" or a budget of 0 for none: for templates that
        # know only enable_thinking (DeepSeek R1's, Qwen3's)
        variables["enable_thinking"] = budget != 0
        request.chat_template_kwargs = json.dumps(variables, ensure_ascii=False)
    start = start_of(variables)
    if start is None:
        return None
    if budget == 0 and start is Start.MAYBE:
        start = Start.CLOSED  # NOTE: the answer's grammar alone: the output may not open a thought
    answer = _answer_grammar(request.response_format)
    if start is not Start.CLOSED and (answer is not None or budget is not None):
        if request.tools and not request.HasField("response_format"):
            # NOTE: gRPC plans its tools' grammar later, in preparation; a budget's grammar here would stand in
            # for it and the calls would come back unread: refused rather than silently degraded
            raise BadRequest("thinking_budget_tokens with tools is not supported on gRPC yet: leave the budget "
                             "unset (the template's own thinking applies) or send no tools")
        # NOTE: framed: the tools' call syntax writes its own message headers (harmony's)
        grammar = reasoning.grammar(start, budget, answer, framed=bool(request.tools))
        request.response_format.CopyFrom(pb.ResponseFormat(lark_grammar=grammar))
        sp.ClearField("json_finish")
        sp.ClearField("json_repeat_penalty")
    return ThoughtPlan(reasoning, start)


@dataclass
class ThoughtEvents:
    """A gRPC request's events with each choice's thought apart: ``Delta.text`` the answer, ``Delta.reasoning``
    the thought, ``Usage.reasoning_tokens`` its tokens; text held at a choice's end is sent in one last delta
    before its ``done``."""

    plan: ThoughtPlan
    readers: dict[int, ThoughtReader] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)

    def events(self, msg: pb.GenerateResponse) -> list[pb.GenerateResponse]:
        kind = msg.WhichOneof("event")
        if kind == "delta":
            d = msg.delta
            reader = self.readers.setdefault(d.choice_index, self.plan.reader())
            thinking = reader.thinking_now
            d.reasoning, d.text = reader.feed(d.text)
            if thinking or d.reasoning:
                self.tokens[d.choice_index] = self.tokens.get(d.choice_index, 0) + \
                    self.plan.thought_tokens(list(d.token_ids), reader.thinking_now)
            return [msg]
        if kind != "done":
            return [msg]
        i = msg.done.choice_index
        msg.done.usage.reasoning_tokens = self.tokens.get(i, 0)
        thought, text = self.readers.setdefault(i, self.plan.reader()).close()
        if not thought and not text:
            return [msg]
        last = pb.GenerateResponse(request_id=msg.request_id,
                                   delta=pb.Delta(text=text, reasoning=thought, choice_index=i))
        return [last, msg]
