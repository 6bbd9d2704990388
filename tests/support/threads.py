"""Running test code on several threads at once (races between replicas, stores, connections)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def in_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(0..n-1)`` on n threads started together; their results (a thread's exception is raised)."""
    barrier = threading.Barrier(n)

    def run(i: int) -> Any:
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return [f.result() for f in [pool.submit(run, i) for i in range(n)]]
