"""Read-side queries of ``PostgresJobStore`` (a mixin): jobs with counts, listings, results, gauges.

Every tenant-facing query filters on the tenant in SQL (``tenant = %s``), not
after the fact; ``tenant=None`` is only for the store's own calls on a job it
just created or locked. A job's counts, usage and error count come from one
statement, so they agree with each other.
"""

from __future__ import annotations

from typing import Any

from service.batch.pg_base import OPEN, Conn, PgBase
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

JOB_SELECT = """
SELECT j.id, j.tenant, j.display_name, j.metadata, j.window_s, j.priority, j.idem_key, j.state, j.times,
       j.expires_at, j.ended_at, j.failure, j.trace, c.counts, u.p, u.c, u.k, e.n, u.r
FROM batch_jobs j
CROSS JOIN LATERAL (
    SELECT coalesce(jsonb_object_agg(s.state, s.n), '{}'::jsonb) AS counts
    FROM (SELECT state, count(*) AS n FROM batch_items WHERE job_id = j.id GROUP BY state) s) c
CROSS JOIN LATERAL (
    SELECT coalesce(sum(prompt_tokens), 0) AS p, coalesce(sum(completion_tokens), 0) AS c,
           coalesce(sum(cached_tokens), 0) AS k, coalesce(sum(reasoning_tokens), 0) AS r
    FROM batch_results WHERE job_id = j.id) u
CROSS JOIN LATERAL (SELECT count(*) AS n FROM batch_job_errors WHERE job_id = j.id) e
"""
RESULT_SELECT = ", ".join(f"r.{c}" for c in RESULT_FIELDS)


class PgReads(PgBase):
    """Queries over the schema of ``service.batch.pg_schema``."""

    def get_job(self, tenant: str, job_id: str) -> Job | None:
        return self._read(lambda db: self._job(db, job_id, tenant, errors=True))

    def list_jobs(self, tenant: str, limit: int, page_token: str = "") -> tuple[list[Job], str]:
        query, args = JOB_SELECT + " WHERE j.tenant = %s", [tenant]
        if page_token:
            created, _, last_id = page_token.partition("|")
            query += " AND (j.created_at, j.id) < (%s, %s)"
            args += [float(created), last_id]  # type: ignore[list-item]
        query += " ORDER BY j.created_at DESC, j.id DESC LIMIT %s"
        rows = self._read(lambda db: db.execute(query, (*args, limit + 1)).fetchall())
        jobs = [self._job_from_row(r) for r in rows[:limit]]
        token = job_cursor(jobs[-1]) if len(rows) > limit else ""
        return jobs, token

    def results(
        self, tenant: str, job_id: str, by_completion: bool, cursor: str, limit: int
    ) -> list[StoredResult]:
        # NOTE: custom_id is COLLATE "C" (the schema's), so its order and the cursor compare bytes, as SQLite does
        where, after = ("r.done_seq > %s", int(cursor or 0)) if by_completion else ("r.custom_id > %s", cursor)
        order = "r.done_seq" if by_completion else "r.custom_id"
        rows = self._read(lambda db: db.execute(
            f"SELECT r.custom_id, r.done_seq, r.state, r.attempts, {RESULT_SELECT} "
            "FROM batch_results r JOIN batch_jobs j ON j.id = r.job_id "
            f"WHERE j.id = %s AND j.tenant = %s AND {where} ORDER BY {order} LIMIT %s",
            (job_id, tenant, after, limit),
        ).fetchall())
        return [
            StoredResult(r[0], str(r[1]) if by_completion else r[0], ItemState(r[2]), r[3], ItemResult(*r[4:]))
            for r in rows
        ]

    def state_counts(self) -> dict[str, int]:
        """Store-wide gauges (every tenant, every replica): no tenant filter by design."""
        out = {s.value: 0 for s in JobState}

        def read(db: Conn) -> dict[str, int]:
            out.update({s: int(n) for s, n in db.execute("SELECT state, count(*) FROM batch_jobs GROUP BY state")})
            return dict(db.execute(
                "SELECT i.state, count(*) FROM batch_items i JOIN batch_jobs j ON j.id = i.job_id "
                "WHERE i.state = ANY(%s) AND j.state = ANY(%s) GROUP BY i.state",
                (list(OPEN), [JobState.IN_PROGRESS.value, JobState.CANCELLING.value]),
            ).fetchall())

        counts = self._read(read)
        for state in OPEN:
            out[f"{state}_items"] = int(counts.get(state, 0))
        return out

    def stopping_jobs(self) -> dict[str, JobState]:
        """Jobs cancelling or expired in which *this replica* runs items (each replica aborts its own)."""
        rows = self._read(lambda db: db.execute(
            "SELECT DISTINCT j.id, j.state FROM batch_jobs j JOIN batch_items i ON i.job_id = j.id "
            "WHERE j.state = ANY(%s) AND i.state = %s AND i.owner = %s",
            ([JobState.CANCELLING.value, JobState.EXPIRED.value], ItemState.RUNNING.value, self.replica_id),
        ).fetchall())
        return {r[0]: JobState(r[1]) for r in rows}

    def _job(self, db: Conn, job_id: str, tenant: str | None, errors: bool) -> Job | None:
        """The job (None if absent or not ``tenant``'s); ``errors`` adds the first upload errors."""
        if tenant is None:
            row = db.execute(JOB_SELECT + " WHERE j.id = %s", (job_id,)).fetchone()
        else:
            row = db.execute(JOB_SELECT + " WHERE j.id = %s AND j.tenant = %s", (job_id, tenant)).fetchone()
        if row is None:
            return None
        job = self._job_from_row(row)
        if errors:
            job.errors = [
                ItemError(*r)
                for r in db.execute(
                    "SELECT line, custom_id, status, message FROM batch_job_errors WHERE job_id = %s "
                    "ORDER BY line LIMIT %s",
                    (job_id, MAX_ERRORS_SHOWN),
                )
            ]
        return job

    def _job_from_row(self, r: Any) -> Job:
        spec = JobSpec(r[1], r[2], dict(r[3]), r[4], r[5], r[6], r[12])
        counts = Counts(**{state: int(n) for state, n in r[13].items()})
        counts.total = sum(int(n) for n in r[13].values())
        ended = r[10]
        return Job(
            r[0], spec, JobState(r[7]), dict(r[8]), r[9], ended + self.retention_s if ended is not None else None,
            counts=counts, usage=Usage(int(r[14]), int(r[15]), int(r[16]), int(r[18])), error_count=int(r[17]),
            failure=r[11],
        )
