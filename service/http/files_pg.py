"""``FileStore`` on PostgreSQL: the uploaded files in the database of a shared ``--batch-db``.

With ``--batch-db postgresql://...`` every replica keeps the batch API's
uploaded files in that database (table ``http_files``), so a file uploaded
through one replica is there for ``POST /v1/batches`` or ``GET /v1/files/{id}``
on any other. The contract is ``service.http.files``'s (tenant-scoped, committed
on return, retention checked at each upload); the differences:

* **Lazy, never fatal.** Nothing connects when the store is built: the pool
  opens at the first call, and psycopg_pool keeps (re)connecting in the
  background. A database that is down at start, or lost later, makes calls
  raise ``FilesUnavailable`` (the HTTP API answers 503 with Retry-After); the
  server starts and serves everything else. While the store is down a call
  fails at once, except one per ``PROBE_S`` that tries the database.
* **Schema.** The first call that reaches the database creates the table if it
  is missing, under a transaction-level advisory lock, so replicas starting at
  once never race on ``CREATE TABLE IF NOT EXISTS`` (two of them can both pass
  the check and one then fails). A table already there is used as it is (the
  role then needs no ``CREATE`` right).
* **Retention.** An upload deletes files older than ``retention_s`` that no
  other transaction holds (``FOR UPDATE SKIP LOCKED``): replicas uploading at
  once never wait for, or deadlock with, each other's clean-up.

NOTE: the DSN (which may hold a password) is never logged nor put in an
error; logs name the database as ``user@host:port/dbname``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from psycopg import Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from service.http.files import (
    COLUMNS,
    FileRecord,
    FilesUnavailable,
    Page,
    new_record,
    page_query,
    paged,
    record_of,
)

log = logging.getLogger("service.http")
T = TypeVar("T")
Conn = Connection[Any]
# psycopg_pool logs every failed connection attempt as a warning; this store reports an outage once
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

TABLE = "http_files"
# NOTE: one fixed key for "the HTTP files schema" (pg_advisory_xact_lock takes a bigint); per database,
# distinct from the batch store's migration lock.
SCHEMA_LOCK_KEY = int.from_bytes(b"httpfile", "big")
SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id text PRIMARY KEY, tenant text NOT NULL, filename text NOT NULL, purpose text NOT NULL,
        bytes bigint NOT NULL, created_at double precision NOT NULL, data bytea NOT NULL)""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_created ON {TABLE} (created_at)",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_tenant ON {TABLE} (tenant, created_at)",
)
# NOTE: as the batch store's: a database that does not answer, or a cut link, is an error within seconds
CONNECT_KWARGS: dict[str, Any] = {
    "connect_timeout": 5, "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
    "keepalives_count": 3, "tcp_user_timeout": 10_000,
}
# psycopg_pool gives up a connection attempt after this long, so the next call starts a fresh one at once
RECONNECT_TIMEOUT_S = 5.0
PROBE_S = 1.0


def describe(dsn: str) -> str:
    """``dsn`` for logs: ``user@host:port/dbname``, never its password."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "(unparsable PostgreSQL DSN)"
    user = f"{info['user']}@" if info.get("user") else ""
    return f"{user}{info.get('host') or 'localhost'}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


class PgFileStore:
    """``FileStore`` in PostgreSQL (see the module docstring); ``dsn`` is a libpq URL or key=value string."""

    def __init__(
        self,
        dsn: str,
        retention_s: float,
        clock: Callable[[], float] = time.time,
        *,
        pool_size: int = 4,
        wait_s: float = 2.0,
    ) -> None:
        """Builds the pool without connecting; ``wait_s``: how long a call waits for a pooled connection."""
        self.retention_s, self.clock = retention_s, clock
        self.where = describe(dsn)
        # NOTE: check_connection on every checkout costs a round trip but hands out no connection that
        # died with a database restart; autocommit, because the one write opens its own transaction.
        self.pool: ConnectionPool[Any] = ConnectionPool(
            dsn, min_size=1, max_size=pool_size, open=False, kwargs={"autocommit": True, **CONNECT_KWARGS},
            check=ConnectionPool.check_connection, name="http-files", timeout=wait_s,
            reconnect_timeout=RECONNECT_TIMEOUT_S,
        )
        self._threads = ThreadPoolExecutor(pool_size, thread_name_prefix="http-files-pg")
        self._lock = threading.Lock()
        self._opened = False  # the pool (opened at the first call)
        self._schema = False  # the table is known to exist
        self._down = False
        self._last_probe = 0.0
        self._last_error = ""

    # -- the store's threads ------------------------------------------------------------------
    @contextlib.contextmanager
    def _connection(self) -> Iterator[Conn]:
        """A pooled connection to a database that has the table; ``FilesUnavailable`` if there is none."""
        with self._lock:
            if not self._opened:
                self.pool.open(wait=False)  # NOTE: never raises for a database that is down
                self._opened = True
        try:
            with self.pool.connection() as conn:
                if not self._schema:
                    self._create_schema(conn)
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:  # lost, refused, pool timeout
            raise FilesUnavailable(f"PostgreSQL file store {self.where}: {str(exc).strip() or type(exc).__name__}") \
                from exc

    def _create_schema(self, conn: Conn) -> None:
        try:
            with conn.transaction():
                if conn.execute("SELECT to_regclass(%s) IS NULL", (TABLE,)).fetchone() == (True,):
                    # NOTE: the lock first: two concurrent CREATE TABLE IF NOT EXISTS can both pass the check
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
                    for sql in SCHEMA:
                        conn.execute(sql)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise
        except psycopg.Error as exc:  # NOTE: e.g. no right to create the table: 503 and logged, never a 500
            raise FilesUnavailable(f"PostgreSQL file store {self.where}: cannot create {TABLE}: {exc}") from exc
        self._schema = True

    def _run(self, body: Callable[[Conn], T]) -> T:
        """``body(conn)`` on a pooled connection; while the store is down, at once ``FilesUnavailable``
        except one call per ``PROBE_S``."""
        with self._lock:
            if self._down:
                now = time.monotonic()
                if now - self._last_probe < PROBE_S:
                    raise FilesUnavailable(self._last_error)
                self._last_probe = now
        try:
            with self._connection() as conn:
                result = body(conn)
        except FilesUnavailable as exc:
            self._mark(False, str(exc))
            raise
        self._mark(True, "")
        return result

    def _mark(self, up: bool, error: str) -> None:
        """Record how a call went; an outage and its end are logged once."""
        with self._lock:
            if not up:
                self._last_error = error
            if up != self._down:  # no change
                return
            self._down = not up
            if not up:
                self._last_probe = time.monotonic()
        if up:
            log.info("HTTP file store %s reachable again", self.where)
        else:
            log.info("HTTP file store unavailable (the files API answers 503; retrying): %s", error)

    @staticmethod
    def _insert(conn: Conn, tenant: str, record: FileRecord, data: bytes, cutoff: float) -> None:
        with conn.transaction():
            conn.execute(
                f"DELETE FROM {TABLE} WHERE id IN "
                f"(SELECT id FROM {TABLE} WHERE created_at < %s FOR UPDATE SKIP LOCKED)", (cutoff,)
            )
            conn.execute(
                f"INSERT INTO {TABLE} (id, tenant, filename, purpose, bytes, created_at, data) "
                "VALUES (%s, %s, %s, %s, %s, %s, %b)",
                (record.id, tenant, record.filename, record.purpose, record.bytes, record.created_at, data),
            )

    def _put(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        record = new_record(filename, purpose, data, self.clock(), self.retention_s)
        self._run(lambda conn: self._insert(conn, tenant, record, data, record.created_at - self.retention_s))
        return record

    def _get(self, tenant: str, file_id: str) -> FileRecord | None:
        row = self._run(lambda conn: conn.execute(
            f"SELECT {COLUMNS} FROM {TABLE} WHERE id = %s AND tenant = %s", (file_id, tenant)
        ).fetchone())
        return record_of(row, self.retention_s) if row else None

    def _list(self, tenant: str, page: Page) -> tuple[list[FileRecord], bool]:
        def read(conn: Conn) -> list[Any] | None:
            cursor = None
            if page.after:
                row = conn.execute(f"SELECT created_at FROM {TABLE} WHERE id = %s AND tenant = %s",
                                   (page.after, tenant)).fetchone()
                if row is None:
                    return None
                cursor = float(row[0])
            tail, args = page_query(page, cursor, "%s")
            return conn.execute(f"SELECT {COLUMNS} FROM {TABLE} WHERE tenant = %s{tail}", (tenant, *args)).fetchall()

        rows = self._run(read)
        if rows is None:
            raise LookupError(page.after)
        return paged([record_of(r, self.retention_s) for r in rows], page.limit)

    def _content(self, tenant: str, file_id: str) -> bytes | None:
        row = self._run(lambda conn: conn.execute(
            f"SELECT data FROM {TABLE} WHERE id = %s AND tenant = %s", (file_id, tenant), binary=True
        ).fetchone())
        return bytes(row[0]) if row else None

    def _delete(self, tenant: str, file_id: str) -> bool:
        return self._run(lambda conn: conn.execute(
            f"DELETE FROM {TABLE} WHERE id = %s AND tenant = %s", (file_id, tenant)
        ).rowcount > 0)

    # -- FileStore ----------------------------------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def put(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        return await self._call(self._put, tenant, filename, purpose, data)

    async def get(self, tenant: str, file_id: str) -> FileRecord | None:
        return await self._call(self._get, tenant, file_id)

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        return await self._call(self._content, tenant, file_id)

    async def delete(self, tenant: str, file_id: str) -> bool:
        return await self._call(self._delete, tenant, file_id)

    async def list(self, tenant: str, page: Page) -> tuple[list[FileRecord], bool]:
        return await self._call(self._list, tenant, page)

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        self.pool.close()
