"""Uploaded files of the HTTP batch API (``POST /v1/files``, purpose ``batch``).

``FileStore`` is what the routes need (``service.http.batches``); two stores
implement it and pass the same contract tests
(tests/unit/http/test_file_store_contract.py):

* ``SqliteFileStore`` (here): one server's files, in SQLite beside a SQLite
  ``--batch-db`` (``":memory:"`` keeps them for the process's life only);
* ``PgFileStore`` (``service.http.files_pg``): the files in the PostgreSQL
  database of a shared ``--batch-db``, so a file uploaded through one replica
  is seen by every other.

Contract: a file belongs to the tenant that uploaded it (another tenant's id
is absent: None, and deleting it is False, and a listing holds only the
caller's files); ``put`` has committed when it returns; files older than
``retention_s`` are deleted (checked at each upload), and a record's
``expires_at`` says when a file becomes due. ``list`` pages through a tenant's
files newest first (or oldest first), optionally of one purpose, after a file
of that tenant (a cursor that is not one: ``LookupError``).
A store that cannot be reached now raises ``FilesUnavailable`` (an
``Unavailable``: the HTTP API answers 503 with Retry-After), never another
error. Every call runs on the store's own threads, so the event loop never
waits on the disk or the database.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from service.request.errors import Unavailable

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at REAL NOT NULL, data BLOB NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS files_tenant ON files (tenant, created_at)",
)
COLUMNS = "id, filename, purpose, bytes, created_at"  # a FileRecord's, in its order


@dataclass(frozen=True)
class FileRecord:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: float
    expires_at: float | None = None  # when the retention deletes it (at the next upload from then on)

    def to_json(self) -> dict[str, Any]:
        expires = int(self.expires_at) if self.expires_at is not None else None
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": int(self.created_at),
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "expires_at": expires}


@dataclass(frozen=True)
class Page:
    """What ``FileStore.list`` is asked for: ``limit`` files after the file ``after`` ("" : from the start),
    newest first unless ``ascending``, of ``purpose`` only when set."""

    limit: int
    after: str = ""
    purpose: str | None = None
    ascending: bool = False


def new_record(filename: str, purpose: str, data: bytes, now: float, retention_s: float) -> FileRecord:
    """The record of a file being uploaded now (a fresh id)."""
    return FileRecord("file-" + uuid.uuid4().hex, filename, purpose, len(data), now, now + retention_s)


def record_of(row: Any, retention_s: float) -> FileRecord:
    """A record from a row of ``COLUMNS``."""
    created = float(row[4])
    return FileRecord(row[0], row[1], row[2], int(row[3]), created, created + retention_s)


def page_query(page: Page, cursor: float | None, placeholder: str) -> tuple[str, list[Any]]:
    """The WHERE/ORDER/LIMIT tail of a listing (after ``WHERE tenant = ?``) and its arguments: the order is
    (created_at, id), so files uploaded in the same instant page in a stable order. ``placeholder``: "?"
    (SQLite) or "%s" (psycopg)."""
    p = placeholder
    sql, args = "", list[Any]()
    if page.purpose is not None:
        sql, args = f" AND purpose = {p}", [page.purpose]
    if cursor is not None:
        op = ">" if page.ascending else "<"
        sql += f" AND (created_at {op} {p} OR (created_at = {p} AND id {op} {p}))"
        args += [cursor, cursor, page.after]
    way = "ASC" if page.ascending else "DESC"
    return sql + f" ORDER BY created_at {way}, id {way} LIMIT {p}", [*args, page.limit + 1]


def paged(records: list[FileRecord], limit: int) -> tuple[list[FileRecord], bool]:
    """(the page, whether more follow) from up to ``limit + 1`` records."""
    return records[:limit], len(records) > limit


class FilesUnavailable(Unavailable):
    """The file store cannot be reached now (database down, no pooled connection in time): retry later."""

    public_message = "the file store is unavailable; retry later"


class FileStore(Protocol):
    """The uploaded files of every tenant (see the module docstring)."""

    async def put(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord: ...
    async def get(self, tenant: str, file_id: str) -> FileRecord | None: ...
    async def content(self, tenant: str, file_id: str) -> bytes | None: ...
    async def delete(self, tenant: str, file_id: str) -> bool: ...
    async def list(self, tenant: str, page: Page) -> tuple[list[FileRecord], bool]:
        """A page of the tenant's files and whether more follow; ``LookupError`` if ``page.after`` is not
        one of the tenant's files."""
        ...

    def close(self) -> None: ...


class SqliteFileStore:
    """``FileStore`` in one SQLite file (or ``":memory:"``), on one dedicated thread."""

    def __init__(self, path: str, retention_s: float, clock: Callable[[], float] = time.time) -> None:
        try:
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            for sql in SCHEMA:
                self._db.execute(sql)
        except sqlite3.Error as exc:  # NOTE: an OSError, so the start-up reports it in one line
            raise OSError(f"HTTP batch files store {path}: {exc}") from exc
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="http-files")
        self.retention_s = retention_s
        self.clock = clock

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _put(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        record = new_record(filename, purpose, data, self.clock(), self.retention_s)
        with self._lock:
            self._db.execute("DELETE FROM files WHERE created_at < ?", (record.created_at - self.retention_s,))
            self._db.execute(
                "INSERT INTO files VALUES (?,?,?,?,?,?,?)",
                (record.id, tenant, filename, purpose, record.bytes, record.created_at, data),
            )
        return record

    def _get(self, tenant: str, file_id: str) -> FileRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {COLUMNS} FROM files WHERE id=? AND tenant=?", (file_id, tenant)).fetchone()
        return record_of(row, self.retention_s) if row else None

    def _list(self, tenant: str, page: Page) -> tuple[list[FileRecord], bool]:
        with self._lock:
            cursor = None
            if page.after:
                row = self._db.execute("SELECT created_at FROM files WHERE id=? AND tenant=?",
                                       (page.after, tenant)).fetchone()
                if row is None:
                    raise LookupError(page.after)
                cursor = float(row[0])
            tail, args = page_query(page, cursor, "?")
            rows = self._db.execute(f"SELECT {COLUMNS} FROM files WHERE tenant=?{tail}", (tenant, *args)).fetchall()
        return paged([record_of(r, self.retention_s) for r in rows], page.limit)

    def _content(self, tenant: str, file_id: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT data FROM files WHERE id=? AND tenant=?", (file_id, tenant)).fetchone()
        return bytes(row[0]) if row else None

    def _delete(self, tenant: str, file_id: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM files WHERE id=? AND tenant=?", (file_id, tenant)).rowcount > 0

    async def put(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        record: FileRecord = await self._call(self._put, tenant, filename, purpose, data)
        return record

    async def get(self, tenant: str, file_id: str) -> FileRecord | None:
        record: FileRecord | None = await self._call(self._get, tenant, file_id)
        return record

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        data: bytes | None = await self._call(self._content, tenant, file_id)
        return data

    async def delete(self, tenant: str, file_id: str) -> bool:
        deleted: bool = await self._call(self._delete, tenant, file_id)
        return deleted

    async def list(self, tenant: str, page: Page) -> tuple[list[FileRecord], bool]:
        listed: tuple[list[FileRecord], bool] = await self._call(self._list, tenant, page)
        return listed

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._db.close()
