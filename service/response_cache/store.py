"""Where answers are kept: a small interface, an in-memory LRU bounded in bytes, SQLite persistence.

Contract of every ``ResponseStore`` (``tests/unit/response_cache/test_response_cache_unit.py`` runs
the same contract tests against each implementation):

* ``get`` returns what ``put`` stored under the key until its TTL passes, then
  None (the entry is dropped and counted as an expiration);
* the bytes held never exceed ``capacity_bytes``: ``put`` evicts least recently
  used entries (counted) and refuses an entry larger than the whole bound;
* ``get`` makes an entry the most recently used.

Times come from an injectable ``clock`` (wall-clock seconds by default, so an
expiry survives a restart of a persistent store). Single-threaded: the service
calls it from the event loop only.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger("service.response_cache")
ENTRY_OVERHEAD_BYTES = 160  # dict slot, key string, tuple and float objects (measured order of magnitude)


@dataclass(frozen=True)
class Entry:
    """One stored answer (never the prompt: the key is a hash)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> Entry:
        d = json.loads(blob)
        return cls(
            d["text"], tuple(d["token_ids"]), d["finish_reason"], d["prompt_tokens"], d["completion_tokens"]
        )


@dataclass
class StoreStats:
    entries: int = 0
    bytes: int = 0
    capacity_bytes: int = 0
    evictions: int = 0
    expirations: int = 0


class ResponseStore(Protocol):
    """The interface the cache uses (see the module docstring for the contract)."""

    def get(self, key: str) -> Entry | None: ...

    def put(self, key: str, entry: Entry, ttl_s: float) -> bool: ...

    def stats(self) -> StoreStats: ...

    def close(self) -> None: ...


class MemoryStore:
    """LRU over an OrderedDict, bounded by the entries' byte size."""

    def __init__(
        self,
        capacity_bytes: int,
        clock: Callable[[], float] = time.time,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        self.capacity = capacity_bytes
        self.clock = clock
        self.on_drop = on_drop  # a dropped key (evicted or expired), for a persistent layer
        self._items: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0
        self._stats = StoreStats(capacity_bytes=capacity_bytes)

    @staticmethod
    def size_of(key: str, blob: bytes) -> int:
        return len(key) + len(blob) + ENTRY_OVERHEAD_BYTES

    def get(self, key: str) -> Entry | None:
        item = self._items.get(key)
        if item is None:
            return None
        blob, expires = item
        if self.clock() >= expires:
            self._drop(key)
            self._stats.expirations += 1
            return None
        self._items.move_to_end(key)
        return Entry.from_bytes(blob)

    def put(self, key: str, entry: Entry, ttl_s: float) -> bool:
        return self.put_blob(key, entry.to_bytes(), self.clock() + ttl_s)

    def put_blob(self, key: str, blob: bytes, expires: float) -> bool:
        """Store raw bytes with an absolute expiry; False if larger than the whole bound."""
        size = self.size_of(key, blob)
        if size > self.capacity or ttl_passed(expires, self.clock()):
            return False
        if key in self._items:
            self._drop(key, notify=False)
        while self._bytes + size > self.capacity and self._items:
            self._drop(next(iter(self._items)))
            self._stats.evictions += 1
        self._items[key] = (blob, expires)
        self._bytes += size
        return True

    def _drop(self, key: str, notify: bool = True) -> None:
        blob, _ = self._items.pop(key)
        self._bytes -= self.size_of(key, blob)
        if notify and self.on_drop is not None:
            self.on_drop(key)

    def keys(self) -> list[str]:
        """Least recently used first."""
        return list(self._items)

    def stats(self) -> StoreStats:
        s = self._stats
        return StoreStats(len(self._items), self._bytes, self.capacity, s.evictions, s.expirations)

    def close(self) -> None:
        self._items.clear()
        self._bytes = 0


def ttl_passed(expires: float, now: float) -> bool:
    return now >= expires


class SqliteStore:
    """A MemoryStore whose entries are also written to a SQLite file, reloaded on open.

    NOTE: memory stays the source of truth for reads (a hit never touches the
    disk); the file holds exactly the entries memory holds (an eviction or
    expiration deletes the row), so it is bounded by the same byte bound.
    """

    def __init__(self, path: str | Path, capacity_bytes: int, clock: Callable[[], float] = time.time) -> None:
        try:
            self.db = self._open(path)
        except sqlite3.DatabaseError as exc:  # not a database (or damaged): a cache may start empty
            if isinstance(exc, sqlite3.OperationalError) or not Path(path).is_file():
                raise  # cannot open the path at all (a directory, no permission): a configuration error
            aside = Path(f"{path}.corrupt-{int(time.time())}")
            log.warning("response cache file %s is unreadable (%s): moved to %s, starting empty", path, exc, aside)
            Path(path).rename(aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            self.db = self._open(path)
        self.mem = MemoryStore(capacity_bytes, clock, on_drop=self._delete)
        self._load()

    @staticmethod
    def _open(path: str | Path) -> sqlite3.Connection:
        db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, blob BLOB NOT NULL, "
                "expires REAL NOT NULL, stored REAL NOT NULL)"
            )
            db.execute("SELECT key, blob, expires, stored FROM entries LIMIT 1").fetchall()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _load(self) -> None:
        """Read the file's live entries into memory, oldest first (the newest end up most recently
        used); a store reopened with a smaller bound keeps the newest that fit (the evicted rows are
        deleted), and a row that does not decode is deleted instead of failing a later hit."""
        now = self.mem.clock()
        self.db.execute("DELETE FROM entries WHERE expires <= ?", (now,))
        rows = self.db.execute("SELECT key, blob, expires FROM entries ORDER BY stored").fetchall()
        bad = 0
        for key, blob, expires in rows:
            try:
                Entry.from_bytes(bytes(blob))
            except (ValueError, KeyError, TypeError):
                self._delete(key)
                bad += 1
                continue
            if not self.mem.put_blob(key, bytes(blob), expires):
                self._delete(key)  # larger than the whole (new) bound
        if bad:
            log.warning("response cache: %d unreadable entries dropped from the file", bad)

    def _delete(self, key: str) -> None:
        self.db.execute("DELETE FROM entries WHERE key = ?", (key,))

    def get(self, key: str) -> Entry | None:
        return self.mem.get(key)

    def put(self, key: str, entry: Entry, ttl_s: float) -> bool:
        blob, now = entry.to_bytes(), self.mem.clock()
        if not self.mem.put_blob(key, blob, now + ttl_s):
            return False
        self.db.execute(
            "INSERT OR REPLACE INTO entries (key, blob, expires, stored) VALUES (?, ?, ?, ?)",
            (key, blob, now + ttl_s, now),
        )
        return True

    def stats(self) -> StoreStats:
        return self.mem.stats()

    def close(self) -> None:
        self.db.close()
        self.mem.close()
