"""The thinking budget of the HTTP dialects, and a reasoning model's chat request set up for them.

``thinking_budget_tokens`` (llama-server's name, on Chat Completions and as an
extension on Responses; Anthropic's ``thinking.budget_tokens``) becomes
``SamplingParams.thinking_budget_tokens``; ``plan`` is the lifecycle's
(``service.api.reasoning``), its refusals as 400s naming ``response_format``.
"""

from __future__ import annotations

from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.reasoning import StartOf, ThoughtPlan
from service.api.reasoning import plan as api_plan
from service.chat.thought import Reasoning
from service.http.errors import bad_param
from service.request.errors import BadRequest

__all__ = ["BUDGET", "StartOf", "ThoughtPlan", "budget_of", "plan"]
BUDGET = "thinking_budget_tokens"
MAX_BUDGET = 1 << 20


def budget_of(raw: Any, param: str = BUDGET) -> int | None:
    """A thinking budget (tokens, 0 .. 2^20) or None; 400 naming ``param`` otherwise."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_BUDGET:
        raise bad_param(param, f"{param} must be an integer from 0 to {MAX_BUDGET}")
    return raw


def plan(request: pb.GenerateRequest, reasoning: Reasoning | None, start_of: StartOf,
         header: Reasoning | None = None) -> ThoughtPlan | None:
    """``service.api.reasoning.plan``; a refusal is a 400 naming ``response_format``."""
    try:
        return api_plan(request, reasoning, start_of, header)
    except BadRequest as exc:
        raise bad_param("response_format", str(exc)) from None
