"""The ASGI application of the HTTP API (Starlette): routes, authentication, body limits, errors.

Routes (docs/openai.md, docs/http-apis.md):

* ``POST /v1/chat/completions``, ``POST /v1/completions``: streamed or not;
* ``POST /v1/messages`` (Anthropic Messages) and ``POST /v1/messages/count_tokens``;
* ``POST /v1/responses`` (OpenAI Responses, stateless);
* ``GET /v1/models``, ``GET /v1/models/{id}``: the one served model;
* the batch API (``service.http.batches``); ``POST /tokenize``, ``POST /detokenize`` (vLLM's,
  ``service.http.tokens``);
* ``GET /health`` (200 while requests are taken, else 503) and ``GET /metrics``
  (Prometheus text: today's ``inference_*`` series and the vLLM-named ones).

Every request is authenticated like a gRPC call (the tenants file in force,
bearer tokens compared in constant time; ``open_http_paths`` need none; the
token comes from ``Authorization: Bearer`` or, as Anthropic clients send it,
``x-api-key``) and
runs with ``CURRENT_TENANT`` and ``CURRENT_CREDENTIAL`` set, so the intake
stamps its tenant on what it prepares and a running request is checked again
as a Generate stream's are (a revoked token ends it UNAUTHENTICATED: a 401, or
an error event in a started event stream).

Every route names what it needs of the server (``Need``, the drain rule of
``service.api.intake``): generation and batch creation need ``WORK`` (refused
503 while loading, draining or after an engine failure, with the reason in
the error's ``code`` and the ``inference-unavailable-reason`` header);
``/v1/models`` needs ``MODEL``; files and batch reads ``STORE`` (always
answered). ``/health`` answers 200 while work is taken, else 503 with the
reason; ``/metrics`` is answered once the engine runs.
Every failure is the dialect's error object (OpenAI's; Anthropic's under
``/v1/messages``); an unexpected exception is a 500 for that request only.

Every generating route runs the same way (``_generate``): authenticate, check
readiness, read the body and parse it off the event loop, run it through the
lifecycle as one ``Run``, watch for a disconnect, commit the status line at
the first event (a refusal before any token is still a 4xx/5xx). A
``service.http.dialect.Dialect`` says only what differs: its body parser and
how the events become its answer.

A JSON route's body must be sent as JSON (``Content-Type: application/json``, any ``+json``
type, or none: else 415). Two ``Authorization`` (or ``x-api-key``) headers never authenticate:
wherever a token is needed the call is refused 401 saying so (docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from inference.v1 import inference_pb2 as pb
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.api.intake import Intake
from service.api.model_rpcs import ModelApi
from service.api.readiness import Need
from service.http.answer import Answer, event_error
from service.http.anthropic_stream import MessagesDialect
from service.http.config import HttpConfig
from service.http.dialect import Dialect, OpenAIDialect, check_model, error_response
from service.http.errors import ApiError, from_status
from service.http.render import Choices
from service.http.requests import Parsed, with_format, with_reasoning, with_vocab
from service.http.responses_stream import ResponsesDialect
from service.http.run import Run, watch_disconnect
from service.http.runs import Runs
from service.http.sse import EventStream
from service.request.errors import Unavailable
from service.request.events import LOADING
from service.security.auth import CURRENT_CREDENTIAL, CURRENT_TENANT, AmbiguousCredentials, bearer_token
from service.security.tenancy import Tenancy

log = logging.getLogger("service.http")
# NOTE: a JSON route takes these Content-Types (and any "+json" one) or none at all: the openai SDKs and
# `curl -H 'Content-Type: application/json'` send the first, some scripts none; text/plain or curl -d's
# default (application/x-www-form-urlencoded) is a 415, never a guess (docs/openai.md).
JSON_TYPES = frozenset({"application/json"})


class HttpApi:
    """The routes over one intake; ``metrics`` (a prometheus_client registry) and ``model_api`` (the gRPC
    model RPCs' ``ModelApi``, for /tokenize and /detokenize) are set once the engine runs."""

    def __init__(self, config: HttpConfig, intake: Intake, tenancy: Tenancy) -> None:
        self.config, self.intake, self.tenancy = config, intake, tenancy
        self.metrics: Any = None
        self.model_api: ModelApi | None = None
        self.created = int(time.time())
        name = config.model_name
        limits = config.limits
        self.chat_dialect = OpenAIDialect(True, name, limits)
        self.completion_dialect = OpenAIDialect(False, name, limits)
        self.messages_dialect = MessagesDialect(name, intake, limits)
        self.responses_dialect = ResponsesDialect(name, limits)

    # -- shared checks ------------------------------------------------------------------------
    def authorize(self, request: Request, role: str = "user") -> str:
        """Authenticate the call against the tenants file in force and make its tenant and credential
        current; raises ApiError 401/403."""
        ambiguous = None
        try:
            token = _token(request)
        except AmbiguousCredentials as exc:  # NOTE: never authenticates; refused wherever a token is needed
            token, ambiguous = None, str(exc)
        verdict = self.tenancy.http_tenant(request.url.path, token, role)
        if isinstance(verdict, tuple):
            raise from_status(verdict[0], ambiguous or verdict[1])
        CURRENT_TENANT.set(verdict.tenant)
        CURRENT_CREDENTIAL.set(verdict if verdict.digest is not None else None)  # None: nothing to re-check
        return verdict.tenant

    def ready(self, need: Need) -> None:
        """Refuse the call (503, the reason as its code and header) when the drain rule says so."""
        if (why := self.intake.unavailable(need)) is not None:
            raise from_status("UNAVAILABLE", why.message, 1000, reason=why.reason)

    def admit(self, request: Request, need: Need) -> str:
        """``authorize`` then ``ready``: the caller's tenant, or ApiError 401/403/503."""
        tenant = self.authorize(request)
        self.ready(need)
        return tenant

    async def json_body(self, request: Request, limit: int) -> bytes:
        """``body`` of a JSON route: a Content-Type other than JSON is a 415 (see ``JSON_TYPES``)."""
        kind = request.headers.get("content-type")
        if kind is not None:
            media = kind.partition(";")[0].strip().lower()
            if media not in JSON_TYPES and not media.endswith("+json"):
                raise ApiError(415, f"Content-Type {media!r} is not JSON: send 'Content-Type: application/json'",
                               code="unsupported_media_type")
        return await self.body(request, limit)

    async def body(self, request: Request, limit: int) -> bytes:
        """The request body, at most ``limit`` bytes (413 past it, before reading it all)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def model(self, name: Any) -> None:
        check_model(name, self.config.model_name)

    # -- generation -----------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._generate(request, self.chat_dialect)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, self.completion_dialect)

    async def messages(self, request: Request) -> Response:
        return await self._generate(request, self.messages_dialect)

    async def responses(self, request: Request) -> Response:
        return await self._generate(request, self.responses_dialect)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's token count of a Messages body (the prompt as Generate would tokenize it)."""
        self.admit(request, Need.MODEL)
        body = await self.json_body(request, self.config.max_body_bytes)
        return JSONResponse(await self.intake.offload(self.messages_dialect.count_tokens, body))

    async def _generate(self, request: Request, dialect: Dialect) -> Response:
        self.admit(request, Need.WORK)
        body = await self.json_body(request, self.config.max_body_bytes)
        # NOTE: parsing grows with the body (100,000 messages: a second): never on the event loop.
        parsed = await self.intake.offload(self._parse, dialect, body, request.headers.get("x-priority"))
        rid = dialect.prefix + uuid.uuid4().hex
        run = self._start(parsed, rid)
        watcher: asyncio.Task[None] | None = watch_disconnect(request.receive, run)
        answer = Answer(Choices(parsed.output, rid), self.intake.grammar)
        try:
            if not parsed.output.stream:
                result = await dialect.complete(answer, run, parsed)
                return JSONResponse(result) if result is not None else Response(status_code=499)
            first = await run.next()  # NOTE: the status line waits for the first event (a refusal is a 4xx)
            if first is None:
                return Response(status_code=499)  # the client left while its request waited
            if first.WhichOneof("event") == "error":
                raise event_error(first.error)
            assert watcher is not None
            events = dialect.events(answer, first, run, parsed)
            response = EventStream(events, run, watcher, dialect.frame, dialect.trailer)
            watcher = None  # the response owns the watcher and the run now
            return response
        finally:
            if watcher is not None:
                watcher.cancel()
                run.abort()

    def _parse(self, dialect: Dialect, body: bytes, priority: str | None) -> Parsed:
        """Worker thread: the body as the request to run (raises ApiError 400/404); completions' token-id
        prompts checked against the vocabulary."""
        parsed = dialect.parse(body, priority)
        builder = self.intake.builder
        if parsed.output.tools is not None:  # the grammar of the model's own call syntax
            parsed = with_format(parsed, builder.tool_format)
        # after the thought, or the answer's header
        parsed = with_reasoning(parsed, builder.reasoning, builder.template.thought_start, builder.header)
        if dialect is self.completion_dialect:
            vocab = self.intake.builder.vocab
            parsed = with_vocab(parsed, vocab.n_vocab, vocab.token_bytes)
        return parsed

    def _start(self, parsed: Parsed, rid: str) -> Run | Runs:
        """The request's run; a completions request with several prompts runs one request per prompt."""
        if len(parsed.prompts) <= 1:
            ids = parsed.prompts[0] if parsed.prompts and isinstance(parsed.prompts[0], tuple) else ()
            return Run(self.intake, self.config.stream, rid, parsed.request, ids)
        runs = []
        for i, prompt in enumerate(parsed.prompts):
            request = pb.GenerateRequest()
            request.CopyFrom(parsed.request)
            request.prompt = prompt if isinstance(prompt, str) else ""
            ids = prompt if isinstance(prompt, tuple) else ()
            runs.append(Run(self.intake, self.config.stream, f"{rid}-{i}", request, ids))
        return Runs(runs, parsed.output.n)

    # -- models, health, metrics ---------------------------------------------------------------
    def _model_object(self) -> dict[str, Any]:
        """OpenAI's model object, and the extension ``chat_format``: how the server speaks the model's chat
        language (GetModelInfoResponse.chat; docs/openai.md, "Tools")."""
        fmt = self.intake.builder.tool_format
        reasoning = self.intake.builder.reasoning
        chat = {"family": fmt.family.name, "tools": fmt.tools_path, "renders": fmt.renders(),
                "parallel_tool_calls": fmt.parallel,
                "reasoning": reasoning.describe() if reasoning is not None else None}
        return {"id": self.config.model_name, "object": "model", "created": self.created,
                "owned_by": "cpu-inference-service", "chat_format": chat}

    async def models(self, request: Request) -> Response:
        self.admit(request, Need.MODEL)
        return JSONResponse({"object": "list", "data": [self._model_object()]})

    async def model_info(self, request: Request) -> Response:
        self.admit(request, Need.MODEL)
        self.model(request.path_params["model"])
        return JSONResponse(self._model_object())

    async def health(self, request: Request) -> Response:
        self.admit(request, Need.WORK)  # NOTE: a readiness probe: 503 (with the reason) whenever work is refused
        return JSONResponse({"status": "ok"})

    async def prometheus(self, request: Request) -> Response:
        self.authorize(request, role="admin")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if self.metrics is None:
            raise from_status("UNAVAILABLE", "model is loading; retry shortly", 1000, reason=LOADING)
        text = await asyncio.to_thread(generate_latest, self.metrics)  # NOTE: never a scrape on the event loop
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model_info, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]


def _token(request: Request) -> str | None:
    """The bearer token, or Anthropic's ``x-api-key`` without one; AmbiguousCredentials for two of either."""
    token = bearer_token([("authorization", value) for value in request.headers.getlist("authorization")])
    keys = request.headers.getlist("x-api-key")
    if len(keys) > 1:
        raise AmbiguousCredentials(f"{len(keys)} x-api-key headers: send exactly one")
    return token or (keys[0] if keys else None) or None


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(request.url.path, exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: "no such route", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
    return error_response(request.url.path, ApiError(exc.status_code, message))


async def _unavailable(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Unavailable)
    log.info("HTTP request answered 503: %s", exc)  # NOTE: the detail (hosts, driver errors) stays in the log
    return error_response(request.url.path, from_status("UNAVAILABLE", exc.public_message))


async def _gone(_request: Request, _exc: Exception) -> Response:
    return Response(status_code=499)  # the client left (or its body timed out) before its request was read


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("HTTP request failed", exc_info=exc)
    return error_response(request.url.path, ApiError(500, f"internal error: {type(exc).__name__}", type="server_error"))


def make_app(routes: list[Route]) -> Starlette:
    """The Starlette application over ``routes`` with each dialect's error shape."""
    handlers: dict[Any, Any] = {
        ApiError: _api_error, HTTPException: _http_error, Unavailable: _unavailable, ClientDisconnect: _gone,
        Exception: _crash,
    }
    return Starlette(routes=routes, exception_handlers=handlers)
