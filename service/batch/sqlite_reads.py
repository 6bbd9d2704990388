"""Read-side queries of ``SqliteJobStore`` (a mixin: jobs with counts, listings, results, gauges)."""

from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any

from service.batch.store import (
    MAX_ERRORS_SHOWN,
    RESULT_FIELDS,
    Counts,
    ItemError,
    ItemResult,
    ItemState,
    Job,
    JobSpec,
    JobState,
    StoredResult,
    Usage,
    job_cursor,
)

RESULT_COLUMNS = ", ".join(RESULT_FIELDS)
OPEN = (ItemState.QUEUED.value, ItemState.RUNNING.value)


class SqliteReads:
    """Queries over the schema of ``service.batch.sqlite_store`` (one connection, one lock)."""

    _db: sqlite3.Connection
    _lock: threading.RLock
    retention_s: float

    def get_job(self, tenant: str, job_id: str) -> Job | None:
        with self._lock:
            job = self._job(self._db, job_id, errors=True)
        return job if job is not None and job.spec.tenant == tenant else None

    def list_jobs(self, tenant: str, limit: int, page_token: str = "") -> tuple[list[Job], str]:
        query = "SELECT id FROM jobs WHERE tenant=?"
        args: list[Any] = [tenant]
        if page_token:
            created, _, last_id = page_token.partition("|")
            query += " AND (created_at < ? OR (created_at = ? AND id < ?))"
            args += [float(created), float(created), last_id]
        query += " ORDER BY created_at DESC, id DESC LIMIT ?"
        with self._lock:
            ids = [r[0] for r in self._db.execute(query, (*args, limit + 1))]
            jobs = [j for j in (self._job(self._db, i, errors=False) for i in ids[:limit]) if j is not None]
        token = job_cursor(jobs[-1]) if len(ids) > limit else ""
        return jobs, token

    def results(
        self, tenant: str, job_id: str, by_completion: bool, cursor: str, limit: int
    ) -> list[StoredResult]:
        if self.get_job(tenant, job_id) is None:
            return []
        done = tuple(s.value for s in (ItemState.COMPLETED, ItemState.FAILED, ItemState.CANCELLED))
        if by_completion:
            where, order, after = "done_seq > ?", "done_seq", int(cursor or 0)
        else:
            where, order, after = "custom_id > ?", "custom_id", cursor  # type: ignore[assignment]
        with self._lock:
            rows = self._db.execute(
                f"SELECT custom_id, done_seq, state, attempts, {RESULT_COLUMNS} FROM items "
                f"WHERE job_id=? AND state IN (?,?,?) AND {where} ORDER BY {order} LIMIT ?",
                (job_id, *done, after, limit),
            ).fetchall()
        return [
            StoredResult(r[0], str(r[1]) if by_completion else r[0], ItemState(r[2]), r[3], ItemResult(*r[4:]))
            for r in rows
        ]

    def state_counts(self) -> dict[str, int]:
        with self._lock:
            out = {s.value: 0 for s in JobState}
            out.update(dict(self._db.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()))
            for state in OPEN:
                (n,) = self._db.execute(
                    "SELECT count(*) FROM items i JOIN jobs j ON j.id = i.job_id WHERE i.state=? AND j.state IN (?,?)",
                    (state, JobState.IN_PROGRESS.value, JobState.CANCELLING.value),
                ).fetchone()
                out[f"{state}_items"] = n
        return out

    def _job(self, db: sqlite3.Connection, job_id: str, errors: bool) -> Job | None:
        row = db.execute(
            "SELECT tenant, display_name, metadata, window_s, priority, idem_key, state, times, expires_at, "
            "ended_at, failure, trace FROM jobs WHERE id=?",
            (job_id,),
        ).fetchone()
        if row is None:
            return None
        spec = JobSpec(row[0], row[1], json.loads(row[2]), row[3], row[4], row[5], row[11])
        ended = row[9]
        job = Job(job_id, spec, JobState(row[6]), json.loads(row[7]), row[8],
                  ended + self.retention_s if ended is not None else None, failure=row[10])
        self._fill_counts(db, job)
        (job.error_count,) = db.execute("SELECT count(*) FROM job_errors WHERE job_id=?", (job_id,)).fetchone()
        if errors:
            job.errors = [
                ItemError(*r)
                for r in db.execute(
                    "SELECT line, custom_id, status, message FROM job_errors WHERE job_id=? ORDER BY line LIMIT ?",
                    (job_id, MAX_ERRORS_SHOWN),
                )
            ]
        return job

    @staticmethod
    def _fill_counts(db: sqlite3.Connection, job: Job) -> None:
        counts, usage = Counts(), Usage()
        for state, n, p, c, k, t in db.execute(
            "SELECT state, count(*), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens), "
            "sum(reasoning_tokens) FROM items WHERE job_id=? GROUP BY state",
            (job.id,),
        ):
            setattr(counts, state, n)
            counts.total += n
            usage.prompt_tokens += p or 0
            usage.completion_tokens += c or 0
            usage.cached_tokens += k or 0
            usage.reasoning_tokens += t or 0
        job.counts, job.usage = counts, usage

    def stopping_jobs(self) -> dict[str, JobState]:
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT j.id, j.state FROM jobs j JOIN items i ON i.job_id = j.id "
                "WHERE j.state IN (?,?) AND i.state=?",
                (JobState.CANCELLING.value, JobState.EXPIRED.value, ItemState.RUNNING.value),
            ).fetchall()
        return {r[0]: JobState(r[1]) for r in rows}
