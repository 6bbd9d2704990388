"""Batch items -> engine Sequences, and engine events -> item results (shared by upload and worker).

An item is an ``Ask`` of the batch tier (``item_ask``), validated by the
lifecycle's prepare stage exactly as the streaming or JSON call's request,
once at upload and again when it runs (the prepared Sequence is not stored,
only the item's bytes). A reasoning model's item is set up in preparation as
its ``Generate`` or ``GenerateJSON`` request is (``service.api.reasoning.ThoughtAsk``:
budget, effort, the answer's grammar after the thought), and its result keeps
the thought apart from the answer (``ItemResult.reasoning``).
"""

from __future__ import annotations

import struct
from dataclasses import replace

from inference.v1 import batch_pb2 as bpb
from inference.v1 import inference_pb2 as pb

from service.api.ask import Ask, CacheAsk
from service.api.grammar_service import GrammarService
from service.api.intake import Intake
from service.api.reasoning import ThoughtAsk, split_deltas
from service.batch.store import ItemResult, ItemState
from service.request.errors import BadRequest
from service.request.events import Delta, Done, Error, Event
from service.request.sequence import FinishReason, Sequence

MAX_CUSTOM_ID_BYTES = 256
SORT_KEY_TOKENS = 64  # items are started in the order of their first 64 prompt tokens


def check_custom_id(custom_id: str) -> str | None:
    """Why ``custom_id`` is unusable, or None."""
    if not custom_id:
        return "custom_id is empty"
    if len(custom_id.encode()) > MAX_CUSTOM_ID_BYTES:
        return f"custom_id is longer than {MAX_CUSTOM_ID_BYTES} bytes"
    return None


def _check_unsupported(sp: pb.SamplingParams) -> None:
    if sp.HasField("n") and sp.n != 1:
        raise BadRequest("a batch item generates one choice: n must be 1 (send n items instead)")
    if sp.logprobs or sp.echo_prompt_logprobs:
        raise BadRequest("batch results carry no log-probabilities: unset logprobs and echo_prompt_logprobs")


def item_ask(item: bpb.BatchItem, request_id: str, tenant: str | None = None) -> Ask:
    """The item as a request of the batch tier (``tenant``: the job's); raises BadRequest for a bad item."""
    kind = item.WhichOneof("request")
    if kind == "generate":
        g = item.generate
        if g.cancel:
            raise BadRequest("cancel is not an item: use CancelBatch")
        _check_unsupported(g.sampling)
        ask = Ask.generate(g, None, reasons=True)
    elif kind == "generate_json":
        _check_unsupported(item.generate_json.sampling)
        ask = Ask.generate_json(item.generate_json, request_id, None, reasons=True)
    else:
        raise BadRequest("set the item's generate or generate_json request")
    # NOTE: items keep out of the response cache: a follower waiting on an identical running
    # request would hold up the worker's claims, and a job's items are each computed once anyway.
    return replace(ask, request_id=request_id, priority=pb.PRIORITY_BATCH, tenant=tenant, cache=CacheAsk(use=False))


async def prepare(intake: Intake, item: bpb.BatchItem, request_id: str) -> Sequence:
    """The item's Sequence, prepared as it will run (not submitted); raises BadRequest for a bad item."""
    return (await intake.prepare(item_ask(item, request_id)))[0]


def sort_key(seq: Sequence) -> bytes:
    """Big-endian first prompt tokens: byte order puts prompts with a shared prefix next to each other."""
    ids = seq.token_ids[:SORT_KEY_TOKENS]
    return struct.pack(f">{len(ids)}I", *ids)


FINISH = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.CLOSED: "closed",
}


def _output(events: list[Event], thought: ThoughtAsk | None) -> tuple[str | None, str, int]:
    """(thought, answer, the thought's tokens) of a run's output (``thought``: its Ask's, as preparation set it
    up); the thought is None when the output was not read for one (all of it is the answer; a model that does not
    reason, whose plan only drops an answer header: Functionary v3.2's)."""
    deltas = [e for e in events if isinstance(e, Delta)]
    said, answer, tokens = split_deltas(thought, deltas)
    reasons = thought is not None and thought.plan is not None and not thought.plan.headed
    return (said if reasons else None), answer, tokens


async def outcome(
    events: list[Event], json_item: bool, schema: str, grammar: GrammarService, thought: ThoughtAsk | None = None
) -> tuple[ItemState, ItemResult]:
    """The stored state and result of a finished item run (its last event is Done or Error); ``schema`` is
    the JSON Schema its document is checked against ("" for none), ``json_item`` a GenerateJSON item's;
    ``thought`` the run's reasoning set-up: the result's text is then the answer, its thought apart."""
    last = events[-1]
    said, text, thought_tokens = _output(events, thought)
    if isinstance(last, Error):
        return ItemState.FAILED, ItemResult(text=text, error_status=last.status, error_message=last.message,
                                            reasoning=said, reasoning_tokens=thought_tokens)
    assert isinstance(last, Done)
    result = ItemResult(
        text=text,
        finish_reason=FINISH.get(last.finish_reason, ""),
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=last.cached_tokens,
        queue_ms=last.queue_ms,
        ttft_ms=last.ttft_ms,
        total_ms=last.total_ms,
        reasoning=said,
        reasoning_tokens=thought_tokens,
    )
    if last.finish_reason is FinishReason.CANCELLED:
        return ItemState.CANCELLED, result
    # NOTE: a generate item with a json_schema response format is checked as its live request is (a
    # document that ended: stop or closed); a cut-off one keeps finish_reason length, as on Generate.
    if json_item or (schema and last.finish_reason in (FinishReason.STOP, FinishReason.CLOSED)):
        problem = await _json_problem(schema, text, last, grammar)
        if problem is not None:
            return ItemState.FAILED, replace(result, error_status=problem[0], error_message=problem[1])
    return ItemState.COMPLETED, result


async def _json_problem(schema: str, text: str, done: Done, grammar: GrammarService) -> tuple[str, str] | None:
    """As GenerateJSON: a cut-off document is OUT_OF_RANGE, an invalid one the validator's status."""
    if done.finish_reason is FinishReason.LENGTH:
        return "OUT_OF_RANGE", f"JSON document cut off at max_tokens={done.completion_tokens}; raise max_tokens"
    try:
        grammar.validate(await grammar.compiled("json_schema", schema, record=False), text)
    except BadRequest as exc:
        return exc.status, str(exc)
    return None
