"""Applies the thread governor's decisions to the engine: threads, log, metrics, span events.

The engine calls ``after_step`` once per step on its own thread (between
decodes, so ``ModelRunner.set_threads`` is safe). Contention signals are read at
most once per second (``ContentionSignal``): CPU used by other processes, the
cgroup's throttling count, CPU pressure. They only make the governor probe
sooner; the decision itself is always the measured step time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from service.threads.cpu_quota import CGROUP_ROOT, PROC_SELF_CGROUP, _own_paths
from service.threads.governor import Change, GovernorConfig, ThreadGovernor

log = logging.getLogger("service.threads")
PRESSURE_PATH = Path("/proc/pressure/cpu")
PROC_STAT = Path("/proc/stat")
STALE_POLLS = 3  # a neighbour sample spanning more polls than this is discarded
RESAMPLE_S = 0.25  # ... and the next one is taken this soon


class ThreadSettable(Protocol):
    def set_threads(self, n: int) -> None: ...


def cpu_stat_path(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> Path | None:
    """The process's own cgroup ``cpu.stat`` (v2, else the v1 cpu controller), if it exists."""
    try:
        text = PROC_SELF_CGROUP.read_text() if proc_cgroup is None else proc_cgroup
    except OSError:
        return None
    v2, v1 = _own_paths(text)
    for path in (root / v2.lstrip("/") / "cpu.stat", root / "cpu" / v1.lstrip("/") / "cpu.stat"):
        if path.is_file():
            return path
    return None


def parse_pressure_some(text: str) -> float | None:
    """``avg10`` of the ``some`` line of a PSI file (percent), or None."""
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                if key == "avg10":
                    return float(value)
    return None


def parse_throttled(text: str) -> int | None:
    """``nr_throttled`` of a cgroup ``cpu.stat``, or None."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "nr_throttled":
            return int(value)
    return None


def parse_busy_seconds(text: str, hz: int = 100) -> float | None:
    """CPU-seconds all CPUs were busy (user, nice, system, irq, softirq, steal) from ``/proc/stat``."""
    first = text.split("\n", 1)[0].split()
    if len(first) < 9 or first[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / hz


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class ContentionSignal:
    """Polls contention signals at most once per ``poll_s``; ``poll`` says contended / not / None (no news).

    * neighbours: CPU time used by everything but this process (``/proc/stat`` minus
      our own), in cores; contended from ``on_cores``, no longer below ``off_cores``.
      Only when this process may use every CPU of the machine (in a container the
      host's counters say nothing about our share).
    * cgroup throttling: ``nr_throttled`` grew (our CPU quota ran out).
    * CPU pressure (``/proc/pressure/cpu`` some avg10 >= ``pressure_pct``), only
      without the neighbour figure (it also counts waits among our own threads).
    """

    def __init__(
        self,
        pressure_path: Path | None = PRESSURE_PATH,
        cpu_stat: Path | None = None,
        proc_stat: Path | None = PROC_STAT,
        pressure_pct: float = 40.0,
        on_cores: float = 0.5,
        off_cores: float = 0.25,
        poll_s: float = 1.0,
        own_cpu: Callable[[], float] = own_cpu_seconds,
    ) -> None:
        self.pressure_path = pressure_path if pressure_path and pressure_path.is_file() else None
        self.cpu_stat = cpu_stat
        whole_machine = len(os.sched_getaffinity(0)) == os.cpu_count()
        self.proc_stat = proc_stat if proc_stat and proc_stat.is_file() and whole_machine else None
        self.pressure_pct, self.on_cores, self.off_cores = pressure_pct, on_cores, off_cores
        self.poll_s = poll_s
        self._own_cpu = own_cpu
        self._next = 0.0
        self._throttled: int | None = None
        self._cpu: tuple[float, float, float] | None = None  # (now, busy s, own s)
        self._neighbours_busy = False
        self.last_pressure: float | None = None
        self.last_neighbour_cores: float | None = None

    def poll(self, now: float) -> bool | None:
        if now < self._next:
            return None
        self._next = now + self.poll_s
        try:
            contended = self._throttling()
            if self.proc_stat is not None:
                contended |= self._neighbours(now)
            elif self.pressure_path is not None:
                self.last_pressure = parse_pressure_some(self.pressure_path.read_text())
                contended |= (self.last_pressure or 0.0) >= self.pressure_pct
        except (OSError, ValueError):
            return None
        return contended

    def _throttling(self) -> bool:
        if self.cpu_stat is None:
            return False
        n = parse_throttled(self.cpu_stat.read_text())
        grew = n is not None and self._throttled is not None and n > self._throttled
        self._throttled = n
        return grew

    def _neighbours(self, now: float) -> bool:
        assert self.proc_stat is not None
        busy, own = parse_busy_seconds(self.proc_stat.read_text()), self._own_cpu()
        if busy is None:
            return False
        # NOTE: a sample older than a few polls spans a time we were idle (no steps, no
        # polls): other processes' CPU then says nothing about the load we now run beside.
        if self._cpu is not None and 0 < now - self._cpu[0] <= STALE_POLLS * self.poll_s:
            cores = max(0.0, (busy - self._cpu[1]) - (own - self._cpu[2])) / (now - self._cpu[0])
            self.last_neighbour_cores = cores
            if cores >= self.on_cores:
                self._neighbours_busy = True
            elif cores < self.off_cores:
                self._neighbours_busy = False
        else:  # no figure yet, or a stale one: take a fresh one soon rather than after poll_s
            self._next = now + min(self.poll_s, RESAMPLE_S)
        self._cpu = (now, busy, own)
        return self._neighbours_busy


class AdaptiveThreads:
    """The engine's per-step hook: feeds the governor, applies and reports its changes."""

    def __init__(
        self,
        runner: ThreadSettable,
        governor: ThreadGovernor,
        signal: ContentionSignal | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.governor = governor
        self.signal = signal
        self._clock = clock
        self._lock = threading.Lock()  # guards the counters read by metric callbacks
        self.switches = {"down": 0, "up": 0}
        self.probes = 0

    @classmethod
    def for_runner(cls, runner: ThreadSettable, threads: int) -> AdaptiveThreads:
        governor = ThreadGovernor(GovernorConfig.for_threads(threads), now=time.monotonic())
        return cls(runner, governor, ContentionSignal(cpu_stat=cpu_stat_path()))

    @property
    def threads(self) -> int:
        """The settled thread count (not a probe's)."""
        return self.governor.chosen

    def after_step(self, n_tokens: int, seconds: float, running: Iterable[Any] = ()) -> None:
        """One finished step; may change the context's thread count before the next decode."""
        now = self._clock()
        if self.signal is not None and (contended := self.signal.poll(now)) is not None:
            self.governor.signal(contended, now)
        change = self.governor.observe(n_tokens, seconds, now)
        if change is not None:
            self.runner.set_threads(change.threads)
            self._report(change, running)

    def _report(self, change: Change, running: Iterable[Any]) -> None:
        if not change.switch:
            with self._lock:
                self.probes += change.reason == "probe"
            log.debug("threads: %s (%d)", change.reason, change.threads)
            return
        direction = "down" if change.threads < self.governor.config.full else "up"
        with self._lock:
            self.switches[direction] += 1
        cores = self.signal.last_neighbour_cores if self.signal is not None else None
        log.info(
            "compute threads now %d (%s: measured faster; other processes using %s cores)",
            change.threads,
            direction,
            "?" if cores is None else f"{cores:.1f}",
        )
        for seq in running:
            span = getattr(seq, "trace", None)
            if span is not None:
                span.add_event("threads_changed", {"inference.threads": change.threads})

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"threads": self.threads, "switches": dict(self.switches), "probes": self.probes}


def observe_threads(meter: Any, control: AdaptiveThreads) -> None:
    """OTel instruments: the settled thread count, switches by direction, probes."""
    from opentelemetry.metrics import Observation

    def threads(_options: Any) -> list[Observation]:
        return [Observation(control.threads)]

    def switches(_options: Any) -> list[Observation]:
        snap = control.snapshot()
        return [Observation(n, {"inference.direction": d}) for d, n in snap["switches"].items()]

    def probes(_options: Any) -> list[Observation]:
        return [Observation(control.snapshot()["probes"])]

    meter.create_observable_gauge(
        "inference.engine.threads",
        [threads],
        unit="{thread}",
        description="compute threads in use (adaptive)",
    )
    meter.create_observable_counter(
        "inference.engine.thread_switches",
        [switches],
        unit="{switch}",
        description="adaptive thread count changes (down: fewer threads)",
    )
    meter.create_observable_counter(
        "inference.engine.thread_probes",
        [probes],
        unit="{probe}",
        description="steps run on the other thread count to compare",
    )
