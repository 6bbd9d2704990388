"""vLLM's ``POST /tokenize`` and ``POST /detokenize``, over the code of the gRPC model RPCs.

Shapes (vLLM's ``TokenizeCompletionRequest`` / ``TokenizeChatRequest`` / ``DetokenizeRequest``):

* ``/tokenize`` takes ``{"model"?, "prompt": str}`` or ``{"model"?, "messages": [...],
  "add_generation_prompt"?: true}``, with ``add_special_tokens`` (default: as generation does: BOS
  for a prompt, BOS for messages unless the chat template writes it) and ``return_token_strs``;
  it answers ``{"count", "max_model_len", "tokens"}`` (and ``"token_strs"`` when asked);
* ``/detokenize`` takes ``{"model"?, "tokens": [ids]}`` and answers ``{"prompt": str}`` (special
  tokens rendered as their text, as vLLM's tokenizer decodes them; bytes that are not UTF-8 as U+FFFD).

Each call is the gRPC ``Tokenize`` / ``Detokenize`` of ``service.api.model_rpcs.ModelApi`` (the
same rendering, tokenization, limits and worker threads), so the HTTP and gRPC answers are equal.
Messages are read as chat completions reads them (``service.http.messages``). The body is parsed in
the lifecycle's worker pool (``Intake.offload``) and tokenized in the model RPCs' own, never on the
event loop. These routes read the model (``Need.MODEL``): refused while loading, answered while
draining, as the gRPC calls are. Every bad input is a 400 naming its parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.v1 import inference_pb2 as pb
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.api.model_rpcs import MAX_DETOKENIZE_TOKENS, ModelApi
from service.api.readiness import Need
from service.http.app import HttpApi
from service.http.body import Body, parse_json
from service.http.errors import ApiError, bad_param, from_status
from service.http.messages import chat_messages
from service.request.errors import BadRequest
from service.request.events import LOADING

TOKENIZE = ("model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "return_token_strs",
            "continue_final_message")
DETOKENIZE = ("model", "tokens")


@dataclass(frozen=True)
class TokenizeAsk:
    request: pb.TokenizeRequest
    token_strs: bool
    field: str  # "prompt" or "messages": the parameter a refusal of the input names


class TokenRoutes:
    """``/tokenize`` and ``/detokenize`` over one ``HttpApi`` (auth, readiness, body limit)."""

    def __init__(self, api: HttpApi) -> None:
        self.api = api

    def _model_api(self) -> ModelApi:
        if self.api.model_api is None:  # NOTE: set with the engine; Need.MODEL refused before that
            raise from_status("UNAVAILABLE", "model is loading; retry shortly", 1000, reason=LOADING)
        return self.api.model_api

    async def _body(self, request: Request) -> bytes:
        self.api.admit(request, Need.MODEL)
        return await self.api.json_body(request, self.api.config.max_body_bytes)

    async def tokenize(self, request: Request) -> Response:
        ask = await self.api.intake.offload(self._tokenize_ask, await self._body(request))
        model_api = self._model_api()
        try:
            out = await model_api.tokenize(ask.request)
        except BadRequest as exc:
            raise bad_param(ask.field, str(exc)) from None
        body: dict[str, Any] = {"count": len(out.token_ids), "max_model_len": model_api.builder.limits.max_context,
                                "tokens": list(out.token_ids)}
        if ask.token_strs:
            body["token_strs"] = [p.decode("utf-8", "replace") for p in out.pieces]
        return JSONResponse(body)

    async def detokenize(self, request: Request) -> Response:
        ids = await self.api.intake.offload(self._detokenize_ids, await self._body(request))
        try:
            out = await self._model_api().detokenize(pb.DetokenizeRequest(token_ids=ids, render_special=True))
        except BadRequest as exc:
            raise bad_param("tokens", str(exc)) from None
        return JSONResponse({"prompt": out.text})

    # -- worker threads: the body -> the RPC's request (raises ApiError 400/404) -------------------
    def _model(self, body: Body) -> None:
        if body.str_("model") is not None:
            self.api.model(body.get("model"))

    def _tokenize_ask(self, raw: bytes) -> TokenizeAsk:
        body = Body(parse_json(raw), TOKENIZE)
        self._model(body)
        if body.bool_("add_generation_prompt") is False or body.bool_("continue_final_message"):
            name = "add_generation_prompt" if body.get("add_generation_prompt") is False else "continue_final_message"
            raise bad_param(name, f"{name}: messages are tokenized as chat completions renders them, with the "
                                  "assistant's turn opened (add_generation_prompt true, continue_final_message false)")
        prompt, has_messages = body.str_("prompt"), body.has("messages")
        if (prompt is None) == (not has_messages):
            raise ApiError(400, "set either prompt or messages (one of them)", param="prompt")
        req = pb.TokenizeRequest(text=prompt or "")
        if has_messages:
            req.messages.extend(chat_messages(body.get("messages")))
        if (add := body.bool_("add_special_tokens")) is not None:
            req.add_special = add
        return TokenizeAsk(req, bool(body.bool_("return_token_strs")), "messages" if has_messages else "prompt")

    def _detokenize_ids(self, raw: bytes) -> list[int]:
        body = Body(parse_json(raw), DETOKENIZE)
        self._model(body)
        ids = body.list_("tokens")
        if ids is None:
            raise bad_param("tokens", "'tokens' is a required property")
        if len(ids) > MAX_DETOKENIZE_TOKENS:
            raise bad_param("tokens", f"{len(ids)} tokens; at most {MAX_DETOKENIZE_TOKENS} per call")
        n = self._model_api().vocab.n_vocab
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n:
                raise bad_param("tokens", f"tokens[{i}] = {t!r} is not a token id of this model (0 .. {n - 1})")
        return ids

    def routes(self) -> list[Route]:
        return [
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
        ]
