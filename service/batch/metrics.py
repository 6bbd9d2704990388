"""The batch service's OpenTelemetry instruments (``observe_batches``).

Gauges: ``inference.batch.jobs{state}``, ``inference.batch.items{item_state}``
(the store-wide backlog: with a shared store, every replica reports the same
figures), ``inference.batch.items_per_second`` (this replica's worker) and
``inference.batch.store_up`` (1 while the store answers, 0 while it does not:
the database is down or unreachable, BatchService answers UNAVAILABLE).

Counters: ``inference.batch.store_errors`` (calls that found the store
unavailable), ``inference.batch.store_calls{op}`` and
``inference.batch.store_time{op}`` (seconds spent in the store per method, on
its thread: the database's share of an item's time), and with a shared store
``inference.batch.leases_lost`` / ``inference.batch.leases_reclaimed``.

NOTE: the job and backlog gauges read the store on the exporter's thread;
while the store is down they report nothing rather than block the scrape.
"""

from __future__ import annotations

from typing import Any, Protocol

from service.batch.leases import LeaseKeeper
from service.batch.store import StoreUnavailable
from service.batch.store_thread import StoreThread

ITEMS = ("queued_items", "running_items")


class RateSource(Protocol):
    def rate(self) -> float: ...


def observe_batches(meter: Any, db: StoreThread, worker: RateSource, leases: LeaseKeeper | None = None) -> None:
    """Register the batch instruments on ``meter``; see the module docstring."""
    from opentelemetry.metrics import CallbackOptions, Observation

    def counts() -> dict[str, int]:
        if db.store is None or not db.up:
            return {}
        try:
            return db.store.state_counts()
        except StoreUnavailable:
            return {}

    def jobs(_options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {"state": state}) for state, n in counts().items() if state not in ITEMS]

    def backlog(_options: CallbackOptions) -> list[Observation]:
        found = counts()
        return [Observation(found[k], {"item_state": k.removesuffix("_items")}) for k in ITEMS if k in found]

    meter.create_observable_gauge("inference.batch.jobs", [jobs], description="batch jobs by state")
    meter.create_observable_gauge("inference.batch.items", [backlog], description="items of open batch jobs by state")
    meter.create_observable_gauge(
        "inference.batch.items_per_second", [lambda _o: [Observation(worker.rate())]], unit="1/s",
        description="batch items finished per second (last 10 s)",
    )
    meter.create_observable_gauge(
        "inference.batch.store_up", [lambda _o: [Observation(1 if db.up else 0)]],
        description="1 while the batch job store answers, 0 while BatchService answers UNAVAILABLE",
    )
    _store_counters(meter, db, Observation)
    if leases is not None:
        meter.create_observable_counter(
            "inference.batch.leases_lost", [lambda _o: [Observation(leases.lost)]],
            description="item runs aborted because another replica took over their expired lease",
        )
        meter.create_observable_counter(
            "inference.batch.leases_reclaimed", [lambda _o: [Observation(leases.reclaimed)]],
            description="expired leases (of any replica) this replica put back in the queue",
        )


def _store_counters(meter: Any, db: StoreThread, observation: Any) -> None:
    meter.create_observable_counter(
        "inference.batch.store_errors", [lambda _o: [observation(db.errors)]],
        description="batch store calls that found the store unavailable",
    )
    meter.create_observable_counter(
        "inference.batch.store_calls", [lambda _o: [observation(n, {"op": op}) for op, (n, _) in db.stats().items()]],
        description="batch store calls by method",
    )
    meter.create_observable_counter(
        "inference.batch.store_time",
        [lambda _o: [observation(s, {"op": op}) for op, (_, s) in db.stats().items()]],
        unit="s", description="time spent in batch store calls by method (on the store thread)",
    )
