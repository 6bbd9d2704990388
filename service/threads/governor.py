"""Adaptive compute threads: a pure decision object fed one timing per engine step.

Why: ggml's CPU backend runs each graph on an OpenMP team whose threads meet at
hundreds of barriers per decode; libgomp spins at those barriers. When another
process takes a core, a preempted team member stalls every barrier and a decode
with the full thread count gets many times slower than with one thread fewer
(measured here, 2 cores, Gemma 3 270M, 4 sequences: ~88 tok/s with 2 threads
and ~59 with 1 when quiet; ~5 with 2 threads and ~30-60 with 1 next to one busy
process). Which count is faster depends on the neighbours, so it is measured.

How: the governor keeps the count it has *chosen* and every so often *probes*
the other count for a few steps, comparing step times of similar steps (same
token-count bucket, the chosen count's times from the last ``fresh_s`` or four
steps, whichever is longer). The other count must win by ``margin`` to be
chosen (hysteresis); a probe that loses doubles the wait before the next one
(up to ``max_interval_s``), a switch resets it. A probe step that is decisively
slower (``abort_ratio``) ends the probe at once, so probing the full count next
to a busy neighbour costs about one slow step. While an outside signal says
the machine is quiet, the full count is not questioned at all (no probes).
Contention signals only schedule a probe now: step time at the full count
rising to ``slowdown`` x its uncontended level, and outside signals
(``signal``) starting while on the full count or ending while on the reduced
one. A full-count step ``collapse`` x its uncontended level (the barrier stall
makes a step take seconds) switches to the reduced count at once, without a
probe, unless the outside signal says the machine is quiet: then it probes
(see ``_on_collapse``).

Not thread-safe: the engine thread calls ``observe`` after every step.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GovernorConfig:
    full: int  # the configured thread count (--threads)
    reduced: int  # the count tried under contention
    probe_steps: int = 6  # probe samples compared (after one warm-up step)
    min_interval_s: float = 2.0  # first wait before a probe, and after a switch
    max_interval_s: float = 30.0  # longest wait between probes (backoff cap)
    margin: float = 0.12  # the other count must be this much faster per step to be chosen
    abort_ratio: float = 1.8  # a probe step this much slower than the chosen count ends the probe
    slowdown: float = 1.5  # chosen-full step time over its uncontended level that signals contention
    collapse: float = 4.0  # a full-thread step this much slower than uncontended: drop at once
    baseline_drift: float = 1.001  # the uncontended level may rise this much per step (workload drift)
    alpha: float = 0.25  # EWMA weight of the newest step
    fresh_s: float = 3.0  # a probe compares only with step times of the chosen count this recent
    settle_steps: int = 3  # recent steps of the chosen count in a bucket before a probe may start

    @staticmethod
    def for_threads(full: int) -> GovernorConfig:
        return GovernorConfig(full=full, reduced=max(1, full // 2))


@dataclass(frozen=True)
class Change:
    """Set the context's thread count to ``threads``; ``switch`` is a settled choice, else a probe."""

    threads: int
    switch: bool
    reason: str


def bucket(n_tokens: int) -> int:
    """Steps are compared within powers-of-two token-count buckets (1, 2-3, 4-7, ...)."""
    return max(1, n_tokens).bit_length()


@dataclass
class _Probe:
    threads: int
    started: float
    ratios: list[float] = field(default_factory=list)
    steps: int = 0
    rebase: bool = False  # a lost probe makes the full count's recent step times its new baseline


class ThreadGovernor:
    """Chooses between ``config.full`` and ``config.reduced`` threads; see the module docstring."""

    def __init__(self, config: GovernorConfig, now: float = 0.0) -> None:
        if not 1 <= config.reduced < config.full:
            raise ValueError("need 1 <= reduced < full threads")
        self.config = config
        self.chosen = config.full
        self.switches = 0
        self.steps = 0  # steps observed
        # (threads, bucket) -> (EWMA of seconds per step, when last updated, steps since it restarted)
        self._ewma: dict[tuple[int, int], tuple[float, float, int]] = {}
        self._baseline: dict[int, float] = {}  # bucket -> uncontended seconds per step at full
        self._interval = config.min_interval_s
        self._next_probe = now + config.min_interval_s
        self._probe: _Probe | None = None
        self._recent: deque[tuple[int, float]] = deque(maxlen=32)  # (bucket, when) of the last steps
        self._step_s: float | None = None  # EWMA of all step times
        self._slow = False  # full-thread steps well above their uncontended level
        self._outside: bool | None = None  # the last outside contention signal (None: none yet)

    @property
    def threads(self) -> int:
        """The count in use now (a probe's count while probing)."""
        return self._probe.threads if self._probe else self.chosen

    def observe(self, n_tokens: int, seconds: float, now: float) -> Change | None:
        """One finished step of ``n_tokens`` that took ``seconds``; returns a change to apply, if any."""
        if n_tokens <= 0 or seconds <= 0:
            return None
        self.steps += 1
        self._step_s = seconds if self._step_s is None else 0.25 * seconds + 0.75 * self._step_s
        b = bucket(n_tokens)
        if self._probe is not None:
            return self._probe_step(b, seconds, now)
        self._learn(self.chosen, b, seconds, now)
        if self.chosen == self.config.full:
            slow = self._slowed(b)
            if slow and not self._slow:
                self._probe_soon(now)
            self._slow = slow
            if self._collapsed(b, seconds):
                return self._on_collapse(now)
        self._recent.append((b, now))
        if now >= self._next_probe and self._steady(b, now) and not self._quiet():
            other = self.config.reduced if self.chosen == self.config.full else self.config.full
            self._probe = _Probe(other, started=now)
            return Change(other, False, "probe")
        return None

    def signal(self, contended: bool, now: float) -> None:
        """An outside contention signal (neighbours' CPU use, pressure, throttling).

        A change that questions the choice probes now: contention starting while
        on the full count, or ending while on the reduced one.
        """
        if contended != self._outside and contended == (self.chosen == self.config.full):
            self._probe_soon(now)
        self._outside = contended

    def _quiet(self) -> bool:
        """On the full count with the outside signal saying nobody else wants the CPU: no probe.

        NOTE: probing fewer threads on a quiet machine can only lose (or win by
        noise: a burst of our own clients' CPU use inflates a reference), and each
        probe or false switch costs steps at the slower count. Without any outside
        signal (``None``) the governor probes on its schedule as before; a collapse
        still drops at once, whatever the signal says.
        """
        return self.chosen == self.config.full and self._outside is False

    def _steady(self, b: int, now: float) -> bool:
        """Start a probe only on the most common kind of recent step, with a few recent ones as
        reference (the probe's steps are then mostly of that kind and comparable).

        NOTE: "recent" is by time too: after an idle gap the steps before it describe
        another load and must not hold the probe back until 32 new steps have passed.
        """
        recent = [rb for rb, t in self._recent if now - t <= self._fresh_s()]
        common = Counter(recent).most_common(1)[0][0]
        return b == common and self._ewma[(self.chosen, b)][2] >= self.config.settle_steps

    def _fresh_s(self) -> float:
        """How old a reference may be: ``fresh_s``, or a few steps when steps are slow (contention)."""
        return max(self.config.fresh_s, 4 * (self._step_s or 0.0))

    def _probe_soon(self, now: float) -> None:
        self._next_probe = min(self._next_probe, now)

    def _learn(self, threads: int, b: int, seconds: float, now: float) -> None:
        key, a = (threads, b), self.config.alpha
        old = self._ewma.get(key)
        # NOTE: a reference older than fresh_s restarts: conditions may have changed since.
        if old is not None and now - old[1] <= self._fresh_s():
            self._ewma[key] = (a * seconds + (1 - a) * old[0], now, old[2] + 1)
        else:
            self._ewma[key] = (seconds, now, 1)
        if threads == self.config.full:
            base = self._baseline.get(b)
            self._baseline[b] = seconds if base is None else min(base * self.config.baseline_drift, seconds)

    def _collapsed(self, b: int, seconds: float) -> bool:
        """A full-thread step ``collapse`` x its uncontended level: the barrier stall.

        NOTE: one such step is evidence enough (a hiccup costs the reduced count until
        the probe of the full count 2 s later); a stalled step costs seconds.
        """
        base = self._baseline.get(b)
        return base is not None and seconds > self.config.collapse * base

    def _on_collapse(self, now: float) -> Change | None:
        """A collapsed full-count step: drop at once, unless the outside signal says quiet.

        NOTE: with nobody else on the CPU no barrier can stall, and a step far above the
        bucket's uncontended level is the workload's own growth (at 32 streams each row's
        attention spans every running sequence's cells, so same-size steps get several
        times slower as contexts grow; that dropped a quiet server to 1 thread). Then a
        probe decides (a neighbour the signal has not seen yet still loses it to the
        reduced count within a few steps), and a lost probe re-learns the baseline. The
        probe keeps the usual backoff, so repeated false collapses cost a few steps per
        ``max_interval_s`` at most.
        """
        if self._outside is not False:
            return self._drop(now)
        if now < self._next_probe:
            return None
        self._probe = _Probe(self.config.reduced, started=now, rebase=True)
        return Change(self.config.reduced, False, "probe (steps slowed, machine quiet)")

    def _drop(self, now: float) -> Change:
        """Switch to the reduced count at once (probes of the full count verify it later)."""
        self._probe = _Probe(self.config.reduced, started=now)
        return self._end_probe(now, won=True, reason="steps collapsed")

    def _slowed(self, b: int) -> bool:
        base = self._baseline.get(b)
        recent = self._ewma.get((self.config.full, b))
        return base is not None and recent is not None and recent[0] > self.config.slowdown * base

    def _probe_step(self, b: int, seconds: float, now: float) -> Change | None:
        probe, cfg = self._probe, self.config
        assert probe is not None
        # NOTE: only recent step times of the chosen count are a fair reference; a
        # step with none in its bucket is still judged against the slowest recent one.
        fresh = {
            k[1]: v[0]
            for k, v in self._ewma.items()
            if k[0] == self.chosen and probe.started - v[1] <= self._fresh_s()
        }
        ratio = seconds / fresh[b] if b in fresh else None
        probe.steps += 1
        if (ratio or 0.0) > cfg.abort_ratio or seconds > cfg.abort_ratio * max(
            fresh.values(), default=float("inf")
        ):
            return self._end_probe(now, won=False, reason="probe lost")
        if probe.steps == 1:
            return None  # the first step on the new count is not compared
        if ratio is not None:
            probe.ratios.append(ratio)
        r = probe.ratios
        decisive = len(r) >= 3 and max(r) < 1.0 - 2 * cfg.margin  # clearly faster: no need to wait
        if len(r) >= cfg.probe_steps or decisive or (probe.steps >= 2 * cfg.probe_steps and len(r) >= 3):
            won = statistics.median(r) < 1.0 - cfg.margin
            return self._end_probe(now, won, "probe won" if won else "probe lost")
        if probe.steps >= 2 * cfg.probe_steps:  # too few comparable steps: try again later
            return self._end_probe(now, won=False, reason="probe inconclusive", backoff=False)
        return None

    def _end_probe(self, now: float, won: bool, reason: str, backoff: bool = True) -> Change:
        probe, cfg = self._probe, self.config
        assert probe is not None
        self._probe = None
        if won:
            self.chosen = probe.threads
            self.switches += 1
            self._interval = cfg.min_interval_s
            # NOTE: the chosen count's old step times are stale now (contention changed).
            self._ewma = {k: v for k, v in self._ewma.items() if k[0] != self.chosen}
        else:
            if probe.rebase:
                full = {k[1]: v[0] for k, v in self._ewma.items() if k[0] == cfg.full}
                self._baseline = {b: max(base, full.get(b, base)) for b, base in self._baseline.items()}
            if backoff:
                self._interval = min(self._interval * 2, cfg.max_interval_s)
        self._next_probe = now + (self._interval if backoff else cfg.min_interval_s)
        return Change(self.chosen, won, reason)
