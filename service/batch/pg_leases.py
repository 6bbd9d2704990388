"""The running side of ``PostgresJobStore`` (a mixin): claims as leases, results, requeues, recovery.

A claimed item is RUNNING with ``owner`` = the claiming replica and
``lease_until`` = store clock + ``lease_s``. A claim is current while the item
is RUNNING with the claim's attempt number *and* owner: only then do
``finish``, ``requeue`` and ``renew`` act on it.

NOTE on time: leases are compared with the store's ``clock``, like every other
time of the store (the contract tests drive it with a fake clock), not with the
database's ``now()``. Replicas' clocks must then agree to well within
``lease_s`` (NTP gives milliseconds; the default lease is 60 s). A replica whose
clock runs ahead can only requeue a live lease early: the item runs again and
the first run's result is refused, so a skew costs work, never a second result.
"""

from __future__ import annotations

from typing import Any

from psycopg import errors

from service.batch.pg_base import Conn, PgBase
from service.batch.store import Claim, ItemResult, ItemState, JobState

CLAIM_SQL = """
UPDATE batch_items i SET state = 'running', attempts = i.attempts + 1, owner = %s, lease_until = %s
FROM (SELECT custom_id FROM batch_items WHERE job_id = %s AND state = 'queued'
      ORDER BY sort_key, line LIMIT %s FOR UPDATE SKIP LOCKED) q
WHERE i.job_id = %s AND i.custom_id = q.custom_id
RETURNING i.custom_id, i.request, i.attempts, i.sort_key, i.line
"""
CURRENT = "job_id = %s AND custom_id = %s AND state = 'running' AND attempts = %s AND owner = %s"


class PgLeases(PgBase):
    """claim / finish / requeue / renew / reclaim_expired / recover over the shared tables."""

    def claim(self, limit: int) -> list[Claim]:
        if limit <= 0:
            return []
        return self._tx(lambda db: self._claim(db, limit))

    def _claim(self, db: Conn, limit: int) -> list[Claim]:
        out: list[Claim] = []
        jobs = db.execute(
            "SELECT id, tenant, priority, trace FROM batch_jobs WHERE state = %s "
            "ORDER BY priority DESC, created_at, id",
            (JobState.IN_PROGRESS.value,),
        ).fetchall()
        for cls in sorted({j[2] for j in jobs}, reverse=True):
            self._claim_round_robin(db, [(j[0], j[1], j[3]) for j in jobs if j[2] == cls], limit, out)
        for job_id in sorted({c.job_id for c in out}):
            self._notify(db, job_id)  # watchers see the running count move
        return out

    def _claim_round_robin(self, db: Conn, jobs: list[tuple[str, str, str]], limit: int, out: list[Claim]) -> None:
        """Claim into ``out`` from ``jobs`` (oldest first), sharing the free slots between them.

        NOTE: as SqliteJobStore: round-robin a few items at a time; within a job sort_key order.
        ``SKIP LOCKED`` passes over items another replica is claiming right now (no waiting, no
        item claimed twice); a job that yields fewer than asked leaves this round.
        """
        until = self.clock() + self.lease_s
        while jobs and len(out) < limit:
            share = max(1, (limit - len(out)) // len(jobs))
            still = []
            for job_id, tenant, trace in jobs:
                take = min(share, limit - len(out))
                rows = db.execute(CLAIM_SQL, (self.replica_id, until, job_id, take, job_id)).fetchall()
                rows.sort(key=lambda r: (bytes(r[3]), r[4]))  # RETURNING has no order
                out += [Claim(job_id, cid, tenant, bytes(req), attempts, trace) for cid, req, attempts, _, _ in rows]
                if len(rows) == take:
                    still.append((job_id, tenant, trace))
                if len(out) >= limit:
                    return
            jobs = still

    def finish(self, claim: Claim, state: ItemState, result: ItemResult) -> bool:
        try:
            return self._tx(lambda db: self._finish(db, claim, state, result))
        except errors.UniqueViolation:  # a result exists already (see _add_results): nothing recorded
            return False

    def _finish(self, db: Conn, claim: Claim, state: ItemState, result: ItemResult) -> bool:
        job_state = self._lock_job(db, claim.job_id)
        if job_state is None:
            return False
        row = db.execute(
            f"UPDATE batch_items SET state = %s, lease_until = NULL WHERE {CURRENT} RETURNING 1",
            (state.value, claim.job_id, claim.custom_id, claim.attempt, self.replica_id),
        ).fetchone()
        if row is None:  # stale: requeued (lease ran out, restart) or already finished
            return False
        self._add_results(db, claim.job_id, [(claim.custom_id, state, claim.attempt, result, self.replica_id)])
        self._close_if_done(db, claim.job_id, job_state)
        self._notify(db, claim.job_id)
        return True

    def requeue(self, claim: Claim, started: bool = False) -> None:
        self._tx(lambda db: self._requeue(db, claim, started))

    def _requeue(self, db: Conn, claim: Claim, started: bool) -> None:
        job_state = self._lock_job(db, claim.job_id)
        if job_state is None:
            return
        row = db.execute(
            f"UPDATE batch_items SET state = 'queued', attempts = attempts - %s, lease_until = NULL "
            f"WHERE {CURRENT} RETURNING 1",
            (0 if started else 1, claim.job_id, claim.custom_id, claim.attempt, self.replica_id),
        ).fetchone()
        if row is not None:
            self._stop_if_cancelled(db, claim.job_id, job_state)
            self._notify(db, claim.job_id, work=True)

    def renew(self, claims: list[Claim], uploads: list[str] | None = None) -> list[Claim]:
        return self._tx(lambda db: self._renew(db, claims, uploads or []))

    def _renew(self, db: Conn, claims: list[Claim], uploads: list[str]) -> list[Claim]:
        until = self.clock() + self.lease_s
        if uploads:
            db.execute(
                "UPDATE batch_jobs SET lease_until = %s WHERE id = ANY(%s) AND state = %s AND owner = %s",
                (until, uploads, JobState.VALIDATING.value, self.replica_id),
            )
        if not claims:
            return []
        kept = db.execute(
            "UPDATE batch_items i SET lease_until = %s "
            "FROM unnest(%s::text[], %s::text[], %s::int[]) AS c(job_id, custom_id, attempt) "
            "WHERE i.job_id = c.job_id AND i.custom_id = c.custom_id AND i.attempts = c.attempt "
            "AND i.state = 'running' AND i.owner = %s RETURNING i.job_id, i.custom_id",
            (until, [c.job_id for c in claims], [c.custom_id for c in claims], [c.attempt for c in claims],
             self.replica_id),
        ).fetchall()
        ours = {(j, c) for j, c in kept}
        return [c for c in claims if (c.job_id, c.custom_id) not in ours]

    def reclaim_expired(self) -> int:
        return self._tx(lambda db: self._reclaim(db, own=False))

    def recover(self) -> int:
        """Start-up: this replica's running items and expired leases -> queued; its broken uploads and
        expired ones deleted; cancelling/expired jobs with nothing left running closed.

        NOTE: never another live replica's items or uploads: the store is shared. With one replica this
        is SqliteJobStore's "every running item back to queued".
        """
        return self._tx(lambda db: self._recover(db))

    def _recover(self, db: Conn) -> int:
        n = self._reclaim(db, own=True)
        stopping = db.execute(
            "SELECT id FROM batch_jobs WHERE state = ANY(%s) ORDER BY id",
            ([JobState.CANCELLING.value, JobState.EXPIRED.value],),
        ).fetchall()
        for (job_id,) in stopping:
            state = self._lock_job(db, job_id)
            if state is not None:
                self._stop_if_cancelled(db, job_id, state)
        return n

    def _reclaim(self, db: Conn, own: bool) -> int:
        """Requeue running items whose lease ran out (and this replica's own when ``own``); delete uploads
        likewise; returns items requeued. Jobs are locked in id order, each before its items."""
        now, lost = self.clock(), "(lease_until <= %s OR (%s AND owner = %s))"
        args: tuple[Any, ...] = (now, own, self.replica_id)
        db.execute(f"DELETE FROM batch_jobs WHERE state = 'validating' AND {lost}", args)
        job_ids = [r[0] for r in db.execute(
            f"SELECT DISTINCT job_id FROM batch_items WHERE state = 'running' AND {lost} ORDER BY job_id", args
        )]
        n = 0
        for job_id in job_ids:
            state = self._lock_job(db, job_id)
            if state is None:
                continue
            cur = db.execute(
                f"UPDATE batch_items SET state = 'queued', lease_until = NULL "
                f"WHERE job_id = %s AND state = 'running' AND {lost}", (job_id, *args),
            )
            n += cur.rowcount
            self._stop_if_cancelled(db, job_id, state)
            self._notify(db, job_id, work=True)
        return n
