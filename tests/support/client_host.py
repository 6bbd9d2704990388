"""Clients on their own host: worker processes inside a node's network namespace.

gRPC opens its sockets on its own threads, so a test process cannot talk to
another namespace by switching one thread. ``ClientHost`` starts worker
processes (``spawn``: nothing of this process's gRPC state is inherited) that
enter the node's namespace before anything else and then run module-level
functions of ``tests.support.replica_calls`` (and any other picklable function)
with plain data in and out. Several calls run at once (a watch stream stays
open while other calls go on).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, TypeVar

from tests.support.netns import Node, enter

T = TypeVar("T")


class ClientHost:
    """Run functions in worker processes inside ``node``'s namespace (``call``, ``submit``)."""

    def __init__(self, node: Node, workers: int = 6) -> None:
        self.node = node
        self.pool = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=enter, initargs=(node.ns,)
        )

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        return self.pool.submit(fn, *args)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 60.0) -> T:
        """``fn(*args)`` on the client host; raises what it raised, or TimeoutError after ``timeout``."""
        return self.submit(fn, *args).result(timeout)

    def close(self) -> None:
        """Stop the workers, killing any still inside a call (e.g. a stream to a replica that is gone)."""
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.kill()
            proc.join(10)
