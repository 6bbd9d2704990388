"""A real server's worker keeps its leases, and gives a run up when another replica took its item.

The server is replica "a" on a PostgreSQL store (``--batch-lease-s 3``: renewed every second).
The test plays replica "b" with a store instance whose clock runs 10 s ahead (the skew docs/batch.md
warns about): to b, a's lease has run out, so b requeues the item and claims it. a's next lease round
learns the claim is lost and aborts its run in the engine; only b's result is recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from inference.v1 import batch_pb2_grpc as bpb_grpc

from service.batch.postgres_store import PostgresJobStore
from service.batch.store import ItemResult, ItemState
from tests.model.batch.test_batch import create, final, gen, results
from tests.support.pg import cluster, database_name
from tests.support.server import RunningServer, start_server, wait_batch_store

pytestmark = pytest.mark.model
LEASE_S = 3.0


def until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


@pytest.fixture()
def replica_a(tmp_path: Path) -> Iterator[tuple[RunningServer, str]]:
    name = database_name(str(tmp_path))
    dsn = cluster().create_database(name)
    srv = start_server(batch_db=cluster().url(name), replica_id="a", batch_lease_s=LEASE_S, batch_max_running=1)
    try:
        wait_batch_store(srv)
        yield srv, dsn
    finally:
        srv.close()


@pytest.mark.timeout(180)
def test_a_run_whose_lease_another_replica_took_is_aborted_and_only_the_new_result_is_kept(
    replica_a: tuple[RunningServer, str],
) -> None:
    srv, dsn = replica_a
    with grpc.insecure_channel(srv.target) as ch, psycopg.connect(dsn, autocommit=True) as db:
        stub = bpb_grpc.BatchServiceStub(ch)
        job = create(stub, [gen("long", "Tell a long story:", max_tokens=3000, ignore_eos=True)])
        running = "SELECT owner, attempts FROM batch_items WHERE state = 'running'"
        until(lambda: db.execute(running).fetchall() == [("a", 1)], 60, "a runs the item")
        until(lambda: srv.engine.scheduler.has_work(), 30, "the run is in a's engine")
        b = PostgresJobStore(dsn, "b", clock=lambda: time.time() + 10, lease_s=LEASE_S)
        try:
            assert b.reclaim_expired() == 1  # to b's clock a's lease ran out
            (claim,) = b.claim(1)
            assert claim.attempt == 2
            keeper = srv.server.batch.worker.leases
            until(lambda: keeper.lost == 1, 60, "a's lease round finds the claim lost")
            until(lambda: not srv.engine.scheduler.has_work(), 30, "a aborted its run")
            assert b.finish(claim, ItemState.COMPLETED, ItemResult(text="from b", finish_reason="stop"))
        finally:
            b.close()
        assert final(stub, job.id).counts.completed == 1
        (only,) = results(stub, job.id)
        assert (only.custom_id, only.text, only.attempts) == ("long", "from b", 2)
        assert db.execute("SELECT count(*) FROM batch_results").fetchone() == (1,)
