"""Scheduler and queue-policy unit tests with fake steps (no model)."""

from __future__ import annotations

import pytest

from service.kv.integrity import check_integrity
from service.paged_kv import KVBlockManager
from service.priority import AdmissionControl, FCFSPolicy, PriorityPolicy, QueueFull
from service.request.sequence import FinishReason, Priority, SamplingParams, SeqStatus, Sequence
from service.scheduler.scheduler import Scheduler
from tests.support.sim import ShadowKV, append_token, drive, fake_forward


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def mkseq(
    rid: str,
    n_prompt: int,
    max_tokens: int = 4,
    prio: Priority = Priority.INTERACTIVE,
    arrival: float = 1000.0,
    base: int = 0,
) -> Sequence:
    s = Sequence(
        request_id=rid,
        token_ids=[base + i % 7 for i in range(n_prompt)],
        params=SamplingParams(max_tokens=max_tokens),
        priority=prio,
        arrival=arrival,
    )
    return s


def make(
    num_blocks: int = 64,
    block_size: int = 4,
    lanes: int = 16,
    max_running: int = 4,
    budget: int = 32,
    policy: object = None,
    clock: Clock | None = None,
) -> tuple[Scheduler, ShadowKV]:
    kv = KVBlockManager(num_blocks, block_size, lanes)
    sched = Scheduler(
        kv,
        policy or PriorityPolicy(aging_s=10.0),
        max_running=max_running,
        step_tokens=budget,
        append_token=append_token,
        clock=clock or Clock(),
    )
    return sched, ShadowKV(num_blocks * block_size)


def test_interactive_before_batch_and_fcfs_within_tier() -> None:
    sched, _ = make(max_running=1)
    b1 = mkseq("b1", 3, prio=Priority.BATCH, arrival=1.0)
    i1 = mkseq("i1", 3, arrival=3.0)
    i2 = mkseq("i2", 3, arrival=4.0)
    b2 = mkseq("b2", 3, prio=Priority.BATCH, arrival=2.0)
    for s in (b1, i1, i2, b2):
        sched.add(s)
    order = [s.request_id for s in sched.policy.order(sched.waiting, now=5.0)]
    assert order == ["i1", "i2", "b1", "b2"]
    assert FCFSPolicy().order(sched.waiting, now=5.0)[0] is b1


def test_aging_promotes_old_batch_requests() -> None:
    policy = PriorityPolicy(aging_s=10.0)
    old = mkseq("old", 3, prio=Priority.BATCH, arrival=0.0)
    new = mkseq("new", 3, arrival=15.0)
    assert policy.effective_tier(old, now=5.0) is Priority.BATCH
    assert [s.request_id for s in policy.order([new, old], now=20.0)] == ["old", "new"]


def test_victim_is_cheapest_batch_never_interactive() -> None:
    policy = PriorityPolicy()
    cand = mkseq("i", 3)
    b_big = mkseq("bb", 40, prio=Priority.BATCH)
    b_small = mkseq("bs", 5, prio=Priority.BATCH)
    inter = mkseq("ii", 2)
    for s, n in ((b_big, 40), (b_small, 5), (inter, 2)):
        s.num_computed, s.status = n, SeqStatus.RUNNING
    assert policy.pick_victim(cand, [b_big, b_small, inter], now=0.0) is b_small
    assert policy.pick_victim(cand, [inter], now=0.0) is None
    batch_cand = mkseq("b", 3, prio=Priority.BATCH)
    assert (
        policy.pick_victim(batch_cand, [b_big, b_small], now=0.0) is None
    )  # batch never preempts for admission


def test_budget_decodes_first_then_chunked_prefill() -> None:
    sched, shadow = make(budget=16, max_running=6)
    for i in range(3):
        sched.add(mkseq(f"d{i}", 3, max_tokens=50, base=i * 10))
    plan = sched.schedule()
    sched.update(plan, fake_forward(sched, shadow, plan))
    long = mkseq("long", 40, prio=Priority.BATCH, base=100)
    sched.add(long)
    plan = sched.schedule()
    sizes = {i.seq.request_id: i.num_tokens for i in plan.items}
    assert sizes == {"d0": 1, "d1": 1, "d2": 1, "long": 13}  # decodes first, prompt chunked to the budget
    assert not plan.items[-1].sample
    sched.update(plan, fake_forward(sched, shadow, plan))
    inter = mkseq("inter", 6, base=200)
    sched.add(inter)
    plan = sched.schedule()
    sizes = {i.seq.request_id: i.num_tokens for i in plan.items}
    # An interactive request awaiting its first token gets a step of its prompt alone...
    assert sizes == {"inter": 6}
    sched.update(plan, fake_forward(sched, shadow, plan))
    later = mkseq("later", 6, base=300)
    sched.add(later)
    plan = sched.schedule()
    sizes = {i.seq.request_id: i.num_tokens for i in plan.items}
    # ...but never two in a row, and interactive prefill still goes before batch prefill.
    assert sizes == {"d0": 1, "d1": 1, "d2": 1, "inter": 1, "later": 6, "long": 16 - 4 - 6}


def test_steps_with_decode_rows_stay_under_the_mixed_cap() -> None:
    kv = KVBlockManager(64, 4, 16)
    sched = Scheduler(
        kv, FCFSPolicy(), max_running=6, step_tokens=32, append_token=append_token, mixed_step_tokens=10
    )
    shadow = ShadowKV(64 * 4)
    first = mkseq("first", 30, max_tokens=20)
    sched.add(first)
    plan = sched.schedule()
    assert plan.num_tokens == 30  # no decode rows yet: the whole budget
    sched.update(plan, fake_forward(sched, shadow, plan))
    sched.add(mkseq("second", 30, max_tokens=20, base=100))
    sizes = []
    for _ in range(4):
        plan = sched.schedule()
        sizes.append({i.seq.request_id: i.num_tokens for i in plan.items})
        sched.update(plan, fake_forward(sched, shadow, plan))
        check_integrity(kv, sched.running)
    # one decode row + 9 prompt tokens per step (10 in all), then both decode
    assert sizes == [
        {"first": 1, "second": 9},
        {"first": 1, "second": 9},
        {"first": 1, "second": 9},
        {"first": 1, "second": 3},
    ]


def test_preemption_when_running_cap_is_full_keeps_tokens() -> None:
    sched, shadow = make(max_running=2, budget=32)
    b1, b2 = mkseq("b1", 4, 30, Priority.BATCH, 999.0, 1), mkseq("b2", 4, 30, Priority.BATCH, 999.5, 2)
    sched.add(b1)
    sched.add(b2)
    for _ in range(5):
        plan = sched.schedule()
        sched.update(plan, fake_forward(sched, shadow, plan))
    generated = list(b2.token_ids)
    i = mkseq("i", 4, 3, Priority.INTERACTIVE, 1000.0, 3)
    sched.add(i)
    plan = sched.schedule()
    assert plan.preempted == (b2,)  # equal cost: the newest gives way
    assert b2.status is SeqStatus.WAITING and b2.num_computed == 0 and b2.preemptions == 1
    assert b2.token_ids == generated  # generated tokens are kept for the resume
    assert sched.preemptions[(Priority.BATCH, "priority")] == 1
    sched.update(plan, fake_forward(sched, shadow, plan))
    drive(sched, shadow)
    assert all(s.finish_reason is FinishReason.LENGTH for s in (b1, b2, i))


def test_memory_pressure_preempts_and_everyone_finishes_identically() -> None:
    """A pool too small for all at once: outputs equal the unpressured run (recompute is exact)."""

    def run(num_blocks: int) -> tuple[list[list[int]], int]:
        sched, shadow = make(num_blocks=num_blocks, block_size=4, lanes=16, max_running=8, budget=64)
        seqs = [mkseq(f"r{k}", 10 + k, max_tokens=20, base=k * 3, prio=Priority.BATCH) for k in range(8)]
        for s in seqs:
            sched.add(s)
        drive(sched, shadow)
        return [s.token_ids for s in seqs], sum(sched.preemptions.values())

    roomy, p0 = run(256)
    tight, p1 = run(24)  # 96 token slots for 8 sequences of up to ~37 tokens
    assert p0 == 0 and p1 > 0
    assert tight == roomy


def test_prompt_filling_most_of_the_pool_still_runs_to_completion() -> None:
    sched, shadow = make(num_blocks=4, block_size=4)
    s = mkseq("huge", 10)
    sched.add(s)
    drive(sched, shadow)
    assert s.finish_reason is FinishReason.LENGTH  # 10 + 4 tokens fit 16 slots


def test_sequence_larger_than_the_pool_fails_instead_of_waiting_forever() -> None:
    sched, shadow = make(num_blocks=4, block_size=4)
    s, ok = mkseq("huge", 20), mkseq("ok", 3)  # 20 tokens can never fit 16 slots
    sched.add(s)
    sched.add(ok)
    drive(sched, shadow)
    assert s.finish_reason is FinishReason.ERROR and s.error_status == "INVALID_ARGUMENT"
    assert s.error is not None and "does not fit" in s.error
    assert ok.finish_reason is FinishReason.LENGTH


def test_queue_limits() -> None:
    adm = AdmissionControl({Priority.INTERACTIVE: 2, Priority.BATCH: 1})
    a, b, c = mkseq("a", 1), mkseq("b", 1), mkseq("c", 1)
    adm.enter(a, lambda p, d: 100)
    adm.enter(b, lambda p, d: 100)
    with pytest.raises(QueueFull) as info:
        adm.enter(c, lambda p, d: 1234)
    assert info.value.retry_after_ms == 1234 and "retry after 1234 ms" in str(info.value)
    adm.enter(mkseq("x", 1, prio=Priority.BATCH), lambda p, d: 1)
    assert adm.leave(a) and not adm.leave(a)
    adm.enter(c, lambda p, d: 1)
    assert adm.depth(Priority.INTERACTIVE) == 2


def test_deadline_expiry_in_queue() -> None:
    clock = Clock()
    sched, shadow = make(max_running=1, clock=clock)
    runner = mkseq("run", 3, max_tokens=100)
    sched.add(runner)
    plan = sched.schedule()
    sched.update(plan, fake_forward(sched, shadow, plan))
    late = mkseq("late", 3)
    late.deadline = clock.t + 0.5
    sched.add(late)
    clock.t += 1.0
    plan = sched.schedule()
    assert plan.expired == (late,)
    assert late.finish_reason is FinishReason.CANCELLED and late.first_scheduled is None
    assert late not in sched.waiting


def test_abort_frees_everything() -> None:
    sched, shadow = make()
    seqs = [mkseq(f"s{i}", 9, 50, base=i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    plan = sched.schedule()
    sched.update(plan, fake_forward(sched, shadow, plan))
    for s in seqs:
        assert sched.abort(s)
    assert not sched.abort(seqs[0])
    assert sched.kv.num_used == 0
    check_integrity(sched.kv, [])


def test_batch_prefill_is_capped_per_step_interactive_is_not() -> None:
    kv = KVBlockManager(64, 4, 16)
    sched = Scheduler(
        kv,
        PriorityPolicy(aging_s=100.0),
        max_running=4,
        step_tokens=32,
        append_token=append_token,
        clock=Clock(),
        batch_prefill_budget=8,
    )
    shadow = ShadowKV(256)
    b = mkseq("b", 30, prio=Priority.BATCH, arrival=1000.0)
    sched.add(b)
    plan = sched.schedule()
    assert [(i.seq.request_id, i.num_tokens) for i in plan.items] == [("b", 8)]
    sched.update(plan, fake_forward(sched, shadow, plan))
    i = mkseq("i", 20, arrival=1000.0, base=50)
    sched.add(i)
    plan = sched.schedule()  # isolated step: interactive prefill only, uncapped
    assert [(x.seq.request_id, x.num_tokens) for x in plan.items] == [("i", 20)]
    sched.update(plan, fake_forward(sched, shadow, plan))
    plan = sched.schedule()
    assert {x.seq.request_id: x.num_tokens for x in plan.items} == {"i": 1, "b": 8}


def test_equally_preempted_sequences_resume_oldest_first() -> None:
    sched, _ = make()
    old, new = mkseq("old", 4, arrival=1.0), mkseq("new", 4, arrival=2.0)
    for s in (new, old):
        s.reset_for_recompute()  # one preemption each
    fresh = mkseq("fresh", 4, arrival=0.5)
    order = sched.policy.order([fresh, new, old], now=3.0)
    assert [s.request_id for s in order] == ["old", "new", "fresh"]
    new.reset_for_recompute()  # preempted twice: goes first
    assert [s.request_id for s in sched.policy.order([old, new], now=3.0)] == ["new", "old"]


def test_paused_sequences_are_not_scheduled_and_give_way_first() -> None:
    sched, shadow = make(max_running=2)
    a, b, c = mkseq("a", 4, max_tokens=50), mkseq("b", 4, max_tokens=50), mkseq("c", 4, max_tokens=3)
    for s in (a, b):
        sched.add(s)
    sched.update(plan := sched.schedule(), fake_forward(sched, shadow, plan))
    assert {s.request_id for s in sched.running} == {"a", "b"}
    a.paused = True
    sched.add(c)
    plan = sched.schedule()  # c takes the paused sequence's running place
    assert a in plan.preempted and {i.seq.request_id for i in plan.items} == {"b", "c"}
    assert a.status is SeqStatus.WAITING and a in sched.waiting
    sched.update(plan, fake_forward(sched, shadow, plan))
    for _ in range(5):
        plan = sched.schedule()
        assert "a" not in {i.seq.request_id for i in plan.items}
        sched.update(plan, fake_forward(sched, shadow, plan))
    a.paused = False
    drive(sched, shadow)
    assert a.finish_reason is FinishReason.LENGTH and a.num_generated == 50
