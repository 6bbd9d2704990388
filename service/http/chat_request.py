"""The one chat request every dialect builds: neutral turns, tools, an output format, sampling -> a proto.

Chat Completions, Anthropic Messages and OpenAI Responses bodies differ in shape
only. Each dialect's parser reads its body into these neutral pieces, and
``chat_request`` makes the ``inference.v1.GenerateRequest`` a gRPC client would
send, plus the JSON Schema the finished document is validated against:

* ``turns``: system / user / assistant ``ChatMessage``s, earlier tool calls and
  tool results already rendered as text (``service.http.tools.call_text`` and
  ``result_text``: the chat template knows only these three roles);
* a ``ToolPlan`` (``service.http.tools.plan_functions``): its description joins
  the first system turn (one is added when there is none), its grammar or
  schema constrains the output;
* a ``Format``: ``json_object`` or a JSON Schema, constrained by the same
  grammar path as ``GenerateJSON`` and validated again at the end. Tools and a
  format do not mix (a 400 naming the format's parameter).
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


def with_tools(turns: list[pb.ChatMessage], tools_text: str) -> list[pb.ChatMessage]:
    """``turns`` with the tools' description at the end of the first system turn (or in a new one first)."""
    out = list(turns)
    if out and out[0].role == "system":
        out[0] = pb.ChatMessage(role="system", content=f"{out[0].content}\n\n{tools_text}")
    else:
        out.insert(0, pb.ChatMessage(role="system", content=tools_text))
    return out


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
    if plan is not None:
        turns = with_tools(turns, plan.system_text)
    req = pb.GenerateRequest(messages=turns, sampling=sampling, priority=priority)
    if plan is not None:
        kind, source = plan.fmt
        req.response_format.CopyFrom(pb.ResponseFormat(**{kind: source}))
        if kind == "json_schema" and req.sampling.json_finish == pb.JSON_FINISH_UNSPECIFIED:
            # NOTE: a forced call closed early would carry made-up short arguments and still read as a
            # call to make: cut off by max_tokens it stays text (finish "length") unless the body asks
            req.sampling.json_finish = pb.JSON_FINISH_CUT_OFF
        return req, source if kind == "json_schema" else None
    if fmt is not None:
        req.response_format.CopyFrom(pb.ResponseFormat(json_schema=fmt.schema))
        return req, fmt.schema
    return req, None
