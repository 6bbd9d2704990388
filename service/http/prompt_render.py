"""The render endpoints: the prompt and token ids a request would prefill, without running it.

``POST /v1/chat/completions/render`` and ``POST /v1/completions/render`` take the body of the
matching generation route. A prefix-aware router (llm-d's precise prefix-cache scorer) calls them
to tokenize a request with this server's own template and tokenizer, then looks the token ids up
in the index it keeps from the server's KV-cache events (``service.kv_events``).

The body is parsed by the generation routes' own parser (``service.http.requests``: the same
400s, a completions token-id prompt checked against the vocabulary), except that ``model`` may be
left out (llm-d sends none); given, it must name the served model (404). Each prompt then goes
through the lifecycle's preparation, ``Intake.prepare`` (render, tokenize, validate the sampling
fields, compile a response format's grammar), exactly as a real request would, and is not
submitted: the ids are the ones a real request prefills.

The answer follows vLLM's render endpoints (a ``GenerateRequest`` per prompt): for chat one
object, for completions a list with one object per prompt, in order::

    {"request_id": "...", "token_ids": [...], "prompt": "<the rendered text>", "model": "...",
     "features": null}

``prompt`` is this server's addition (a token-id prompt's is its ids decoded); vLLM's
``sampling_params`` and stream fields are not returned. Authentication is the generation routes';
the routes need the loaded model (``Need.MODEL``: 503 while loading, answered while draining).
"""

from __future__ import annotations

import uuid
from typing import Any

from inference.v1 import inference_pb2 as pb
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.api.ask import Ask
from service.api.readiness import Need
from service.http.app import HttpApi
from service.http.body import parse_json
from service.http.dialect import check_model
from service.http.errors import from_status
from service.http.prompts import Prompt, text_of
from service.http.requests import (
    Parsed,
    parse_chat,
    parse_completion,
    with_format,
    with_reasoning,
    with_vocab,
)
from service.request.errors import BadRequest


class RenderRoutes:
    """The two render routes over the HTTP API's intake (see the module docstring)."""

    def __init__(self, api: HttpApi) -> None:
        self.api = api

    async def chat(self, request: Request) -> Response:
        return JSONResponse((await self._render(request, chat=True))[0])

    async def completions(self, request: Request) -> Response:
        return JSONResponse(await self._render(request, chat=False))

    async def _render(self, request: Request, chat: bool) -> list[dict[str, Any]]:
        api = self.api
        tenant = api.authorize(request)
        api.ready(Need.MODEL)
        body = await api.json_body(request, api.config.max_body_bytes)
        parsed = await api.intake.offload(self._parse, body, chat, request.headers.get("x-priority"))
        return [await self._one(parsed.request, prompt, tenant) for prompt in parsed.prompts or (None,)]

    async def _one(self, template: pb.GenerateRequest, prompt: Prompt | None, tenant: str) -> dict[str, Any]:
        """One prompt (None: the chat's messages) prepared as a real request is."""
        intake = self.api.intake
        request = pb.GenerateRequest()
        request.CopyFrom(template)
        ids = prompt if isinstance(prompt, tuple) else ()
        if isinstance(prompt, str):
            request.prompt = prompt
        try:
            seqs = await intake.prepare(Ask.generate(request, None, ids), tenant)
        except BadRequest as exc:
            raise from_status(exc.status, str(exc)) from None
        return {
            "request_id": uuid.uuid4().hex,
            "token_ids": list(seqs[0].token_ids),
            "prompt": await intake.offload(self._text, request, ids),
            "model": self.api.config.model_name,
            "features": None,
        }

    def _text(self, request: pb.GenerateRequest, ids: tuple[int, ...]) -> str:
        """Worker thread: the text the ids were tokenized from (the rendered chat), or the ids decoded."""
        builder = self.api.intake.builder
        if ids:
            return text_of(ids, builder.vocab.token_bytes)
        return builder.render_tokens(request.prompt, list(request.messages), tools=request.tools,
                                     kwargs=request.chat_template_kwargs)[0]

    def _parse(self, body: bytes, chat: bool, priority: str | None) -> Parsed:
        """Worker thread: the body as the generation route parses it, ``model`` optional."""
        raw = parse_json(body)
        name, limits = self.api.config.model_name, self.api.config.limits
        if raw.get("model") is None:
            raw["model"] = name  # NOTE: llm-d's renderer strips the model field
        parsed = (parse_chat if chat else parse_completion)(raw, name, priority, limits)
        check_model(raw["model"], name)
        if chat:  # NOTE: as the generation route sets it up: a thinking budget or an effort sets enable_thinking
            builder = self.api.intake.builder
            parsed = with_format(parsed, builder.tool_format) if parsed.output.tools else parsed
            return with_reasoning(parsed, builder.reasoning, builder.template.thought_start, builder.header)
        vocab = self.api.intake.builder.vocab
        return with_vocab(parsed, vocab.n_vocab, vocab.token_bytes)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions/render", self.chat, methods=["POST"]),
            Route("/v1/completions/render", self.completions, methods=["POST"]),
        ]
