"""A reasoning model's chat request: where its output starts, its thinking budget, and the grammar of thought + answer.

Every dialect's body ends in one ``GenerateRequest``; for a model whose template
reasons in markers (``service.chat.thinking``) ``with_reasoning`` then decides,
from the request's template variables (``enable_thinking``, ``reasoning_effort``,
...), where the output starts (``ChatTemplate.thought_start``) and how it is
constrained:

* ``SamplingParams.thinking_budget_tokens`` (llama-server's
  ``thinking_budget_tokens``; Anthropic's ``thinking.budget_tokens``): the thought
  has at most that many tokens, then the family's end marker is forced; 0 turns
  thinking off: ``enable_thinking: false`` unless the request sets it, and a
  prompt that still opens the thought has it closed at once; ``reasoning_effort``
  is the template's variable of that name, and sets ``enable_thinking`` (unless
  the request does): true, or false for ``"none"`` (also a budget of 0);
* a request with a constraint of its own (a JSON Schema ``response_format``, the
  tools' call grammar) has it applied to the answer after the thought: the
  output's grammar is the free thought up to the end marker, then the answer's
  grammar (``service.chat.thought.grammar``). NOTE: a JSON Schema becomes a
  ``%json`` item of that grammar, so the document is not closed within the budget
  (``json_finish``) there: it is generated under the schema and validated at the
  end as any other.

The answer (``service.http.answer``) reads each choice's output through a
``ThoughtReader`` from the start found here (``Output.thought``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.chat.syntax import json_rule
from service.chat.thinking import Start
from service.chat.thought import Reasoning, ThoughtReader
from service.http.errors import bad_param

BUDGET = "thinking_budget_tokens"
MAX_BUDGET = 1 << 20
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


def budget_of(raw: Any, param: str = BUDGET) -> int | None:
    """A thinking budget (tokens, 0 .. 2^20) or None; 400 naming ``param`` otherwise."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_BUDGET:
        raise bad_param(param, f"{param} must be an integer from 0 to {MAX_BUDGET}")
    return raw


def _answer_grammar(fmt: pb.ResponseFormat) -> str | None:
    """The request's own constraint as the Lark grammar of the answer (None: free text)."""
    kind = fmt.WhichOneof("format")
    if kind is None:
        return None
    if kind == "lark_grammar":
        return fmt.lark_grammar
    if kind == "json_schema":
        return f"start: {json_rule(json.loads(fmt.json_schema))}\n"
    raise bad_param("response_format", f"a {kind} constraint cannot follow a reasoning model's thought")


def plan(request: pb.GenerateRequest, reasoning: Reasoning | None, start_of: StartOf) -> ThoughtPlan | None:
    """Set up ``request`` for a reasoning model (see the module doc; changes its variables, its budget's
    effect and its response format); the plan its answer is read by, None when the model does not reason."""
    if reasoning is None or not request.messages:
        return None
    sp = request.sampling
    budget = sp.thinking_budget_tokens if sp.HasField("thinking_budget_tokens") else None
    variables: dict[str, Any] = json.loads(request.chat_template_kwargs) if request.chat_template_kwargs else {}
    effort = variables.get("reasoning_effort")
    if effort == "none" and budget is None:
        budget = 0  # NOTE: OpenAI's effort "none": no thought, for templates that know only enable_thinking
    if "enable_thinking" not in variables and (budget == 0 or effort is not None):
        # NOTE: an effort asks for a thought, "none" or a budget of 0 for none: for templates that know only
        # enable_thinking (DeepSeek R1's, Qwen3's)
        variables["enable_thinking"] = budget != 0
        request.chat_template_kwargs = json.dumps(variables, ensure_ascii=False)
    start = start_of(variables)
    if start is None:
        return None
    if budget == 0 and start is Start.MAYBE:
        start = Start.CLOSED  # NOTE: the answer's grammar alone: the output may not open a thought
    answer = _answer_grammar(request.response_format)
    if start is not Start.CLOSED and (answer is not None or budget is not None):
        request.response_format.CopyFrom(pb.ResponseFormat(lark_grammar=reasoning.grammar(start, budget, answer)))
        sp.ClearField("json_finish")
        sp.ClearField("json_repeat_penalty")
    return ThoughtPlan(reasoning, start)

