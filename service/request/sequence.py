"""Per-request state: one ``Sequence`` object owns everything about a request.

The scheduler, the KV manager and the engine all read and write this object;
nothing per-request lives anywhere else (no slots).

Token layout of a sequence (the "one counter" design)::

    token_ids: [ p0 p1 ... p(n-1) | g0 g1 ... g(k-1) ]
                 prompt              generated (last one not yet computed)
    num_computed ──────────────────────────▶ (tokens whose KV is in the cache)

Every step schedules ``len(token_ids) - num_computed`` tokens (capped by the
step budget): a fresh prompt, a prefill chunk, a resumed (preempted) sequence
and a decode step are all the same code path.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

import numpy as np

from service.request.constraints import FinishBudget, KeyFilter, Matcher
from service.request.text_stream import TextStream


class Priority(IntEnum):
    """Scheduling tier; lower value is served first."""

    INTERACTIVE = 0
    BATCH = 1


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(Enum):
    STOP = "stop"
    LENGTH = "length"
    CLOSED = "closed"  # a JSON document closed early by its shortest completion (json_finish)
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class SamplingParams:
    """Validated decoding parameters (see ``SamplingParams`` in the proto)."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False  # report each generated token's log-probability
    top_logprobs: int = 0  # ... and this many most likely alternatives
    n: int = 1  # choices of the request (each choice is its own Sequence)
    echo_prompt_logprobs: bool = False  # report the prompt tokens' log-probabilities
    frequency_penalty: float = 0.0  # OpenAI: logit -= count in the output so far * this
    presence_penalty: float = 0.0  # OpenAI: logit -= this for tokens in the output so far
    repetition_penalty: float = 1.0  # llama.cpp: over the last 64 context tokens (1 = off)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted by id
    json_finish: bool = False  # close a JSON document within max_tokens (JSON_FINISH_CLOSE_WITHIN_BUDGET)
    json_repeat_penalty: float = 0.0  # DRY-style penalty on repeats where JSON output is free text

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Any of logit_bias / frequency / presence / repetition penalty is on (the sampler's extra pass)."""
        return bool(
            self.logit_bias
            or self.frequency_penalty
            or self.presence_penalty
            or self.repetition_penalty != 1.0
        )


_uid = itertools.count(1)


@dataclass(eq=False)
class Sequence:
    """All state of one request.

    ``emit`` is called on the engine thread with each event (delta, done or
    error); the servicer supplies a function that hands it to the event loop.
    """

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    priority: Priority = Priority.INTERACTIVE
    emit: Callable[[Any], None] = lambda _e: None
    deadline: float | None = None  # time.monotonic() value, or None
    matcher: Matcher | None = None  # grammar state for constrained output (service.json_grammar)
    grammar: Any = None  # the CompiledGrammar behind ``matcher``
    text: TextStream | None = None
    uid: int = field(default_factory=lambda: next(_uid))
    arrival: float = field(default_factory=time.monotonic)

    num_prompt_tokens: int = 0
    num_computed: int = 0
    num_cached: int = 0  # prompt tokens served from the prefix cache (first admission)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks
    lane: int | None = None  # llama.cpp sequence id while running
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    preemptions: int = 0
    # Queue ordering: preempted sequences return to the front of their tier.
    queue_key: tuple[float, ...] = (1, 0.0)
    enqueued_at: float = 0.0  # when it last entered the waiting queue (aging is measured from here)
    promoted: bool = False  # a batch request admitted by aging keeps interactive rank while it runs

    first_scheduled: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    rng: np.random.Generator | None = None
    trace: Any = None  # request tracing handle (service.observability.telemetry), or None
    tenant: str = "anonymous"  # who sent it (service.security.auth); fair share and quotas are per tenant
    # Output produced by the current step, drained by the engine's emit.
    out_tokens: list[int] = field(default_factory=list)
    out_text: str = ""
    error: str | None = None
    error_status: str = "INTERNAL"
    keys: KeyFilter | None = None  # against duplicate object keys (json_schema output; grammar.json_keys)
    budget: FinishBudget | None = None  # budget-aware completion state (engine.json_finish), json_finish only
    paused: bool = False  # not scheduled while its client does not read (engine thread writes it)
    closed: bool = False  # its terminal event was delivered (event loop writes it)
    # -- several choices of one request (SamplingParams.n) and log-probabilities --------
    choice_index: int = 0
    group: tuple[Sequence, ...] = ()  # every choice of the request (empty when n == 1)
    after: Sequence | None = None  # admitted only once this choice's prompt is computed (prefill sharing)
    prompt_done: bool = False  # the whole prompt has been computed once (sticky)
    pending_logprob: Any = None  # logprobs.TokenLogprob of the token just sampled (engine thread)
    out_logprobs: list[Any] = field(default_factory=list)  # parallel to out_tokens
    prompt_logprobs: list[Any] = field(default_factory=list)  # of prompt tokens 1.., while echoing
    prompt_logprobs_sent: bool = False
    num_draft: int = 0  # speculative tokens at the end of token_ids, not accepted yet
    recompute_until: int = 0  # tokens whose KV existed before the last preemption (recomputed on resume)

    def __post_init__(self) -> None:
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)
        self.queue_key = (1, self.arrival)
        self.enqueued_at = self.arrival
        seed = self.params.seed
        self.rng = np.random.default_rng(seed)

    # -- derived counts ---------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    def drop_drafts(self) -> None:
        """Forget the speculative tokens (they were never accepted, so never output)."""
        if self.num_draft:
            del self.token_ids[-self.num_draft :]
            self.num_draft = 0

    @property
    def needs_prompt_rows(self) -> bool:
        """Every prompt position must produce logits (echo_prompt_logprobs not yet reported)."""
        return self.params.echo_prompt_logprobs and not self.prompt_logprobs_sent

    def may_start(self) -> bool:
        """False while the choice it shares its prompt with has not computed that prompt."""
        a = self.after
        return a is None or a.prompt_done or a.status is SeqStatus.FINISHED

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def reset_for_recompute(self) -> None:
        """Forget all KV state; generated tokens are kept and recomputed on resume."""
        self.drop_drafts()
        self.recompute_until = max(self.recompute_until, self.num_computed)
        self.num_computed = 0
        self.block_table = []
        self.lane = None
        self.status = SeqStatus.WAITING
        self.preemptions += 1
        # NOTE: resumed before fresh work; the most-preempted first, then the oldest.
        self.queue_key = (0, -float(self.preemptions), self.arrival)
