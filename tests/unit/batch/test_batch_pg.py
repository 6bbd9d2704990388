"""PostgresJobStore beyond the JobStore contract: several replicas (store instances) on one database.

Each test gets its own database on the throwaway cluster of tests/support/pg.py and a
fake clock shared by its replicas (leases expire when the test says so).
Threads stand in for replicas racing each other; replicas as separate hosts are
a later harness (issue 26).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from service.batch.postgres_store import PostgresJobStore
from service.batch.store import ItemResult, ItemState, JobSpec, JobState, JobStore, NewItem, StoredResult
from tests.support.clock import FakeClock
from tests.support.pg import fresh_database
from tests.support.threads import in_threads

pytestmark = pytest.mark.timeout(120)
LEASE_S = 30.0


@dataclass
class Replicas:
    """Open store instances on this test's database; every one is closed after the test."""

    dsn: str
    clock: FakeClock = field(default_factory=FakeClock)
    opened: list[PostgresJobStore] = field(default_factory=list)

    def open(self, replica_id: str, **kw: Any) -> PostgresJobStore:
        store = PostgresJobStore(self.dsn, replica_id, retention_s=3600, clock=self.clock,
                                 lease_s=LEASE_S, **kw)
        self.opened.append(store)
        return store


@pytest.fixture()
def stores(tmp_path: Path) -> Iterator[Replicas]:
    """The test's replicas as store instances. NOTE: not named ``replicas``: the suite's model guard
    knows fixtures by name, and tests/model's ``replicas`` fixtures start servers with the model."""
    r = Replicas(fresh_database(str(tmp_path)))
    yield r
    for s in r.opened:
        s.close()


def ok(text: str = "out") -> ItemResult:
    return ItemResult(text=text, finish_reason="stop", prompt_tokens=3, completion_tokens=2)


def started(store: JobStore, *ids: str, tenant: str = "t1") -> str:
    job, _ = store.create_job(JobSpec(tenant))
    store.add_items(job.id, [NewItem(cid, n + 1, cid.encode()) for n, cid in enumerate(ids)])
    assert store.start_job(job.id).state is JobState.IN_PROGRESS
    return job.id


def all_results(store: JobStore, tenant: str, job_id: str) -> list[StoredResult]:
    """Every finished item of the job, by custom_id, fetched in pages."""
    out: list[StoredResult] = []
    while page := store.results(tenant, job_id, False, out[-1].cursor if out else "", 256):
        out += page
    return out


def test_two_replicas_claiming_from_threads_never_run_one_item_twice(stores: Replicas) -> None:
    a, b = stores.open("a"), stores.open("b")
    ids = [f"i{n:03}" for n in range(300)]
    job_id = started(a, *ids)
    claimed: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def work(i: int) -> int:
        store, done = (a, b)[i % 2], 0
        while claims := store.claim(4):
            with lock:
                claimed.update(c.custom_id for c in claims)
            for c in claims:
                assert c.attempt == 1
                assert store.finish(c, ItemState.COMPLETED, ok(f"{store.replica_id} {c.custom_id}"))
                done += 1
        return done

    per_thread = in_threads(4, work)
    assert sum(per_thread) == 300 and set(claimed) == set(ids) and max(claimed.values()) == 1
    results = all_results(b, "t1", job_id)
    assert [r.custom_id for r in results] == ids  # exactly one result per custom_id
    job = b.get_job("t1", job_id)
    assert job is not None and job.state is JobState.COMPLETED and job.counts.completed == 300


def test_an_expired_lease_is_requeued_by_another_replica_and_the_stale_owner_cannot_finish(
    stores: Replicas,
) -> None:
    a, b = stores.open("a"), stores.open("b")
    job_id = started(a, "x", "y")
    (stale,) = a.claim(1)
    stores.clock.advance(LEASE_S - 1)
    assert b.reclaim_expired() == 0  # a's lease still runs
    stores.clock.advance(1)
    assert b.reclaim_expired() == 1  # a "died": its lease ran out
    (fresh, other) = sorted(b.claim(10), key=lambda c: c.custom_id)
    assert (fresh.custom_id, fresh.attempt, other.attempt) == (stale.custom_id, 2, 1)
    assert not a.finish(stale, ItemState.COMPLETED, ok("stale"))  # a came back: refused
    assert a.renew([stale]) == [stale]  # ... and told the claim is lost
    a.requeue(stale)  # ignored
    assert b.finish(fresh, ItemState.COMPLETED, ok("fresh")) and b.finish(other, ItemState.COMPLETED, ok())
    results = {r.custom_id: r for r in a.results("t1", job_id, False, "", 10)}
    assert results[stale.custom_id].result.text == "fresh" and results[stale.custom_id].attempts == 2
    assert a.get_job("t1", job_id).state is JobState.COMPLETED  # type: ignore[union-attr]


def test_a_lapsed_lease_nobody_took_over_still_records(stores: Replicas) -> None:
    a = stores.open("a")
    started(a, "x")
    (c,) = a.claim(1)
    stores.clock.advance(10 * LEASE_S)  # e.g. a long pause; no replica reclaimed it meanwhile
    assert a.finish(c, ItemState.COMPLETED, ok())  # NOTE: still the current claim: no second run exists


def test_renew_keeps_leases_alive(stores: Replicas) -> None:
    a, b = stores.open("a"), stores.open("b")
    started(a, "x", "y")
    claims = a.claim(2)
    for _ in range(5):
        stores.clock.advance(LEASE_S * 2 / 3)
        assert a.renew(claims) == []
        assert b.reclaim_expired() == 0
    stores.clock.advance(LEASE_S)
    assert b.reclaim_expired() == 2


def test_recover_at_start_requeues_only_this_replicas_items(stores: Replicas) -> None:
    a, b = stores.open("a"), stores.open("b")
    job_id = started(a, "1", "2", "3", "4")
    a.claim(2)
    b.claim(1)
    assert stores.open("c").recover() == 0  # a new replica never takes live leases
    assert stores.open("a").recover() == 2  # a restarted: its own running items run again
    job = b.get_job("t1", job_id)
    assert job is not None and (job.counts.running, job.counts.queued) == (1, 3)


def test_idempotency_key_makes_one_job_across_replicas(stores: Replicas) -> None:
    stores = [stores.open("a"), stores.open("b")]
    made = in_threads(8, lambda i: stores[i % 2].create_job(JobSpec("t1", idempotency_key="k")))
    assert sum(created for _, created in made) == 1
    assert len({job.id for job, _ in made}) == 1
    other, created = stores[1].create_job(JobSpec("t2", idempotency_key="k"))
    assert created and other.id != made[0][0].id  # unique per tenant only


def test_a_half_uploaded_job_never_runs_and_is_dropped_when_its_replica_dies(stores: Replicas) -> None:
    a, b = stores.open("a"), stores.open("b")
    job, _ = a.create_job(JobSpec("t1", idempotency_key="k"))
    a.add_items(job.id, [NewItem("x", 1, b"x")])
    assert b.claim(10) == []
    assert b.recover() == 0 and b.get_job("t1", job.id) is not None  # a is alive: its upload stays
    assert b.create_job(JobSpec("t1", idempotency_key="k")) == (b.get_job("t1", job.id), False)
    stores.clock.advance(LEASE_S * 2 / 3)
    a.renew([], [job.id])  # a's heartbeat covers the uploads it still receives
    stores.clock.advance(LEASE_S * 2 / 3)
    b.reclaim_expired()
    assert b.get_job("t1", job.id) is not None
    stores.clock.advance(LEASE_S)  # a died mid-upload
    b.reclaim_expired()
    assert b.get_job("t1", job.id) is None
    with pytest.raises(LookupError):
        a.add_items(job.id, [NewItem("y", 2, b"y")])
    with pytest.raises(LookupError):
        a.start_job(job.id)
    again, created = b.create_job(JobSpec("t1", idempotency_key="k"))
    assert created and again.id != job.id  # the key is free again


def test_a_cancel_on_one_replica_reaches_the_owner_of_the_running_items(stores: Replicas) -> None:
    a, b = stores.open("a"), stores.open("b")
    job_id = started(a, "1", "2", "3", "4")
    running = a.claim(2)
    mark = a.changes()
    job = b.cancel_job("t1", job_id)
    assert job is not None and job.state is JobState.CANCELLING and job.counts.cancelled == 2
    assert a.wait_for_change(job_id, timeout=30, since=mark)  # LISTEN/NOTIFY woke a
    assert a.stopping_jobs() == {job_id: JobState.CANCELLING} and b.stopping_jobs() == {}
    assert a.claim(10) == []
    for c in running:
        assert a.finish(c, ItemState.CANCELLED, ItemResult(finish_reason="cancelled", error_status="CANCELLED"))
    assert b.get_job("t1", job_id).state is JobState.CANCELLED  # type: ignore[union-attr]


def test_wait_for_change_wakes_on_another_replicas_progress_and_times_out_otherwise(stores: Replicas) -> None:
    a, b = stores.open("a"), stores.open("b")
    job_id = started(b, "1")
    assert not a.wait_for_change(job_id, timeout=0.2)
    mark = a.changes()
    (c,) = b.claim(1)
    assert b.finish(c, ItemState.COMPLETED, ok())
    assert a.wait_for_change(job_id, timeout=30, since=mark)
    assert a.wait_for_change(None, timeout=30, since=mark)  # any job
    assert not a.wait_for_change("batch_other", timeout=0.2, since=a.changes())


def test_one_result_per_custom_id_holds_when_one_claim_is_finished_twice_at_once(stores: Replicas) -> None:
    a = stores.open("a")
    job_id = started(a, "x")
    (c,) = a.claim(1)
    recorded = in_threads(6, lambda i: a.finish(c, ItemState.COMPLETED, ok(str(i))))
    assert sorted(recorded) == [False] * 5 + [True]
    assert len(a.results("t1", job_id, True, "", 10)) == 1


def test_the_database_refuses_a_second_result_row(stores: Replicas) -> None:
    import psycopg

    a = stores.open("a")
    job_id = started(a, "x")
    (c,) = a.claim(1)
    assert a.finish(c, ItemState.COMPLETED, ok())
    with psycopg.connect(stores.dsn) as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO batch_results (job_id, custom_id, done_seq, state, attempts) VALUES (%s, 'x', 99, 'completed', 1)",
            (job_id,),
        )


def test_migrations_are_applied_once_when_replicas_start_at_once(tmp_path: Path) -> None:
    import psycopg

    from service.batch.pg_schema import LATEST

    dsn = fresh_database(str(tmp_path))
    stores = in_threads(6, lambda i: PostgresJobStore(dsn, f"r{i}", clock=FakeClock()))
    try:
        assert {s.schema_version for s in stores} == {LATEST}
        stores.append(PostgresJobStore(dsn, "late", clock=FakeClock()))  # idempotent: nothing to do
        with psycopg.connect(dsn) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM batch_schema_version ORDER BY version")]
        assert versions == list(range(1, LATEST + 1))
        started(stores[0], "x")
        assert [c.custom_id for c in stores[-1].claim(5)] == ["x"]
    finally:
        for s in stores:
            s.close()


def test_open_store_picks_postgres_by_the_url_scheme(tmp_path: Path) -> None:
    from service.batch.open_store import open_store

    dsn = fresh_database(str(tmp_path))
    url = "postgresql://postgres@127.0.0.1:{port}/{dbname}".format(
        **dict(kv.split("=", 1) for kv in dsn.split())
    )
    store = open_store(url, retention_s=60, replica_id="r1")
    try:
        assert isinstance(store, PostgresJobStore) and store.replica_id == "r1"
    finally:
        store.close()


def test_a_stale_claim_with_the_same_attempt_number_from_another_replica_is_refused(stores: Replicas) -> None:
    a, b = stores.open("a"), stores.open("b")
    job_id = started(a, "x")
    (old,) = a.claim(1)
    a.requeue(old)  # unstarted: the attempt is given back
    (new,) = b.claim(1)
    assert new.attempt == old.attempt == 1
    assert not a.finish(old, ItemState.COMPLETED, ok("a"))  # only the owner's claim is current
    assert b.finish(new, ItemState.COMPLETED, ok("b"))
    assert [r.result.text for r in b.results("t1", job_id, False, "", 10)] == ["b"]
