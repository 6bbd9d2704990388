"""ChangeFeed: another replica's committed changes wake waiters on this replica's event loop.

Two ``PostgresJobStore`` instances on one database stand in for two replicas; replica a's feed is
attached to a's store and read on an event loop, replica b makes the changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.batch.feed import ChangeFeed
from service.batch.postgres_store import PostgresJobStore
from service.batch.store import ItemResult, ItemState, JobSpec, NewItem
from tests.support.pg import fresh_database

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def two(tmp_path: Path) -> Iterator[tuple[PostgresJobStore, PostgresJobStore]]:
    dsn = fresh_database(str(tmp_path))
    a, b = PostgresJobStore(dsn, "a"), PostgresJobStore(dsn, "b")
    yield a, b
    a.close()
    b.close()


async def test_a_watcher_wakes_on_another_replicas_progress_and_workers_on_new_work(
    two: tuple[PostgresJobStore, PostgresJobStore],
) -> None:
    a, b = two
    loop, feed, work = asyncio.get_running_loop(), ChangeFeed(), asyncio.Event()
    feed.on_work = work.set
    await loop.run_in_executor(None, feed.attach, a, loop)
    assert feed.live() and feed.poll_s(0.5) == 5.0  # notifications arrive: re-read every 5 s at the latest
    job, _ = b.create_job(JobSpec("t1"))
    b.add_items(job.id, [NewItem("x", 1, b"x")])
    b.start_job(job.id)  # a job started on b: work for every replica's worker
    await asyncio.wait_for(work.wait(), 10)
    mark = feed.mark()
    (claim,) = b.claim(1)
    assert b.finish(claim, ItemState.COMPLETED, ItemResult(text="done"))
    assert await feed.wait(job.id, mark, timeout=10)  # b's progress reached a's loop
    assert not await feed.wait("batch_other", feed.mark(), timeout=0.2)


async def test_without_a_shared_store_waiters_poll() -> None:
    feed = ChangeFeed()
    assert not feed.live() and feed.poll_s(0.5) == 0.5
    assert not await feed.wait("batch_x", feed.mark(), timeout=0.05)
    feed.changed("batch_x")  # a local change still wakes
    assert await feed.wait("batch_x", 0, timeout=0.05)
