"""``StoreThread``: the event loop's door to the job store (threads, health, time spent).

Every ``JobStore`` call of the worker and the servicer runs on a store thread,
so the event loop never waits on the disk or the database:

* SQLite: one thread for everything (the store is one connection);
* a shared store (``lanes=True``): the worker's calls and the RPCs' calls run on
  separate threads (``WORKER_THREADS``, ``RPC_THREADS``), so a call of a client
  never queues behind result writes that wait for the database.

It also keeps what operators and benchmarks ask about the store:

* **health**: a call that raises ``StoreUnavailable`` marks the store down, the
  next call that returns marks it up again; ``on_health(up)`` is told of every
  change (the server turns it into the BatchService's gRPC health). Before a
  shared store is open (``attach``), every call raises ``StoreUnavailable``.
  While the store is down an RPC's call (``rpc``) fails at once, except one per
  ``PROBE_S`` that tries the store (the worker's rounds keep trying too), so a
  client gets UNAVAILABLE in about a second, not after the database's timeouts.
* **time**: calls and seconds per method (``stats``), the numerator of "the
  database's share of time per item".

NOTE: reads the metrics callbacks make (``state_counts``) do not pass through
here: they run on the exporter's thread and must not queue behind the worker.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.batch.store import JobStore, StoreUnavailable

log = logging.getLogger("service.batch")
T = TypeVar("T")
WORKER_THREADS, RPC_THREADS = 2, 3  # a shared store's lanes (its connection pool holds more connections)
PROBE_S = 1.0


class StoreThread:
    """Runs JobStore calls on store threads; ``up``/``errors``/``stats`` describe how they went."""

    def __init__(
        self, store: JobStore | None = None, on_health: Callable[[bool], None] | None = None, lanes: bool = False
    ) -> None:
        self.store = store
        self.on_health = on_health
        self.up = store is not None
        self.errors = 0  # calls that raised StoreUnavailable
        self.last_error = "" if store is not None else "the batch store is not open yet"
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._lock = threading.Lock()
        self._last_probe = 0.0
        self._pool = ThreadPoolExecutor(WORKER_THREADS if lanes else 1, thread_name_prefix="batch-store")
        self._rpc_pool = ThreadPoolExecutor(RPC_THREADS, thread_name_prefix="batch-rpc") if lanes else self._pool

    def attach(self, store: JobStore) -> None:
        """The store is open (and recovered): calls go to it from now on."""
        self.store = store
        self._mark(True, "", quiet=True)

    async def __call__(self, method: str, *args: Any) -> Any:
        """(The worker) ``store.<method>(*args)``; StoreUnavailable while the store is down or not open."""
        return await self._call(self._pool, method, args)

    async def rpc(self, method: str, *args: Any) -> Any:
        """(The servicer) as ``__call__``, but failing at once while the store is down (one probe per
        ``PROBE_S`` goes through)."""
        if not self.up and self.store is not None:
            now = time.monotonic()
            if now - self._last_probe < PROBE_S:
                raise StoreUnavailable(self.last_error)
            self._last_probe = now
        return await self._call(self._rpc_pool, method, args)

    async def _call(self, pool: ThreadPoolExecutor, method: str, args: tuple[Any, ...]) -> Any:
        store = self.store
        if store is None:
            raise StoreUnavailable(self.last_error)
        fn = getattr(store, method)

        def timed() -> Any:  # NOTE: timed on the store thread: the queue in front of it is not store time
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self.calls[method] += 1
                    self.seconds[method] += time.perf_counter() - t0

        try:
            result = await asyncio.get_running_loop().run_in_executor(pool, timed)
        except StoreUnavailable as exc:
            self.errors += 1
            self._mark(False, str(exc))
            raise
        self._mark(True, "")
        return result

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker-lane thread (opening a store, recovering it)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def stats(self) -> dict[str, tuple[int, float]]:
        """Per store method: (calls, seconds spent in the store)."""
        with self._lock:
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
        self._rpc_pool.shutdown(wait=True)
        if self.store is not None:
            self.store.close()
