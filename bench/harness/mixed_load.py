"""Mixed load: interactive requests on a timer beside other work, and tokens counted inside a window.

Used by scenario E (interactive latency beside batch streams) and scenario J (beside a batch job).
"""

from __future__ import annotations

import asyncio
import time

import grpc

from bench.harness.grpc_load import INTERACTIVE, ReqResult, Stream


class WindowMeter:
    """Counts tokens that arrive between ``start`` and ``end`` (perf_counter times)."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end, self.tokens = start, end, 0

    def add(self, n: int, at: float) -> None:
        if self.start <= at <= self.end:
            self.tokens += n


async def interactive(
    ch: grpc.aio.Channel, prompts: list[str], tokens: int, interval_s: float, meter: WindowMeter
) -> list[ReqResult]:
    """Open loop: an interactive request of ``tokens`` tokens every ``interval_s`` from the meter's
    start until 1 s before its end (prompts in turn); their tokens go to ``meter``."""
    stream = Stream(ch, on_tokens=meter.add)
    start, end = meter.start, meter.end
    tasks = []
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    i = 0
    while time.perf_counter() < end - 1.0:
        tasks.append(asyncio.create_task(stream.request(prompts[i % len(prompts)], tokens, INTERACTIVE)))
        i += 1
        await asyncio.sleep(max(0.0, start + i * interval_s - time.perf_counter()))
    results = list(await asyncio.gather(*tasks))
    await stream.close()
    return results
