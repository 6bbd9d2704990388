"""The SQLite batch store's schema: the first version's tables, then versioned migrations applied at open.

``migrate(db)`` brings a database to ``LATEST``: the tables of version 1
(``CREATE ... IF NOT EXISTS``: a new file, or one of any earlier version), then
every migration past the file's ``PRAGMA user_version`` (0 for a file written
before versions were kept, which holds version 1's tables), in one
``BEGIN IMMEDIATE`` transaction. A migration is never edited once released: a
change is a new version appended to ``MIGRATIONS``, as for PostgreSQL
(``service.batch.pg_schema``).

Tables: ``jobs``; ``items``, one row per (job, custom_id) holding its result
(version 2: ``reasoning`` and ``reasoning_tokens``, a reasoning model's thought
apart from ``text``; results stored before read back with none, NULL); ``job_errors``.
"""

from __future__ import annotations

import sqlite3

from service.batch.schema_versions import Migrations, apply

V1 = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, display_name TEXT NOT NULL, metadata TEXT NOT NULL,
    window_s INTEGER NOT NULL, priority INTEGER NOT NULL, idem_key TEXT NOT NULL, state TEXT NOT NULL,
    times TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL, ended_at REAL,
    failure TEXT NOT NULL DEFAULT '', done_seq INTEGER NOT NULL DEFAULT 0, trace TEXT NOT NULL DEFAULT '');
CREATE UNIQUE INDEX IF NOT EXISTS jobs_idem ON jobs(tenant, idem_key) WHERE idem_key != '';
CREATE INDEX IF NOT EXISTS jobs_tenant ON jobs(tenant, created_at, id);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, priority, created_at);
CREATE TABLE IF NOT EXISTS items (
    job_id TEXT NOT NULL, custom_id TEXT NOT NULL, line INTEGER NOT NULL, request BLOB NOT NULL,
    sort_key BLOB NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, done_seq INTEGER,
    text TEXT NOT NULL DEFAULT '', finish_reason TEXT NOT NULL DEFAULT '',
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, queue_ms REAL NOT NULL DEFAULT 0,
    ttft_ms REAL NOT NULL DEFAULT 0, total_ms REAL NOT NULL DEFAULT 0,
    error_status TEXT NOT NULL DEFAULT '', error_message TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (job_id, custom_id));
CREATE INDEX IF NOT EXISTS items_queue ON items(job_id, state, sort_key, line);
CREATE INDEX IF NOT EXISTS items_done ON items(job_id, done_seq);
CREATE TABLE IF NOT EXISTS job_errors (
    job_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, status TEXT NOT NULL,
    message TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS job_errors_job ON job_errors(job_id, line);
"""

# (version, statements) past version 1: append only.
MIGRATIONS: Migrations = (
    (2, ("ALTER TABLE items ADD COLUMN reasoning TEXT",  # NOTE: NULL: not read for a thought (older results)
         "ALTER TABLE items ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0")),
)
LATEST = MIGRATIONS[-1][0]


def migrate(db: sqlite3.Connection) -> int:
    """Create version 1's tables where missing, then apply the missing migrations (one transaction); the
    schema version after. ``db`` is in autocommit mode (``isolation_level=None``)."""
    db.executescript(V1)
    db.execute("BEGIN IMMEDIATE")
    try:
        (current,) = db.execute("PRAGMA user_version").fetchone()
        current = max(apply(MIGRATIONS, int(current), db.execute), 1)  # 0: a file of version 1
        db.execute(f"PRAGMA user_version={current}")  # NOTE: a PRAGMA takes no parameter (an int here)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return current
