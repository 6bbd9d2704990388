"""``StoreThread``: the event loop's door to the job store (one thread, health, time spent).

Every ``JobStore`` call of the servicer and the worker runs on one dedicated
thread, so the event loop never waits on the disk or the database. The thread
also keeps what operators and benchmarks ask about the store:

* **health**: a call that raises ``StoreUnavailable`` marks the store down, the
  next call that returns marks it up again; ``on_health(up)`` is told of every
  change (the server turns it into the BatchService's gRPC health). Before a
  shared store is open (``attach``), every call raises ``StoreUnavailable``.
* **time**: calls and seconds per method (``stats``), the numerator of "the
  database's share of time per item".

NOTE: reads the metrics callbacks make (``state_counts``) do not pass through
here: they run on the exporter's thread and must not queue behind the worker.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.batch.store import JobStore, StoreUnavailable

log = logging.getLogger("service.batch")
T = TypeVar("T")


class StoreThread:
    """Runs JobStore calls on one thread; ``up``/``errors``/``stats`` describe how they went."""

    def __init__(self, store: JobStore | None = None, on_health: Callable[[bool], None] | None = None) -> None:
        self.store = store
        self.on_health = on_health
        self.up = store is not None
        self.errors = 0  # calls that raised StoreUnavailable
        self.last_error = "" if store is not None else "the batch store is not open yet"
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="batch-store")

    def attach(self, store: JobStore) -> None:
        """The store is open (and recovered): calls go to it from now on."""
        self.store = store
        self._mark(True, "", quiet=True)

    async def __call__(self, method: str, *args: Any) -> Any:
        """``store.<method>(*args)`` on the store thread; StoreUnavailable while it is down or not open."""
        store = self.store
        if store is None:
            raise StoreUnavailable(self.last_error)
        fn = getattr(store, method)

        def timed() -> Any:  # NOTE: timed on the store thread: the queue in front of it is not store time
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.calls[method] += 1
                self.seconds[method] += time.perf_counter() - t0

        try:
            result = await self.run(timed)
        except StoreUnavailable as exc:
            self.errors += 1
            self._mark(False, str(exc))
            raise
        self._mark(True, "")
        return result

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the store thread (opening a store, recovering it)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def stats(self) -> dict[str, tuple[int, float]]:
        """Per store method: (calls, seconds spent in the store)."""
        return {m: (n, self.seconds[m]) for m, n in self.calls.items()}

    def _mark(self, up: bool, error: str, quiet: bool = False) -> None:
        if not up:
            self.last_error = error
        if up == self.up:
            return
        self.up = up
        if quiet:
            pass
        elif up:
            log.info("batch store reachable again")
        else:
            log.warning("batch store unavailable: %s (BatchService answers UNAVAILABLE; retrying)", error)
        if self.on_health is not None:
            self.on_health(up)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self.store is not None:
            self.store.close()
