"""Speculation backs off where drafted steps are measured slower than plain ones, and comes back."""

from __future__ import annotations

from service.engine.spec_payoff import PayoffConfig, SpecPayoff
from service.engine.speculator import SpecConfig, Speculator
from service.request.sequence import SamplingParams, SeqStatus, Sequence
from service.scheduler.plan import Plan, ScheduledSeq


def test_drafting_is_free_until_both_kinds_of_step_are_measured() -> None:
    p = SpecPayoff(PayoffConfig(min_samples=3))
    for _ in range(2):
        p.observe(True, 1, 0.05)  # drafts rejected: one token in a slow step
        p.observe(False, 1, 0.02)
    assert not p.losing() and all(p.allow() for _ in range(100))
    p.observe(True, 1, 0.05)
    p.observe(False, 1, 0.02)
    assert p.losing()


def test_while_losing_one_step_in_probe_every_drafts() -> None:
    p = SpecPayoff(PayoffConfig(min_samples=1, probe_every=8))
    p.observe(True, 1, 0.05)
    p.observe(False, 1, 0.02)
    allowed = [p.allow() for _ in range(32)]
    assert allowed.count(True) == 4 and allowed[7] and allowed[15]


def test_drafts_that_pay_keep_drafting_free_and_a_good_probe_brings_it_back() -> None:
    p = SpecPayoff(PayoffConfig(min_samples=1, alpha=0.5))
    p.observe(False, 1, 0.02)  # 50 tok/s plain
    p.observe(True, 4, 0.03)  # 133 tok/s drafted: pays
    assert not p.losing()
    for _ in range(3):
        p.observe(True, 1, 0.05)  # the workload stopped repeating: 20 tok/s
    assert p.losing()
    p.observe(True, 8, 0.03)  # an extraction request: 267 tok/s
    assert not p.losing()


def _lone(draft: int) -> tuple[Plan, Sequence]:
    seq = Sequence("r", [1, 2, 3, 4, 5, 6, 1, 2], SamplingParams(max_tokens=100, temperature=0.0))
    seq.num_prompt_tokens = seq.num_computed = 7
    seq.status = SeqStatus.RUNNING
    item = ScheduledSeq(seq, 1 + draft, sample=True, draft=draft)
    return Plan(items=(item,), preempted=(), preempt_reasons=(), kv_ops=(), expired=(), failed=()), seq


def test_the_speculator_feeds_lone_decode_steps_to_the_payoff_and_stops_proposing_when_it_loses() -> None:
    spec = Speculator(SpecConfig(enabled=True, tokens=4, max_running=1))
    for _ in range(3):
        spec.after_step(_lone(draft=4)[0], 0.08)  # a drafted step, nothing kept: 12.5 tok/s
        spec.after_step(_lone(draft=0)[0], 0.02)  # a plain step: 50 tok/s
    assert spec.payoff.losing()
    proposals = 0
    for _ in range(31):
        _plan, seq = _lone(draft=0)

        class Sched:
            running, waiting = [seq], []

        spec.propose(Sched())  # type: ignore[arg-type]
        proposals += seq.num_draft > 0
    assert proposals == 0  # the 32nd step would be the probe


def test_a_probe_while_losing_drafts_a_single_token() -> None:
    spec = Speculator(SpecConfig(enabled=True, tokens=6, max_running=1))
    for _ in range(3):
        spec.after_step(_lone(draft=4)[0], 0.08)
        spec.after_step(_lone(draft=0)[0], 0.02)
    widths = []
    for _ in range(64):
        _plan, seq = _lone(draft=0)

        class Sched:
            running, waiting = [seq], []

        spec.propose(Sched())  # type: ignore[arg-type]
        widths.append(seq.num_draft)
    assert sorted(set(widths)) == [0, 1] and widths.count(1) == 2  # steps 32 and 64, one token each


def test_a_seeded_sampled_request_drafts_as_before_whatever_the_payoff_measured() -> None:
    """Its output must not depend on timing: the same seed gives the same text on an idle server."""
    spec = Speculator(SpecConfig(enabled=True, tokens=4, max_running=1))
    for _ in range(3):
        spec.after_step(_lone(draft=4)[0], 0.08)
        spec.after_step(_lone(draft=0)[0], 0.02)
    assert spec.payoff.losing()
    seq = Sequence("r", [1, 2, 3, 4, 5, 6, 1, 2], SamplingParams(max_tokens=100, temperature=0.9, seed=7))
    seq.num_prompt_tokens = seq.num_computed = 7
    seq.status = SeqStatus.RUNNING

    class Sched:
        running, waiting = [seq], []

    spec.propose(Sched())  # type: ignore[arg-type]
    assert seq.num_draft == 4  # the full width, on a step the payoff would have skipped
