"""The engine: one thread, one ``step()`` per ``llama_decode``.

``step()`` = plan -> forward -> mask -> sample -> update -> emit. Every running
sequence advances in the same decode; requests join (admission) and leave
(finish, cancel, preemption) between steps.

Threading: RPC handlers call ``submit``/``abort`` from the event loop; those
only post to the inbox. Results go back as one ``loop.call_soon_threadsafe``
per step carrying every event of the step. ctypes releases the GIL inside
``llama_decode``, so the event loop keeps serving while the engine computes.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.events import Delta, Done, Error
from service.metrics import EngineMetrics
from service.paged_kv import KVBlockManager
from service.priority import AdmissionControl, QueueFull, QueuePolicy
from service.runner import ModelRunner
from service.sampling import sample_rows
from service.scheduler import Plan, Scheduler
from service.sequence import FinishReason, Priority, Sequence
from service.telemetry import Telemetry

log = logging.getLogger("service.engine")


class Draining(Exception):
    """The server is shutting down and accepts no new requests."""


@dataclass(frozen=True)
class EngineConfig:
    max_running: int = 16
    token_budget: int = 128
    batch_prefill_budget: int = 64
    queue_limits: tuple[int, int] = (256, 1024)  # interactive, batch


class Engine:
    """Owns the scheduler and the model runner; runs them on a dedicated thread."""

    def __init__(
        self,
        runner: ModelRunner,
        kv: KVBlockManager,
        policy: QueuePolicy,
        config: EngineConfig,
        metrics: EngineMetrics | None = None,
        mask_batch: Any = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.runner = runner
        self.kv = kv
        self.config = config
        self.metrics = metrics or EngineMetrics()
        self.mask_batch = mask_batch  # json_grammar.MaskBatch for constrained rows, or None
        self.telemetry = telemetry or Telemetry()
        self.eog_ids = runner.vocab.eog_ids
        self.scheduler = Scheduler(
            kv,
            policy,
            max_running=config.max_running,
            token_budget=config.token_budget,
            append_token=self._append_token,
            batch_prefill_budget=config.batch_prefill_budget,
            mixed_step_tokens=runner.mixed_batch_max,
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Sequence]] = queue.SimpleQueue()
        limits = config.queue_limits
        self.admission = AdmissionControl({Priority.INTERACTIVE: limits[0], Priority.BATCH: limits[1]})
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.draining = False
        self._cancel_message = "cancelled"
        self.step_hook: Callable[[Engine], None] | None = None  # tests: called after every step
        self.logits_hook: Callable[[list[Sequence], np.ndarray], None] | None = None  # tests: sees logits

    # -- lifecycle ------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the engine thread and wait for its warm-up decode; raises what the warm-up raised.

        NOTE: every ``llama_decode`` of a context must run on this one thread,
        the warm-up included. ggml's CPU backend uses OpenMP, which keeps a
        thread team per calling thread; while a second caller (say a loader
        thread that ran the warm-up) stays alive, libgomp counts more managed
        threads than CPUs and stops spinning at barriers, so each of the graph's
        hundreds of barriers sleeps in the kernel. Measured on this 2-core
        machine: an 8-token decode 30 ms from one thread, 40-47 ms after
        another live thread had decoded once.
        """
        self.loop = loop
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(("wake", None))  # type: ignore[arg-type]
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _warm_up(self) -> None:
        """One real decode before SERVING (loads weights into cache, proves the model works)."""
        ids = self.runner.vocab.tokenize("Hello") or [0]
        n = len(ids)
        self.runner.decode(np.asarray(ids), np.arange(n), np.zeros(n), np.r_[np.zeros(n - 1), 1])
        self.runner.clear_kv()

    # -- API for RPC handlers (any thread) ----------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """Queue ``seq``; raises QueueFull or Draining instead of dropping anything."""
        if self.draining:
            raise Draining("server is shutting down")
        try:
            self.admission.enter(seq, self._retry_hint_ms)
        except QueueFull:
            self.metrics.on_reject(seq.priority)
            raise
        self.metrics.on_accept(seq)
        self._inbox.put(("add", seq))

    def abort(self, seq: Sequence) -> None:
        """Cancel ``seq``; it ends within one step with a CANCELLED done event."""
        self._inbox.put(("abort", seq))

    def cancel_all(self, message: str) -> None:
        """Cancel every queued and running request (end of a drain)."""
        self._cancel_message = message
        self._inbox.put(("cancel_all", None))  # type: ignore[arg-type]

    def _retry_hint_ms(self, priority: Priority, depth: int) -> int:
        """Rough time for the queue ahead to drain: backlog x typical request latency."""
        e2e = self.metrics.snapshot()["tiers"][priority]["e2e"]["p50_ms"] or 1000.0
        backlog = depth / max(self.config.max_running, 1)
        return int(min(60_000, max(100.0, e2e * max(backlog, 0.1))))

    # -- engine thread ---------------------------------------------------------------------
    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            self._warm_up()
        except BaseException as exc:  # reported to start()'s caller
            failure.append(exc)
            return
        finally:
            ready.set()
        while not self._stopping:
            self._drain_inbox(block=not self.scheduler.has_work())
            if self._stopping:
                break
            if self.scheduler.has_work():
                try:
                    self.step()
                except Exception as exc:  # pragma: no cover - defensive: never kill the engine
                    log.exception("engine step failed")
                    self._fail_running(f"engine step failed: {exc}")

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, seq = item
            if kind == "add":
                self.scheduler.add(seq)
            elif kind == "abort" and self.scheduler.abort(seq):
                self._left_queue(seq)
                self._dispatch([(seq, self._done(seq))])
            elif kind == "cancel_all":
                self._cancel_everything()
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _cancel_everything(self) -> None:
        """End every queued and running request with UNAVAILABLE (end of a drain); one handoff."""
        events: list[tuple[Sequence, Any]] = []
        for s in self.scheduler.waiting + self.scheduler.running:
            self.scheduler.abort(s)
            self._left_queue(s)
            self.metrics.on_finish(s)
            events.append((s, Error("UNAVAILABLE", self._cancel_message)))
        self._dispatch(events)

    def _left_queue(self, seq: Sequence) -> bool:
        return self.admission.leave(seq)

    def step(self) -> None:
        """plan -> forward -> mask -> sample -> update -> emit."""
        plan = self.scheduler.schedule()
        events: list[tuple[Sequence, Any]] = []
        for seq in plan.expired:
            self._left_queue(seq)
            self.metrics.on_finish(seq)
            events.append((seq, Error("DEADLINE_EXCEEDED", "deadline expired while the request was queued")))
        if not plan.items:
            self.runner.apply_kv_ops(plan.kv_ops)
            self._dispatch(events)
            if not plan.expired:
                time.sleep(0.001)
            return
        self._note_plan(plan)
        self.runner.apply_kv_ops(plan.kv_ops)
        logits, sampling = self._forward(plan)
        sampled = self._sample(sampling, logits)
        finished = self.scheduler.update(plan, sampled)
        self._emit(plan, sampled, finished, events)
        if self.step_hook is not None:
            self.step_hook(self)

    def _note_plan(self, plan: Plan) -> None:
        for item in plan.items:
            if self._left_queue(item.seq):
                self.telemetry.on_scheduled(item.seq)
        for seq, reason in zip(plan.preempted, plan.preempt_reasons, strict=True):
            self.telemetry.on_preempted(seq, reason)

    def _forward(self, plan: Plan) -> tuple[np.ndarray, list[Sequence]]:
        toks: list[int] = []
        pos: list[np.ndarray] = []
        lanes: list[int] = []
        want: list[int] = []
        sampling: list[Sequence] = []
        for item in plan.items:
            seq, n, start = item.seq, item.num_tokens, item.seq.num_computed
            toks.extend(seq.token_ids[start : start + n])
            pos.append(np.arange(start, start + n))
            lanes.extend([seq.lane] * n)  # type: ignore[list-item]
            want.extend([0] * (n - 1) + [1 if item.sample else 0])
            if item.sample:
                sampling.append(seq)
        logits = self.runner.decode(
            np.asarray(toks), np.concatenate(pos), np.asarray(lanes), np.asarray(want)
        )
        prefill = sum(i.num_tokens for i in plan.items if not i.sample or i.num_tokens > 1)
        self.metrics.on_step(len(plan.items), prefill, len(sampling))
        return logits, sampling

    def _sample(self, seqs: list[Sequence], logits: np.ndarray) -> dict[int, int]:
        constrained = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if constrained and self.mask_batch is not None:
            us = self.mask_batch.fill_and_apply([seqs[i].matcher for i in constrained], logits, constrained)
            self.metrics.on_mask(us, len(constrained), 0)
        if self.logits_hook is not None:
            self.logits_hook(seqs, logits)
        tokens = sample_rows(logits, [s.params for s in seqs], [s.rng for s in seqs])  # type: ignore[misc]
        if self.telemetry.enabled:
            for s in seqs:
                if s.first_token_time is None:
                    self.telemetry.on_first_token(s)
        return {s.uid: int(t) for s, t in zip(seqs, tokens, strict=True)}

    # -- per-token bookkeeping (called by Scheduler.update) -------------------------------
    def _append_token(self, seq: Sequence, token: int) -> FinishReason | None:
        """Append a sampled token (and any tokens the grammar then forces); say why it finished."""
        reason = self._append_one(seq, token)
        if reason is None and seq.matcher is not None:
            # NOTE: fast-forward: tokens the grammar forces are appended uncomputed,
            # so the next step computes them in one chunk instead of sampling each.
            forced = seq.matcher.forced_tokens()
            for t in forced:
                reason = self._append_one(seq, t)
                if reason is not None:
                    break
            if forced:
                self.metrics.on_mask(0.0, 0, len(forced))
        return reason

    def _append_one(self, seq: Sequence, token: int) -> FinishReason | None:
        if seq.matcher is not None and (err := seq.matcher.error()) is not None:
            seq.error, seq.error_status = f"grammar failed: {err}", getattr(err, "status", "INTERNAL")
            return FinishReason.ERROR
        seq.token_ids.append(token)
        if token in self.eog_ids and not seq.params.ignore_eos:
            return FinishReason.STOP  # counted in usage, never sent as output
        seq.out_tokens.append(token)
        if seq.matcher is not None:
            try:
                seq.matcher.consume(token)
            except Exception as exc:
                seq.error, seq.error_status = f"grammar rejected token {token}: {exc}", "INTERNAL"
                return FinishReason.ERROR
        if seq.text is not None:
            seq.out_text += seq.text.push(token)
            if seq.text.stopped:
                return FinishReason.STOP
        if seq.matcher is not None and seq.matcher.is_stopped():
            return FinishReason.STOP
        if seq.num_generated >= seq.params.max_tokens:
            return FinishReason.LENGTH
        return None

    # -- emission ---------------------------------------------------------------------------
    def _emit(self, plan: Plan, sampled: dict[int, int], finished: list[Sequence], events: list) -> None:
        done = {s.uid for s in finished}
        for item in plan.items:
            seq = item.seq
            if seq.uid in done and seq.text is not None and seq.finish_reason is not FinishReason.ERROR:
                seq.out_text += seq.text.flush()
            if seq.out_tokens or seq.out_text:
                events.append((seq, Delta(seq.out_text, tuple(seq.out_tokens))))
                seq.out_text, seq.out_tokens = "", []
        for seq in finished:
            self.metrics.on_finish(seq)
            if seq.finish_reason is FinishReason.ERROR:
                events.append((seq, Error(seq.error_status, seq.error or "request failed")))
            else:
                events.append((seq, self._done(seq)))
        self._dispatch(events)

    def _done(self, seq: Sequence) -> Done:
        if seq.finish_reason is FinishReason.CANCELLED:
            self.metrics.on_finish(seq)
        return Done.of(seq)

    def _dispatch(self, events: list[tuple[Sequence, Any]]) -> None:
        if not events:
            return
        if self.loop is None:
            _deliver(events)
        else:
            self.loop.call_soon_threadsafe(_deliver, events)

    def _fail_running(self, message: str) -> None:
        events = []
        for seq in list(self.scheduler.running):
            seq.error = message
            self.scheduler.fail(seq)
            self.metrics.on_finish(seq)
            events.append((seq, Error("INTERNAL", message)))
        self._dispatch(events)


def _deliver(events: list[tuple[Sequence, Any]]) -> None:
    for seq, event in events:
        try:
            seq.emit(event)
        except Exception:  # pragma: no cover - a broken sink must not affect other requests
            log.exception("delivering an event for %s failed", seq.request_id)
