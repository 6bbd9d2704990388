"""Shared pieces of ``PostgresJobStore``: the transaction runner and the row-level state changes.

Every state change of a job's items runs in one transaction that first locks the
job's row (``_lock_job``), then its items.

NOTE: that one lock order (job row, then item rows; several jobs in id order)
is what keeps concurrent replicas free of deadlocks; ``claim`` is the one
writer that takes no job lock, and it never waits (``SKIP LOCKED``). Should a
deadlock or serialization failure still happen, ``_tx`` runs the transaction
again (it was rolled back entirely).

A lost connection (database down or restarting, link cut, pool exhausted) is
raised as ``StoreUnavailable``, never retried here: a commit whose answer was
lost is ambiguous, so the caller retries with backoff under the store's
contract (the worker's rounds, the client's retry with its idempotency key).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from psycopg import Connection, errors
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from service.batch.shared_store import WORK
from service.batch.store import RESULT_FIELDS, TERMINAL, ItemResult, ItemState, JobState, StoreUnavailable

log = logging.getLogger("service.batch")
T = TypeVar("T")
Conn = Connection[Any]
RETRIES = 5
RESULT_COLUMNS = ", ".join(RESULT_FIELDS)
OPEN = (ItemState.QUEUED.value, ItemState.RUNNING.value)
# NOTE: libpq settings of every connection: a database that does not answer, or a cut link, must
# surface as an error within seconds (keepalives on idle connections, tcp_user_timeout on unacknowledged
# writes), not after the kernel's minutes of retransmissions.
CONNECT_KWARGS: dict[str, Any] = {
    "connect_timeout": 5, "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
    "keepalives_count": 3, "tcp_user_timeout": 10_000,
}
# (custom_id, state, attempts, result, replica that ran it or None)
ResultRow = tuple[str, ItemState, int, ItemResult, str | None]


@contextlib.contextmanager
def unavailable_on_connection_loss() -> Iterator[None]:
    """Connection-class errors (server gone, link cut, pool timeout) -> ``StoreUnavailable``.

    NOTE: a deadlock or serialization failure is an OperationalError too, but it is the
    transaction's fault, not the connection's: it passes through for ``_tx`` to retry.
    """
    try:
        yield
    except errors.TransactionRollback:
        raise
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise StoreUnavailable(f"PostgreSQL: {str(exc).strip() or type(exc).__name__}") from exc


def one(db: Conn, query: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The single row ``query`` must return (an aggregate, or a row the transaction holds locked)."""
    row = db.execute(query, args).fetchone()
    if row is None:
        raise LookupError(f"no row for {query.split()[0]} ... {args!r}")
    return tuple(row)


class PgBase:
    """The pool, the clock and the helpers every part of the store uses."""

    pool: ConnectionPool[Any]
    clock: Callable[[], float]
    retention_s: float
    replica_id: str
    lease_s: float
    channel: str

    def _tx(self, body: Callable[[Conn], T]) -> T:
        """Run ``body(conn)`` in one transaction, committed on return; retried after a deadlock."""
        for attempt in range(RETRIES):
            try:
                with unavailable_on_connection_loss(), self.pool.connection() as conn, conn.transaction():
                    return body(conn)
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == RETRIES - 1:
                    raise
                log.debug("batch store transaction retried after a deadlock", exc_info=True)
                time.sleep(0.005 * 2**attempt)
        raise AssertionError("unreachable")

    def _read(self, body: Callable[[Conn], T]) -> T:
        """Run ``body(conn)`` on a pooled connection in one read transaction (a consistent snapshot)."""
        with unavailable_on_connection_loss(), self.pool.connection() as conn, conn.transaction():
            return body(conn)

    def _notify(self, db: Conn, job_id: str, work: bool = False) -> None:
        """Wake every replica's waiters for ``job_id`` (delivered when the transaction commits);
        ``work``: the change gives workers something to do (runnable items, items to abort)."""
        db.execute("SELECT pg_notify(%s, %s)", (self.channel, job_id))
        if work:
            db.execute("SELECT pg_notify(%s, %s)", (self.channel, WORK))

    @staticmethod
    def _lock_job(db: Conn, job_id: str) -> JobState | None:
        """Lock the job's row for this transaction; its state (None: no such job)."""
        row = db.execute("SELECT state FROM batch_jobs WHERE id = %s FOR UPDATE", (job_id,)).fetchone()
        return JobState(row[0]) if row is not None else None

    def _transition(self, db: Conn, job_id: str, *states: JobState) -> None:
        """Enter ``states`` in turn (each gets a timestamp); a final state also starts retention."""
        now = self.clock()
        final = states[-1]
        db.execute(
            "UPDATE batch_jobs SET state = %s, times = times || %s, ended_at = %s WHERE id = %s",
            (final.value, Jsonb({s.value: now for s in states}), now if final in TERMINAL else None, job_id),
        )

    def _add_results(self, db: Conn, job_id: str, rows: list[ResultRow]) -> None:
        """Store finished items' results with the job's next completion-order numbers (the job is locked).

        NOTE: the primary key (job_id, custom_id) of batch_results is the last guard of "one result
        per custom_id": a second insert fails and rolls the whole transaction back.
        """
        if not rows:
            return
        (last,) = one(
            db, "UPDATE batch_jobs SET done_seq = done_seq + %s WHERE id = %s RETURNING done_seq", (len(rows), job_id)
        )
        first = last - len(rows) + 1
        with db.cursor() as cur:
            cur.executemany(
                f"INSERT INTO batch_results (job_id, custom_id, done_seq, state, attempts, replica, {RESULT_COLUMNS}) "
                f"VALUES ({', '.join(['%s'] * (6 + len(RESULT_FIELDS)))})",
                [(job_id, cid, first + n, state.value, attempts, replica, *(getattr(r, f) for f in RESULT_FIELDS))
                 for n, (cid, state, attempts, r, replica) in enumerate(rows)],
            )

    def _close_if_done(self, db: Conn, job_id: str, state: JobState) -> None:
        """COMPLETED (via FINALIZING) or CANCELLED once no item of the job is queued or running."""
        (open_items,) = one(
            db, "SELECT count(*) FROM batch_items WHERE job_id = %s AND state = ANY(%s)", (job_id, list(OPEN))
        )
        if open_items:
            return
        if state is JobState.IN_PROGRESS:
            self._transition(db, job_id, JobState.FINALIZING, JobState.COMPLETED)
        elif state is JobState.CANCELLING:
            self._transition(db, job_id, JobState.CANCELLED)

    def _cancel_queued(self, db: Conn, job_id: str, status: str, message: str) -> None:
        """Every queued item of the (locked) job -> cancelled, with a result in upload order."""
        rows = db.execute(
            "UPDATE batch_items SET state = %s, lease_until = NULL WHERE job_id = %s AND state = %s "
            "RETURNING custom_id, line, attempts",
            (ItemState.CANCELLED.value, job_id, ItemState.QUEUED.value),
        ).fetchall()
        rows.sort(key=lambda r: r[1])
        err = ItemResult(error_status=status, error_message=message)
        self._add_results(db, job_id, [(cid, ItemState.CANCELLED, attempts, err, None) for cid, _, attempts in rows])

    def _stop_if_cancelled(self, db: Conn, job_id: str, state: JobState) -> None:
        """Queued items of a cancelling or expired (locked) job are cancelled; close it when nothing is left."""
        if state is JobState.CANCELLING:
            self._cancel_queued(db, job_id, "CANCELLED", "the batch was cancelled before this item finished")
        elif state is JobState.EXPIRED:
            self._cancel_queued(db, job_id, "DEADLINE_EXCEEDED", "the batch expired before this item finished")
        self._close_if_done(db, job_id, state)
