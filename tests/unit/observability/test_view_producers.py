"""The producers of the observability views: the scheduler and the KV manager report what they hold."""

from __future__ import annotations

from service.request.sequence import Priority, Sequence
from tests.support.sim import fake_forward
from tests.unit.scheduler.test_scheduler import make, mkseq


def test_scheduler_and_kv_views_count_what_they_hold() -> None:
    sched, shadow = make(num_blocks=64, block_size=4, lanes=16, max_running=2, budget=32)
    for i, prio in enumerate((Priority.INTERACTIVE, Priority.BATCH, Priority.BATCH)):
        sched.add(mkseq(f"r{i}", 6, prio=prio, base=10 * i))
    plan = sched.schedule()
    sched.update(plan, fake_forward(sched, shadow, plan))
    sched.preemptions[(Priority.BATCH, "kv_memory")] += 2  # as a preemption counts it

    def per_tier(seqs: list[Sequence]) -> dict[Priority, int]:
        return {p: sum(1 for s in seqs if s.priority is p) for p in Priority}

    load = sched.view()
    assert sched.running and sched.waiting  # something in both lists
    assert load.running == per_tier(sched.running) and load.waiting == per_tier(sched.waiting)
    assert (load.num_running, load.num_waiting, load.num_preemptions) == (len(sched.running), len(sched.waiting), 2)
    assert load.preemptions_of(Priority.BATCH) == 2 and load.preemptions_of(Priority.INTERACTIVE) == 0
    assert load.preemptions_by_reason() == {"kv_memory": 2}

    kv = sched.kv.view()
    assert (kv.blocks_total, kv.block_size) == (64, 4)
    assert kv.blocks_used == sched.kv.num_used > 0
    assert kv.blocks_used + kv.blocks_cached + kv.blocks_free == kv.blocks_total
    assert kv.prompt_tokens == sched.kv.stats.prompt_tokens and kv.host_prefixes == 0
    assert 0.0 < kv.usage <= 1.0 and kv.hit_rate == 0.0  # nothing shared yet
