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

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from service.engine.inbox import Abort, CancelAll, Inbox, Pause, Submit, Wake
from service.engine.model_step import LogitsHook, ModelStep, RequestHooks
from service.engine.speculator import Speculator
from service.engine.token_appender import TokenAppender
from service.engine.watchdog import Watchdog
from service.engine.wiring import Collaborators, EngineConfig
from service.model.runner import ModelRunner
from service.observability.engine_metrics import EngineMetrics
from service.observability.step_clock import StepClock
from service.observability.telemetry import Telemetry
from service.observability.views import EngineSnapshot, ModelFigures
from service.paged_kv import KVBlockManager
from service.priority import AdmissionControl, QueueFull, QueuePolicy
from service.request.events import DRAINING, ENGINE_FAILED, Delta, Done, Error, take_output
from service.request.sequence import FinishReason, Priority, Sequence
from service.scheduler.admission import RetryHints
from service.scheduler.batch_rows import BatchRowCap
from service.scheduler.plan import Plan
from service.scheduler.scheduler import Scheduler

log = logging.getLogger("service.engine")
Event = Delta | Done | Error  # what the engine hands a request's sink


class Draining(Exception):
    """The server is shutting down and accepts no new requests."""

    reason = DRAINING  # ``Error.reason``: clients may retry the request on another replica


class EngineFailed(Draining):
    """The engine thread died or stalled; nothing more is accepted (UNAVAILABLE to clients)."""

    reason = ENGINE_FAILED


class Engine:
    """Owns the scheduler and the model runner; runs them on a dedicated thread.

    Complete when built: ``parts`` brings every collaborator (NOTE: ``step_hook`` and
    ``logits_hook`` are test probes, set and cleared by tests around a request).
    """

    def __init__(
        self,
        runner: ModelRunner,
        kv: KVBlockManager,
        policy: QueuePolicy,
        config: EngineConfig,
        parts: Collaborators | None = None,
    ) -> None:
        parts = parts if parts is not None else Collaborators()
        self.runner = runner
        self.kv = kv
        self.config = config
        self.metrics = parts.metrics or EngineMetrics()
        self.clock = StepClock()  # where each step's time goes (GetMetrics step_phases)
        self._hooks: RequestHooks = parts.hooks or Telemetry()
        self.model = ModelStep(
            runner, self.metrics, self._hooks, runner.vocab.token_bytes, self.clock, parts.mask_batch
        )
        self.eog_ids = runner.vocab.eog_ids
        self._appender = TokenAppender(self.eog_ids, runner.vocab.token_bytes)
        self.scheduler = self._scheduler(kv, policy)
        self.speculator = Speculator(config.speculation)
        self.loop = parts.loop
        self.on_failure = parts.on_failure  # called on the event loop, once
        self.thread_control = parts.thread_control  # threads.adaptive.AdaptiveThreads
        self._inbox = Inbox()
        limits = config.queue_limits
        self.admission = AdmissionControl({Priority.INTERACTIVE: limits[0], Priority.BATCH: limits[1]})
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.draining = False
        self.failure: str | None = None  # why the engine failed; then nothing is accepted
        self.step_started: float | None = None  # monotonic start of the step in progress
        self._life = threading.Lock()  # orders submit() against fail()
        self._live: dict[int, Sequence] = {}  # accepted, terminal event not yet delivered (under _life)
        self.hints = RetryHints(self.metrics.figures, config.max_running)
        self._watchdog: Watchdog | None = None
        self._current: Plan | None = None  # the plan of the step in progress
        self.step_hook: Callable[[Engine], None] | None = None  # tests: called after every step

    def _scheduler(self, kv: KVBlockManager, policy: QueuePolicy) -> Scheduler:
        config, runner = self.config, self.runner
        cap = config.batch_rows_with_interactive
        return Scheduler(
            kv,
            policy,
            max_running=config.max_running,
            step_tokens=config.step_tokens,
            append_token=self._appender,
            batch_prefill_budget=config.batch_prefill_budget,
            mixed_step_tokens=runner.mixed_batch_max,
            prompt_rows=runner.prompt_rows,
            batch_rows=BatchRowCap(cap) if cap > 0 else None,
            long_prompt_tokens=config.long_prompt_tokens or None,
        )

    def view(self) -> EngineSnapshot:
        """Scheduler, KV pool, model memory and step phases, for metrics (``observability.sources.EngineView``).

        Any thread; plain reads of state the engine thread changes (see ``Scheduler.view``).
        """
        runner = self.runner
        model = ModelFigures(
            runner.model_path.name,
            runner.kv_cache_type,
            runner.kv_bytes_per_token,
            runner.kv_buffer_bytes,
            runner.spilled_bytes,
        )
        return EngineSnapshot(self.scheduler.view(), self.kv.view(), model, self.clock.snapshot())

    @property
    def logits_hook(self) -> LogitsHook | None:
        """Tests: called with (sequences, their rows) for every row a token is chosen from."""
        return self.model.logits_hook

    @logits_hook.setter
    def logits_hook(self, value: LogitsHook | None) -> None:
        self.model.logits_hook = value

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
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
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        if self.config.step_timeout_s > 0:
            self._watchdog = Watchdog(self, self._thread, self.config.step_timeout_s)
            self._watchdog.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the engine thread; True once it has exited (only then may the runner be closed)."""
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.stop()
        self._inbox.put(Wake())
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            if self._thread.is_alive():
                log.error("engine thread still busy %.0f s after stop; its context is left allocated", timeout)
                return False
        return True

    def _warm_up(self) -> None:
        """One real decode before SERVING (loads weights into cache, proves the model works)."""
        ids = self.runner.vocab.tokenize("Hello") or [0]
        n = len(ids)
        self.runner.decode(np.asarray(ids), np.arange(n), np.zeros(n), np.r_[np.zeros(n - 1), 1])
        self.runner.clear_kv()

    # -- API for RPC handlers (any thread) ----------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """Queue ``seq``; raises QueueFull (incl. DeadlineUnmeetable) or Draining instead of dropping it."""
        with self._life:
            if self.failure is not None:
                raise EngineFailed(f"engine failed: {self.failure}")
            if self.draining:
                raise Draining("server is shutting down")
            try:
                self.hints.check_deadline(seq, self.admission.depth(seq.priority))
                self.admission.enter(seq, self.hints)
            except QueueFull:
                self.metrics.on_reject(seq.priority)
                raise
            self.metrics.on_accept(seq)
            self._live[seq.uid] = seq
            self._inbox.put(Submit(seq))

    def abort(self, seq: Sequence, error: Error | None = None) -> None:
        """Cancel ``seq``; it ends within one step with a CANCELLED done event (or ``error``)."""
        self._inbox.put(Abort(seq, error))

    def pause(self, seq: Sequence, paused: bool) -> None:
        """Stop (or resume) scheduling ``seq``, e.g. while its client does not read; KV may be preempted."""
        self._inbox.put(Pause(seq, paused))

    def cancel_all(self, message: str) -> None:
        """Cancel every queued and running request (end of a drain)."""
        self._inbox.put(CancelAll(message))

    # -- engine thread ---------------------------------------------------------------------
    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            self._warm_up()
        except BaseException as exc:  # reported to start()'s caller
            failure.append(exc)
            return
        finally:
            ready.set()
        try:
            while not self._stopping and self.failure is None:
                idle = not self.scheduler.has_runnable()
                if idle:
                    self._settle_kv()
                self._drain_inbox(block=idle)
                if self._stopping or self.failure is not None:
                    break
                if self.scheduler.has_runnable():
                    self._guarded_step()
                self.kv.flush_events()  # NOTE: the step's prefix-index changes, one batch (service.kv.events)
        except BaseException as exc:  # the loop itself broke: end everything, loudly
            log.exception("engine thread died")
            self.fail(f"engine thread died: {type(exc).__name__}: {exc}")

    def _guarded_step(self) -> None:
        """One step; a failure ends the step's sequences (and running ones) but not the engine."""
        self.step_started = t0 = time.monotonic()
        try:
            self.step()
            if self._current is not None:
                seconds = time.monotonic() - t0
                self.speculator.after_step(self._current, seconds)
                if self.thread_control is not None:
                    self.thread_control.after_step(self._current.num_tokens, seconds, self.scheduler.running)
        except Exception as exc:
            log.exception("engine step failed")
            self._fail_step(f"engine step failed: {type(exc).__name__}: {exc}")
        finally:
            self.step_started = None
            self._current = None  # a later failure must not reach back to this step's plan

    def _settle_kv(self) -> None:
        """Idle: apply the cell operations still queued (the last requests' evictions and spills).

        NOTE: they would be applied before the next decode anyway; applied now, the next request's
        first step does not pay for them (a spill copies its chain out: ~10 ms per 1,000 tokens).
        """
        ops = self.kv.take_ops()
        if not ops:
            return
        try:
            self.runner.apply_kv_ops(ops)
        except Exception as exc:
            log.exception("applying KV operations failed")
            self._fail_step(f"KV operations failed: {type(exc).__name__}: {exc}")

    def _drain_inbox(self, block: bool) -> None:
        """Handle the inbox's messages (waiting up to 0.5 s for the first when ``block``)."""
        for message in self._inbox.drain(block):
            match message:
                case Submit(seq):
                    self.scheduler.add(seq)
                case Abort(seq, error):
                    self._abort(seq, error)
                case Pause(seq, paused):
                    seq.paused = paused
                case CancelAll(text):
                    self._cancel_everything(text)
                case Wake():
                    pass

    def _abort(self, seq: Sequence, error: Error | None) -> None:
        if not self.scheduler.abort(seq):
            return
        self._left_queue(seq)
        if error is None:
            self._dispatch([(seq, self._done(seq))])
        else:
            self.metrics.on_finish(seq)
            self._dispatch([(seq, error)])

    def _cancel_everything(self, message: str) -> None:
        """End every queued and running request with UNAVAILABLE (end of a drain); one handoff."""
        events: list[tuple[Sequence, Event]] = []
        for s in self.scheduler.waiting + self.scheduler.running:
            self.scheduler.abort(s)
            events.append(self._ended(s, "UNAVAILABLE", message, DRAINING))
        self._dispatch(events)

    def _left_queue(self, seq: Sequence) -> bool:
        return self.admission.leave(seq)

    def _ended(self, seq: Sequence, status: str, message: str, reason: str = "") -> tuple[Sequence, Error]:
        """The one way the engine ends a request it removed with an error: counted, then its event."""
        self._left_queue(seq)
        self.metrics.on_finish(seq)
        return seq, Error(status, message, reason)

    def step(self) -> None:
        """(propose) -> plan -> forward -> mask -> sample -> (verify) -> update -> emit."""
        clock = self.clock
        clock.start()
        self.speculator.propose(self.scheduler)
        plan = self.scheduler.schedule()
        expired = "deadline expired while the request was queued"
        events: list[tuple[Sequence, Event]] = [self._ended(s, "DEADLINE_EXCEEDED", expired) for s in plan.expired]
        events += [self._ended(s, s.error_status, s.error or "request cannot run") for s in plan.failed]
        if not plan.items:
            self.runner.apply_kv_ops(plan.kv_ops)
            self._dispatch(events)
            clock.stop()  # NOTE: a step without a decode is not a step of the breakdown
            if not plan.expired and not plan.failed:
                time.sleep(0.001)
            return
        self._current = plan
        self._note_plan(plan)
        self.runner.apply_kv_ops(plan.kv_ops)
        clock.lap("plan")
        logits, sampling, drafted = self.model.forward(plan)  # laps "batch" and "decode"
        sampled = self.model.sample(sampling, logits)
        clock.lap("sample")
        accepted = self.speculator.verify(drafted)
        if accepted:
            self.metrics.on_generated(sum(len(t) for t in accepted.values()))
            self.model.show_kept(drafted, accepted)
        finished = self.scheduler.update(plan, sampled, accepted)
        if self._appender.forced:
            self.metrics.on_mask(0.0, 0, self._appender.forced)
            self._appender.forced = 0
        clock.lap("update")
        self._emit(plan, sampled, finished, events)
        clock.lap("emit")
        clock.stop()
        if self.step_hook is not None:
            self.step_hook(self)

    def _note_plan(self, plan: Plan) -> None:
        for item in plan.items:
            if self._left_queue(item.seq):
                self._hooks.on_scheduled(item.seq)
                if item.seq.after is not None and item.seq.num_cached:
                    self.metrics.on_shared_prefill()
        for seq, reason in zip(plan.preempted, plan.preempt_reasons, strict=True):
            self._hooks.on_preempted(seq, reason)

    # -- emission ---------------------------------------------------------------------------
    def _emit(
        self, plan: Plan, sampled: dict[int, int], finished: list[Sequence], events: list[tuple[Sequence, Event]]
    ) -> None:
        done = {s.uid for s in finished}
        for item in plan.items:
            events.extend((item.seq, d) for d in take_output(item.seq, item.seq.uid in done))
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

    def _dispatch(self, events: list[tuple[Sequence, Event]]) -> None:
        if not events:
            return
        if self.loop is None:
            self._deliver(events)
        else:
            self.loop.call_soon_threadsafe(self._deliver, events)

    def _deliver(self, events: list[tuple[Sequence, Event]]) -> None:
        """Hand events to their requests; exactly one terminal event (Done or Error) per request."""
        for seq, event in events:
            if seq.closed:
                continue  # already ended (e.g. failed by the watchdog while this step ran)
            if isinstance(event, Done | Error):
                seq.closed = True
                with self._life:
                    self._live.pop(seq.uid, None)
            try:
                seq.emit(event)
            except Exception:  # pragma: no cover - a broken sink must not affect other requests
                log.exception("delivering an event for %s failed", seq.request_id)

    def _fail_step(self, message: str) -> None:
        """A step raised: end its sequences (and every running one) with INTERNAL; waiting ones wait on.

        Sequences that finished inside the failed step are in the plan but no
        longer running; they get the error too, unless their final event was
        already delivered (delivery is exactly-once per request).
        """
        plan, self._current = self._current, None
        seqs = list(dict.fromkeys([*(i.seq for i in plan.items), *self.scheduler.running] if plan else self.scheduler.running))
        events: list[tuple[Sequence, Event]] = []
        for seq in seqs:
            seq.error = message
            self.scheduler.fail(seq)
            events.append(self._ended(seq, "INTERNAL", message))
        self._dispatch(events)

    def fail(self, cause: str) -> None:
        """The engine cannot go on (thread died, step stalled): end every request, refuse new ones.

        Thread-safe and idempotent; called by the engine thread or the watchdog.
        Every queued, running or submitted request gets an UNAVAILABLE error
        (clients retry on another replica); ``on_failure`` then runs on the loop.
        """
        with self._life:
            if self.failure is not None:
                return
            self.failure = cause
        log.error("engine failed: %s", cause)
        if self.loop is not None and self.on_failure is not None:
            self.loop.call_soon_threadsafe(self.on_failure, cause)  # NOT_SERVING first
        with self._life:
            seqs = list(self._live.values())
        message = f"engine failed ({cause}); retry on another replica"
        self._dispatch([(s, Error("UNAVAILABLE", message, ENGINE_FAILED)) for s in seqs])
