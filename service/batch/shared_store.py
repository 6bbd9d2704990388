"""``SharedJobStore``: a ``JobStore`` that several replicas share (leases, wake-ups).

What changes when replicas share one store (``PostgresJobStore``) instead of each
owning one (``SqliteJobStore``):

* every store instance has a ``replica_id`` (stable across restarts of one
  replica: its pod name); a claimed item records its owner and ``lease_until``
  (store clock + ``lease_s``);
* ``renew(claims, uploads)`` extends the leases of the owner's running items (the
  worker calls it well within ``lease_s``: every ``lease_s / 3``) and of the
  uploads it still receives; it returns the claims that are no longer the
  caller's (their lease ran out and another replica requeued them): abort those.
  An upload not named (its RPC ended without a discard: the database was down)
  lapses like a dead replica's;
* ``reclaim_expired()`` (any replica, periodically) requeues items whose lease
  ran out (their owner died or lost the database) and deletes uploads whose
  replica died; an item keeps its attempt count, as after a restart;
* ``recover()`` (start-up) requeues only this replica's own running items and
  expired leases, never those of another live replica; it deletes only this
  replica's broken uploads and expired ones;
* ``finish``/``requeue``/``renew`` also check the owner: a run whose lease was
  taken over can never record a result (the one-result rule holds across replicas);
* ``stopping_jobs()`` names the jobs in which *this replica* has items to abort;
* ``wait_for_change`` blocks until an instance (this one included) reports a change
  of a job (or of any job, or ``WORK``: runnable items or items to abort), or a
  timeout; ``on_change`` hands every change to a callback instead (the server's
  event loop). Callers poll at a timeout as a fallback: a wake-up is a hint,
  the store is the truth.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from service.batch.store import Claim, JobStore

# The pseudo job id of changes that give workers something to do: a job started, items requeued
# (released, or their lease ran out), a job cancelled or expired (owners abort their running items).
WORK = "*work"


class SharedJobStore(JobStore):
    """A ``JobStore`` shared by replicas; see the module docstring."""

    replica_id: str
    lease_s: float

    @abc.abstractmethod
    def renew(self, claims: list[Claim], uploads: list[str] | None = None) -> list[Claim]:
        """Extend the leases of ``claims`` and of the uploads (job ids) this replica still receives;
        returns the claims lost."""

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

    @abc.abstractmethod
    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(job_id)`` (``WORK`` included) for every change from now on, on the store's
        listener thread: it must return at once (e.g. ``loop.call_soon_threadsafe``)."""

    @abc.abstractmethod
    def notifications_live(self) -> bool:
        """True while change notifications arrive (False: they are reconnecting; poll faster)."""
