"""How the scheduler recomputes a preempted sequence (no model): the prompt in a chunk that ends where the
prompt ends, the generated tokens in steps under llama.cpp's tiled-attention threshold (64 rows), so the
recompute gives the KV its decode steps gave (tests/model/engine/test_recompute_exact.py checks the logits)."""

from __future__ import annotations

from service.paged_kv import KVBlockManager
from service.priority import PriorityPolicy
from service.request.sequence import SamplingParams, Sequence
from service.scheduler.scheduler import Scheduler
from tests.support.sim import append_token

PROMPT, GENERATED, STEP, PER_ROW = 10, 100, 128, 63


def scheduler() -> Scheduler:
    kv = KVBlockManager(128, 16, 8, prefix_cache=False)
    return Scheduler(
        kv, PriorityPolicy(aging_s=30.0), max_running=4, step_tokens=STEP, append_token=append_token,
        mixed_step_tokens=PER_ROW,
    )


def chunks(sched: Scheduler, seq: Sequence, steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        plan = sched.schedule()
        out += [i.num_tokens for i in plan.items if i.seq is seq]
        sched.update(plan, {i.seq.uid: 1 for i in plan.items if i.sample})
    return out


def test_a_preempted_sequence_recomputes_its_generated_tokens_in_per_row_steps() -> None:
    sched = scheduler()
    seq = Sequence("s", list(range(PROMPT)), SamplingParams(max_tokens=1000))
    sched.add(seq)
    assert chunks(sched, seq, GENERATED) == [PROMPT] + [1] * (GENERATED - 1)  # prompt, then decode rows
    sched.preempt(seq, "priority")
    recompute = chunks(sched, seq, 3)
    assert recompute == [PROMPT, PER_ROW, GENERATED - PER_ROW]
    assert seq.num_computed == PROMPT + GENERATED  # resumed: one token sampled, decoding again


def test_a_fresh_prompt_still_takes_the_whole_step() -> None:
    sched = scheduler()
    seq = Sequence("s", list(range(110)), SamplingParams(max_tokens=4))
    sched.add(seq)
    assert chunks(sched, seq, 1) == [110]
