"""``ChangeFeed``: job-change wake-ups on the event loop (WatchBatch streams, the worker).

With a shared store every replica hears every committed change of a job
(``SharedJobStore.on_change``: PostgreSQL ``LISTEN/NOTIFY`` on the store's own
connection and thread); the feed moves them onto the event loop, where a
``WatchBatch`` stream waits for its job and the worker for ``WORK``. Without a
shared store (SQLite: one replica) nothing arrives and waiters poll.

Waiting follows a mark: take ``mark()`` *before* reading the store, then
``wait(job_id, since=mark, timeout)``: a change committed between the read and
the wait still wakes the waiter.

NOTE: a wake-up is a hint, the store is the truth: every waiter re-reads the
store at its timeout too (notifications sent while the listener reconnects are
lost), so ``poll_s`` shortens the timeout while notifications are down.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from service.batch.shared_store import WORK, SharedJobStore

MAX_TRACKED_JOBS = 10_000
FALLBACK_POLL_S = 5.0  # re-read at least this often while notifications arrive


class ChangeFeed:
    """Per-job change counters on the event loop; ``on_work`` is called for ``WORK`` changes."""

    def __init__(self) -> None:
        self.store: SharedJobStore | None = None
        self.on_work: Callable[[], None] | None = None
        self._seq = 0
        self._last: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._event = asyncio.Event()

    def attach(self, store: SharedJobStore, loop: asyncio.AbstractEventLoop) -> None:
        """Receive ``store``'s changes from now on (its listener thread hands them to ``loop``)."""
        self.store = store

        def hand_over(job_id: str) -> None:  # the listener thread
            with contextlib.suppress(RuntimeError):  # NOTE: the loop closed first (shutdown): nobody waits
                loop.call_soon_threadsafe(self.changed, job_id)

        store.on_change(hand_over)

    def live(self) -> bool:
        """True while another replica's changes reach this feed."""
        return self.store is not None and self.store.notifications_live()

    def poll_s(self, interval: float) -> float:
        """How long a waiter may wait before re-reading: ``interval`` unless wake-ups are live."""
        return max(interval, FALLBACK_POLL_S) if self.live() else interval

    def mark(self) -> int:
        return self._seq

    def changed(self, job_id: str) -> None:
        """A change of ``job_id`` (event loop thread)."""
        self._seq += 1
        self._last[job_id] = self._seq
        self._last.move_to_end(job_id)
        while len(self._last) > MAX_TRACKED_JOBS:
            self._last.popitem(last=False)
        event, self._event = self._event, asyncio.Event()
        event.set()
        if job_id == WORK and self.on_work is not None:
            self.on_work()

    async def wait(self, job_id: str, since: int, timeout: float) -> bool:
        """True once ``job_id`` changed after mark ``since``; False after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._last.get(job_id, 0) <= since:
            left = deadline - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), left)
        return True
