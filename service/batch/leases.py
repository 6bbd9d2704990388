"""The worker's lease duties on a shared store (``SharedJobStore``): renew, give up, take over.

Every ``lease_s / 3`` (so two renewals may fail before a lease runs out) the
worker's ``LeaseKeeper.round``:

1. renews the leases of the items it runs and of the uploads this replica is
   still receiving (``renew``); the claims the store answers as lost (their
   lease ran out, e.g. while this replica could not reach the database, and
   another replica took the item) are aborted here: their result would be
   refused anyway, and the item already runs elsewhere;
2. requeues every replica's expired leases (``reclaim_expired``): a replica
   that died (``kill -9``, node lost, link cut) leaves its items to the others
   after at most ``lease_s`` plus one round.

With a store of one replica (SQLite) there are no leases and no keeper.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from service.batch.store import Claim
from service.batch.store_thread import StoreThread

log = logging.getLogger("service.batch")


class LeaseKeeper:
    """Renews this replica's leases and requeues expired ones, every ``lease_s / 3``."""

    def __init__(self, db: StoreThread, lease_s: float, uploads: set[str]) -> None:
        self.db, self.lease_s, self.uploads = db, lease_s, uploads
        self.period_s = lease_s / 3
        self._last = 0.0
        self.lost = 0  # claims given up because another replica took them over
        self.reclaimed = 0  # expired leases (any replica's) requeued by this one

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.period_s

    def wait_s(self) -> float:
        """Seconds until the next round is due."""
        return max(0.0, self._last + self.period_s - time.monotonic())

    async def round(self, claims: Iterable[Claim], give_up: Callable[[Claim], bool]) -> None:
        """Renew ``claims`` and this replica's uploads; ``give_up(claim)`` for each one the store no
        longer has as ours (True: a run was aborted); requeue expired leases. Raises StoreUnavailable
        (the worker backs off) with the round still due."""
        lost: list[Claim] = await self.db("renew", list(claims), sorted(self.uploads))
        for claim in lost:
            if give_up(claim):
                log.warning("batch item %s/%s (attempt %d): lease lost to another replica; aborted here",
                            claim.job_id, claim.custom_id, claim.attempt)
                self.lost += 1
        n: int = await self.db("reclaim_expired")
        if n:
            log.info("batch: %d items whose lease ran out (their replica is gone) are queued again", n)
        self.reclaimed += n
        self._last = time.monotonic()
