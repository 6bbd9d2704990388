"""The lifecycle's prepare stage: an ``Ask`` -> ready-to-submit ``Sequence``s, off the event loop.

Rendering the chat, tokenizing and validating the sampling fields cost time
that grows with the input, so they run in this module's own bounded thread
pool (``WORKERS`` threads, the intake's), never on the event loop that answers every other call;
grammar compilation has its own pool (``GrammarService``). Sizes are checked
before the expensive work: a prompt whose bytes cannot fit the context is
refused before it is rendered or tokenized (``RequestBuilder.prompt_ids``).

Contract: ``prepare`` returns the request's choices (``SamplingParams.n``,
linked to share one prompt), not submitted; every bad field is a
``BadRequest`` with its status.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from dataclasses import dataclass, replace

from inference.v1 import inference_pb2 as pb

from service.api.ask import Ask
from service.api.grammar_service import GrammarService
from service.api.request_builder import RequestBuilder
from service.request.choices import link_choices
from service.request.constraints import FinishBudget
from service.request.errors import BadRequest
from service.request.sequence import Priority, SamplingParams, Sequence
from service.request.text_stream import TextStream

# NOTE: two threads: preparation is CPU work (jinja rendering holds the GIL, llama.cpp's tokenizer
# releases it) and the machine this is sized for has two cores besides the engine's thread.
WORKERS = 2


@dataclass(frozen=True)
class Plan:
    """What the worker thread computed for a request: its prompt tokens and validated fields."""

    token_ids: tuple[int, ...]
    params: SamplingParams
    priority: Priority


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


class Preparer:
    """Prepares requests for one loaded model (see the module docstring)."""

    def __init__(self, builder: RequestBuilder, grammar: GrammarService, pool: Executor) -> None:
        self.builder, self.grammar, self._pool = builder, grammar, pool

    async def prepare(self, ask: Ask, tenant: str, arrival: float) -> list[Sequence]:
        """The request's choices (arrived at ``arrival``), validated and ready to submit; raises BadRequest."""
        plan = await asyncio.get_running_loop().run_in_executor(self._pool, self.plan, ask)
        seqs = [await self._sequence(ask, plan, tenant, arrival) for _ in range(plan.params.n)]
        return link_choices(seqs)

    def plan(self, ask: Ask) -> Plan:
        """Worker thread: render and tokenize the prompt, validate the fields (raises BadRequest)."""
        prompt, messages = ask.prompt, list(ask.messages)
        if ask.json_mode:
            if not ask.fmt or not ask.fmt[1]:
                raise BadRequest("json_schema is empty")
            if prompt and not messages and not ask.raw_prompt and self.builder.template.from_model:
                prompt, messages = "", [pb.ChatMessage(role="user", content=prompt)]
        priority = self.builder.priority(ask.priority)
        kwargs = self._thought(ask, bool(messages))
        if ask.prompt_ids:
            ids = self._given_ids(ask)
        else:
            ids = self.builder.prompt_ids(prompt, messages, ask.tools, kwargs)
        if ask.calls is not None:  # the grammar of the model's call syntax (service.api.call_plan)
            ask.calls.prepare(ask.tools, self.builder.tool_format, self.builder.limits.inputs)
        if ask.thought is not None:  # the thought (or header), then the answer's grammar (the calls' or the format's)
            ask.thought.compose(ask.answer_constraint, framed=ask.fmt is None and bool(ask.tools))
        json_output = ask.json_mode or (ask.fmt is not None and ask.fmt[0] == "json_schema")
        params = self.builder.sampling(ask.sampling, len(ids), json_mode=ask.json_mode, json_output=json_output)
        if params.stop and json_output:
            raise BadRequest(
                "stop strings cannot be combined with a JSON Schema: a document cut at a stop string "
                "would not be valid JSON (the grammar ends the document itself)"
            )
        if ask.json_mode and (params.n != 1 or params.echo_prompt_logprobs):
            raise BadRequest("GenerateJSON returns one document: n and echo_prompt_logprobs need Generate")
        if ask.after_thought:
            # NOTE: a JSON Schema after a thought is a %json item of the output's grammar: not closed within the
            # budget, and the thought is no document to keep from repeating (service.api.reasoning)
            params = replace(params, json_finish=False, json_repeat_penalty=0.0)
        return Plan(tuple(ids), params, priority)

    def _thought(self, ask: Ask, chat: bool) -> str:
        """The template variables to render with: a reasoning model's chat set up in preparation has its thought
        planned first (``ask.thought``: ``enable_thinking`` from its budget, see ``service.api.reasoning``), as has
        the answer header of one whose answers open with one (``RequestBuilder.header``) when no call reader reads
        the answer (no tools in the prompt)."""
        if ask.thought is None:
            return ask.template_kwargs
        sp = ask.sampling
        budget = sp.thinking_budget_tokens if sp.HasField("thinking_budget_tokens") else None
        b = self.builder
        header = None if ask.tools else b.header  # NOTE: tool_choice none leaves the tools out (Ask.generate)
        return ask.thought.setup(ask.template_kwargs, budget, chat, b.reasoning, b.template.thought_start, header)

    def _given_ids(self, ask: Ask) -> list[int]:
        """A prompt of the caller's token ids, checked: in the vocabulary, and room left in the context."""
        if ask.prompt or ask.messages:
            raise BadRequest("set prompt token ids, or prompt or messages, not both")
        n, limit = self.builder.vocab.n_vocab, self.builder.limits.max_context
        for i, t in enumerate(ask.prompt_ids):
            if not 0 <= t < n:
                raise BadRequest(f"prompt token id {t} (position {i}) is outside the vocabulary (0..{n - 1})")
        if len(ask.prompt_ids) >= limit:
            raise BadRequest(f"prompt is {len(ask.prompt_ids)} tokens; the context limit is {limit} tokens "
                             "(prompt plus generated tokens)")
        return list(ask.prompt_ids)

    async def _sequence(self, ask: Ask, plan: Plan, tenant: str, arrival: float) -> Sequence:
        """One choice's Sequence (event loop: cheap; the grammar compiles in its own pool)."""
        seq = Sequence(
            request_id=ask.request_id, token_ids=list(plan.token_ids), params=plan.params,
            priority=plan.priority, deadline=ask.deadline, arrival=arrival,
        )
        seq.tenant = tenant
        # NOTE: with tools the text shows the family's markers (control tokens render as nothing otherwise), so
        # that the calls can be read from it (service.chat.markup)
        # and, for a reasoning model's chat, its thought markers (service.chat.thought reads them)
        thinks = ask.thought is not None and ask.thought.plan is not None  # GenerateJSON's prompt too
        chat_reasons = (bool(ask.messages) or thinks) and self.builder.reasoning is not None
        shown = self.builder.shown_bytes if ask.tools or chat_reasons else self.builder.vocab.token_bytes
        seq.text = TextStream(shown, plan.params.stop)
        if (fmt := ask.constraint) is not None:
            seq.matcher, seq.grammar = await self.grammar.matcher_for(*fmt)
            seq.keys = self.grammar.key_guard(fmt[0])
            seq.budget = budget_for(seq)
        return seq
