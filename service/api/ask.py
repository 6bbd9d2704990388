"""``Ask``: one request as every front end hands it to the lifecycle (``service.api.intake``).

The gRPC ``Generate`` and ``GenerateJSON`` RPCs, each HTTP dialect and the
batch worker translate what they received into an ``Ask`` and nothing else;
the lifecycle validates it (``BadRequest`` for a bad field), so an ``Ask`` may
hold anything a caller sent. Deadlines are absolute ``time.monotonic()``
values (None: none); the front end derives them from its own protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from inference.v1 import inference_pb2 as pb

from service.api.call_plan import CallAsk
from service.api.proto_convert import response_format
from service.api.reasoning import ThoughtAsk


@dataclass(frozen=True)
class CacheAsk:
    """What the request asks of the response cache (``GenerateRequest`` fields of the same names)."""

    policy: int = pb.CACHE_POLICY_UNSPECIFIED
    ttl_s: int | None = None
    semantic: bool = False
    use: bool = True  # False: the request keeps out of the response cache altogether (batch items)


@dataclass(frozen=True)
class Ask:
    """One request, front-end neutral (see the module docstring)."""

    request_id: str
    prompt: str = ""
    # NOTE: the request's own repeated field, not a copy: copying 100,000 messages is work on the loop.
    messages: Sequence[pb.ChatMessage] = ()
    sampling: pb.SamplingParams = field(default_factory=pb.SamplingParams)
    priority: int = pb.PRIORITY_UNSPECIFIED
    fmt: tuple[str, str] | None = None  # (constraint kind, source): json_schema, regex, lark, gbnf
    deadline: float | None = None
    json_mode: bool = False  # GenerateJSON: one JSON document (a bare prompt is rendered as a user turn)
    raw_prompt: bool = False  # json_mode: do not render a bare prompt through the chat template
    cache: CacheAsk = CacheAsk()
    tenant: str | None = None  # None: the caller's (set by authentication); batch items: the job's
    # Caller-supplied prompt token ids (HTTP completions), instead of prompt and messages: sent to the
    # engine as they are (no tokenization, no BOS), each checked against the vocabulary.
    prompt_ids: tuple[int, ...] = ()
    tools: Sequence[pb.Tool] = ()  # functions the chat template is given (GenerateRequest.tools)
    template_kwargs: str = ""  # further chat template variables, a JSON object (GenerateRequest.chat_template_kwargs)
    calls: CallAsk | None = None  # the tool choice; planned in preparation, read back by the gRPC front end
    # NOTE: a reasoning model's chat set up in preparation (gRPC): its thought plan, read back by the front end;
    # None: set up by the front end itself (the HTTP dialects) or not at all
    thought: ThoughtAsk | None = None

    @property
    def constraint(self) -> tuple[str, str] | None:
        """The output's constraint once prepared: the thought's grammar then the answer's, or the answer's."""
        if self.thought is not None and self.after_thought:
            return "lark", self.thought.lark
        return self.answer_constraint

    @property
    def after_thought(self) -> bool:
        """Once prepared: the answer's constraint follows a thought (or a family's answer header) in the output's
        grammar."""
        return self.thought is not None and bool(self.thought.lark)

    @property
    def answer_constraint(self) -> tuple[str, str] | None:
        """The answer's constraint once prepared: ``fmt``, or the grammar of the planned tool calls."""
        if self.fmt is None and self.calls is not None and self.calls.lark:
            return "lark", self.calls.lark
        return self.fmt

    @classmethod
    def generate(cls, req: pb.GenerateRequest, deadline: float | None, prompt_ids: tuple[int, ...] = (),
                 reasons: bool = False) -> Ask:
        """A ``GenerateRequest`` (gRPC, or built by the HTTP API; ``prompt_ids``: a completions token-id prompt;
        ``reasons``: a reasoning model's chat is set up in preparation, ``service.api.reasoning.ThoughtAsk``)."""
        fmt = response_format(req.response_format) if req.HasField("response_format") else None
        tools = () if req.tool_choice == pb.TOOL_CHOICE_NONE else req.tools  # NOTE: "none" leaves them out
        return cls(
            req.request_id, req.prompt, req.messages, req.sampling, req.priority, fmt, deadline,
            cache=_cache_ask(req), prompt_ids=prompt_ids, tools=tools, template_kwargs=req.chat_template_kwargs,
            calls=CallAsk.of(req), thought=ThoughtAsk() if reasons else None,
        )

    @classmethod
    def generate_json(cls, req: pb.GenerateJSONRequest, request_id: str, deadline: float | None,
                      reasons: bool = False) -> Ask:
        """A ``GenerateJSONRequest``: its schema is the constraint (an empty one is refused in preparation);
        ``reasons`` as for ``generate`` (the thought, then the document under the schema)."""
        return cls(
            request_id, req.prompt, req.messages, req.sampling, req.priority,
            ("json_schema", req.json_schema), deadline, json_mode=True, raw_prompt=req.raw_prompt,
            cache=_cache_ask(req), thought=ThoughtAsk() if reasons else None,
        )


def _cache_ask(req: pb.GenerateRequest | pb.GenerateJSONRequest) -> CacheAsk:
    ttl = req.cache_ttl_s if req.HasField("cache_ttl_s") else None
    return CacheAsk(req.cache_policy, ttl, req.semantic_cache)
