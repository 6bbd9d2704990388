"""Tokenize, Detokenize, CountTokens and GetModelInfo: answers about the loaded model.

Translates the request protos into ``RequestBuilder``/``Vocab`` calls and the
runner's model facts into response protos; every bad input is a ``BadRequest``
(INVALID_ARGUMENT). Nothing here touches the engine: these RPCs never queue.

NOTE: tokenizing is CPU work (about 0.4 s per MiB of text here), so it runs in
a worker thread, never on the event loop that streams every other request's
tokens; the threads are this module's own (``WORKERS``), so a flood of calls
neither takes more cores nor delays other users of the loop's default executor
(the semantic cache's embedder). Inputs are bounded (``MAX_TOKENIZE_BYTES``,
``MAX_DETOKENIZE_TOKENS``).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.v1 import inference_pb2 as pb

import service
from service.api.request_builder import (
    DEFAULT_JSON_MAX_TOKENS,
    DEFAULT_MAX_TOKENS,
    MAX_CHOICES,
    BadRequest,
    RequestBuilder,
)
from service.model.logprobs import MAX_TOP_LOGPROBS
from service.model.runner import Vocab

log = logging.getLogger("service.model_api")

MAX_TOKENIZE_BYTES = 1 << 20  # text (or all message contents) of one Tokenize/CountTokens call
MAX_DETOKENIZE_TOKENS = 1 << 18  # token ids of one Detokenize call
WORKERS = 2  # threads that tokenize (the machine's cores; the engine has its own thread)
# The ResponseFormat kinds, straight from the contract (the server accepts every one).
RESPONSE_FORMATS = tuple(f.name for f in pb.ResponseFormat.DESCRIPTOR.oneofs_by_name["format"].fields)


@dataclass(frozen=True)
class ServerFacts:
    """What GetModelInfo reports about the server rather than the model."""

    kv_pool_tokens: int
    kv_block_size: int
    max_running: int
    kv_cache_type: str  # --kv-cache-type
    kv_bytes_per_token: int  # in that type, all layers, K and V


def server_version() -> str:
    """The installed package's version, else the source tree's ``service.__version__``."""
    try:
        return importlib.metadata.version("cpu-inference-service")
    except importlib.metadata.PackageNotFoundError:
        return service.__version__


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in chunks (hashlib releases the GIL while hashing)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _hash_in_background(path: Path) -> Future[str]:
    """Start hashing ``path`` on a daemon thread; the future holds the hex digest ("" if unreadable)."""
    result: Future[str] = Future()
    result.set_running_or_notify_cancel()  # NOTE: so a cancelled awaiter cannot cancel the shared result

    def run() -> None:
        try:
            result.set_result(file_sha256(path))
        except OSError as exc:
            log.warning("cannot hash the model file %s: %s", path, exc)
            result.set_result("")

    threading.Thread(target=run, name="model-sha256", daemon=True).start()
    return result


class ModelApi:
    """Answers the model RPCs for one loaded model.

    ``facts`` is ``ModelRunner.model_info()``. The model file's SHA-256 is
    computed once, in the background, from construction on; GetModelInfo
    waits for it the first time (0.07 s for 100 MB here) and then answers
    from a cached response.
    """

    def __init__(self, builder: RequestBuilder, facts: dict[str, Any], server: ServerFacts, path: Path) -> None:
        self.builder = builder
        self.vocab: Vocab = builder.vocab
        self.facts = facts
        self.server = server
        self.path = path
        self._sha256 = _hash_in_background(path)
        self._info: pb.GetModelInfoResponse | None = None
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="model-api")

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- tokens (each call runs in a worker thread; see the module note) ------------------
    async def tokenize(self, req: pb.TokenizeRequest) -> pb.TokenizeResponse:
        """Token ids and pieces of the text or rendered chat, tokenized exactly as Generate does."""
        return await self._off_loop(self._tokenize, req)

    async def count_tokens(self, req: pb.CountTokensRequest) -> pb.CountTokensResponse:
        """The prompt's token count (Generate's usage.prompt_tokens) and the room left after it.

        NOTE: a prompt longer than the context is counted, not refused (Generate
        would refuse it): callers count in order to truncate.
        """
        count = len((await self._off_loop(self._tokens, req))[1])
        limit = self.builder.limits.max_context
        return pb.CountTokensResponse(count=count, context_size=limit, max_new_tokens=max(0, limit - count))

    async def detokenize(self, req: pb.DetokenizeRequest) -> pb.DetokenizeResponse:
        """The bytes of the tokens, as Generate streams them (control tokens only with render_special)."""
        if len(req.token_ids) > MAX_DETOKENIZE_TOKENS:
            raise BadRequest(f"{len(req.token_ids)} token ids; at most {MAX_DETOKENIZE_TOKENS} per call")
        return await self._off_loop(self._detokenize, list(req.token_ids), req.render_special)

    def _tokens(self, req: pb.TokenizeRequest | pb.CountTokensRequest) -> tuple[str, list[int]]:
        tools = () if req.tool_choice == pb.TOOL_CHOICE_NONE else req.tools  # NOTE: as Ask.generate leaves them
        size = len(req.text.encode()) + sum(len(m.content.encode()) for m in req.messages)
        size += len(req.chat_template_kwargs.encode()) + sum(len(t.parameters.encode()) for t in tools)
        if size > MAX_TOKENIZE_BYTES:
            raise BadRequest(f"input is {size} bytes; at most {MAX_TOKENIZE_BYTES} bytes per call")
        add = req.add_special if req.HasField("add_special") else None
        parse = req.parse_special if req.HasField("parse_special") else None
        return self.builder.render_tokens(req.text, list(req.messages), add, parse, "text", tools,
                                          req.chat_template_kwargs)

    def _tokenize(self, req: pb.TokenizeRequest) -> pb.TokenizeResponse:
        text, ids = self._tokens(req)
        pieces = [self.vocab.piece(t, special=True) for t in ids]
        return pb.TokenizeResponse(token_ids=ids, pieces=pieces, prompt=text)

    def _detokenize(self, ids: list[int], render_special: bool) -> pb.DetokenizeResponse:
        n = self.vocab.n_vocab
        for i, t in enumerate(ids):
            if not 0 <= t < n:
                raise BadRequest(f"token_ids[{i}] = {t} is outside the vocabulary (0 .. {n - 1})")
        if render_special:
            raw = b"".join(self.vocab.piece(t, special=True) for t in ids)
        else:
            raw = b"".join(self.vocab.token_bytes[t] for t in ids)
        return pb.DetokenizeResponse(text=raw.decode("utf-8", "replace"), raw=raw)

    # -- model info --------------------------------------------------------------------------
    async def model_info(self) -> pb.GetModelInfoResponse:
        """The model, server and request limits (built once, after the file hash is ready)."""
        if self._info is None:
            sha256 = await asyncio.wrap_future(self._sha256)
            self._info = self._info_response(sha256)
        return self._info

    def _info_response(self, sha256: str) -> pb.GetModelInfoResponse:
        f, s = self.facts, self.server
        metadata = {k: v for k, v in f["metadata"].items() if k != "tokenizer.chat_template"}
        return pb.GetModelInfoResponse(
            file_name=self.path.name,
            sha256=sha256,
            architecture=f["architecture"],
            name=f["name"],
            parameter_count=f["parameter_count"],
            quantization=f["quantization"],
            file_size_bytes=f["file_size_bytes"],
            training_context=f["training_context"],
            kv_pool_tokens=s.kv_pool_tokens,
            kv_block_size=s.kv_block_size,
            max_running=s.max_running,
            vocab_size=self.vocab.n_vocab,
            special_tokens=[
                pb.SpecialToken(name=name, token_id=t, text=text.decode("utf-8", "replace"))
                for name, t, text in self.vocab.special_tokens()
            ],
            chat_template=self.builder.template.source,
            response_formats=RESPONSE_FORMATS,
            server_version=server_version(),
            limits=self._limits(),
            embedding_length=f["embedding_length"],
            layers=f["layers"],
            metadata=metadata,
            chat=self._chat(),
            kv_cache_type=s.kv_cache_type,
            kv_bytes_per_token=s.kv_bytes_per_token,
        )

    def _chat(self) -> pb.ChatFormat:
        fmt = self.builder.tool_format
        reasoning = self.builder.reasoning
        return pb.ChatFormat(family=fmt.family.name, tools=fmt.tools_path, renders=fmt.renders(),
                             parallel_tool_calls=fmt.parallel,
                             reasoning=reasoning.thinking.name if reasoning is not None else "")

    def _limits(self) -> pb.RequestLimits:
        return pb.RequestLimits(
            context_size=self.builder.limits.max_context,
            default_max_tokens=DEFAULT_MAX_TOKENS,
            default_json_max_tokens=DEFAULT_JSON_MAX_TOKENS,
            max_stop_strings=self.builder.limits.inputs.max_stop_strings,
            max_top_logprobs=MAX_TOP_LOGPROBS,
            max_choices=MAX_CHOICES,
        )


def model_api_for(engine: Any, builder: RequestBuilder) -> ModelApi:
    """The ModelApi of a built engine: model facts from its runner, pool size and max_running from it."""
    server = ServerFacts(
        kv_pool_tokens=engine.kv.capacity_tokens,
        kv_block_size=engine.kv.block_size,
        max_running=engine.config.max_running,
        kv_cache_type=engine.runner.kv_cache_type,
        kv_bytes_per_token=engine.runner.kv_bytes_per_token,
    )
    return ModelApi(builder, engine.runner.model_info(), server, engine.runner.model_path)
