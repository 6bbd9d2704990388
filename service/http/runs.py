"""The runs of a completions request with several prompts, merged into one sequence of events.

Each prompt is a request of its own through the lifecycle (one ``Run`` each: preparation, quotas,
cache and the engine's fair share treat it as any request), started together. ``Runs`` has the
interface the answer writer reads a single ``Run`` through (``next``, ``events``, ``abort``,
``aborted``), so the answer, its stream and the disconnect watch are the same for one prompt or many:

* choice ``j`` of prompt ``i`` is renumbered ``i * n + j`` (OpenAI's index order);
* the first ``next`` waits for every prompt's first event, so a prompt refused before it ran (a 400,
  a 429) is the status of the whole response, and returns the refusal of the first refused prompt,
  else the first events in prompt order; from then on, events come as the runs produce them
  (a stream interleaves the prompts' choices, each chunk with its index; an unstreamed answer sorts
  them by index);
* an error of one prompt ends the whole response with that error: the answer writer stops at it
  and ``abort`` cancels the other prompts' requests (NOTE: OpenAI's answer for a partly failed
  multi-prompt request is not documented; partial choices would read as a complete answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from inference.v1 import inference_pb2 as pb

from service.http.run import Run


class Runs:
    """The merged events of ``runs`` (one per prompt, ``n`` choices each); see the module docstring."""

    def __init__(self, runs: list[Run], n: int) -> None:
        self.runs, self.n = runs, n
        self.aborted = False
        self._first: list[pb.GenerateResponse] | None = None  # the first events, not handed out yet
        self._pending: dict[asyncio.Future[pb.GenerateResponse | None], int] = {}

    def _renumber(self, i: int, ev: pb.GenerateResponse) -> pb.GenerateResponse:
        kind = ev.WhichOneof("event")
        if kind == "delta":
            ev.delta.choice_index += i * self.n
        elif kind == "done":
            ev.done.choice_index += i * self.n
        return ev

    def _wait_next(self, i: int) -> None:
        self._pending[asyncio.ensure_future(self.runs[i].next())] = i

    async def _open(self) -> list[pb.GenerateResponse]:
        """Every prompt's first event (a prompt whose client left: none), then its next is awaited."""
        firsts = await asyncio.gather(*(r.next() for r in self.runs))
        for i, ev in enumerate(firsts):
            if ev is not None:
                self._wait_next(i)
        events = [self._renumber(i, ev) for i, ev in enumerate(firsts) if ev is not None]
        refused = [ev for ev in events if ev.WhichOneof("event") == "error"]
        return refused[:1] or events

    async def next(self) -> pb.GenerateResponse | None:
        """The next event of any prompt (choice indexes renumbered); None once every run has ended."""
        if self._first is None:
            self._first = await self._open()
        if self._first:
            return self._first.pop(0)
        while self._pending and not self.aborted:
            done, _ = await asyncio.wait(self._pending, return_when=asyncio.FIRST_COMPLETED)
            fut = min(done, key=lambda f: self._pending[f])  # NOTE: of events ready at once, prompt order
            i = self._pending.pop(fut)
            if (ev := fut.result()) is not None:
                self._wait_next(i)
                return self._renumber(i, ev)
        return None

    async def events(self) -> AsyncIterator[pb.GenerateResponse]:
        """The remaining events, up to every run's end (or an abort)."""
        while (item := await self.next()) is not None:
            yield item

    def abort(self) -> None:
        """Cancel every prompt's request (idempotent)."""
        self.aborted = True
        for fut in self._pending:
            fut.cancel()
        self._pending.clear()
        for run in self.runs:
            run.abort()
