"""A gRPC request's events with tools -> protos that carry the answer's text and its calls, parsed.

The answer is generated in the model family's call syntax under its grammar
(``service.api.call_plan``) and read back as it comes by the reader the HTTP API
uses (``service.api.tool_calls.CallReader``), one per choice:

* ``Delta.text`` carries only the answer's text: the call syntax is held back;
* a call goes out once complete (the next call began, or the answer ended), whole
  and checked against its function's schema, in ``Delta.tool_calls``;
* the choice's ``Done`` lists every call sent (``Done.tool_calls``) with
  ``FINISH_REASON_TOOL_CALLS`` when the answer ended with calls; a choice cut off by
  ``max_tokens`` keeps ``FINISH_REASON_LENGTH`` and lists the calls completed before;
* a call whose arguments break a keyword the grammar could not enforce ends the
  request with INVALID_ARGUMENT, reason ``schema_not_enforced``, naming the keyword,
  where it broke and the tool's parameters (``failed``: the request's terminal event
  was this error; its later events are dropped by the stream).
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.v1 import inference_pb2 as pb

from service.api.call_plan import CallAsk
from service.api.proto_convert import error_proto
from service.api.tool_calls import CallFailed, CallReader, Json, ToolPlan
from service.request.events import SCHEMA_NOT_ENFORCED


def call_protos(calls: Sequence[Json]) -> list[pb.ToolCall]:
    return [pb.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"]) for c in calls]


def call_error(exc: CallFailed, plan: ToolPlan) -> pb.Error:
    """The Error of an answer that did not read back into valid calls."""
    if exc.keyword:
        return error_proto("INVALID_ARGUMENT", f"{plan.param(exc.tool)}: {exc}", reason=SCHEMA_NOT_ENFORCED)
    return error_proto("INTERNAL", f"generated tool call does not follow the call syntax: {str(exc)[:200]}")


class CallEvents:
    """One request's events read into calls (see the module docstring); event loop only."""

    def __init__(self, ask: CallAsk) -> None:
        self.ask = ask
        self.readers: dict[int, CallReader] = {}
        self.failed = False

    def messages(self, msg: pb.GenerateResponse) -> list[pb.GenerateResponse]:
        """The messages of one event's message (an error of the request's calls instead: ``failed`` is then
        set; none once it is). NOTE: read after a reasoning model's thought is split off (``Delta.text``
        is then the answer alone, ``service.api.reasoning.ThoughtEvents``)."""
        plan, kind = self.ask.plan, msg.WhichOneof("event")
        if self.failed:
            return []
        if plan is None or kind not in ("delta", "done"):  # no calls to read; errors pass as they are
            return [msg]
        index = msg.delta.choice_index if kind == "delta" else msg.done.choice_index
        if index not in self.readers:
            self.readers[index] = CallReader.of(plan)
        reader = self.readers[index]
        try:
            return self._delta(msg, reader) if kind == "delta" else self._done(msg, reader)
        except CallFailed as exc:
            self.failed = True
            return [pb.GenerateResponse(request_id=msg.request_id, error=call_error(exc, plan))]

    @staticmethod
    def _delta(msg: pb.GenerateResponse, reader: CallReader) -> list[pb.GenerateResponse]:
        text, _ = reader.feed(msg.delta.text)
        msg.delta.text = text
        msg.delta.tool_calls.extend(call_protos(reader.complete_calls(ended=False)))
        return [msg]

    @staticmethod
    def _done(msg: pb.GenerateResponse, reader: CallReader) -> list[pb.GenerateResponse]:
        d = msg.done
        stop = d.finish_reason == pb.FINISH_REASON_STOP
        text, _ = reader.close(stop)
        last = call_protos(reader.complete_calls(ended=True)) if stop else []
        out = []
        if text or last:  # what the end of the answer completed, before its Done
            delta = pb.Delta(text=text, choice_index=d.choice_index, tool_calls=last)
            out.append(pb.GenerateResponse(request_id=msg.request_id, delta=delta))
        d.tool_calls.extend(call_protos(reader.calls[: reader.handed]))
        if stop and reader.calls:
            d.finish_reason = pb.FINISH_REASON_TOOL_CALLS
        out.append(msg)
        return out
