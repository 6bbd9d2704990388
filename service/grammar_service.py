"""Grammar compilation off the engine thread: a worker pool, a cache and per-request matchers."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from service.metrics import EngineMetrics
from service.requests import BadRequest


class GrammarService:
    """Compiles constraints in worker threads so a slow schema never stalls an engine step."""

    def __init__(
        self, vocab: Any, metrics: EngineMetrics, *, max_source_bytes: int, timeout_s: float
    ) -> None:
        self.metrics = metrics
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar")
        try:
            from service import json_grammar
        except ImportError:  # structured output not available in this build
            self._jg: Any = None
            return
        self._jg = json_grammar
        self._ll_tokenizer = vocab.ll_tokenizer()
        self.compiler = json_grammar.GrammarCompiler(
            self._ll_tokenizer, max_source_bytes=max_source_bytes, compile_timeout_s=timeout_s
        )

    def mask_batch(self, n_vocab: int, max_rows: int) -> Any:
        if self._jg is None:
            return None
        return self._jg.MaskBatch(self._ll_tokenizer, n_vocab, max_rows)

    async def matcher_for(self, kind: str, source: str) -> tuple[Any, Any]:
        """(matcher, compiled) for a constraint; raises BadRequest with the grammar's status."""
        if self._jg is None:
            raise BadRequest("structured output is not available", "UNIMPLEMENTED")
        loop = asyncio.get_running_loop()
        try:
            compiled, hit, ms = await asyncio.wait_for(
                loop.run_in_executor(self._pool, self.compiler.compile, kind, source), self.timeout_s + 1.0
            )
        except self._jg.GrammarError as exc:
            raise BadRequest(str(exc), exc.status) from exc
        except TimeoutError as exc:
            raise BadRequest(
                f"grammar compilation exceeded {self.timeout_s:.0f} s", "RESOURCE_EXHAUSTED"
            ) from exc
        self.metrics.on_grammar_compile(ms, hit)
        return self.compiler.matcher(compiled), compiled

    def validate(self, compiled: Any, text: str) -> None:
        """Final guarantee: the document validates against its schema (raises BadRequest INTERNAL)."""
        try:
            self._jg.validate_document(compiled, text)
        except self._jg.GrammarError as exc:
            raise BadRequest(f"generated document failed validation: {exc}", "INTERNAL") from exc

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._jg is not None:
            self.compiler.close()
