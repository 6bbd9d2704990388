"""FileStore contract tests (no model): every store of the HTTP batch API's uploaded files passes them.

Stores under test: ``SqliteFileStore`` on a file and in memory, ``PgFileStore`` on a
throwaway PostgreSQL (tests/support/pg.py: one database per test; skipped without
PostgreSQL, failed in CI). Times come from a fake clock, so retention is tested
without waiting. The contract: put/get/content/delete per tenant (another tenant's
file is None, deleting it False, a listing holds only the caller's files), retention at
upload (and ``expires_at`` saying when), listings paged newest or oldest first after a
file of the tenant's (filtered by purpose), and, for the stores that can be shared, two
instances on one database (two replicas) see each other's files.

PostgreSQL beyond the contract: the table is created once when replicas start at once
(and a role that may not create it gets ``Unavailable`` until it exists); a database that
is down at start or stops later makes calls raise ``Unavailable`` (the HTTP API's 503),
never another error, and never with the password in it; the store serves again once the
database is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from service.http.files import FileRecord, FileStore, FilesUnavailable, Page, SqliteFileStore
from service.http.files_pg import PROBE_S, PgFileStore
from service.request.errors import Unavailable
from tests.support.clock import FakeClock
from tests.support.threads import in_threads

pytestmark = pytest.mark.timeout(120)
DAY = 24 * 3600.0
KINDS = ("sqlite-file", "sqlite-memory", "postgres")
SHARED = ("sqlite-file", "postgres")  # kinds whose second instance opens the first one's data


@dataclass
class Opener:
    """Opens stores of one kind on this test's data (a file, a database); all closed after the test."""

    kind: str
    location: str
    clock: FakeClock = field(default_factory=FakeClock)
    opened: list[FileStore] = field(default_factory=list)

    def __call__(self, retention_s: float = DAY) -> FileStore:
        store: FileStore
        if self.kind == "postgres":
            store = PgFileStore(self.location, retention_s, self.clock)
        else:
            store = SqliteFileStore(self.location, retention_s, self.clock)
        self.opened.append(store)
        return store


def _location(kind: str, tmp_path: Path) -> str:
    if kind == "postgres":
        # a throwaway PostgreSQL (skipped without one, failed in CI)
        from tests.support.pg import fresh_database

        return fresh_database(str(tmp_path))
    return ":memory:" if kind == "sqlite-memory" else str(tmp_path / "batch-files.db")


def _opener(kind: str, tmp_path: Path) -> Iterator[Opener]:
    opener = Opener(kind, _location(kind, tmp_path))
    yield opener
    for s in opener.opened:
        s.close()


@pytest.fixture(params=KINDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    yield from _opener(request.param, tmp_path)


@pytest.fixture(params=SHARED)
def shared_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    yield from _opener(request.param, tmp_path)


@pytest.fixture()
def store(opener: Opener) -> FileStore:
    return opener()


JSONL = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'


# -- the contract --------------------------------------------------------------------------------
async def test_put_get_content_delete(store: FileStore, opener: Opener) -> None:
    record = await store.put("t1", "in.jsonl", "batch", JSONL)
    assert record.id.startswith("file-") and (record.filename, record.purpose) == ("in.jsonl", "batch")
    assert (record.bytes, record.created_at) == (len(JSONL), opener.clock.now)
    assert await store.get("t1", record.id) == record
    assert record.to_json()["bytes"] == len(JSONL)
    assert await store.content("t1", record.id) == JSONL
    assert await store.delete("t1", record.id) is True
    assert await store.get("t1", record.id) is None
    assert await store.content("t1", record.id) is None
    assert await store.delete("t1", record.id) is False


async def test_unknown_ids_are_absent(store: FileStore) -> None:
    assert await store.get("t1", "file-nope") is None
    assert await store.content("t1", "file-nope") is None
    assert await store.delete("t1", "file-nope") is False


async def test_every_upload_gets_its_own_id_and_keeps_its_bytes_exactly(store: FileStore) -> None:
    blobs = [b"", bytes(range(256)) * 64, JSONL * 1000, "é\u2603\n".encode()]
    records = [await store.put("t1", f"f{n}", "batch", b) for n, b in enumerate(blobs)]
    assert len({r.id for r in records}) == len(blobs)
    for r, b in zip(records, blobs, strict=True):
        assert await store.content("t1", r.id) == b
        got = await store.get("t1", r.id)
        assert got is not None and got.bytes == len(b)


async def test_a_tenant_never_sees_reads_or_deletes_another_tenants_file(store: FileStore) -> None:
    mine = await store.put("t1", "in.jsonl", "batch", JSONL)
    assert await store.get("t2", mine.id) is None
    assert await store.content("t2", mine.id) is None
    assert await store.delete("t2", mine.id) is False
    assert await store.content("t1", mine.id) == JSONL  # still there for its owner


async def test_files_past_the_retention_are_deleted_at_the_next_upload(opener: Opener) -> None:
    store = opener(retention_s=3600)
    old = await store.put("t1", "old", "batch", b"old")
    other_tenant = await store.put("t2", "old2", "batch", b"old2")
    opener.clock.advance(1800)
    young = await store.put("t1", "young", "batch", b"young")
    assert await store.get("t1", old.id) is not None  # not yet past the retention
    opener.clock.advance(1801)
    await store.put("t3", "new", "batch", b"new")  # any tenant's upload cleans every tenant's old files
    assert await store.get("t1", old.id) is None and await store.content("t1", old.id) is None
    assert await store.get("t2", other_tenant.id) is None
    assert await store.content("t1", young.id) == b"young"


async def test_a_record_says_when_the_retention_deletes_it(opener: Opener) -> None:
    store = opener(retention_s=3600)
    record = await store.put("t1", "in.jsonl", "batch", JSONL)
    assert record.expires_at == opener.clock.now + 3600
    assert record.to_json()["expires_at"] == int(opener.clock.now + 3600)
    assert await store.get("t1", record.id) == record


async def ids(store: FileStore, tenant: str, page: Page) -> tuple[list[str], bool]:
    records, more = await store.list(tenant, page)
    return [r.id for r in records], more


async def test_a_listing_pages_through_the_tenants_files_newest_first(store: FileStore, opener: Opener) -> None:
    mine = []
    for n in range(5):
        mine.append(await store.put("t1", f"f{n}", "batch", b"x" * n))
        await store.put("t2", f"other{n}", "batch", b"y")
        opener.clock.advance(1)
    newest = [r.id for r in reversed(mine)]
    assert await ids(store, "t1", Page(limit=2)) == (newest[:2], True)
    assert await ids(store, "t1", Page(limit=2, after=newest[1])) == (newest[2:4], True)
    assert await ids(store, "t1", Page(limit=2, after=newest[3])) == (newest[4:], False)
    assert await ids(store, "t1", Page(limit=5)) == (newest, False)
    assert await ids(store, "t1", Page(limit=10, ascending=True)) == (newest[::-1], False)
    assert await ids(store, "t1", Page(limit=10, after=newest[2], ascending=True)) == (newest[:2][::-1], False)
    records, _ = await store.list("t1", Page(limit=10))
    assert records == [await store.get("t1", i) for i in newest]  # the same records as get


async def test_files_of_one_instant_page_in_a_stable_order(store: FileStore) -> None:
    made = {(await store.put("t1", f"f{n}", "batch", b"x")).id for n in range(7)}  # the clock stands still
    seen, after = [], ""
    while True:
        page, more = await ids(store, "t1", Page(limit=3, after=after))
        seen += page
        if not more:
            break
        after = page[-1]
    assert len(seen) == 7 and set(seen) == made  # each once


async def test_a_listing_holds_only_the_callers_files_and_never_pages_after_anothers(store: FileStore) -> None:
    mine = await store.put("t1", "mine", "batch", JSONL)
    theirs = await store.put("t2", "theirs", "batch", JSONL)
    assert await ids(store, "t1", Page(limit=10)) == ([mine.id], False)
    assert await ids(store, "t2", Page(limit=10)) == ([theirs.id], False)
    assert await ids(store, "t3", Page(limit=10)) == ([], False)
    for after in (theirs.id, "file-nope"):
        with pytest.raises(LookupError):
            await store.list("t1", Page(limit=10, after=after))


async def test_a_listing_filters_by_purpose(store: FileStore) -> None:
    batch = await store.put("t1", "in.jsonl", "batch", JSONL)
    other = await store.put("t1", "notes.txt", "user_data", b"notes")
    assert await ids(store, "t1", Page(limit=10, purpose="batch")) == ([batch.id], False)
    assert await ids(store, "t1", Page(limit=10, purpose="user_data")) == ([other.id], False)
    assert await ids(store, "t1", Page(limit=10, purpose="batch_output")) == ([], False)


async def test_two_instances_on_one_database_see_each_others_files(shared_opener: Opener) -> None:
    a, b = shared_opener(), shared_opener()  # two replicas
    record = await a.put("t1", "in.jsonl", "batch", JSONL)
    assert await b.get("t1", record.id) == record
    assert await ids(b, "t1", Page(limit=10)) == ([record.id], False)
    assert await b.content("t1", record.id) == JSONL
    assert await b.get("t2", record.id) is None
    assert await b.delete("t1", record.id) is True
    assert await a.get("t1", record.id) is None


# -- PostgreSQL beyond the contract --------------------------------------------------------------

def test_replicas_starting_at_once_create_the_table_once(tmp_path: Path) -> None:
    import psycopg

    from tests.support.pg import fresh_database

    dsn = fresh_database(str(tmp_path))
    stores = [PgFileStore(dsn, DAY) for _ in range(6)]
    try:
        # NOTE: the first call of each creates the table (the private sync path: one thread per replica)
        records: list[FileRecord] = in_threads(6, lambda i: stores[i]._put(f"t{i}", "f", "batch", b"x"))
        assert all(stores[0]._content(f"t{i}", r.id) == b"x" for i, r in enumerate(records))
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM http_files").fetchone() == (6,)
    finally:
        for s in stores:
            s.close()


async def test_a_role_that_may_not_create_the_table_gets_unavailable_then_uses_the_table_once_it_exists(
    tmp_path: Path,
) -> None:
    import psycopg

    from tests.support.pg import cluster, database_name, fresh_database

    owner_dsn = fresh_database(str(tmp_path))
    role = database_name(str(tmp_path)).replace("t_", "r_")
    with psycopg.connect(cluster().admin_dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")  # PostgreSQL 15: no CREATE on schema public
    limited = PgFileStore(owner_dsn.replace("user=postgres", f"user={role}"), DAY, wait_s=0.5)
    owner = PgFileStore(owner_dsn, DAY)
    try:
        with pytest.raises(FilesUnavailable):
            await limited.put("t1", "f", "batch", b"x")
        record = await owner.put("t1", "f", "batch", b"x")  # the owner creates the table
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            conn.execute(f"GRANT SELECT, INSERT, DELETE ON http_files TO {role}")
        await asyncio.sleep(PROBE_S)  # the limited store's next probe
        assert await limited.content("t1", record.id) == b"x"
    finally:
        limited.close()
        owner.close()


@pytest.fixture()
def own_cluster() -> Iterator[Any]:
    """A cluster of this test's own (it stops it), not started yet, on a port fixed now."""
    from tests.support.pg import PgCluster, free_port, require

    pg = PgCluster(require(), port=free_port())
    yield pg
    pg.stop()


def _url_with_password(pg: Any) -> str:
    # NOTE: the test cluster trusts every local connection: the password is sent nowhere, only carried
    return f"postgresql://postgres:s3cret-pw@{pg.host}:{pg.port}/postgres"


async def _assert_unavailable(store: FileStore) -> list[str]:
    """Every call raises ``Unavailable`` (nothing else); their messages."""
    messages = []
    for call in (lambda: store.put("t1", "f", "batch", b"x"), lambda: store.get("t1", "file-x"),
                 lambda: store.content("t1", "file-x"), lambda: store.delete("t1", "file-x"),
                 lambda: store.list("t1", Page(limit=10))):
        with pytest.raises(Unavailable) as err:
            await call()
        assert isinstance(err.value, FilesUnavailable)
        messages += [str(err.value), err.value.public_message]
    return messages


async def test_a_database_down_at_start_is_unavailable_until_it_comes(
    own_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = PgFileStore(_url_with_password(own_cluster), DAY, wait_s=0.5)  # nothing connects yet
    try:
        messages = await _assert_unavailable(store)
        own_cluster.start()
        await _wait_up(store, PROBE_S)
        record = await store.put("t1", "in.jsonl", "batch", JSONL)
        assert await store.content("t1", record.id) == JSONL
    finally:
        store.close()
    assert not any("s3cret-pw" in m for m in messages)
    assert "s3cret-pw" not in caplog.text


async def test_a_database_that_stops_makes_calls_unavailable_and_they_work_again_when_it_is_back(
    own_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    own_cluster.start()
    store = PgFileStore(_url_with_password(own_cluster), DAY, wait_s=0.5)
    try:
        record = await store.put("t1", "in.jsonl", "batch", JSONL)
        messages: list[str] = []

        def while_down() -> None:
            messages.extend(asyncio.run_coroutine_threadsafe(_assert_unavailable(store), loop).result(60))

        loop = asyncio.get_running_loop()
        await asyncio.to_thread(own_cluster.restart, while_down)
        await _wait_up(store, PROBE_S)
        assert await store.content("t1", record.id) == JSONL  # committed before the outage: kept
    finally:
        store.close()
    assert messages and not any("s3cret-pw" in m for m in messages)
    assert "s3cret-pw" not in caplog.text
    assert "file store unavailable" in caplog.text and "reachable again" in caplog.text


async def _wait_up(store: FileStore, probe_s: float, timeout: float = 60.0) -> None:
    """Until a call succeeds (the store retries once per ``probe_s`` while down)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await store.get("t1", "file-x")
            return
        except Unavailable:
            assert time.monotonic() < deadline, "the file store did not come back"
            await asyncio.sleep(probe_s / 2)
