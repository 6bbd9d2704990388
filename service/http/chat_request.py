"""The one chat request every dialect builds: neutral turns, tools, an output format, sampling -> a proto.

Chat Completions, Anthropic Messages and OpenAI Responses bodies differ in shape
only. Each dialect's parser reads its body into these neutral pieces, and
``chat_request`` makes the ``inference.v1.GenerateRequest`` a gRPC client would
send, plus the JSON Schema the finished document is validated against:

* ``turns``: system / user / assistant / tool ``ChatMessage``s, earlier calls in
  ``tool_calls`` and results with their ``tool_call_id`` (the model's chat
  template renders them: ``service.chat``);
* a ``ToolPlan`` (``service.http.tools.plan_functions``): its functions become
  ``GenerateRequest.tools``; its grammar, in the model family's call syntax, is
  set once the model's format is known (``service.http.requests.with_format``);
* a ``Format``: ``json_object`` or a JSON Schema, constrained by the same
  grammar path as ``GenerateJSON`` and validated again at the end. Tools and a
  format do not mix (a 400 naming the format's parameter);
* template variables (``chat_template_kwargs``, ``reasoning_effort``):
  ``GenerateRequest.chat_template_kwargs``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.http.errors import bad_param
from service.http.tools import ToolPlan


@dataclass(frozen=True)
class Format:
    """A JSON output format: the JSON Schema (as text) the output is generated under and validated against."""

    schema: str


JSON_OBJECT = Format('{"type": "object"}')


def json_schema(schema: Any, param: str) -> Format:
    """The format of a JSON Schema given as ``param`` (absent: any JSON value); 400 if it is not an object."""
    if schema is None:
        schema = {}
    if not isinstance(schema, dict):
        raise bad_param(param, f"'{param}' must be a JSON Schema object")
    return Format(json.dumps(schema))


def template_kwargs(variables: dict[str, Any]) -> str:
    """``GenerateRequest.chat_template_kwargs`` of the variables a body sets ("" for none)."""
    return json.dumps(variables, ensure_ascii=False) if variables else ""


def chat_request(
    turns: list[pb.ChatMessage],
    sampling: pb.SamplingParams,
    priority: pb.Priority,
    plan: ToolPlan | None = None,
    fmt: Format | None = None,
    fmt_param: str = "response_format",
) -> tuple[pb.GenerateRequest, str | None]:
    """The request and the schema its finished output must validate against (None: no final validation).

    Raises ApiError 400 naming ``fmt_param`` when both tools and a format are given.
    """
    if plan is not None and fmt is not None:
        raise bad_param(fmt_param, f"{fmt_param} cannot be combined with tools")
    req = pb.GenerateRequest(messages=turns, sampling=sampling, priority=priority)
    if plan is not None:
        req.tools.extend(plan.protos())
        return req, None
    if fmt is not None:
        req.response_format.CopyFrom(pb.ResponseFormat(json_schema=fmt.schema))
        return req, fmt.schema
    return req, None
