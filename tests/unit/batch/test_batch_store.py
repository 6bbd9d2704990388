"""JobStore contract tests (no model): every implementation must pass them.

Implementations under test: ``SqliteJobStore`` on a file, ``PostgresJobStore`` on a
throwaway PostgreSQL (tests/support/pg.py: one database per test), plus any named by
``BATCH_STORE_FACTORY=module:function`` (``function(tmp_path, clock, retention_s)``
returning a JobStore; called twice with the same ``tmp_path`` it must open the
same data, e.g. a PostgreSQL adapter on a per-test schema). Times come from a
fake clock, so expiry and retention are tested without waiting.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from service.batch.sqlite_store import SqliteJobStore
from service.batch.store import (
    ItemError,
    ItemResult,
    ItemState,
    JobSpec,
    JobState,
    JobStore,
    NewItem,
    job_cursor,
)
from tests.support.clock import FakeClock

HOUR = 3600.0


def _sqlite(tmp_path: Path, clock: FakeClock, retention_s: float) -> JobStore:
    return SqliteJobStore(str(tmp_path / "batch.db"), retention_s=retention_s, clock=clock)


def _postgres(tmp_path: Path, clock: FakeClock, retention_s: float) -> JobStore:
    from tests.support.pg import make_store  # a throwaway PostgreSQL (skipped without one, failed in CI)

    return make_store(tmp_path, clock, retention_s)


def _factories() -> dict[str, Callable[..., JobStore]]:
    out: dict[str, Callable[..., JobStore]] = {"sqlite": _sqlite, "postgres": _postgres}
    extra = os.environ.get("BATCH_STORE_FACTORY")
    if extra:
        module, _, name = extra.partition(":")
        out[extra] = getattr(importlib.import_module(module), name)
    return out


Opener = Callable[[], JobStore]


@pytest.fixture(params=sorted(_factories()))
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Opener, FakeClock]]:
    """(open a store on this test's data, its fake clock); every store opened is closed after the test."""
    clock, factory, opened = FakeClock(), _factories()[request.param], []

    def open_store() -> JobStore:
        opened.append(factory(tmp_path, clock, 24 * HOUR))
        return opened[-1]

    yield open_store, clock
    for s in opened:
        s.close()


@pytest.fixture()
def store(opener: tuple[Opener, FakeClock]) -> JobStore:
    return opener[0]()


@pytest.fixture()
def clock(opener: tuple[Opener, FakeClock]) -> FakeClock:
    return opener[1]


def items(*ids: str, key: bytes = b"") -> list[NewItem]:
    return [NewItem(cid, n + 1, f"request {cid}".encode(), key) for n, cid in enumerate(ids)]


def ok(text: str = "out", prompt: int = 3, completion: int = 2) -> ItemResult:
    return ItemResult(text=text, finish_reason="stop", prompt_tokens=prompt, completion_tokens=completion)


def started(store: JobStore, *ids: str, tenant: str = "t1", **spec: object) -> str:
    job, _ = store.create_job(JobSpec(tenant, **spec))  # type: ignore[arg-type]
    store.add_items(job.id, items(*ids))
    assert store.start_job(job.id).state is JobState.IN_PROGRESS
    return job.id


def run_all(store: JobStore) -> None:
    while claims := store.claim(8):
        for c in claims:
            assert store.finish(c, ItemState.COMPLETED, ok(f"out {c.custom_id}"))


def test_idempotency_key_returns_the_first_job_of_the_same_tenant_only(store: JobStore) -> None:
    first, created = store.create_job(JobSpec("t1", idempotency_key="k"))
    again, created_again = store.create_job(JobSpec("t1", idempotency_key="k"))
    other, created_other = store.create_job(JobSpec("t2", idempotency_key="k"))
    assert created and not created_again and created_other
    assert again.id == first.id and other.id != first.id
    plain = [store.create_job(JobSpec("t1"))[0].id for _ in range(2)]
    assert len(set(plain)) == 2  # no key: always a new job


def test_a_tenant_never_sees_another_tenants_job(store: JobStore) -> None:
    job_id = started(store, "a", "b", tenant="t1")
    run_all(store)
    assert store.get_job("t2", job_id) is None
    assert store.cancel_job("t2", job_id) is None
    assert store.results("t2", job_id, False, "", 10) == []
    assert store.list_jobs("t2", 10) == ([], "")
    assert [r.custom_id for r in store.results("t1", job_id, False, "", 10)] == ["a", "b"]


def test_job_completes_with_counts_usage_times_and_results_in_both_orders(
    store: JobStore, clock: FakeClock
) -> None:
    job_id = started(store, "c", "a", "b")
    claims = store.claim(10)
    assert [c.custom_id for c in claims] == ["c", "a", "b"]  # equal sort keys: upload order
    job = store.get_job("t1", job_id)
    assert job is not None and job.counts.running == 3 and job.counts.total == 3
    for c in (claims[2], claims[0], claims[1]):  # finish b, c, a
        clock.advance(1)
        assert store.finish(c, ItemState.COMPLETED, ok(c.custom_id, prompt=5, completion=4))
    job = store.get_job("t1", job_id)
    assert job is not None and job.state is JobState.COMPLETED
    assert (job.counts.completed, job.counts.failed, job.counts.running) == (3, 0, 0)
    assert (job.usage.prompt_tokens, job.usage.completion_tokens) == (15, 12)
    assert set(job.times) == {"validating", "in_progress", "finalizing", "completed"}
    assert job.delete_at == job.times["completed"] + 24 * HOUR
    by_id = store.results("t1", job_id, False, "", 10)
    assert [(r.custom_id, r.result.text) for r in by_id] == [("a", "a"), ("b", "b"), ("c", "c")]
    by_done = store.results("t1", job_id, True, "", 10)
    assert [r.custom_id for r in by_done] == ["b", "c", "a"]
    assert [r.custom_id for r in store.results("t1", job_id, True, by_done[0].cursor, 10)] == ["c", "a"]
    assert [r.custom_id for r in store.results("t1", job_id, False, by_id[1].cursor, 10)] == ["c"]


def test_a_result_keeps_a_reasoning_models_thought_apart_from_its_answer(opener: tuple[Opener, FakeClock]) -> None:
    store = opener[0]()
    job_id = started(store, "r", "p")
    thought = replace(ok('{"ok": true}', completion=12), reasoning="Two is less than three.", reasoning_tokens=7)
    r, p = store.claim(2)
    assert store.finish(r, ItemState.COMPLETED, thought) and store.finish(p, ItemState.COMPLETED, ok("plain"))
    again = opener[0]()  # reopened: committed
    got = {x.custom_id: x.result for x in again.results("t1", job_id, False, "", 10)}
    assert got == {"r": thought, "p": ok("plain")}
    assert (got["r"].text, got["r"].reasoning, got["r"].reasoning_tokens) == ('{"ok": true}', thought.reasoning, 7)
    assert (got["p"].reasoning, got["p"].reasoning_tokens) == (None, 0)  # not read for a thought
    job = again.get_job("t1", job_id)
    assert job is not None and (job.usage.completion_tokens, job.usage.reasoning_tokens) == (14, 7)


def test_duplicate_and_bad_items_are_reported_and_the_job_goes_on(store: JobStore) -> None:
    job, _ = store.create_job(JobSpec("t1"))
    bad = NewItem("bad", 2, b"x", error=ItemError(2, "bad", "INVALID_ARGUMENT", "prompt is empty"))
    refused = store.add_items(job.id, [*items("a"), bad, NewItem("a", 3, b"again")])
    assert [r.line for r in refused] == [3]
    store.add_errors(job.id, [ItemError(3, "a", "ALREADY_EXISTS", "duplicate custom_id")])
    job = store.start_job(job.id)
    assert job.state is JobState.IN_PROGRESS
    assert (job.counts.total, job.counts.failed, job.counts.queued, job.error_count) == (2, 1, 1, 2)
    assert [(e.line, e.status) for e in job.errors] == [(2, "INVALID_ARGUMENT"), (3, "ALREADY_EXISTS")]
    run_all(store)
    results = {r.custom_id: r for r in store.results("t1", job.id, False, "", 10)}
    assert results["bad"].result.error_status == "INVALID_ARGUMENT" and results["a"].result.text == "out a"


def test_a_job_whose_items_are_all_bad_fails(store: JobStore) -> None:
    job, _ = store.create_job(JobSpec("t1"))
    store.add_items(job.id, [NewItem("x", 1, b"", error=ItemError(1, "x", "INVALID_ARGUMENT", "bad"))])
    failed = store.start_job(job.id)
    assert failed.state is JobState.FAILED and "invalid" in failed.failure and failed.delete_at is not None
    empty, _ = store.create_job(JobSpec("t1"))
    assert store.start_job(empty.id).state is JobState.FAILED
    assert store.claim(10) == []


def test_restart_requeues_running_items_and_a_stale_run_never_records_a_second_result(
    opener: tuple[Opener, FakeClock],
) -> None:
    first = opener[0]()
    job_id = started(first, "a", "b", "c")
    stale = first.claim(2)
    assert [c.attempt for c in stale] == [1, 1]
    second = opener[0]()  # "restart": a new store on the same data
    assert second.recover() == 2
    fresh = second.claim(10)
    assert sorted((c.custom_id, c.attempt) for c in fresh) == [("a", 2), ("b", 2), ("c", 1)]
    assert not second.finish(stale[0], ItemState.COMPLETED, ok("stale"))  # the killed run's late result
    for c in fresh:
        assert second.finish(c, ItemState.COMPLETED, ok("fresh"))
        assert not second.finish(c, ItemState.COMPLETED, ok("twice"))
    results = second.results("t1", job_id, False, "", 10)
    assert [(r.custom_id, r.result.text) for r in results] == [("a", "fresh"), ("b", "fresh"), ("c", "fresh")]
    job = second.get_job("t1", job_id)
    assert job is not None and job.state is JobState.COMPLETED and job.counts.completed == 3


def test_recover_deletes_uploads_that_broke_off(store: JobStore) -> None:
    job, _ = store.create_job(JobSpec("t1", idempotency_key="k"))
    store.add_items(job.id, items("a"))
    store.recover()
    assert store.get_job("t1", job.id) is None
    assert store.create_job(JobSpec("t1", idempotency_key="k"))[1]  # the key is free again


def test_requeue_gives_the_item_back_unstarted(store: JobStore) -> None:
    job_id = started(store, "a")
    (c,) = store.claim(1)
    store.requeue(c)
    (again,) = store.claim(1)
    assert again.attempt == 1 and again.custom_id == "a"
    store.requeue(again, started=True)  # cancelled by a drain after it started: the attempt counts
    store.requeue(again)  # stale now: ignored
    (third,) = store.claim(1)
    assert third.attempt == 2
    assert not store.finish(again, ItemState.COMPLETED, ok())
    assert store.get_job("t1", job_id).counts.running == 1  # type: ignore[union-attr]


def test_cancel_stops_queued_items_keeps_finished_results_and_waits_for_running_ones(store: JobStore) -> None:
    job_id = started(store, "a", "b", "c", "d")
    done, running = store.claim(2)
    assert store.finish(done, ItemState.COMPLETED, ok())
    job = store.cancel_job("t1", job_id)
    assert job is not None and job.state is JobState.CANCELLING
    assert (job.counts.completed, job.counts.cancelled, job.counts.running) == (1, 2, 1)
    assert store.claim(10) == []  # queued items never start
    assert store.stopping_jobs() == {job_id: JobState.CANCELLING}
    assert store.finish(running, ItemState.CANCELLED, ItemResult(finish_reason="cancelled", error_status="CANCELLED"))
    job = store.get_job("t1", job_id)
    assert job is not None and job.state is JobState.CANCELLED and "cancelled" in job.times
    assert store.stopping_jobs() == {}
    states = {r.custom_id: r.state for r in store.results("t1", job_id, False, "", 10)}
    assert states == {"a": ItemState.COMPLETED, "b": ItemState.CANCELLED, "c": ItemState.CANCELLED,
                      "d": ItemState.CANCELLED}
    assert store.cancel_job("t1", job_id).state is JobState.CANCELLED  # type: ignore[union-attr]


def test_cancel_with_nothing_running_ends_at_once(store: JobStore) -> None:
    job_id = started(store, "a")
    assert store.cancel_job("t1", job_id).state is JobState.CANCELLED  # type: ignore[union-attr]


def test_a_job_past_its_completion_window_expires_keeping_finished_results(
    store: JobStore, clock: FakeClock
) -> None:
    job_id = started(store, "a", "b", "c", completion_window_s=600)
    done, running = store.claim(2)
    store.finish(done, ItemState.COMPLETED, ok())
    clock.advance(599)
    store.sweep()
    assert store.get_job("t1", job_id).state is JobState.IN_PROGRESS  # type: ignore[union-attr]
    clock.advance(1)
    store.sweep()
    job = store.get_job("t1", job_id)
    assert job is not None and job.state is JobState.EXPIRED and job.counts.cancelled == 1
    assert store.stopping_jobs() == {job_id: JobState.EXPIRED}  # the running item is to be cancelled
    store.finish(running, ItemState.CANCELLED, ItemResult(error_status="DEADLINE_EXCEEDED"))
    results = {r.custom_id: r for r in store.results("t1", job_id, False, "", 10)}
    assert results["a"].state is ItemState.COMPLETED
    assert results["c"].result.error_status == "DEADLINE_EXCEEDED"
    assert store.claim(10) == []


def test_finished_jobs_are_deleted_after_the_retention_period(store: JobStore, clock: FakeClock) -> None:
    job_id = started(store, "a")
    running_id = started(store, "b")
    run_all(store)
    late_id = started(store, "c")
    clock.advance(24 * HOUR - 1)
    store.sweep()
    assert store.get_job("t1", job_id) is not None
    clock.advance(1)
    store.sweep()
    assert store.get_job("t1", job_id) is None and store.get_job("t1", running_id) is None
    assert store.results("t1", job_id, False, "", 10) == []
    assert store.get_job("t1", late_id) is not None  # not finished: never deleted by retention


def test_claim_orders_jobs_by_class_and_age_shares_slots_and_groups_prompt_prefixes(store: JobStore) -> None:
    old, _ = store.create_job(JobSpec("t1"))
    store.add_items(old.id, [NewItem(f"o{i}", i + 1, b"", bytes([i % 2])) for i in range(6)])
    store.start_job(old.id)
    urgent = started(store, "u1", "u2", priority=1)
    new = started(store, "n1", "n2")
    first = store.claim(2)
    assert [c.job_id for c in first] == [urgent, urgent]
    mixed = store.claim(4)
    assert {c.job_id for c in mixed} == {old.id, new}  # both remaining jobs get slots
    rest = store.claim(10)
    olds = [c.custom_id for c in mixed + rest if c.job_id == old.id]
    assert olds == ["o0", "o2", "o4", "o1", "o3", "o5"]  # sort key 0 first, then 1: prefixes together


def test_list_pages_newest_first(store: JobStore, clock: FakeClock) -> None:
    ids = []
    for _ in range(5):
        clock.advance(1)
        ids.append(store.create_job(JobSpec("t1"))[0].id)
    seen, token = [], ""
    while True:
        page, token = store.list_jobs("t1", 2, token)
        seen += [j.id for j in page]
        if not token:
            break
    assert seen == ids[::-1]


def test_list_continues_after_a_given_job_and_holds_only_the_tenants_jobs(store: JobStore, clock: FakeClock) -> None:
    mine, theirs = [], []
    for n in range(6):
        clock.advance(1 if n % 2 else 0)  # NOTE: pairs of jobs created in the same instant
        mine.append(store.create_job(JobSpec("t1"))[0].id)
        theirs.append(store.create_job(JobSpec("t2"))[0].id)
    newest = [j.id for j in store.list_jobs("t1", 100)[0]]  # NOTE: jobs of one instant: in id order
    assert sorted(newest) == sorted(mine) and newest[0] in mine[-2:] and newest[-1] in mine[:2]
    for i, job_id in enumerate(newest):
        job = store.get_job("t1", job_id)
        assert job is not None
        page, token = store.list_jobs("t1", 2, job_cursor(job))
        assert [j.id for j in page] == newest[i + 1 : i + 3]
        assert bool(token) == (i + 3 < len(newest))
    assert sorted(j.id for j in store.list_jobs("t2", 10)[0]) == sorted(theirs)
    assert {j.spec.tenant for j in store.list_jobs("t1", 10)[0]} == {"t1"}


def test_state_counts_report_jobs_and_backlog(store: JobStore) -> None:
    started(store, "a", "b", "c")
    store.claim(1)
    counts = store.state_counts()
    assert counts["in_progress"] == 1 and counts["queued_items"] == 2 and counts["running_items"] == 1


def test_batch_gauges_report_jobs_by_state_backlog_and_rate(store: JobStore) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from service.batch.metrics import observe_batches
    from service.batch.store_thread import StoreThread

    class Worker:
        def rate(self) -> float:
            return 2.5

    started(store, "a", "b", "c")
    store.claim(1)
    reader = InMemoryMetricReader()
    observe_batches(MeterProvider(metric_readers=[reader]).get_meter("t"), StoreThread(store), Worker())
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        (m.name, tuple(sorted(p.attributes.items()))): p.value
        for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics for p in m.data.data_points
    }
    assert points[("inference.batch.jobs", (("state", "in_progress"),))] == 1
    assert points[("inference.batch.items", (("item_state", "queued"),))] == 2
    assert points[("inference.batch.items", (("item_state", "running"),))] == 1
    assert points[("inference.batch.items_per_second", ())] == 2.5
    assert points[("inference.batch.store_up", ())] == 1
