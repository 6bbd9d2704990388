"""Short prompts go before long prefills of their tier (``Scheduler(long_prompt_tokens=...)``), no model."""

from __future__ import annotations

from service.paged_kv import KVBlockManager
from service.priority import PriorityPolicy
from service.request.sequence import Priority, SamplingParams, Sequence
from service.scheduler.plan import Plan
from service.scheduler.scheduler import Scheduler
from tests.support.sim import ShadowKV, append_token, drive, fake_forward

BUDGET, LONG = 32, 40


def mkseq(rid: str, n_prompt: int, max_tokens: int = 4, base: int = 0, prio: Priority = Priority.INTERACTIVE) -> Sequence:
    return Sequence(
        request_id=rid,
        token_ids=[base + i % 7 for i in range(n_prompt)],
        params=SamplingParams(max_tokens=max_tokens),
        priority=prio,
        arrival=1000.0,
    )


def make(long_prompt_tokens: int | None = LONG, mixed: int | None = None) -> tuple[Scheduler, ShadowKV]:
    sched = Scheduler(
        KVBlockManager(128, 4, 16),
        PriorityPolicy(aging_s=100.0),
        max_running=8,
        step_tokens=BUDGET,
        append_token=append_token,
        clock=lambda: 1000.0,
        mixed_step_tokens=mixed,
        long_prompt_tokens=long_prompt_tokens,
    )
    return sched, ShadowKV(512)


def step(sched: Scheduler, shadow: ShadowKV) -> Plan:
    plan = sched.schedule()
    sched.update(plan, fake_forward(sched, shadow, plan))
    return plan


def shape(plan: Plan) -> dict[str, int]:
    return {i.seq.request_id: i.num_tokens for i in plan.items}


def test_short_prompt_arriving_mid_prefill_is_computed_before_the_long_one() -> None:
    sched, shadow = make()
    sched.add(mkseq("long", 200))
    assert shape(step(sched, shadow)) == {"long": BUDGET}
    sched.add(mkseq("short", 10, base=50))
    plan = step(sched, shadow)
    assert shape(plan) == {"short": 10, "long": BUDGET - 10}
    assert plan.items[0].seq.request_id == "short"


def test_without_the_setting_the_long_prefill_keeps_the_whole_step() -> None:
    sched, shadow = make(long_prompt_tokens=None)
    sched.add(mkseq("long", 200))
    step(sched, shadow)
    sched.add(mkseq("short", 10, base=50))
    assert shape(step(sched, shadow)) == {"long": BUDGET}


def test_a_waiting_long_prompt_behind_a_short_one_is_admitted_with_what_is_left() -> None:
    sched, shadow = make()
    sched.add(mkseq("long", 200))
    sched.add(mkseq("short", 20, base=50))
    assert shape(step(sched, shadow)) == {"short": 20, "long": BUDGET - 20}


def test_a_long_prompt_gets_no_first_token_step_of_its_own_a_short_one_does() -> None:
    sched, shadow = make(mixed=16)
    sched.add(mkseq("d", 4, max_tokens=50, base=30))
    step(sched, shadow)  # d's prompt
    sched.add(mkseq("long", 200))
    plan = step(sched, shadow)
    assert shape(plan) == {"d": 1, "long": 15}  # a mixed step under the cap: d keeps decoding
    sched.add(mkseq("short", 10, base=50))
    assert shape(step(sched, shadow)) == {"short": 10, "long": BUDGET - 10}  # isolated: interactive prefill only
    assert shape(step(sched, shadow)) == {"d": 1, "short": 1, "long": 14}


def test_a_prompt_mostly_in_the_prefix_cache_counts_as_short() -> None:
    sched, shadow = make()
    first = mkseq("first", 60, max_tokens=1)
    sched.add(first)
    drive(sched, shadow)  # finished: its blocks stay cached
    sched.add(mkseq("long", 200, base=100))
    step(sched, shadow)
    again = mkseq("again", 64, max_tokens=1)  # the first 60 tokens cached: 4 left to compute
    assert sched.kv.match_prefix(again).num_tokens >= 56
    sched.add(again)
    plan = step(sched, shadow)
    assert plan.items[0].seq.request_id == "again"


def test_long_prompts_are_not_starved_and_every_request_finishes() -> None:
    sched, shadow = make()
    seqs = [mkseq("long", 300, base=100)] + [mkseq(f"s{i}", 12, base=i * 13) for i in range(12)]
    for s in seqs:
        sched.add(s)
    drive(sched, shadow)
    assert all(s.finish_reason is not None for s in seqs)
    assert all(s.num_generated == 4 for s in seqs)


def test_batch_tier_short_prompts_do_not_jump_interactive_long_ones() -> None:
    sched, shadow = make()
    sched.add(mkseq("long", 200))
    sched.add(mkseq("batch-short", 8, base=50, prio=Priority.BATCH))
    plan = step(sched, shadow)
    assert [i.seq.request_id for i in plan.items] == ["long"]
