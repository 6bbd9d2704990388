"""The adaptive thread governor (pure decisions over simulated step times) and its signal readers."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.threads.adaptive import (
    AdaptiveThreads,
    ContentionSignal,
    cpu_stat_path,
    parse_busy_seconds,
    parse_pressure_some,
    parse_throttled,
)
from service.threads.governor import GovernorConfig, ThreadGovernor, bucket

# Seconds per step by thread count, roughly as measured on the 2-core machine (4 sequences).
QUIET = {2: 0.045, 1: 0.068}
BUSY = {2: 0.700, 1: 0.130}  # one busy neighbour: the spinning team stalls at every barrier


class Sim:
    """Drives a governor with step times from a table; applies its changes like the engine does."""

    def __init__(self, governor: ThreadGovernor, n_tokens: int = 4) -> None:
        self.g = governor
        self.now = 0.0
        self.n_tokens = n_tokens
        self.threads = governor.threads
        self.changes: list[tuple[float, int, bool]] = []
        self.slow_probe_steps = 0

    def run(self, seconds: float, table: dict[int, float]) -> None:
        end = self.now + seconds
        while self.now < end:
            dt = table[self.threads]
            if self.threads != self.g.chosen and dt > table[self.g.chosen]:
                self.slow_probe_steps += 1
            self.now += dt
            change = self.g.observe(self.n_tokens, dt, self.now)
            if change is not None:
                self.threads = change.threads
                self.changes.append((self.now, change.threads, change.switch))


def governor() -> ThreadGovernor:
    return ThreadGovernor(GovernorConfig.for_threads(2))


def test_quiet_machine_keeps_full_threads_and_backs_off_probing() -> None:
    sim = Sim(governor())
    sim.run(300, QUIET)
    assert sim.g.chosen == 2 and sim.g.switches == 0
    probes = [c for c in sim.changes if c[1] == 1]
    # waits 2, 4, 8, 16, then every 30 s: about 12 probes in 300 s, not one per few steps
    assert 5 <= len(probes) <= 14
    assert sim.slow_probe_steps <= 8 * len(probes)


def test_busy_neighbour_switches_to_fewer_threads_and_back_when_it_leaves() -> None:
    sim = Sim(governor())
    sim.run(60, QUIET)
    sim.run(60, BUSY)
    assert sim.g.chosen == 1 and sim.g.switches == 1
    switched_at = next(t for t, n, switch in sim.changes if switch and n == 1)
    assert switched_at < 60 + 5  # the slowdown is a rising edge: probed at once
    sim.run(60, QUIET)
    assert sim.g.chosen == 2 and sim.g.switches == 2
    back_at = next(t for t, n, switch in sim.changes if switch and n == 2)
    assert back_at < 120 + GovernorConfig.for_threads(2).max_interval_s + 5


def test_probing_full_threads_next_to_a_busy_neighbour_costs_one_slow_step_per_probe() -> None:
    sim = Sim(governor())
    sim.run(10, QUIET)
    sim.slow_probe_steps = 0
    sim.run(300, BUSY)
    probes_of_full = [c for c in sim.changes if c[1] == 2 and not c[2] and c[0] > 10]
    assert sim.g.chosen == 1
    assert probes_of_full, "full threads must be re-tried now and then"
    assert sim.slow_probe_steps == len(probes_of_full)
    assert len(probes_of_full) <= 300 / 30 + 4  # backoff: 2, 4, 8, 16, then every 30 s


def test_counts_within_the_margin_never_flap() -> None:
    sim = Sim(governor())
    sim.run(600, {2: 0.050, 1: 0.047})  # reduced only 6% faster: below the 12% margin
    assert sim.g.switches == 0


def test_a_clear_winner_within_noise_is_still_chosen() -> None:
    g = governor()
    now, threads, i = 0.0, 2, 0
    while now < 120:
        jitter = 1.0 + 0.15 * ((i * 7919) % 11 - 5) / 5  # +-15%, deterministic
        dt = {2: 0.100, 1: 0.060}[threads] * jitter
        now += dt
        i += 1
        change = g.observe(4, dt, now)
        if change is not None:
            threads = change.threads
    assert g.chosen == 1


def test_an_outside_signal_probes_before_the_backoff_expires() -> None:
    g = governor()
    sim = Sim(g)
    sim.run(100, QUIET)  # backoff grown to its cap
    n = len(sim.changes)
    g.signal(True, sim.now)
    sim.run(0.2, QUIET)
    assert len(sim.changes) > n and sim.changes[n][1] == 1  # a probe of the reduced count started


def test_steps_are_compared_only_within_their_token_bucket() -> None:
    g = governor()
    now = 0.0
    for i in range(2000):  # alternating tiny and large steps; no contention
        n = 1 if i % 2 else 48
        threads = g.threads
        dt = (0.012 if n == 1 else 0.090) * (1.0 if threads == 2 else 1.45)
        now += dt
        change = g.observe(n, dt, now)
        assert change is None or change.threads in (1, 2)
    assert g.switches == 0 and g.chosen == 2
    assert bucket(1) == 1 and bucket(3) == 2 and bucket(4) == 3 and bucket(48) == 6


def test_config_needs_fewer_reduced_threads() -> None:
    with pytest.raises(ValueError):
        ThreadGovernor(GovernorConfig(full=1, reduced=1))
    assert GovernorConfig.for_threads(8).reduced == 4


def test_pressure_and_throttling_files_are_parsed() -> None:
    psi = "some avg10=12.50 avg60=3.00 avg300=1.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    assert parse_pressure_some(psi) == 12.5
    assert parse_pressure_some("garbage") is None
    assert parse_throttled("nr_periods 10\nnr_throttled 3\nthrottled_time 9\n") == 3
    assert parse_throttled("usage_usec 5\n") is None


def test_cgroup_cpu_stat_is_found_for_v2_and_v1(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "cpu.stat").write_text("nr_throttled 0\n")
    assert cpu_stat_path(tmp_path, "0::/app\n") == tmp_path / "app" / "cpu.stat"
    (tmp_path / "cpu" / "pod").mkdir(parents=True)
    (tmp_path / "cpu" / "pod" / "cpu.stat").write_text("nr_throttled 0\n")
    assert cpu_stat_path(tmp_path, "3:cpu,cpuacct:/pod\n0::/\n") == tmp_path / "cpu" / "pod" / "cpu.stat"
    assert cpu_stat_path(tmp_path / "none", "0::/\n") is None


def test_contention_signal_rises_on_pressure_or_new_throttling(tmp_path: Path) -> None:
    psi, stat = tmp_path / "cpu", tmp_path / "cpu.stat"
    psi.write_text("some avg10=5.00 avg60=0 avg300=0 total=0\n")
    stat.write_text("nr_throttled 7\n")
    sig = ContentionSignal(psi, stat, proc_stat=None, pressure_pct=40.0, poll_s=1.0)
    assert sig.poll(0.0) is False
    assert sig.poll(0.5) is None  # polled at most once per poll_s
    stat.write_text("nr_throttled 9\n")
    assert sig.poll(1.0) is True
    assert sig.poll(2.0) is False
    psi.write_text("some avg10=55.00 avg60=0 avg300=0 total=0\n")
    assert sig.poll(3.0) is True and sig.last_pressure == 55.0


class RecordingRunner:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def set_threads(self, n: int) -> None:
        self.calls.append(n)


class RecordingSpan:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def add_event(self, name: str, attrs: dict) -> None:
        self.events.append((name, attrs))


class Seq:
    def __init__(self) -> None:
        self.trace = RecordingSpan()


def test_adaptive_threads_applies_changes_counts_switches_and_marks_running_spans() -> None:
    runner, clock = RecordingRunner(), [0.0]
    control = AdaptiveThreads(runner, governor(), None, clock=lambda: clock[0])
    seq = Seq()
    threads = 2
    for _ in range(400):
        dt = (QUIET if clock[0] < 10 else BUSY)[threads]
        clock[0] += dt
        control.after_step(4, dt, [seq])
        threads = runner.calls[-1] if runner.calls else 2
    assert control.threads == 1 and runner.calls[-1] == 1
    snap = control.snapshot()
    assert snap["switches"] == {"down": 1, "up": 0} and snap["probes"] >= 2
    assert seq.trace.events == [("threads_changed", {"inference.threads": 1})]


class FakeStat:
    """A ``/proc/stat`` stand-in plus this process's CPU seconds, read by a ``ContentionSignal``."""

    def __init__(self, tmp_path: Path) -> None:
        self.path, self.own = tmp_path / "stat", 0.0
        self.write(0)

    def write(self, busy_jiffies: int) -> None:  # user nice system idle iowait irq softirq steal
        self.path.write_text(f"cpu  {busy_jiffies} 0 0 5000 0 0 0 0 0 0\ncpu0 1 2 3\n")

    def signal(self) -> ContentionSignal:
        sig = ContentionSignal(None, None, proc_stat=self.path, poll_s=1.0, own_cpu=lambda: self.own)
        if sig.proc_stat is None:
            pytest.skip("this process may not use every CPU (affinity)")
        return sig


@pytest.mark.may_skip  # on a machine where this process may not use every CPU
def test_neighbour_cpu_is_the_machine_busy_time_minus_our_own(tmp_path: Path) -> None:
    fake = FakeStat(tmp_path)
    sig = fake.signal()
    assert sig.poll(0.0) is False
    fake.write(190)  # 1.9 CPU-seconds busy in 1 s, 1.8 of them ours: neighbours 0.1 cores
    fake.own = 1.8
    assert sig.poll(1.0) is False and sig.last_neighbour_cores == pytest.approx(0.1)
    fake.write(390)  # 2.0 busy, 1.0 ours: a neighbour takes a whole core
    fake.own = 2.8
    assert sig.poll(2.0) is True and sig.last_neighbour_cores == pytest.approx(1.0)
    fake.write(560)  # 1.7 busy, 1.4 ours: 0.3 cores, between off (0.25) and on (0.5): still contended
    fake.own = 4.2
    assert sig.poll(3.0) is True
    fake.write(760)  # 2.0 busy, 1.9 ours: quiet again
    fake.own = 6.1
    assert sig.poll(4.0) is False
    assert parse_busy_seconds("cpu  100 0 50 999 7 0 0 50 0 0\n") == 2.0
    assert parse_busy_seconds("intr 5\n") is None


def test_contention_ending_while_on_fewer_threads_probes_full_threads_at_once() -> None:
    g = governor()
    sim = Sim(g)
    g.signal(True, sim.now)
    sim.run(200, BUSY)  # settled on 1 thread, backoff at its cap
    assert g.chosen == 1
    n = len(sim.changes)
    g.signal(False, sim.now)
    sim.run(1.0, QUIET)
    assert sim.changes[n][1] == 2  # probed full threads within a second
    sim.run(2.0, QUIET)
    assert g.chosen == 2


def test_a_stale_reference_from_quiet_times_does_not_spoil_the_first_probe() -> None:
    """Load in windows with idle gaps: old quiet step times must not be compared with busy ones."""
    prefill = {"quiet": {2: 0.20, 1: 0.37}, "busy": {2: 1.50, 1: 0.38}}  # 128-token steps
    decode = {"quiet": QUIET, "busy": BUSY}
    g = governor()
    now, threads = 0.0, 2
    switched_at = None
    for phase, start in (("quiet", 0.0), ("busy", 60.0)):
        now = max(now, start)
        end = start + 20.0
        i = 0
        while now < end:
            table, n = (prefill, 128) if i % 16 < 4 else (decode, 4)  # a burst of prompts, then decodes
            dt = table[phase][threads]
            now += dt
            i += 1
            change = g.observe(n, dt, now)
            if change is not None:
                threads = change.threads
                if change.switch and switched_at is None:
                    switched_at = now
    assert g.chosen == 1
    # the busy window opens with 4 prompt steps (6 s at full threads); the first decode steps decide
    assert switched_at is not None and switched_at < 60.0 + 6.0 + 4.0


def test_thread_count_switches_and_probes_are_exported_as_otel_metrics() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from service.threads.adaptive import observe_threads

    runner, clock = RecordingRunner(), [0.0]
    control = AdaptiveThreads(runner, governor(), None, clock=lambda: clock[0])
    threads = 2
    while clock[0] < 30:
        dt = (QUIET if clock[0] < 10 else BUSY)[threads]
        clock[0] += dt
        control.after_step(4, dt)
        threads = runner.calls[-1] if runner.calls else 2
    reader = InMemoryMetricReader()
    observe_threads(MeterProvider(metric_readers=[reader]).get_meter("t"), control)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        m.name: [(dict(p.attributes or {}), getattr(p, "value", None)) for p in m.data.data_points]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert points["inference.engine.threads"] == [({}, 1)]
    assert ({"inference.direction": "down"}, 1) in points["inference.engine.thread_switches"]
    assert points["inference.engine.thread_probes"][0][1] == control.snapshot()["probes"] >= 2


def test_after_an_idle_gap_a_probe_of_full_threads_beside_a_busy_neighbour_ends_after_one_step() -> None:
    """Load in windows: probes must not run many steps at the slow count for want of references."""
    prefill = {2: 1.50, 1: 0.38}
    g = governor()
    now, threads, slow_steps, probes = 0.0, 2, 0, 0
    for start in (0.0, 55.0, 110.0):  # three busy windows of 25 s, idle in between
        now, i = max(now, start), 0
        while now < start + 25.0:
            table, n = (prefill, 128) if i % 16 < 4 else (BUSY, 4)
            dt = table[threads]
            slow_steps += threads == 2 and g.chosen == 1
            now += dt
            i += 1
            change = g.observe(n, dt, now)
            if change is not None:
                probes += change.threads == 2 and not change.switch
                threads = change.threads
    assert g.chosen == 1 and probes >= 2
    assert slow_steps <= probes + 1


def test_very_slow_steps_of_mixed_sizes_still_give_fresh_references() -> None:
    """16 streams beside a busy process: full-thread steps of 1-2 s, sizes alternating between buckets."""
    times = {16: {2: 1.3, 1: 0.25}, 40: {2: 1.9, 1: 0.40}}
    g = governor()
    now, threads, i = 0.0, 2, 0
    sim = Sim(g, n_tokens=16)
    sim.run(30, {2: 0.09, 1: 0.14})  # quiet first: settled on full threads
    now, threads = sim.now, sim.threads
    start = now
    while now < start + 40 and g.chosen == 2:
        n = 16 if i % 3 == 0 else 40  # one decode-only step, then two with prompt tokens
        dt = times[n][threads]
        now += dt
        i += 1
        change = g.observe(n, dt, now)
        if change is not None:
            threads = change.threads
    assert g.chosen == 1 and now < start + 25


def test_a_collapsed_full_thread_step_drops_to_fewer_threads_at_once() -> None:
    g = governor()
    sim = Sim(g)
    sim.run(200, QUIET)  # probing backed off to its cap; uncontended level learned
    while g.threads != g.chosen:  # not in the middle of a probe
        sim.run(0.05, QUIET)
    n = len(sim.changes)
    assert g.observe(4, 0.045 * 1.3, sim.now + 0.1) is None  # slower, not collapsed
    change = g.observe(4, 0.045 * 5, sim.now + 0.4)  # 5x the uncontended level: the barrier stall
    assert change is not None and change.switch and change.threads == 1
    assert g.chosen == 1 and len(sim.changes) == n


def test_a_quiet_outside_signal_stops_probing_and_contention_still_switches_at_once() -> None:
    g = governor()
    sim = Sim(g)
    g.signal(False, sim.now)
    sim.run(300, QUIET)
    assert sim.changes == []  # no probe of fewer threads while the machine is known to be quiet
    g.signal(True, sim.now)
    sim.run(5, BUSY)
    assert g.chosen == 1  # contention: probed at once and switched
    g.signal(False, sim.now)
    sim.run(5, QUIET)
    assert g.chosen == 2
    n = len(sim.changes)
    sim.run(300, QUIET)
    assert len(sim.changes) == n


@pytest.mark.may_skip  # on a machine where this process may not use every CPU
def test_a_neighbour_sample_spanning_an_idle_gap_is_discarded(tmp_path: Path) -> None:
    """Other processes' CPU while we had no steps says nothing about the load we run beside now."""
    fake = FakeStat(tmp_path)
    sig = fake.signal()
    assert sig.poll(0.0) is False
    fake.write(2000)  # 20 busy CPU-seconds over the next 10 s, none ours: another server's busy window
    assert sig.poll(10.0) is False and sig.last_neighbour_cores is None
    fake.write(2047)  # then 0.47 busy in 0.25 s (the quick re-sample), 0.45 ours: 0.08 cores, quiet
    fake.own = 0.45
    assert sig.poll(10.25) is False and sig.last_neighbour_cores == pytest.approx(0.08)
    fake.write(2247)  # 2.0 busy in 1 s, 1.0 ours: a neighbour now, measured over a fresh second
    fake.own = 1.45
    assert sig.poll(11.0) is None  # not yet due (polls once per poll_s)
    assert sig.poll(11.25) is True


def test_after_an_idle_gap_a_new_kind_of_step_probes_back_up_within_two_seconds() -> None:
    """Busy at 4 rows on 1 thread, idle 12 s, then quiet at 16 rows: the old steps must not hold the probe."""
    g = governor()
    sim = Sim(g, n_tokens=4)
    g.signal(True, sim.now)
    sim.run(30, BUSY)
    assert g.chosen == 1
    sim.now += 12.0  # idle: another server's window
    sim.n_tokens = 16
    start = sim.now
    g.signal(False, sim.now)
    sim.run(10, {2: 0.110, 1: 0.170})
    back = [t for t, n, switch in sim.changes if switch and n == 2 and t > start]
    assert back and back[0] - start < 2.0


def test_on_a_quiet_machine_steps_that_grow_with_the_workload_keep_full_threads() -> None:
    """A warm-up's short steps, then 32 streams: steps of the same size 5-6x slower (every row's
    attention spans all running sequences' cells); fewer threads are slower still."""
    g = governor()
    g.signal(False, 0.0)
    sim = Sim(g, n_tokens=32)
    sim.run(5, {2: 0.040, 1: 0.070})  # short contexts: the bucket's uncontended level
    for level in (0.20, 0.22, 0.24):  # 32 streams: 5-6x that level
        sim.run(20, {2: level, 1: 1.9 * level})
    assert g.chosen == 2 and g.switches == 0
    probes = [c for c in sim.changes if c[1] == 1]
    assert 1 <= len(probes) <= 4  # a few probes verify it; each lost one re-learns the level


def test_a_collapse_on_a_quiet_machine_probes_first_and_a_real_neighbour_wins_it() -> None:
    g = governor()
    sim = Sim(g)
    g.signal(False, sim.now)
    sim.run(10, QUIET)
    sim.run(3, BUSY)  # a neighbour the signal has not seen yet: the 0.7 s steps are a collapse
    assert g.chosen == 1 and sim.changes[0][2] is False  # a probe first, then the switch
