"""The drain rule: when the server refuses a call, by what the call needs (``Need``).

Every method of both services and every HTTP route names its need; the rule
is decided in one place, ``Readiness.unavailable``:

====================  =========  =============  ========
need                  loading    engine failed  draining
====================  =========  =============  ========
``WORK`` (engine)     refused    refused        refused
``MODEL`` (read)      refused    answered       answered
``STORE`` (batch db)  answered   answered       answered
====================  =========  =============  ========

A refusal is UNAVAILABLE with the reason in the message and in the trailing
metadata key ``inference-unavailable-reason`` (``loading``, ``draining``,
``engine_failed``: the last two mean "retry on another replica").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import grpc

from service.request.events import DRAINING, ENGINE_FAILED, LOADING

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


class EngineState(Protocol):
    """What the rule reads of the engine."""

    @property
    def failure(self) -> str | None: ...
    @property
    def draining(self) -> bool: ...


def unavailable(engine: EngineState | None, need: Need) -> Unavailable | None:
    """Why a call with this ``need`` is refused now (``engine`` None: still loading), or None."""
    if need is Need.STORE:
        return None
    if engine is None:
        return Unavailable(LOADING, "model is loading; retry shortly")
    if need is Need.MODEL:
        return None
    if engine.failure is not None:
        return Unavailable(ENGINE_FAILED, f"engine failed ({engine.failure}); retry on another replica")
    if engine.draining:
        return Unavailable(DRAINING, "server is shutting down; retry on another replica")
    return None


def unavailable_metadata(reason: str) -> tuple[tuple[str, str], ...]:
    """Trailing metadata of an RPC that failed UNAVAILABLE for ``reason`` (none for no reason)."""
    return ((REASON_METADATA_KEY, reason),) if reason else ()


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
