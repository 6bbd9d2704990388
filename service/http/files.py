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
is absent: None, and deleting it is False); ``put`` has committed when it
returns; files older than ``retention_s`` are deleted (checked at each upload).
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

SCHEMA = """CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at REAL NOT NULL, data BLOB NOT NULL)"""


@dataclass(frozen=True)
class FileRecord:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": int(self.created_at),
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "expires_at": None}


def new_record(filename: str, purpose: str, data: bytes, now: float) -> FileRecord:
    """The record of a file being uploaded now (a fresh id)."""
    return FileRecord("file-" + uuid.uuid4().hex, filename, purpose, len(data), now)


class FilesUnavailable(Unavailable):
    """The file store cannot be reached now (database down, no pooled connection in time): retry later."""

    public_message = "the file store is unavailable; retry later"


class FileStore(Protocol):
    """The uploaded files of every tenant (see the module docstring)."""

    async def put(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord: ...
    async def get(self, tenant: str, file_id: str) -> FileRecord | None: ...
    async def content(self, tenant: str, file_id: str) -> bytes | None: ...
    async def delete(self, tenant: str, file_id: str) -> bool: ...
    def close(self) -> None: ...


class SqliteFileStore:
    """``FileStore`` in one SQLite file (or ``":memory:"``), on one dedicated thread."""

    def __init__(self, path: str, retention_s: float, clock: Callable[[], float] = time.time) -> None:
        try:
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute(SCHEMA)
        except sqlite3.Error as exc:  # NOTE: an OSError, so the start-up reports it in one line
            raise OSError(f"HTTP batch files store {path}: {exc}") from exc
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="http-files")
        self.retention_s = retention_s
        self.clock = clock

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _put(self, tenant: str, filename: str, purpose: str, data: bytes) -> FileRecord:
        record = new_record(filename, purpose, data, self.clock())
        with self._lock:
            self._db.execute("DELETE FROM files WHERE created_at < ?", (record.created_at - self.retention_s,))
            self._db.execute(
                "INSERT INTO files VALUES (?,?,?,?,?,?,?)",
                (record.id, tenant, filename, purpose, record.bytes, record.created_at, data),
            )
        return record

    def _get(self, tenant: str, file_id: str) -> FileRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, filename, purpose, bytes, created_at FROM files WHERE id=? AND tenant=?", (file_id, tenant)
            ).fetchone()
        return FileRecord(*row) if row else None

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

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._db.close()
