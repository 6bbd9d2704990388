"""What a gRPC request asks of its tools' answer (``tool_choice``, ``parallel_tool_calls``) -> its ``ToolPlan``.

``GenerateRequest.tools`` are rendered by the chat template (``service.chat``); with
them, the answer is generated under the grammar of the model family's call syntax
and read back into calls (``service.api.call_events``), as the HTTP API does:

* ``TOOL_CHOICE_AUTO`` (or unset): free text until the family's trigger, then calls;
* ``TOOL_CHOICE_REQUIRED``: calls from the first token; ``TOOL_CHOICE_FUNCTION``: one
  call of ``tool_choice_function``;
* ``TOOL_CHOICE_NONE``: the tools are left out of the prompt (``Ask.generate``), and
  the answer is text (under a ``response_format``, if one is given);
* with a ``response_format`` the tools are only rendered (the caller's format is the
  constraint, nothing is read back: how the HTTP API hands over its own grammar).

``CallAsk`` is built on the event loop from the request's scalar fields (cheap); the
prepare stage's worker thread plans it (``prepare``: every function's schema checked, the
grammar written), and the front end reads the plan from it when the events arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb

from service.api.chat_input import functions
from service.api.input_limits import InputLimits
from service.api.tool_calls import ToolPlan
from service.chat.tool_format import ToolFormat
from service.request.errors import BadRequest

MODES: dict[int, str] = {  # ToolChoice -> the mode of a ToolPlan ("none": no plan)
    pb.TOOL_CHOICE_UNSPECIFIED: "auto", pb.TOOL_CHOICE_AUTO: "auto", pb.TOOL_CHOICE_REQUIRED: "required",
    pb.TOOL_CHOICE_FUNCTION: "named", pb.TOOL_CHOICE_NONE: "none",
}


@dataclass(eq=False)
class CallAsk:
    """A request's tool choice as sent, and its plan once prepared (see the module docstring)."""

    choice: int  # a pb.ToolChoice value (anything a caller sent)
    function: str = ""
    parallel: bool = True
    rendered_only: bool = False  # a response_format is the constraint: no plan, no calls read
    # NOTE: written once by the prepare stage's worker thread, which the event loop awaits before any event
    # of the request exists; the front end reads it from its events (None: no calls to read).
    plan: ToolPlan | None = None
    lark: str = ""  # the plan's grammar

    @classmethod
    def of(cls, req: pb.GenerateRequest) -> CallAsk | None:
        """The ask of a request that has tools or sets a tool field (None: neither)."""
        parallel = req.parallel_tool_calls if req.HasField("parallel_tool_calls") else None
        if not (req.tools or req.tool_choice or req.tool_choice_function or parallel is not None):
            return None
        return cls(req.tool_choice, req.tool_choice_function, parallel is not False, req.HasField("response_format"))

    def prepare(self, tools: Sequence[pb.Tool], fmt: ToolFormat, limits: InputLimits) -> None:
        """Worker thread: check the choice against the tools, then set ``plan`` and ``lark``, the grammar of
        the answer (left unset: nothing to read back); raises BadRequest naming the field."""
        mode = MODES.get(self.choice)
        if mode is None:
            raise BadRequest(f"tool_choice {self.choice} is not a ToolChoice value")
        if (mode == "named") != bool(self.function):
            raise BadRequest("tool_choice_function is set with tool_choice TOOL_CHOICE_FUNCTION, and only then")
        if not tools and mode != "none" and (self.choice or not self.parallel):
            raise BadRequest("tool_choice and parallel_tool_calls need tools")
        if self.rendered_only:
            # NOTE: "none" leaves the tools out, so a format may constrain the text (a family's answer header:
            # service.api.reasoning)
            if (self.choice and mode != "none") or not self.parallel:
                raise BadRequest("tool_choice and parallel_tool_calls cannot be combined with a response_format "
                                 "(the format constrains the output; no calls are read)")
            return
        if mode == "none" or not tools:
            return
        fns = functions(tools, limits)
        if mode == "named" and self.function not in {f.name for f in fns}:
            raise BadRequest(f"tool_choice_function names {self.function[:64]!r}, which is not one of the tools")
        plan = ToolPlan(mode, tuple(fns), self.function, self.parallel, fmt, "tools[{}].parameters")
        self.plan, self.lark = plan, plan.grammar()
