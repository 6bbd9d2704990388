"""A Generate stream's backpressure (``service.api.stream_backlog``): the count of unread messages, and a
write pending ``write_pending_s`` (issue #35: a client whose window is full is paused whatever the count)."""

from __future__ import annotations

import asyncio

from service.api.stream_backlog import Backlog, StreamLimits


class Pauses:
    """Records ``on_pause`` calls; ``changed`` is set on each."""

    def __init__(self) -> None:
        self.calls: list[bool] = []
        self.changed = asyncio.Event()

    def __call__(self, paused: bool) -> None:
        self.calls.append(paused)
        self.changed.set()

    async def next(self) -> bool:
        await asyncio.wait_for(self.changed.wait(), timeout=60)
        self.changed.clear()
        return self.calls[-1]


def test_a_write_pending_past_its_limit_pauses_below_the_count_and_its_completion_resumes() -> None:
    async def run() -> None:
        pauses = Pauses()
        backlog = Backlog(StreamLimits(backlog_high=256, backlog_low=64, write_pending_s=0.05), False, pauses,
                          lambda: None)
        for _ in range(3):
            backlog.on_produced()
        backlog.on_write()  # the first message's write never completes (a full window)
        assert await pauses.next() is True
        assert backlog.value == 3 and backlog.write_stuck
        backlog.on_sent()
        assert await pauses.next() is False
        backlog.close()
        assert pauses.calls == [True, False]

    asyncio.run(run())


def test_a_write_completing_in_time_pauses_nothing() -> None:
    async def run() -> None:
        pauses = Pauses()
        backlog = Backlog(StreamLimits(write_pending_s=0.05), False, pauses, lambda: None)
        for _ in range(50):
            backlog.on_produced()
            backlog.on_write()
            backlog.on_sent()
        while backlog._pending is not None:  # until the timer has fired and found no write pending
            await asyncio.sleep(0.01)
        assert pauses.calls == [] and not backlog.write_stuck
        backlog.close()

    asyncio.run(run())


def test_with_the_limit_off_only_the_count_pauses() -> None:
    async def run() -> None:
        pauses = Pauses()
        backlog = Backlog(StreamLimits(backlog_high=4, backlog_low=1, write_pending_s=0.0), False, pauses,
                          lambda: None)
        backlog.on_produced()
        backlog.on_write()
        assert backlog._pending is None
        for _ in range(3):
            backlog.on_produced()
        assert await pauses.next() is True  # at 4 unread
        backlog.close()

    asyncio.run(run())
