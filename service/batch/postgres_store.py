"""``JobStore`` on PostgreSQL, shared by every replica (``--batch-db postgresql://...``).

psycopg 3 with a small ``psycopg_pool`` connection pool; every method is one
transaction committed before it returns (retried after a deadlock). The schema
is migrated at open (``service.batch.pg_schema``: versioned, under an advisory
lock, so replicas may start at once). Compared with ``SqliteJobStore``
(``service.batch.shared_store`` has the whole list):

* claims are leases (owner replica id + ``lease_until``), taken with
  ``SELECT ... FOR UPDATE SKIP LOCKED`` (``service.batch.pg_leases``);
* a result is one row of ``batch_results`` whose primary key is (job, custom_id);
* the ``idempotency_key`` is unique per tenant in the database (a partial unique
  index); a second create with the key returns the first job, from any replica;
* an upload in progress is VALIDATING, which no claim ever takes; it carries
  the uploading replica's lease, so a replica that dies mid-upload leaves
  nothing runnable and its key free again once the lease ran out;
* every change of a job NOTIFYs ``channel`` with the job id on commit;
  ``wait_for_change`` wakes on it (``service.batch.pg_notify``).
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Callable

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from service.batch.pg_base import CONNECT_KWARGS, Conn, one, unavailable_on_connection_loss
from service.batch.pg_leases import PgLeases
from service.batch.pg_notify import ChangeListener
from service.batch.pg_reads import PgReads
from service.batch.pg_schema import migrate
from service.batch.shared_store import SharedJobStore
from service.batch.store import ItemError, ItemResult, ItemState, Job, JobSpec, JobState, NewItem

DEFAULT_LEASE_S = 60.0
# NOTE: psycopg_pool retries a failed connection with doubling waits (1, 2, 4, ... s) for up to
# reconnect_timeout; after a long outage the next try could come many seconds after the database is
# back. Giving up after 5 s lets the next call start a fresh attempt at once (waits of 1 and 2 s).
RECONNECT_TIMEOUT_S = 5.0
# psycopg_pool logs every failed attempt as a warning; StoreThread reports an outage once, at its start
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
INSERT_ITEMS = """
INSERT INTO batch_items (job_id, custom_id, line, request, sort_key, state)
SELECT %s, u.custom_id, u.line, u.request, u.sort_key, u.state
FROM unnest(%s::text[], %s::int[], %s::bytea[], %s::bytea[], %s::text[]) AS u(custom_id, line, request, sort_key, state)
ON CONFLICT (job_id, custom_id) DO NOTHING RETURNING custom_id, line
"""


class PostgresJobStore(PgReads, PgLeases, SharedJobStore):
    """PostgreSQL implementation of ``SharedJobStore``; ``dsn`` is a libpq URL or key=value string."""

    def __init__(
        self,
        dsn: str,
        replica_id: str,
        retention_s: float = 7 * 24 * 3600,
        clock: Callable[[], float] = time.time,
        lease_s: float = DEFAULT_LEASE_S,
        pool_size: int = 6,
        channel: str = "inference_batch",
        connect_timeout_s: float = 30.0,
        wait_s: float = 2.0,
    ) -> None:
        """Connect and migrate; ``StoreUnavailable`` when the database does not answer within
        ``connect_timeout_s`` (the caller retries). A call waits at most ``wait_s`` for a pooled connection."""
        if not replica_id:
            raise ValueError("a shared batch store needs a replica id")
        self.replica_id, self.retention_s, self.clock, self.lease_s = replica_id, retention_s, clock, lease_s
        self.channel = channel
        # NOTE: check_connection on every checkout costs a round trip but hands out no connection
        # that died with a database restart; autocommit, because every write opens its own transaction.
        self.pool = ConnectionPool(
            dsn, min_size=1, max_size=pool_size, open=False, kwargs={"autocommit": True, **CONNECT_KWARGS},
            check=ConnectionPool.check_connection, name=f"batch-{replica_id}", timeout=wait_s,
            reconnect_timeout=RECONNECT_TIMEOUT_S,
        )
        try:
            with unavailable_on_connection_loss():
                self.pool.open(wait=True, timeout=connect_timeout_s)
                with self.pool.connection() as conn:
                    self.schema_version = migrate(conn)
        except BaseException:
            self.pool.close()
            raise
        self._listener = ChangeListener(dsn, channel)

    # -- upload -------------------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> tuple[Job, bool]:
        return self._tx(lambda db: self._create(db, spec))

    def _create(self, db: Conn, spec: JobSpec) -> tuple[Job, bool]:
        now = self.clock()
        if spec.idempotency_key:  # an upload whose replica died frees its key
            db.execute(
                "DELETE FROM batch_jobs WHERE tenant = %s AND idem_key = %s AND state = %s AND lease_until <= %s",
                (spec.tenant, spec.idempotency_key, JobState.VALIDATING.value, now),
            )
        for _ in range(5):
            job_id = self._insert_job(db, spec, now)
            if job_id is not None:
                created = True
                break
            # NOTE: ON CONFLICT waited for a concurrent insert of the key (another replica) to end; this
            # SELECT (a new snapshot) sees that job, unless its upload was discarded meanwhile: insert again
            row = db.execute(
                "SELECT id FROM batch_jobs WHERE tenant = %s AND idem_key = %s", (spec.tenant, spec.idempotency_key)
            ).fetchone()
            if row is not None:
                job_id, created = row[0], False
                break
        else:
            raise RuntimeError("idempotency key: the job holding it keeps disappearing")
        job = self._job(db, job_id, spec.tenant, errors=True)
        assert job is not None
        return job, created

    def _insert_job(self, db: Conn, spec: JobSpec, now: float) -> str | None:
        """A new VALIDATING job owned by this replica (its upload lease running); None if the key is taken."""
        job_id = "batch_" + uuid.uuid4().hex
        row = db.execute(
            "INSERT INTO batch_jobs (id, tenant, display_name, metadata, window_s, priority, idem_key, state, "
            "times, created_at, expires_at, trace, owner, lease_until) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (tenant, idem_key) WHERE idem_key <> '' DO NOTHING RETURNING id",
            (job_id, spec.tenant, spec.display_name, Jsonb(spec.metadata), spec.completion_window_s,
             spec.priority, spec.idempotency_key, JobState.VALIDATING.value, Jsonb({JobState.VALIDATING.value: now}),
             now, now + spec.completion_window_s, spec.trace, self.replica_id, now + self.lease_s),
        ).fetchone()
        return None if row is None else job_id

    def add_items(self, job_id: str, items: list[NewItem]) -> list[NewItem]:
        return self._tx(lambda db: self._add_items(db, job_id, items))

    def _add_items(self, db: Conn, job_id: str, items: list[NewItem]) -> list[NewItem]:
        """Insert in one statement; a custom_id already stored (or earlier in ``items``) is refused.

        Raises LookupError when the job is no longer an upload in progress (deleted as broken).
        """
        renewed = db.execute(  # locks the job's row and extends the upload's lease
            "UPDATE batch_jobs SET lease_until = %s WHERE id = %s AND state = %s RETURNING id",
            (self.clock() + self.lease_s, job_id, JobState.VALIDATING.value),
        ).fetchone()
        if renewed is None:
            raise LookupError(f"batch {job_id} is not an upload in progress")
        states = [(ItemState.QUEUED if it.error is None else ItemState.FAILED).value for it in items]
        inserted = db.execute(INSERT_ITEMS, (
            job_id, [it.custom_id for it in items], [it.line for it in items], [it.request for it in items],
            [it.sort_key for it in items], states,
        )).fetchall()
        taken, refused = _split(items, inserted)
        bad = [(it.custom_id, it.error) for it in taken if it.error is not None]
        self._insert_errors(db, job_id, [e for _, e in bad])
        self._add_results(db, job_id, [
            (cid, ItemState.FAILED, 0, ItemResult(error_status=e.status, error_message=e.message), None)
            for cid, e in bad
        ])
        return refused

    def add_errors(self, job_id: str, errors: list[ItemError]) -> None:
        self._tx(lambda db: self._insert_errors(db, job_id, errors))

    @staticmethod
    def _insert_errors(db: Conn, job_id: str, errors: list[ItemError]) -> None:
        if errors:
            with db.cursor() as cur:
                cur.executemany(
                    "INSERT INTO batch_job_errors (job_id, line, custom_id, status, message) VALUES (%s, %s, %s, %s, %s)",
                    [(job_id, e.line, e.custom_id, e.status, e.message) for e in errors],
                )

    def start_job(self, job_id: str) -> Job:
        return self._tx(lambda db: self._start(db, job_id))

    def _start(self, db: Conn, job_id: str) -> Job:
        """VALIDATING -> IN_PROGRESS (or FAILED); a job cancelled meanwhile stays as it is.

        Raises LookupError when the job is gone (its upload was deleted as broken).
        """
        state = self._lock_job(db, job_id)
        if state is None:
            raise LookupError(f"no batch {job_id}")
        if state is JobState.VALIDATING:
            (runnable, total) = one(
                db, "SELECT count(*) FILTER (WHERE state = %s), count(*) FROM batch_items WHERE job_id = %s",
                (ItemState.QUEUED.value, job_id),
            )
            db.execute("UPDATE batch_jobs SET owner = NULL, lease_until = NULL WHERE id = %s", (job_id,))
            if runnable:
                self._transition(db, job_id, JobState.IN_PROGRESS)
            else:
                why = "every item of the job is invalid (see errors)" if total else "the job has no items"
                db.execute("UPDATE batch_jobs SET failure = %s WHERE id = %s", (why, job_id))
                self._transition(db, job_id, JobState.FAILED)
            self._notify(db, job_id, work=True)
        job = self._job(db, job_id, None, errors=True)
        assert job is not None
        return job

    def discard_job(self, job_id: str) -> None:
        self._tx(lambda db: db.execute("DELETE FROM batch_jobs WHERE id = %s", (job_id,)))

    # -- cancel, expiry, retention ------------------------------------------------------------
    def cancel_job(self, tenant: str, job_id: str) -> Job | None:
        return self._tx(lambda db: self._cancel(db, tenant, job_id))

    def _cancel(self, db: Conn, tenant: str, job_id: str) -> Job | None:
        row = db.execute(
            "SELECT state FROM batch_jobs WHERE id = %s AND tenant = %s FOR UPDATE", (job_id, tenant)
        ).fetchone()
        if row is None:
            return None
        if JobState(row[0]) in (JobState.IN_PROGRESS, JobState.VALIDATING):
            self._cancel_queued(db, job_id, "CANCELLED", "the batch was cancelled before this item ran")
            self._transition(db, job_id, JobState.CANCELLING)
            self._close_if_done(db, job_id, JobState.CANCELLING)
            self._notify(db, job_id, work=True)  # NOTE: the owners of its running items abort them (stopping_jobs)
        return self._job(db, job_id, tenant, errors=True)

    def sweep(self) -> None:
        self._tx(self._expire)
        self._tx(self._delete_retained)

    def _expire(self, db: Conn) -> None:
        now = self.clock()
        expired = db.execute(
            "SELECT id FROM batch_jobs WHERE state = %s AND expires_at <= %s ORDER BY id FOR UPDATE",
            (JobState.IN_PROGRESS.value, now),
        ).fetchall()
        for (job_id,) in expired:
            self._cancel_queued(db, job_id, "DEADLINE_EXCEEDED", "the batch expired before this item ran")
            self._transition(db, job_id, JobState.EXPIRED)
            self._notify(db, job_id, work=True)

    def _delete_retained(self, db: Conn) -> None:
        """Final jobs past retention, with their items and results (not while an item still runs)."""
        db.execute(
            "DELETE FROM batch_jobs j WHERE j.ended_at IS NOT NULL AND j.ended_at + %s <= %s "
            "AND NOT EXISTS (SELECT 1 FROM batch_items i WHERE i.job_id = j.id AND i.state = 'running')",
            (self.retention_s, self.clock()),
        )

    # -- wake-ups, close ----------------------------------------------------------------------
    def changes(self) -> int:
        return self._listener.mark()

    def wait_for_change(self, job_id: str | None, timeout: float, since: int | None = None) -> bool:
        return self._listener.wait(job_id, timeout, since)

    def on_change(self, callback: Callable[[str], None]) -> None:
        self._listener.subscribe(callback)

    def notifications_live(self) -> bool:
        return self._listener.connected

    def close(self) -> None:
        self._listener.stop()
        self.pool.close()

    def __repr__(self) -> str:
        return f"PostgresJobStore(replica_id={self.replica_id!r}, lease_s={self.lease_s})"


def _split(items: list[NewItem], inserted: list[tuple[str, int]]) -> tuple[list[NewItem], list[NewItem]]:
    """(items stored, items refused) given the (custom_id, line) rows the INSERT returned.

    NOTE: of equal custom_ids within one call the first is stored (unnest feeds rows in order and
    ON CONFLICT DO NOTHING skips the later ones), as SqliteJobStore's INSERT OR IGNORE does.
    """
    pending = collections.Counter(inserted)
    taken, refused = [], []
    for it in items:
        if pending[(it.custom_id, it.line)] > 0:
            pending[(it.custom_id, it.line)] -= 1
            taken.append(it)
        else:
            refused.append(it)
    return taken, refused
