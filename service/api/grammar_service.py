"""Grammar compilation off the engine thread: one worker pool, a cache and per-request matchers.

NOTE: the cache is looked up on the event loop (a hash and a dict lookup), so a
cached grammar never waits behind slow compiles; only misses occupy the
compiler's one worker pool. A request that waits past the compile timeout gets
RESOURCE_EXHAUSTED, but the compile goes on and its result is cached for the
next request (a timeout is never cached as a failure).
"""

from __future__ import annotations

import asyncio
from typing import Any

from service.grammar.json_keys import KeyGuard, KeyVocab
from service.observability.engine_metrics import EngineMetrics
from service.request.errors import BadRequest
from service.request.events import SCHEMA_NOT_ENFORCED


class GrammarService:
    """Compiles constraints in worker threads so a slow schema never stalls an engine step."""

    def __init__(
        self, vocab: Any, metrics: EngineMetrics, *, max_source_bytes: int, timeout_s: float
    ) -> None:
        from service import json_grammar  # llguidance is a hard dependency

        self.metrics = metrics
        self.timeout_s = timeout_s
        self._jg = json_grammar
        self._ll_tokenizer = vocab.ll_tokenizer()
        self.key_vocab = KeyVocab(vocab.token_bytes)
        self.compiler = json_grammar.GrammarCompiler(
            self._ll_tokenizer, max_source_bytes=max_source_bytes, compile_timeout_s=timeout_s
        )

    def is_special_token(self, token: int) -> bool:
        """llguidance treats ``token`` as special: a grammar reaches it only as ``<[id]>``."""
        return bool(self._ll_tokenizer.is_special_token(token))

    def mask_batch(self, n_vocab: int, max_rows: int) -> Any:
        return self._jg.MaskBatch(self._ll_tokenizer, n_vocab, max_rows)

    async def matcher_for(self, kind: str, source: str) -> tuple[Any, Any]:
        """(matcher, compiled) for a constraint; raises BadRequest with the grammar's status."""
        compiled = await self.compiled(kind, source)
        return self.compiler.matcher(compiled), compiled

    async def compiled(self, kind: str, source: str, record: bool = True) -> Any:
        """The compiled constraint (from the cache when it is there); raises BadRequest as ``matcher_for``.

        ``record=False`` (a look-up to validate a finished document) leaves the compile metrics alone.
        """
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            fut, hit = self.compiler.start(kind, source)
            compiled = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self.timeout_s)
        except self._jg.GrammarError as exc:
            raise BadRequest(str(exc), exc.status) from None
        except TimeoutError:
            raise BadRequest(
                f"grammar compilation exceeded {self.timeout_s:g} s (it goes on: a retry may hit the cache)",
                "RESOURCE_EXHAUSTED",
            ) from None
        if record:
            self.metrics.on_grammar_compile((loop.time() - t0) * 1e3, hit)
        return compiled

    def key_guard(self, kind: str) -> KeyGuard | None:
        """A duplicate-key guard for JSON output (json_schema), else None."""
        return KeyGuard(self.key_vocab) if kind == "json_schema" else None

    def validate(self, compiled: Any, text: str) -> None:
        """Final guarantee: the document validates against its schema; raises BadRequest INVALID_ARGUMENT
        with reason ``schema_not_enforced`` naming the keyword and path it breaks.

        NOTE: no up-front refusal of a schema the grammar only approximates: its grammar still serves
        every output that complies; only a document that breaks it ends so.
        """
        try:
            self._jg.validate_document(compiled, text)
        except self._jg.SchemaNotEnforced as exc:
            raise BadRequest(f"generated document failed validation: {exc}", exc.status, SCHEMA_NOT_ENFORCED) from exc

    def cache_stats(self) -> dict[str, Any]:
        return self.compiler.cache.stats()

    def close(self) -> None:
        self.compiler.close()
