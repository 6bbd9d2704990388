"""Interactive tail: fewer batch decode rows per step while interactive work exists (no model)."""

from __future__ import annotations

from collections import Counter

import pytest

from service.kv.integrity import check_integrity
from service.priority import FCFSPolicy
from service.request.sequence import Priority, SeqStatus
from service.scheduler.batch_rows import BatchRowCap
from service.scheduler.plan import Plan
from service.scheduler.scheduler import Scheduler
from tests.support.sim import ShadowKV, drive, fake_forward
from tests.unit.scheduler.test_scheduler import Clock, make, mkseq


def step(sched: Scheduler, shadow: ShadowKV) -> Plan:
    plan = sched.schedule()
    sched.update(plan, fake_forward(sched, shadow, plan))
    check_integrity(sched.kv, sched.running)
    return plan


def loaded(limit: int | None, n_batch: int = 8, max_tokens: int = 40) -> tuple[Scheduler, ShadowKV]:
    """``n_batch`` batch sequences past their prompts, decoding."""
    sched, shadow = make(num_blocks=256, lanes=32, max_running=16, budget=64)
    sched.batch_rows = BatchRowCap(limit) if limit else None
    for i in range(n_batch):
        sched.add(mkseq(f"b{i}", 3, max_tokens, Priority.BATCH, base=10 * i))
    while any(s.num_computed < s.num_prompt_tokens for s in sched.running) or sched.waiting:
        step(sched, shadow)
    return sched, shadow


def decoded_uids(plan: Plan, prio: Priority) -> list[int]:
    return [i.seq.uid for i in plan.items if i.seq.priority is prio and i.num_tokens == 1 and i.sample]


def test_without_interactive_work_every_batch_row_decodes() -> None:
    sched, shadow = loaded(limit=3)
    for _ in range(5):
        assert len(decoded_uids(step(sched, shadow), Priority.BATCH)) == 8


def test_with_an_interactive_request_running_batch_rows_are_capped_and_rotate() -> None:
    sched, shadow = loaded(limit=3)
    sched.add(mkseq("i", 3, 30, Priority.INTERACTIVE, base=99))
    step(sched, shadow)  # the interactive request's isolated first-token step
    last: dict[int, int] = {s.uid: 0 for s in sched.running if s.priority is Priority.BATCH}
    longest_wait = 0
    for n in range(1, 13):
        plan = step(sched, shadow)
        batch = decoded_uids(plan, Priority.BATCH)
        assert len(batch) == 3
        assert len(decoded_uids(plan, Priority.INTERACTIVE)) == 1  # interactive rows are never capped
        for uid in batch:
            longest_wait = max(longest_wait, n - last[uid])
            last[uid] = n
    # least recently decoded first: 8 rows, 3 per step -> nobody waits more than ceil(8 / 3) steps
    assert longest_wait <= 3
    assert min(last.values()) >= 12 - 2


def test_a_skipped_batch_row_keeps_its_place_and_finishes_with_the_same_tokens() -> None:
    capped, shadow_c = loaded(limit=2, max_tokens=12)
    free, shadow_f = loaded(limit=None, max_tokens=12)
    seqs = {}
    for name, sched in (("capped", capped), ("free", free)):
        sched.add(mkseq("i", 3, 20, Priority.INTERACTIVE, base=99))
        seqs[name] = {s.request_id: s for s in [*sched.running, *sched.waiting]}
    steps_capped = drive(capped, shadow_c)
    steps_free = drive(free, shadow_f)
    assert steps_capped > steps_free  # batch rows lost steps ...
    assert capped.preemptions == free.preemptions == Counter()  # ... but nobody lost its place
    # ... and every sequence ends with the same tokens (the simulated model's next token is a hash
    # of the whole context: a row that lost or repeated a token would differ from here on)
    assert sorted(seqs["capped"]) == sorted(seqs["free"]) == [*(f"b{i}" for i in range(8)), "i"]
    for rid, seq in seqs["capped"].items():
        other = seqs["free"][rid]
        assert seq.status is other.status is SeqStatus.FINISHED, rid
        assert seq.num_generated == other.num_generated == (20 if rid == "i" else 12), rid
        assert seq.token_ids == other.token_ids, rid


def test_cap_lifts_once_the_interactive_request_finishes() -> None:
    sched, shadow = loaded(limit=3, max_tokens=40)
    sched.add(mkseq("i", 3, 2, Priority.INTERACTIVE, base=99))
    for _ in range(4):
        step(sched, shadow)
    assert not any(
        s.priority is Priority.INTERACTIVE and s.status is SeqStatus.RUNNING for s in sched.running
    )
    assert len(decoded_uids(step(sched, shadow), Priority.BATCH)) == 8


def test_a_waiting_interactive_request_also_caps_batch_rows() -> None:
    cap = BatchRowCap(2)
    sched, shadow = loaded(limit=2)
    sched.batch_rows = cap
    waiting = mkseq("i", 3, 5, Priority.INTERACTIVE, base=99)
    waiting.paused = False
    sched.waiting.append(waiting)  # queued but not admitted this step: the cap still applies
    waiting.status = SeqStatus.WAITING
    sched.max_running = len(sched.running)  # no room: it stays waiting (batch is not preempted here)
    sched.policy.pick_victim = lambda *a: None  # type: ignore[method-assign]
    sched._isolated_last = True  # a decode step, not an isolated one
    plan = step(sched, shadow)
    assert len(decoded_uids(plan, Priority.BATCH)) == 2 and cap.skipped == 6


def test_fcfs_has_no_batch_tier_so_nothing_is_capped() -> None:
    sched, shadow = make(
        num_blocks=256, lanes=32, max_running=16, budget=64, policy=FCFSPolicy(), clock=Clock()
    )
    sched.batch_rows = BatchRowCap(1)
    for i in range(4):
        sched.add(mkseq(f"b{i}", 3, 10, Priority.BATCH, base=10 * i))
    sched.add(mkseq("i", 3, 10, Priority.INTERACTIVE, base=99))
    for _ in range(3):
        plan = step(sched, shadow)
    assert len(plan.items) == 5


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BatchRowCap(0)
