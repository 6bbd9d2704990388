"""``JobStore`` on SQLite in WAL mode (the embedded default, ``--batch-db``).

One table of jobs, one of items (with their results), one of upload errors
(``service.batch.sqlite_schema``: migrated at open). Every write is one ``BEGIN IMMEDIATE`` transaction, committed before the
method returns.

NOTE: ``synchronous=NORMAL`` in WAL mode: a committed transaction survives a
crash of the process (kill -9) but the last ones may be lost if the machine
loses power; ``durable=True`` (``synchronous=FULL``) also survives that, at an
fsync per commit.

Thread safety: one connection behind a lock; the service calls it from one
executor thread so the event loop never waits on the disk.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from service.batch.sqlite_reads import OPEN, SqliteReads
from service.batch.sqlite_schema import migrate
from service.batch.store import (
    RESULT_FIELDS,
    TERMINAL,
    Claim,
    ItemError,
    ItemResult,
    ItemState,
    Job,
    JobSpec,
    JobState,
    JobStore,
    NewItem,
)


class SqliteJobStore(SqliteReads, JobStore):
    """SQLite implementation of ``JobStore`` (``path`` ":memory:" for a private in-memory store)."""

    def __init__(
        self,
        path: str,
        retention_s: float = 7 * 24 * 3600,
        clock: Callable[[], float] = time.time,
        durable: bool = False,
    ) -> None:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.retention_s = retention_s
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._db.execute("PRAGMA busy_timeout=5000")
        self.schema_version = migrate(self._db)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- upload -------------------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> tuple[Job, bool]:
        now = self.clock()
        with self._tx() as db:
            if spec.idempotency_key:
                row = db.execute(
                    "SELECT id FROM jobs WHERE tenant=? AND idem_key=?", (spec.tenant, spec.idempotency_key)
                ).fetchone()
                if row is not None:
                    job = self._job(db, row[0], errors=True)
                    assert job is not None
                    return job, False
            job_id = "batch_" + uuid.uuid4().hex
            times = {JobState.VALIDATING.value: now}
            db.execute(
                "INSERT INTO jobs (id, tenant, display_name, metadata, window_s, priority, idem_key, state, "
                "times, created_at, expires_at, trace) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (job_id, spec.tenant, spec.display_name, json.dumps(spec.metadata), spec.completion_window_s,
                 spec.priority, spec.idempotency_key, JobState.VALIDATING.value, json.dumps(times), now,
                 now + spec.completion_window_s, spec.trace),
            )
            job = self._job(db, job_id, errors=True)
        assert job is not None
        return job, True

    def add_items(self, job_id: str, items: list[NewItem]) -> list[NewItem]:
        refused: list[NewItem] = []
        with self._tx() as db:
            for it in items:
                state, err = (ItemState.QUEUED, None) if it.error is None else (ItemState.FAILED, it.error)
                cur = db.execute(
                    "INSERT OR IGNORE INTO items (job_id, custom_id, line, request, sort_key, state, "
                    "error_status, error_message) VALUES (?,?,?,?,?,?,?,?)",
                    (job_id, it.custom_id, it.line, it.request, it.sort_key, state.value,
                     err.status if err else "", err.message if err else ""),
                )
                if cur.rowcount == 0:
                    refused.append(it)
                elif err is not None:
                    self._insert_errors(db, job_id, [err])
                    self._mark_done(db, job_id, it.custom_id)
        return refused

    def add_errors(self, job_id: str, errors: list[ItemError]) -> None:
        with self._tx() as db:
            self._insert_errors(db, job_id, errors)

    @staticmethod
    def _insert_errors(db: sqlite3.Connection, job_id: str, errors: list[ItemError]) -> None:
        db.executemany(
            "INSERT INTO job_errors (job_id, line, custom_id, status, message) VALUES (?,?,?,?,?)",
            [(job_id, e.line, e.custom_id, e.status, e.message) for e in errors],
        )

    def start_job(self, job_id: str) -> Job:
        with self._tx() as db:
            (runnable,) = db.execute(
                "SELECT count(*) FROM items WHERE job_id=? AND state=?", (job_id, ItemState.QUEUED.value)
            ).fetchone()
            if runnable:
                self._transition(db, job_id, JobState.IN_PROGRESS)
            else:
                (total,) = db.execute("SELECT count(*) FROM items WHERE job_id=?", (job_id,)).fetchone()
                why = "every item of the job is invalid (see errors)" if total else "the job has no items"
                db.execute("UPDATE jobs SET failure=? WHERE id=?", (why, job_id))
                self._transition(db, job_id, JobState.FAILED)
            job = self._job(db, job_id, errors=True)
        assert job is not None
        return job

    def discard_job(self, job_id: str) -> None:
        with self._tx() as db:
            self._delete(db, job_id)

    @staticmethod
    def _delete(db: sqlite3.Connection, job_id: str) -> None:
        for table, key in (("items", "job_id"), ("job_errors", "job_id"), ("jobs", "id")):
            db.execute(f"DELETE FROM {table} WHERE {key}=?", (job_id,))

    # -- state changes ------------------------------------------------------------------------
    def _transition(self, db: sqlite3.Connection, job_id: str, *states: JobState) -> None:
        """Enter ``states`` in turn (each gets a timestamp); a final state also starts retention."""
        now = self.clock()
        (raw,) = db.execute("SELECT times FROM jobs WHERE id=?", (job_id,)).fetchone()
        times = json.loads(raw)
        for s in states:
            times[s.value] = now
        final = states[-1]
        db.execute(
            "UPDATE jobs SET state=?, times=?, ended_at=? WHERE id=?",
            (final.value, json.dumps(times), now if final in TERMINAL else None, job_id),
        )

    def _mark_done(self, db: sqlite3.Connection, job_id: str, custom_id: str) -> None:
        """Give a newly finished item the job's next completion-order number."""
        db.execute("UPDATE jobs SET done_seq = done_seq + 1 WHERE id=?", (job_id,))
        db.execute(
            "UPDATE items SET done_seq = (SELECT done_seq FROM jobs WHERE id=?) WHERE job_id=? AND custom_id=?",
            (job_id, job_id, custom_id),
        )

    def _close_if_done(self, db: sqlite3.Connection, job_id: str) -> None:
        (state,) = db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
        (open_items,) = db.execute(
            "SELECT count(*) FROM items WHERE job_id=? AND state IN (?,?)", (job_id, *OPEN)
        ).fetchone()
        if open_items:
            return
        if state == JobState.IN_PROGRESS.value:
            self._transition(db, job_id, JobState.FINALIZING, JobState.COMPLETED)
        elif state == JobState.CANCELLING.value:
            self._transition(db, job_id, JobState.CANCELLED)

    def _cancel_queued(self, db: sqlite3.Connection, job_id: str, status: str, message: str) -> None:
        ids = [r[0] for r in db.execute(
            "SELECT custom_id FROM items WHERE job_id=? AND state=? ORDER BY line", (job_id, ItemState.QUEUED.value)
        )]
        for cid in ids:
            db.execute(
                "UPDATE items SET state=?, error_status=?, error_message=? WHERE job_id=? AND custom_id=?",
                (ItemState.CANCELLED.value, status, message, job_id, cid),
            )
            self._mark_done(db, job_id, cid)

    def cancel_job(self, tenant: str, job_id: str) -> Job | None:
        with self._tx() as db:
            job = self._job(db, job_id, errors=False)
            if job is None or job.spec.tenant != tenant:
                return None
            if job.state in (JobState.IN_PROGRESS, JobState.VALIDATING):
                self._cancel_queued(db, job_id, "CANCELLED", "the batch was cancelled before this item ran")
                self._transition(db, job_id, JobState.CANCELLING)
                self._close_if_done(db, job_id)
            job = self._job(db, job_id, errors=True)
        return job

    # -- running ------------------------------------------------------------------------------
    def claim(self, limit: int) -> list[Claim]:
        if limit <= 0:
            return []
        out: list[Claim] = []
        with self._tx() as db:
            jobs = db.execute(
                "SELECT id, tenant, priority, trace FROM jobs WHERE state=? ORDER BY priority DESC, created_at, id",
                (JobState.IN_PROGRESS.value,),
            ).fetchall()
            for cls in sorted({j[2] for j in jobs}, reverse=True):
                self._claim_round_robin(db, [(j[0], j[1], j[3]) for j in jobs if j[2] == cls], limit, out)
        return out

    def _claim_round_robin(
        self, db: sqlite3.Connection, jobs: list[tuple[str, str, str]], limit: int, out: list[Claim]
    ) -> None:
        """Claim into ``out`` from ``jobs`` (oldest first), sharing the free slots between them.

        NOTE: round-robin, a few items at a time, so one big job does not hold every slot;
        within a job sort_key order keeps items with a shared prompt prefix together.
        """
        while jobs and len(out) < limit:
            share = max(1, (limit - len(out)) // len(jobs))
            still = []
            for job_id, tenant, trace in jobs:
                take = min(share, limit - len(out))
                rows = db.execute(
                    "SELECT custom_id, request, attempts FROM items WHERE job_id=? AND state=? "
                    "ORDER BY sort_key, line LIMIT ?",
                    (job_id, ItemState.QUEUED.value, take),
                ).fetchall()
                for cid, request, attempts in rows:
                    db.execute(
                        "UPDATE items SET state=?, attempts=? WHERE job_id=? AND custom_id=?",
                        (ItemState.RUNNING.value, attempts + 1, job_id, cid),
                    )
                    out.append(Claim(job_id, cid, tenant, request, attempts + 1, trace))
                if len(rows) == take:
                    still.append((job_id, tenant, trace))
                if len(out) >= limit:
                    return
            jobs = still

    def _current(self, db: sqlite3.Connection, claim: Claim) -> bool:
        row = db.execute(
            "SELECT state, attempts FROM items WHERE job_id=? AND custom_id=?", (claim.job_id, claim.custom_id)
        ).fetchone()
        return row is not None and row[0] == ItemState.RUNNING.value and row[1] == claim.attempt

    def finish(self, claim: Claim, state: ItemState, result: ItemResult) -> bool:
        r = result
        with self._tx() as db:
            if not self._current(db, claim):
                return False
            db.execute(
                f"UPDATE items SET state=?, {', '.join(f'{f}=?' for f in RESULT_FIELDS)} WHERE job_id=? AND custom_id=?",
                (state.value, *(getattr(r, f) for f in RESULT_FIELDS), claim.job_id, claim.custom_id),
            )
            self._mark_done(db, claim.job_id, claim.custom_id)
            self._close_if_done(db, claim.job_id)
        return True

    def requeue(self, claim: Claim, started: bool = False) -> None:
        with self._tx() as db:
            if self._current(db, claim):
                db.execute(
                    "UPDATE items SET state=?, attempts=attempts - ? WHERE job_id=? AND custom_id=?",
                    (ItemState.QUEUED.value, 0 if started else 1, claim.job_id, claim.custom_id),
                )
                self._stop_if_cancelled(db, claim.job_id)

    def _stop_if_cancelled(self, db: sqlite3.Connection, job_id: str) -> None:
        """A requeued item of a job that is cancelling or expired is cancelled instead."""
        (state,) = db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
        if state == JobState.CANCELLING.value:
            self._cancel_queued(db, job_id, "CANCELLED", "the batch was cancelled before this item finished")
        elif state == JobState.EXPIRED.value:
            self._cancel_queued(db, job_id, "DEADLINE_EXCEEDED", "the batch expired before this item finished")
        self._close_if_done(db, job_id)

    def recover(self) -> int:
        with self._tx() as db:
            broken = [r[0] for r in db.execute("SELECT id FROM jobs WHERE state=?", (JobState.VALIDATING.value,))]
            for job_id in broken:
                self._delete(db, job_id)
            n = db.execute(
                "UPDATE items SET state=? WHERE state=?", (ItemState.QUEUED.value, ItemState.RUNNING.value)
            ).rowcount
            for (job_id,) in db.execute(
                "SELECT id FROM jobs WHERE state IN (?,?)", (JobState.CANCELLING.value, JobState.EXPIRED.value)
            ).fetchall():
                self._stop_if_cancelled(db, job_id)
        return n

    def sweep(self) -> None:
        now = self.clock()
        with self._tx() as db:
            for (job_id,) in db.execute(
                "SELECT id FROM jobs WHERE state=? AND expires_at <= ?", (JobState.IN_PROGRESS.value, now)
            ).fetchall():
                self._cancel_queued(db, job_id, "DEADLINE_EXCEEDED", "the batch expired before this item ran")
                self._transition(db, job_id, JobState.EXPIRED)
            for (job_id,) in db.execute(
                "SELECT id FROM jobs WHERE ended_at IS NOT NULL AND ended_at + ? <= ?", (self.retention_s, now)
            ).fetchall():
                (running,) = db.execute(
                    "SELECT count(*) FROM items WHERE job_id=? AND state=?", (job_id, ItemState.RUNNING.value)
                ).fetchone()
                if not running:  # an expired job's last running items are still being cancelled
                    self._delete(db, job_id)

    def close(self) -> None:
        with self._lock:
            self._db.close()
