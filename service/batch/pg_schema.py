"""The PostgreSQL batch store's schema: versioned migrations applied at start-up.

``migrate(conn)`` brings the database to ``LATEST``. Every replica calls it when
it opens the store; the migrations run in one transaction under a transaction-level
advisory lock, so replicas starting at once apply each version exactly once
(the others wait, then find it applied). A migration is never edited once
released: a change is a new version appended to ``MIGRATIONS``.

NOTE: migrations must stay backward compatible (add columns, tables, indexes;
never drop or rename in the same release), because during a rolling upgrade
older replicas keep running on the newer schema. A replica that finds a newer
schema than it knows logs a warning and goes on.

Tables (prefixed ``batch_`` so the store can share a database with others):

* ``batch_jobs``: one row per job; ``owner``/``lease_until`` mark an upload in
  progress (VALIDATING) on a live replica;
* ``batch_items``: the queue, one row per (job, custom_id); ``owner`` and
  ``lease_until`` are the lease of a RUNNING item;
* ``batch_results``: one row per finished item, primary key (job, custom_id):
  the database itself refuses a second result for a custom_id (version 2: the
  ``reasoning`` and ``reasoning_tokens`` of a reasoning model's thought);
* ``batch_job_errors``: upload problems.

Times are wall-clock seconds (double precision) from the store's clock.
"""

from __future__ import annotations

from typing import Any

from service.batch.schema_versions import Migrations, apply

# NOTE: one fixed key for "the batch schema" (pg_advisory_xact_lock takes a bigint); per database.
MIGRATION_LOCK_KEY = 0x62617463685F6D67  # b"batch_mg"

V1 = (
    """CREATE TABLE batch_jobs (
        id text PRIMARY KEY, tenant text NOT NULL, display_name text NOT NULL, metadata jsonb NOT NULL,
        window_s bigint NOT NULL, priority integer NOT NULL, idem_key text NOT NULL, state text NOT NULL,
        times jsonb NOT NULL, created_at double precision NOT NULL, expires_at double precision NOT NULL,
        ended_at double precision, failure text NOT NULL DEFAULT '', done_seq bigint NOT NULL DEFAULT 0,
        trace text NOT NULL DEFAULT '', owner text, lease_until double precision)""",
    "CREATE UNIQUE INDEX batch_jobs_idem ON batch_jobs (tenant, idem_key) WHERE idem_key <> ''",
    "CREATE INDEX batch_jobs_tenant ON batch_jobs (tenant, created_at, id)",
    "CREATE INDEX batch_jobs_state ON batch_jobs (state, priority, created_at)",
    """CREATE TABLE batch_items (
        job_id text NOT NULL REFERENCES batch_jobs (id) ON DELETE CASCADE, custom_id text COLLATE "C" NOT NULL,
        line integer NOT NULL, request bytea NOT NULL, sort_key bytea NOT NULL, state text NOT NULL,
        attempts integer NOT NULL DEFAULT 0, owner text, lease_until double precision,
        PRIMARY KEY (job_id, custom_id))""",
    "CREATE INDEX batch_items_queue ON batch_items (job_id, sort_key, line) WHERE state = 'queued'",
    "CREATE INDEX batch_items_state ON batch_items (job_id, state)",
    "CREATE INDEX batch_items_leases ON batch_items (lease_until) WHERE state = 'running'",
    """CREATE TABLE batch_results (
        job_id text NOT NULL REFERENCES batch_jobs (id) ON DELETE CASCADE, custom_id text COLLATE "C" NOT NULL,
        done_seq bigint NOT NULL, state text NOT NULL, attempts integer NOT NULL, replica text,
        text text NOT NULL DEFAULT '', finish_reason text NOT NULL DEFAULT '',
        prompt_tokens integer NOT NULL DEFAULT 0, completion_tokens integer NOT NULL DEFAULT 0,
        cached_tokens integer NOT NULL DEFAULT 0, queue_ms double precision NOT NULL DEFAULT 0,
        ttft_ms double precision NOT NULL DEFAULT 0, total_ms double precision NOT NULL DEFAULT 0,
        error_status text NOT NULL DEFAULT '', error_message text NOT NULL DEFAULT '',
        PRIMARY KEY (job_id, custom_id), UNIQUE (job_id, done_seq))""",
    """CREATE TABLE batch_job_errors (
        job_id text NOT NULL REFERENCES batch_jobs (id) ON DELETE CASCADE, line integer NOT NULL,
        custom_id text NOT NULL, status text NOT NULL, message text NOT NULL)""",
    "CREATE INDEX batch_job_errors_job ON batch_job_errors (job_id, line)",
)

# A reasoning model's thought kept apart from the answer (``text``); results stored before read back with none.
V2 = (
    "ALTER TABLE batch_results ADD COLUMN reasoning text",  # NOTE: NULL: not read for a thought (older results)
    "ALTER TABLE batch_results ADD COLUMN reasoning_tokens integer NOT NULL DEFAULT 0",
)

# (version, statements): append only.
MIGRATIONS: Migrations = ((1, V1), (2, V2))
LATEST = MIGRATIONS[-1][0]


def migrate(conn: Any) -> int:
    """Apply the missing migrations (one transaction, under the advisory lock); the schema version after.

    ``conn`` is a psycopg connection outside any transaction.
    """
    with conn.transaction():
        # NOTE: the lock comes first, even before CREATE TABLE IF NOT EXISTS: two concurrent
        # CREATE ... IF NOT EXISTS of one table can both pass the check and one then fails.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS batch_schema_version ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        (current,) = conn.execute("SELECT coalesce(max(version), 0) FROM batch_schema_version").fetchone()
        current = apply(MIGRATIONS, int(current), conn.execute,
                        lambda version: conn.execute("INSERT INTO batch_schema_version (version) VALUES (%s)",
                                                     (version,)))
    return current


def schema_version(conn: Any) -> int:
    """The applied version (0 before the first migration)."""
    row = conn.execute("SELECT to_regclass('batch_schema_version') IS NOT NULL").fetchone()
    if not row[0]:
        return 0
    (version,) = conn.execute("SELECT coalesce(max(version), 0) FROM batch_schema_version").fetchone()
    return int(version)
