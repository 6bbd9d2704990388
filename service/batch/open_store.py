"""``--batch-db`` value -> the batch store it names.

* a path (``data/batch.db``), ``:memory:``, or ``sqlite:///relative/path``,
  ``sqlite:////absolute/path``, ``sqlite://`` (in memory) -> ``SqliteJobStore``;
* ``postgresql://...`` or ``postgres://...`` (a libpq URL, passed on unchanged)
  -> ``PostgresJobStore``, shared by every replica;
* any other ``scheme://`` -> ValueError naming the accepted schemes (it used to
  open a SQLite file named after the URL).

NOTE: the ``sqlite:`` forms follow SQLAlchemy's (three slashes then a relative
path, four for an absolute one), which is what users of database URLs expect.

``parse_batch_db`` is pure (no I/O), so the configuration can reject a bad
value before anything starts; ``open_store`` then opens it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from service.batch.store import JobStore

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_PASSWORD_PARAM = re.compile(r"((?:^|&)password=)[^&]*")


@dataclass(frozen=True)
class StoreTarget:
    """Which store ``--batch-db`` names: ``kind`` "sqlite" (``location`` a path or ":memory:") or
    "postgres" (``location`` the URL as given)."""

    kind: str
    location: str

    def __str__(self) -> str:
        """For logs: a PostgreSQL URL without its password."""
        return redact(self.location) if self.kind == "postgres" else self.location


def parse_batch_db(value: str) -> StoreTarget:
    """The store that ``value`` names; ValueError for an empty value or an unknown ``scheme://``."""
    if not value:
        raise ValueError("--batch-db is empty")
    m = _SCHEME.match(value)
    if m is None:  # a plain path (":memory:" and "C:\\..." included: no "://")
        return StoreTarget("sqlite", value)
    scheme = m.group(1).lower()
    if scheme in ("postgresql", "postgres"):
        return StoreTarget("postgres", value)
    if scheme == "sqlite":
        path = value[m.end():]
        if path in ("", "/:memory:", ":memory:"):
            return StoreTarget("sqlite", ":memory:")
        if not path.startswith("/") or path == "/":
            raise ValueError("--batch-db sqlite URL: use sqlite:///relative/path or sqlite:////absolute/path")
        return StoreTarget("sqlite", path[1:])
    raise ValueError(
        f"--batch-db: unknown scheme {scheme!r}; accepted: a file path, sqlite:///path, "
        "postgresql://user@host:port/db (or postgres://)"
    )


def redact(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` parameter) replaced by ``***``."""
    if _SCHEME.match(url) is None:
        return url  # a path
    parts = urlsplit(url)
    query = _PASSWORD_PARAM.sub(r"\1***", parts.query)
    if parts.password is not None:
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host  # an IPv6 address
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts._replace(query=query))


def open_store(
    value: str,
    *,
    retention_s: float,
    replica_id: str,
    clock: Callable[[], float] = time.time,
    lease_s: float | None = None,
) -> JobStore:
    """Open the store ``value`` names (``parse_batch_db``); ``replica_id`` and ``lease_s`` matter only
    for the shared (PostgreSQL) store."""
    target = parse_batch_db(value)
    if target.kind == "sqlite":
        from service.batch.sqlite_store import SqliteJobStore

        return SqliteJobStore(target.location, retention_s=retention_s, clock=clock)
    from service.batch.postgres_store import DEFAULT_LEASE_S, PostgresJobStore  # psycopg only when used

    return PostgresJobStore(target.location, replica_id, retention_s=retention_s, clock=clock,
                            lease_s=DEFAULT_LEASE_S if lease_s is None else lease_s)
