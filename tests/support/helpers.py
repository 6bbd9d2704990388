"""Small gRPC helpers shared by the model tests."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; its last value."""
    import time

    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            return predicate()
        time.sleep(interval)
    return True


def req(rid: str, prompt: str = "", max_tokens: int = 16, **sampling: Any) -> pb.GenerateRequest:
    extra = {k: sampling.pop(k) for k in ("priority", "messages", "response_format") if k in sampling}
    sampling.setdefault("temperature", 0.0)
    return pb.GenerateRequest(
        request_id=rid, prompt=prompt, sampling=pb.SamplingParams(max_tokens=max_tokens, **sampling), **extra
    )


@dataclass
class Result:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    done: pb.Done | None = None
    error: pb.Error | None = None
    deltas: list[pb.Delta] = field(default_factory=list)


def collect(responses: Iterator[pb.GenerateResponse]) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for r in responses:
        res = out.setdefault(r.request_id, Result())
        kind = r.WhichOneof("event")
        if kind == "delta":
            res.text += r.delta.text
            res.token_ids.extend(r.delta.token_ids)
            res.deltas.append(r.delta)
        elif kind == "done":
            res.done = r.done
        else:
            res.error = r.error
    return out


def run_stream(channel: grpc.Channel, requests: list[pb.GenerateRequest], **kw: Any) -> dict[str, Result]:
    """Send all requests on one stream, close it, and collect every event."""
    stub = pb_grpc.InferenceServiceStub(channel)
    return collect(stub.Generate(iter(requests), **kw))


class OpenStream:
    """A Generate stream whose requests are sent on demand (for cancel tests)."""

    def __init__(self, channel: grpc.Channel, timeout: float | None = None, metadata: Any = None) -> None:
        self._q: queue.Queue[pb.GenerateRequest | None] = queue.Queue()
        stub = pb_grpc.InferenceServiceStub(channel)
        self.call = stub.Generate(iter(self._q.get, None), timeout=timeout, metadata=metadata)
        self.events: queue.Queue[pb.GenerateResponse] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for r in self.call:
                self.events.put(r)
        except grpc.RpcError as exc:
            self.error = exc

    def send(self, request: pb.GenerateRequest) -> None:
        self._q.put(request)

    def close(self) -> None:
        self._q.put(None)

    def next_event(self, timeout: float = 60) -> pb.GenerateResponse:
        return self.events.get(timeout=timeout)

    def join(self, timeout: float = 60) -> None:
        self._thread.join(timeout)


class EngineHold:
    """A step hook that holds the engine thread at the end of every step until ``release()``, or until
    ``until()`` holds (chained to the hook already installed; ``with`` restores it): what is running
    provably stays where it is while the test acts, however busy the machine.

    NOTE: a held step counts against the watchdog's --step-timeout-s (60 s by default), so a hold lasts
    at most ``ceiling`` seconds.
    """

    def __init__(self, engine: Any, until: Callable[[], bool] | None = None, ceiling: float = 45.0) -> None:
        self.engine, self.until, self.ceiling = engine, until, ceiling
        self._released = threading.Event()
        self._chained: Callable[[Any], None] | None = None

    def __enter__(self) -> EngineHold:
        self._chained = self.engine.step_hook
        self.engine.step_hook = self
        return self

    def __call__(self, engine: Any) -> None:
        if self._chained is not None:
            self._chained(engine)
        if self.until is None:
            self._released.wait(self.ceiling)
        elif not wait_for(lambda: self._released.is_set() or bool(self.until and self.until()), self.ceiling, 0.002):
            raise AssertionError("EngineHold: the condition never came")  # fails the step: loud
        self._released.set()

    def release(self) -> None:
        self._released.set()

    def __exit__(self, *exc: object) -> None:
        self.engine.step_hook = self._chained
        self.release()


class MarginRecorder:
    """Engine logits hook: per request id, each sampled row's 8 best tokens and their logits."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict[int, float]]] = {}

    def __call__(self, seqs: list, logits: Any) -> None:
        import numpy as np

        for s, row in zip(seqs, logits, strict=True):
            top = np.argpartition(row, -8)[-8:]
            self.rows.setdefault(s.request_id, []).append({int(t): float(row[t]) for t in top})


def near_tie(rows: list[dict[int, float]], k: int, reference: int, other: int, tol: float) -> bool:
    """In the reference run's row ``k``, ``reference`` was the top token and ``other`` within ``tol``."""
    best = rows[k]
    top = max(best.values())
    return best.get(reference) == top and other in best and top - best[other] < tol


def assert_same_greedy(
    reference: list[int], other: list[int], rows: list[dict[int, float]], tol: float = 0.5
) -> None:
    """Token-for-token equality up to the first divergence, which must be a near-tie.

    NOTE: llama.cpp's results depend slightly on batch shape and on which KV
    cells are in use (summation order), moving logits by a few tenths at most.
    A divergence is accepted only where the other run's token was, in the
    reference run, among the best tokens and within ``tol`` of the top logit;
    cross-talk between sequences would produce arbitrary tokens at arbitrary
    margins. After a divergence the texts differ: where the other run can take
    a logits hook, ``ForceReference`` compares every token instead.
    """
    assert len(reference) == len(other)
    for k, (x, y) in enumerate(zip(reference, other, strict=True)):
        if x != y:
            best = rows[k]
            assert near_tie(rows, k, x, y, tol), (
                f"token {k}: {x} vs {y}; reference logits {sorted(best.items(), key=lambda kv: -kv[1])[:3]}"
            )
            return


class ForceReference:
    """Engine logits hook for a greedy run compared with a recorded reference run, token by token.

    At each sampled row of a request in ``reference`` (request id -> its greedy tokens), the row's
    best token is compared with the reference token at that position. A difference where the
    reference was a near-tie (``near_tie`` on the reference's ``rows``, a ``MarginRecorder``'s) is
    noted in ``near_ties``; any other difference in ``divergences``. Either way the reference
    token is then forced (its logit raised above the best), so the run stays on the reference's
    path and every later token is compared too, not only those before the first near-tie.
    ``check`` asserts there was no divergence beyond a near-tie.

    NOTE: only rows the engine samples from pass through the hook first; speculative drafts are
    verified before the hook sees their rows: ``forced_to`` turns speculation off while it forces.
    """

    def __init__(
        self, reference: Mapping[str, list[int]], rows: Mapping[str, list[dict[int, float]]], tol: float = 0.5
    ) -> None:
        self.reference, self.rows, self.tol = reference, rows, tol
        self.compared: dict[str, int] = {}
        self.near_ties: list[tuple[str, int, int, int]] = []  # (request id, position, reference, got)
        self.divergences: list[tuple[str, int, int, int]] = []

    def __call__(self, seqs: list, logits: Any) -> None:
        import numpy as np

        for i, s in enumerate(seqs):
            ref = self.reference.get(s.request_id)
            k = s.num_generated
            if ref is None or k >= len(ref):
                continue
            self.compared[s.request_id] = self.compared.get(s.request_id, 0) + 1
            row = logits[i]
            got, want = int(np.argmax(row)), ref[k]
            if got == want:
                continue
            ok = near_tie(self.rows[s.request_id], k, want, got, self.tol)
            (self.near_ties if ok else self.divergences).append((s.request_id, k, want, got))
            row[want] = row[got] + 1.0

    def check(self, complete: bool = True) -> None:
        """No divergence but near-ties; with ``complete``, every reference token was compared."""
        assert not self.divergences, f"(request, position, reference, got): {self.divergences[:5]}"
        for rid, tokens in self.reference.items() if complete else ():
            assert self.compared.get(rid) == len(tokens), (rid, self.compared.get(rid), len(tokens))


@contextmanager
def recording(engine: Any) -> Iterator[MarginRecorder]:
    """The block's sampled rows recorded (``MarginRecorder``): the reference run of a comparison."""
    rec = MarginRecorder()
    engine.logits_hook = rec
    try:
        yield rec
    finally:
        engine.logits_hook = None


@contextmanager
def forced_to(
    engine: Any, reference: Mapping[str, list[int]], rows: Mapping[str, list[dict[int, float]]], tol: float = 0.5
) -> Iterator[ForceReference]:
    """The block's requests compared with ``reference`` token by token (``ForceReference``), with
    speculation off so that every token passes through the hook before it is chosen."""
    force = ForceReference(reference, rows, tol)
    saved = engine.speculator.config
    engine.speculator.config = replace(saved, enabled=False)
    engine.logits_hook = force
    try:
        yield force
    finally:
        engine.logits_hook = None
        engine.speculator.config = saved


def preempt_reject_cancel(ch: grpc.Channel) -> dict[str, pb.GenerateResponse]:
    """On a server with max_running=1 and a batch queue of 1: a batch request that is preempted
    by an interactive one and then cancelled, one queued then cancelled, one refused (queue
    full), one interactive completed. Returns each request's final event."""
    stream = OpenStream(ch)
    stream.send(req("long", "Once upon a time", 400, ignore_eos=True, priority=pb.PRIORITY_BATCH))
    assert stream.next_event().WhichOneof("event") == "delta"  # running, out of the batch queue
    stream.send(req("queued", "Hello", 4, priority=pb.PRIORITY_BATCH))  # fills the batch queue
    stream.send(req("refused", "Hello", 4, priority=pb.PRIORITY_BATCH))
    stream.send(req("urgent", "Quick:", 3, ignore_eos=True))  # preempts "long" (max_running=1)
    finals: dict[str, pb.GenerateResponse] = {}
    while "urgent" not in finals or "refused" not in finals:
        ev = stream.next_event()
        if ev.WhichOneof("event") != "delta":
            finals[ev.request_id] = ev
    for rid in ("long", "queued"):
        stream.send(pb.GenerateRequest(request_id=rid, cancel=True))
    stream.close()
    stream.join()
    return finals


def assert_loads_stay_bounded(
    pick: Callable[[bytes, Mapping[str, int]], str],
    keys: Sequence[bytes],
    backends: Sequence[str],
    epsilon: float,
    seed: int,
) -> None:
    """3,000 random arrivals (on ``keys``) and departures: no backend ever holds more than
    ``ceil((1 + epsilon) * (total + 1) / n)``, the bounded-load ring's capacity."""
    import math
    import random
    from collections import Counter

    rng = random.Random(seed)
    loads: Counter[str] = Counter()
    placed: list[str] = []
    for _ in range(3000):
        if placed and rng.random() < 0.45:
            loads[placed.pop(rng.randrange(len(placed)))] -= 1
            continue
        cap = math.ceil((1 + epsilon) * (sum(loads.values()) + 1) / len(backends))
        backend = pick(keys[rng.randrange(len(keys))], loads)
        loads[backend] += 1
        placed.append(backend)
        assert loads[backend] <= cap
