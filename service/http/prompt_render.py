"""The render endpoints: the prompt and token ids a request would prefill, without running it.

``POST /v1/chat/completions/render`` and ``POST /v1/completions/render`` take the body of the
matching generation route. A prefix-aware router (llm-d's precise prefix-cache scorer) calls them
to tokenize a request with this server's own template and tokenizer, then looks the token ids up
in the index it keeps from the server's KV-cache events (``service.kv_events``).

The body is parsed by the generation routes' own parser (``service.http.requests``: the same
400s), except that ``model`` may be left out (llm-d sends none); given, it must name the served
model (404). The request then goes through the lifecycle's preparation, ``Intake.prepare``
(render, tokenize, validate the sampling fields, compile a response format's grammar), exactly as
a real request would, and is not submitted: the ids are the ones a real request prefills.

The answer follows vLLM's render endpoints (a ``GenerateRequest``): for chat one object, for
completions a list with one object per prompt (one here: a multi-prompt body is a 400, as on
``/v1/completions``)::

    {"request_id": "...", "token_ids": [...], "prompt": "<the rendered text>", "model": "...",
     "features": null}

``prompt`` is this server's addition; vLLM's ``sampling_params`` and stream fields are not
returned. Authentication is the generation routes'; the routes need the loaded model
(``Need.MODEL``: 503 while loading, answered while draining).
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.api.ask import Ask
from service.api.readiness import Need
from service.http.app import HttpApi
from service.http.body import parse_json
from service.http.errors import from_status
from service.http.requests import Parsed, parse_chat, parse_completion
from service.request.errors import BadRequest


class RenderRoutes:
    """The two render routes over the HTTP API's intake (see the module docstring)."""

    def __init__(self, api: HttpApi) -> None:
        self.api = api

    async def chat(self, request: Request) -> Response:
        return JSONResponse(await self._render(request, chat=True))

    async def completions(self, request: Request) -> Response:
        return JSONResponse([await self._render(request, chat=False)])

    async def _render(self, request: Request, chat: bool) -> dict[str, Any]:
        api = self.api
        tenant = api.authorize(request)
        api.ready(Need.MODEL)
        body = await api.body(request, api.config.max_body_bytes)
        parsed = await api.intake.offload(self._parse, body, chat, request.headers.get("x-priority"))
        req = parsed.request
        try:
            seqs = await api.intake.prepare(Ask.generate(req, None), tenant)
        except BadRequest as exc:
            raise from_status(exc.status, str(exc)) from None
        text, _, _ = await api.intake.offload(api.intake.builder.render, req.prompt, list(req.messages))
        return {
            "request_id": uuid.uuid4().hex,
            "token_ids": list(seqs[0].token_ids),
            "prompt": text,
            "model": api.config.model_name,
            "features": None,
        }

    def _parse(self, body: bytes, chat: bool, priority: str | None) -> Parsed:
        """Worker thread: the body as the generation route parses it, ``model`` optional."""
        raw = parse_json(body)
        if raw.get("model") is None:
            raw["model"] = self.api.config.model_name  # NOTE: llm-d's renderer strips the model field
        parsed = (parse_chat if chat else parse_completion)(raw, self.api.config.model_name, priority)
        self.api.model(raw["model"])
        return parsed

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions/render", self.chat, methods=["POST"]),
            Route("/v1/completions/render", self.completions, methods=["POST"]),
        ]
