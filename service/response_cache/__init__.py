"""Response cache (issue #15): exact replay of deterministic requests, coalescing, opt-in semantic reuse.

Modules: ``key`` (what makes two requests the same), ``store`` (the byte-bounded
LRU and its SQLite persistence), ``coalesce`` (identical requests in flight),
``semantic`` (embedding lookup), ``cache`` (the three together); the front
ends' one call is ``service.api.cache_front``. See docs/response-cache.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

from service.response_cache.cache import CacheConfig, ResponseCache
from service.response_cache.key import ModelIdentity, file_sha256

log = logging.getLogger("service.response_cache")


def build_cache(config: CacheConfig) -> ResponseCache | None:
    """The server's cache (None when its capacity is 0: ``--response-cache-bytes 0``)."""
    return ResponseCache(config) if config.capacity_bytes > 0 else None


def bind_model(cache: ResponseCache | None, model_path: str | Path, chat_template: str) -> None:
    """Key the cache to the loaded model (hashes the file: ~0.3 s per 100 MB); loads the embedder
    when the semantic cache is on (raises semantic.SemanticUnavailable without the extra)."""
    if cache is None:
        return
    cache.bind(ModelIdentity(file_sha256(model_path), chat_template))
    if cache.config.semantic:
        from service.response_cache.semantic import MiniLM, SemanticIndex

        cache.semantic = SemanticIndex(MiniLM(), cache.config.semantic_threshold)
        log.info("semantic response cache on (threshold %.2f)", cache.config.semantic_threshold)


__all__ = ["CacheConfig", "ResponseCache", "bind_model", "build_cache"]
