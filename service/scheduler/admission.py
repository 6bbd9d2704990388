"""Admission-time estimates: the retry hint of a rejection, and shedding of unmeetable deadlines."""

from __future__ import annotations

import time
from collections.abc import Callable

from service.observability.views import MetricsSnapshot
from service.priority import QueueFull
from service.request.sequence import Priority, Sequence

# How long a computed retry hint's latency figure is reused (a flood of rejections must stay cheap).
RETRY_HINT_TTL_S = 0.1


class DeadlineUnmeetable(QueueFull):
    """The queue ahead is longer than the request's deadline allows (RESOURCE_EXHAUSTED)."""

    def __init__(self, priority: Priority, wait_ms: int, left_ms: int) -> None:
        Exception.__init__(
            self,
            f"deadline cannot be met: about {wait_ms} ms of queued work ahead, {left_ms} ms left; "
            f"retry after {wait_ms} ms or with a longer deadline",
        )
        self.priority = priority
        self.retry_after_ms = wait_ms


class RetryHints:
    """Rough time for a tier's queue to drain: backlog x typical request latency.

    NOTE: the typical latency comes from a metrics snapshot, which is costly; it
    is refreshed at most every ``RETRY_HINT_TTL_S``.
    """

    def __init__(self, snapshot: Callable[[], MetricsSnapshot], max_running: int) -> None:
        self.snapshot = snapshot
        self.max_running = max(max_running, 1)
        self._e2e: dict[Priority, tuple[float, float]] = {}  # tier -> (computed at, e2e p50 ms)

    def __call__(self, priority: Priority, depth: int) -> int:
        now = time.monotonic()
        at, e2e = self._e2e.get(priority, (-1.0, 0.0))
        if now - at > RETRY_HINT_TTL_S:
            e2e = self.snapshot().tiers[priority].e2e.p50_ms or 1000.0
            self._e2e[priority] = (now, e2e)
        backlog = depth / self.max_running
        return int(min(60_000, max(100.0, e2e * max(backlog, 0.1))))

    def check_deadline(self, seq: Sequence, depth: int) -> None:
        """Raise DeadlineUnmeetable when a full round of queued work is ahead of ``seq`` and the
        estimated wait exceeds the time it has left."""
        if seq.deadline is None or depth < self.max_running:
            return
        wait = self(seq.priority, depth)
        left = int((seq.deadline - time.monotonic()) * 1e3)
        if wait > left:
            raise DeadlineUnmeetable(seq.priority, wait, max(left, 0))
