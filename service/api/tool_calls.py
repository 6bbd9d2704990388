"""A request's tools as the answer's shape, and the reader of the model's calls: shared by every front end.

``ToolPlan`` says how a request's tools shape its output (the mode: "auto", "required" or
a "named" function; whether several calls may come; the model's ``ToolFormat``) and gives
the Lark grammar of the answer in the model family's call syntax. ``CallReader`` reads
one choice's answer as it is generated: the text before the calls is the answer's
content, each call gets an id (``call_<hex>``) and its arguments exactly as the model
wrote them, validated against the function's schema with ``jsonschema`` at the end.

Contract of ``CallReader`` (what the HTTP dialects and the gRPC servicer rely on):
``feed(text)`` and ``close(complete)`` return (new content, OpenAI-shaped call deltas);
``content`` and ``calls`` hold the whole answer read so far; a failure raises
``CallFailed`` (the front end turns it into its own error).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import jsonschema
from inference.v1 import inference_pb2 as pb

from service.chat.calls import Args, Begin, CallSyntaxError, Content, Function, Piece
from service.chat.reader import Stream
from service.chat.tool_format import ToolFormat

Json = dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    """How a request's tools shape its output; ``fmt``: the model's tool-call format (set once known)."""

    mode: str  # "named" | "required" | "auto"
    functions: tuple[Function, ...]
    named: str = ""  # the function of mode "named"
    parallel: bool = True
    fmt: ToolFormat | None = None
    where: str = "tools[{}].function.parameters"  # the request's name of a tool's parameters ({}: its index)

    def param(self, tool: int) -> str:
        """Where tool ``tool``'s parameters are in the request (an error names them)."""
        return self.where.format(tool)

    @property
    def allowed(self) -> tuple[Function, ...]:
        """The functions the answer may call."""
        return tuple(f for f in self.functions if f.name == self.named) if self.mode == "named" else self.functions

    @property
    def schemas(self) -> dict[str, dict[str, Any]]:
        return {f.name: f.parameters for f in self.functions}

    def grammar(self) -> str:
        """The Lark grammar of the answer in the model's syntax (a named function: one call of it)."""
        assert self.fmt is not None
        return self.fmt.grammar(self.allowed, self.mode != "auto", self.parallel and self.mode != "named")

    def protos(self) -> list[pb.Tool]:
        """The tools as the chat template is given them."""
        return [pb.Tool(name=f.name, description=f.description, parameters=json.dumps(f.parameters))
                for f in self.functions]


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class CallFailed(Exception):
    """The answer did not read back into valid calls: text off the call syntax (a server bug: the grammar
    allows none), or, with ``keyword`` set, arguments that broke a keyword of their function's schema the
    grammar could not enforce (checked only after generation); ``tool`` is that function's index."""

    def __init__(self, message: str, keyword: str = "", path: str = "", tool: int = -1) -> None:
        super().__init__(message)
        self.keyword, self.path, self.tool = keyword, path, tool


def broken(exc: jsonschema.ValidationError, tool: int) -> CallFailed:
    """The CallFailed of arguments that fail their schema: the keyword and where (a JSON pointer)."""
    path = "/" + "/".join(str(p) for p in exc.absolute_path)
    message = (f"the model's output broke `{exc.validator}` at {path}, a keyword this server checks only "
               f"after generation ({exc.message[:200]})")
    return CallFailed(message, str(exc.validator), path, tool)


@dataclass
class CallReader:
    """One choice's answer read as it is generated: its content and its calls (ids given here), as OpenAI's
    stream deltas (``feed``) and as the final message (``content``, ``calls``)."""

    plan: ToolPlan
    stream: Stream
    content: str = ""
    calls: list[Json] = field(default_factory=list)
    handed: int = 0  # calls handed out whole by ``complete_calls``

    @classmethod
    def of(cls, plan: ToolPlan) -> Self:
        assert plan.fmt is not None
        return cls(plan, plan.fmt.stream(plan.allowed))

    def feed(self, text: str) -> tuple[str, list[Json]]:
        """(new content, tool-call deltas) of the next text; raises CallFailed for text off the syntax."""
        try:
            return self._pieces(self.stream.feed(text))
        except CallSyntaxError as exc:
            raise CallFailed(str(exc)) from None

    def close(self, complete: bool) -> tuple[str, list[Json]]:
        """The last content and deltas; ``complete`` (finish "stop"): every call is checked against its
        schema (CallFailed). A cut-off answer keeps what was read."""
        try:
            out = self._pieces(self.stream.close())
        except CallSyntaxError as exc:
            if complete:
                raise CallFailed(str(exc)) from None
            return "", []
        if complete:
            self._validate()
        return out

    def _pieces(self, pieces: Sequence[Piece]) -> tuple[str, list[Json]]:
        text, deltas = "", []
        for p in pieces:
            if isinstance(p, Content):
                text += p.text
            elif isinstance(p, Begin):
                self.calls.append({"id": call_id(), "type": "function", "function": {"name": p.name, "arguments": ""}})
                deltas.append({"index": p.index, **json.loads(json.dumps(self.calls[-1]))})
            elif isinstance(p, Args):
                self.calls[p.index]["function"]["arguments"] += p.text
                deltas.append({"index": p.index, "function": {"arguments": p.text}})
        self.content += text
        return text, deltas

    def complete_calls(self, ended: bool) -> list[Json]:
        """The calls complete since the last time, each checked against its schema (CallFailed): while the
        answer goes on, every call but the last (a call is complete once the next begins); once it ``ended``
        (after ``close(True)``), all of them."""
        end = len(self.calls) if ended else max(len(self.calls) - 1, 0)
        out = self.calls[self.handed:end]
        for call in out:
            self._check(call)
        self.handed = max(self.handed, end)
        return out

    def _validate(self) -> None:
        for call in self.calls:
            self._check(call)

    def _check(self, call: Json) -> None:
        fn = call["function"]
        index = next((i for i, f in enumerate(self.plan.functions) if f.name == fn["name"]), -1)
        try:
            jsonschema.validate(json.loads(fn["arguments"]), self.plan.schemas[fn["name"]],
                                cls=jsonschema.Draft202012Validator)
        except jsonschema.ValidationError as exc:
            raise broken(exc, index) from None
        except (ValueError, KeyError) as exc:
            raise CallFailed(str(exc)) from None
