"""The one way into the engine for every front end: ready check, prepare, submit, abort.

Generate streams, GenerateJSON, the batch worker and the batch servicer all go
through one ``Intake``; none of them holds the gRPC servicer.

Contract:

* ``unavailable(need)`` says why the server does not answer a call now, or
  None; it is the only place these conditions are decided. The rule, by what
  the call needs (``Need``; every method of both services names its need):

  ====================  =========  =============  ========
  need                  loading    engine failed  draining
  ====================  =========  =============  ========
  ``WORK`` (engine)     refused    refused        refused
  ``MODEL`` (read)      refused    answered       answered
  ``STORE`` (batch db)  answered   answered       answered
  ====================  =========  =============  ========

  A refusal is UNAVAILABLE with the reason in the message and in the trailing
  metadata key ``inference-unavailable-reason`` (``loading``, ``draining``,
  ``engine_failed``: the last two mean "retry on another replica");
* ``prepare`` validates request fields into a ``Sequence`` (not submitted;
  raises ``BadRequest``), ``prepare_choices`` one per choice (``n``);
* ``submit`` applies the tenant's quotas and admits into the engine;
  ``QueueFull`` and ``Draining`` propagate, and telemetry and the response
  cache have seen the request's end when they do;
* ``rejection(exc)`` is the one mapping of a refused submit to a status.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb

from service.api.cache_front import CacheFront
from service.api.grammar_service import GrammarService
from service.api.request_builder import RequestBuilder
from service.continuous_batcher import Draining, Engine
from service.observability.telemetry import Telemetry
from service.priority import QueueFull
from service.request.choices import link_choices
from service.request.constraints import FinishBudget
from service.request.errors import BadRequest
from service.request.events import DRAINING, ENGINE_FAILED, LOADING, Error
from service.request.sequence import Sequence
from service.request.text_stream import TextStream
from service.security.auth import current_tenant
from service.security.tenancy import Tenancy

DEADLINE_MARGIN_S = 0.05
REASON_METADATA_KEY = "inference-unavailable-reason"


class Need(Enum):
    """What a call needs from the server, which decides when it is refused (see the module docstring)."""

    WORK = "work"  # starts engine work: Generate (each request), GenerateJSON, CreateBatch
    MODEL = "model"  # reads the loaded model or engine: Tokenize, Detokenize, CountTokens, GetModelInfo, GetMetrics
    STORE = "store"  # reads or cancels stored batch jobs: GetBatch, ListBatches, WatchBatch, GetBatchResults, ...


@dataclass(frozen=True)
class Unavailable:
    """Why a call is refused: the status message and the machine-readable reason."""

    reason: str  # service.request.events.LOADING, DRAINING or ENGINE_FAILED
    message: str


@dataclass(frozen=True)
class Rejection:
    """Why a submit was refused, as a front end answers it."""

    status: str  # gRPC status name
    message: str
    retry_after_ms: int = 0
    quota: str = ""  # the tenant quota that refused it, if one did
    reason: str = ""  # UNAVAILABLE: draining or engine_failed (retry on another replica)

    def error(self) -> Error:
        """The refusal as a request's error event."""
        return Error(self.status, self.message, self.reason)


def rejection(exc: QueueFull | Draining) -> Rejection:
    """A full queue or quota is RESOURCE_EXHAUSTED with its retry hint; draining or failed, UNAVAILABLE."""
    if isinstance(exc, QueueFull):
        return Rejection("RESOURCE_EXHAUSTED", str(exc), exc.retry_after_ms, exc.quota)
    return Rejection("UNAVAILABLE", f"{exc}; retry on another replica", 1000, reason=exc.reason)


def unavailable_metadata(reason: str) -> tuple[tuple[str, str], ...]:
    """Trailing metadata of an RPC that failed UNAVAILABLE for ``reason`` (none for no reason)."""
    return ((REASON_METADATA_KEY, reason),) if reason else ()


def budget_for(seq: Sequence) -> FinishBudget | None:
    """Budget-aware completion state for a ``json_finish`` request; refuses one that cannot fit.

    Raises BadRequest(OUT_OF_RANGE) naming the minimum when even the shortest
    valid document is longer than max_tokens.
    """
    shortest = seq.grammar.min_tokens if seq.grammar is not None else None
    if not seq.params.json_finish or shortest is None:
        return None  # NOTE: no completion found from the start: the request behaves as without it
    if shortest > seq.params.max_tokens:
        raise BadRequest(
            f"max_tokens={seq.params.max_tokens} is below the shortest valid document for this schema "
            f"({shortest} tokens); raise max_tokens to at least {shortest}",
            "OUT_OF_RANGE",
        )
    return FinishBudget(known=shortest)


def rpc_deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The request's deadline: the RPC's, a little early.

    NOTE: ending a request just before the RPC's own deadline lets the client
    receive the server's event saying why (expired while queued) instead of a
    bare DEADLINE_EXCEEDED from its own timer.
    """
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return time.monotonic() + remaining - min(DEADLINE_MARGIN_S, remaining / 10)


class Intake:
    """Prepares and submits requests into one Engine (event loop only)."""

    # NOTE: built before the model loads (the server listens and answers health
    # NOT_SERVING meanwhile); ``attach`` supplies the engine once ready.
    engine: Engine
    builder: RequestBuilder
    grammar: GrammarService

    def __init__(self, telemetry: Telemetry, tenancy: Tenancy, cache: CacheFront) -> None:
        self.telemetry, self.tenancy, self.cache = telemetry, tenancy, cache
        self.ready = False

    def attach(self, engine: Engine, builder: RequestBuilder, grammar: GrammarService) -> None:
        self.engine, self.builder, self.grammar = engine, builder, grammar
        self.ready = True

    def unavailable(self, need: Need = Need.WORK) -> Unavailable | None:
        """Why a call with this ``need`` is refused now, or None (the rule of the module docstring)."""
        if need is Need.STORE:
            return None
        if not self.ready:
            return Unavailable(LOADING, "model is loading; retry shortly")
        if need is Need.MODEL:
            return None
        if self.engine.failure is not None:
            return Unavailable(ENGINE_FAILED, f"engine failed ({self.engine.failure}); retry on another replica")
        if self.engine.draining:
            return Unavailable(DRAINING, "server is shutting down; retry on another replica")
        return None

    async def require(self, context: grpc.aio.ServicerContext, need: Need) -> None:
        """Abort the RPC with UNAVAILABLE (reason in the trailing metadata) if ``unavailable(need)``."""
        if (why := self.unavailable(need)) is not None:
            context.set_trailing_metadata(unavailable_metadata(why.reason))
            await context.abort(grpc.StatusCode.UNAVAILABLE, why.message)

    async def prepare(
        self,
        request_id: str,
        prompt: str,
        messages: Any,
        sampling: pb.SamplingParams,
        priority: int,
        fmt: tuple[str, str] | None,
        deadline: float | None,
        json_mode: bool = False,
        raw_prompt: bool = False,
    ) -> Sequence:
        """Validate a request into a ready-to-submit Sequence; raises BadRequest.

        ``json_mode`` (GenerateJSON): a bare prompt is rendered as one user turn
        through the model's own chat template unless ``raw_prompt`` (or the
        model has none).
        """
        prio = self.builder.priority(priority)
        if json_mode and prompt and not messages and not raw_prompt and self.builder.template.from_model:
            prompt, messages = "", [pb.ChatMessage(role="user", content=prompt)]
        ids = self.builder.prompt_ids(prompt, list(messages))
        json_output = json_mode or (fmt is not None and fmt[0] == "json_schema")
        params = self.builder.sampling(sampling, len(ids), json_mode=json_mode, json_output=json_output)
        if params.stop and json_output:
            raise BadRequest(
                "stop strings cannot be combined with a JSON Schema: a document cut at a stop string "
                "would not be valid JSON (the grammar ends the document itself)"
            )
        seq = Sequence(request_id=request_id, token_ids=ids, params=params, priority=prio, deadline=deadline)
        seq.tenant = current_tenant()  # set by service.security.auth's interceptor
        seq.text = TextStream(self.builder.vocab.token_bytes, params.stop)
        if fmt is not None:
            seq.matcher, seq.grammar = await self.grammar.matcher_for(*fmt)
            seq.keys = self.grammar.key_guard(fmt[0])
            seq.budget = budget_for(seq)
        return seq

    async def prepare_choices(self, request_id: str, *args: Any) -> list[Sequence]:
        """``prepare`` once per choice (SamplingParams.n), linked to share one prompt; raises BadRequest."""
        first = await self.prepare(request_id, *args)
        rest = [await self.prepare(request_id, *args) for _ in range(1, first.params.n)]
        return link_choices([first, *rest])

    def submit(self, seq: Sequence) -> None:
        """Submit; QueueFull/Draining propagate to the caller (telemetry sees them as the request's end)."""
        self.telemetry.on_submit(seq)
        try:
            self.tenancy.submit(seq, self.engine.submit)  # per-tenant quotas first (QuotaExceeded)
        except (QueueFull, Draining) as exc:
            self.telemetry.on_finish(seq, rejection(exc).error())
            self.cache.submitted(seq, False)
            raise
        self.cache.submitted(seq, True)

    def finished(self, seq: Sequence, event: Any) -> None:
        """A request's terminal event reached its front end (telemetry ends its span)."""
        self.telemetry.on_finish(seq, event)

    def abort(self, seq: Sequence, error: Error | None = None) -> None:
        """Cancel ``seq`` wherever it is (its terminal event follows from the engine)."""
        self.engine.abort(seq, error)

    def pause(self, seq: Sequence, paused: bool) -> None:
        self.engine.pause(seq, paused)
