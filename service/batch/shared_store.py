"""``SharedJobStore``: a ``JobStore`` that several replicas share (leases, wake-ups).

What changes when replicas share one store (``PostgresJobStore``) instead of each
owning one (``SqliteJobStore``):

* every store instance has a ``replica_id`` (stable across restarts of one
  replica: its pod name); a claimed item records its owner and ``lease_until``
  (store clock + ``lease_s``);
* ``renew(claims)`` extends the leases of the owner's running items (the worker
  calls it well within ``lease_s``, e.g. every ``lease_s / 3``) and of its
  uploads in progress; it returns the claims that are no longer the caller's
  (their lease ran out and another replica requeued them): abort those;
* ``reclaim_expired()`` (any replica, periodically) requeues items whose lease
  ran out (their owner died or lost the database) and deletes uploads whose
  replica died; an item keeps its attempt count, as after a restart;
* ``recover()`` (start-up) requeues only this replica's own running items and
  expired leases, never those of another live replica; it deletes only this
  replica's broken uploads and expired ones;
* ``finish``/``requeue``/``renew`` also check the owner: a run whose lease was
  taken over can never record a result (the one-result rule holds across replicas);
* ``stopping_jobs()`` names the jobs in which *this replica* has items to abort;
* ``wait_for_change`` blocks until another instance reports a change of a job
  (or of any job), or a timeout: callers poll at the timeout as a fallback.
"""

from __future__ import annotations

import abc

from service.batch.store import Claim, JobStore


class SharedJobStore(JobStore):
    """A ``JobStore`` shared by replicas; see the module docstring."""

    replica_id: str
    lease_s: float

    @abc.abstractmethod
    def renew(self, claims: list[Claim]) -> list[Claim]:
        """Extend the leases of ``claims`` (and of this replica's uploads); returns the claims lost."""

    @abc.abstractmethod
    def reclaim_expired(self) -> int:
        """Requeue items whose lease ran out and delete uploads whose lease ran out; returns items requeued."""

    @abc.abstractmethod
    def changes(self) -> int:
        """A mark of the change notifications seen so far (for ``wait_for_change(since=...)``)."""

    @abc.abstractmethod
    def wait_for_change(self, job_id: str | None, timeout: float, since: int | None = None) -> bool:
        """Block until a change of ``job_id`` (any job when None) after mark ``since`` (default: now);
        False when ``timeout`` passed first (or notifications are down: poll then)."""
