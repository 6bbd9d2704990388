"""The compiled-grammar cache: futures keyed by (kind, sha256(source)), bounded by count and bytes.

Entries are futures so concurrent requests for one source compile once. A
finished compile is charged its estimated size; least recently used entries
are evicted while the cache is over either bound (pending compiles are never
evicted, they cost nothing yet). Failed compiles stay cached (a bad schema is
rejected fast when retried); a caller's *timeout* is not a failure of the
compile and is never cached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Key = tuple[str, str]


class GrammarCache(Generic[T]):
    """Thread-safe LRU of compile futures; ``size_of`` estimates a result's bytes."""

    def __init__(self, max_entries: int, max_bytes: int, size_of: Callable[[T], int]) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, Future[T]] = OrderedDict()
        self._sizes: dict[Key, int] = {}
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_start(self, key: Key, start: Callable[[], Future[T]]) -> tuple[Future[T], bool]:
        """The cached future for ``key`` (hit=True), or ``start()``'s, now cached (hit=False)."""
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None:
                self._entries.move_to_end(key)
                return fut, True
            fut = self._entries[key] = start()
        fut.add_done_callback(lambda f: self._charge(key, f))
        return fut, False

    def _charge(self, key: Key, fut: Future[T]) -> None:
        size = 0
        if not fut.cancelled() and fut.exception() is None:
            size = self._size_of(fut.result())
        with self._lock:
            if self._entries.get(key) is not fut:
                return
            self._sizes[key] = size
            self.bytes += size
            self._evict()

    def _evict(self) -> None:
        """Drop LRU finished entries while over a bound (lock held)."""
        for key in list(self._entries):
            if len(self._entries) <= self.max_entries and self.bytes <= self.max_bytes:
                return
            if not self._entries[key].done():
                continue
            del self._entries[key]
            self.bytes -= self._sizes.pop(key, 0)
            self.evictions += 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.bytes, "evictions": self.evictions}
