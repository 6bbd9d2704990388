"""The batch-job store interface (``JobStore``) and its records.

A job is a row of options and a state; its items are rows of (custom_id, the
serialized request, a state, and once finished a result). Implementations:
``service.batch.sqlite_store.SqliteJobStore`` (embedded, the default) and
``service.batch.postgres_store.PostgresJobStore`` (shared by replicas; its extra
contract is ``service.batch.shared_store``). tests/unit/batch/test_batch_store.py
holds the contract every implementation must pass.

Contract (every implementation):

* every method that changes state has committed the change when it returns
  (callers acknowledge only after that);
* a job is visible only to its tenant (``get_job``/``cancel_job``/``results``
  answer None/empty for another tenant's job);
* an item has exactly one row, hence exactly one result; ``finish`` records a
  result only for the claim that is current (the item is running and its
  attempt number matches), so a stale run can never overwrite or duplicate one;
* ``claim`` moves items queued -> running (attempt + 1) before the caller
  starts them; ``recover`` (at start-up) moves every running item back to
  queued: a crash re-runs an item from scratch, never loses it (a shared store:
  every item this replica ran, and those whose lease ran out);
* times come from the store's ``clock`` (wall-clock seconds), so tests can
  drive expiry and retention with a fake clock.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum

from service.request.errors import Unavailable


class StoreUnavailable(Unavailable):
    """The store cannot be reached now (database down, link cut, no pooled connection in time).

    A call that raises it may or may not have committed (a commit whose answer was
    lost): callers retry later and rely on the contract (a stale claim records
    nothing, an idempotency key makes one job), never on the call having failed.
    """

    public_message = "the batch job store is unavailable; retry later"


class JobState(StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.EXPIRED})


class ItemState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


DEFAULT_WINDOW_S = 24 * 3600
MAX_ERRORS_SHOWN = 100


@dataclass(frozen=True)
class JobSpec:
    """What the caller asked for (BatchOptions) plus its tenant."""

    tenant: str
    display_name: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    completion_window_s: int = DEFAULT_WINDOW_S
    priority: int = 0  # 0: batch class, 1: interactive class (started first)
    idempotency_key: str = ""
    trace: str = ""  # "<trace_id>-<span_id>" (hex) of the CreateBatch span: item spans link to it


@dataclass(frozen=True)
class ItemError:
    """A problem with one uploaded item (line is 1-based)."""

    line: int
    custom_id: str
    status: str
    message: str


@dataclass(frozen=True)
class NewItem:
    """An uploaded item: ``request`` is opaque bytes; ``error`` set = stored as a failed item."""

    custom_id: str
    line: int
    request: bytes
    sort_key: bytes = b""  # items of a job start in sort_key order (shared prompt prefixes together)
    error: ItemError | None = None


@dataclass
class Counts:
    total: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    running: int = 0
    queued: int = 0


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, those of reasoning models' thoughts


@dataclass
class Job:
    """A job as stored; ``times`` maps a JobState value to when the job entered it."""

    id: str
    spec: JobSpec
    state: JobState
    times: dict[str, float]
    expires_at: float
    delete_at: float | None = None
    counts: Counts = field(default_factory=Counts)
    usage: Usage = field(default_factory=Usage)
    errors: list[ItemError] = field(default_factory=list)
    error_count: int = 0
    failure: str = ""


def job_cursor(job: Job) -> str:
    """The ``list_jobs`` page token that continues after ``job`` (every store's: its creation time and id)."""
    return f"{job.times[JobState.VALIDATING.value]!r}|{job.id}"


@dataclass(frozen=True)
class Claim:
    """An item handed to a runner: it is RUNNING in the store with this ``attempt``."""

    job_id: str
    custom_id: str
    tenant: str
    request: bytes
    attempt: int
    trace: str = ""  # the job's JobSpec.trace


@dataclass(frozen=True)
class ItemResult:
    """The outcome of one item: text and counts, or an error (status name + message). For a reasoning model's
    chat ``text`` is the answer alone and ``reasoning`` its thought (``reasoning_tokens`` of the completion
    tokens, its markers included), "" when it wrote none; None: the output was not read for a thought
    (another model or item, or a result stored before the thought was kept apart)."""

    text: str = ""
    finish_reason: str = ""  # "stop", "length", "cancelled", "closed" (a JSON document closed in budget) or ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    queue_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    error_status: str = ""
    error_message: str = ""
    reasoning: str | None = None
    reasoning_tokens: int = 0


# ItemResult's fields, in order: the result columns of both stores (read back positionally)
RESULT_FIELDS = tuple(f.name for f in fields(ItemResult))


@dataclass(frozen=True)
class StoredResult:
    custom_id: str
    cursor: str
    state: ItemState
    attempts: int
    result: ItemResult


class JobStore(abc.ABC):
    """Durable jobs and items; see the module docstring for the contract."""

    clock: Callable[[], float]
    retention_s: float

    @abc.abstractmethod
    def create_job(self, spec: JobSpec) -> tuple[Job, bool]:
        """A new VALIDATING job, or (existing job, False) when the tenant already used the idempotency key."""

    @abc.abstractmethod
    def add_items(self, job_id: str, items: list[NewItem]) -> list[NewItem]:
        """Store uploaded items (one transaction); returns those refused as duplicate custom_ids."""

    @abc.abstractmethod
    def add_errors(self, job_id: str, errors: list[ItemError]) -> None:
        """Record upload problems that are not items (empty or duplicate custom_id)."""

    @abc.abstractmethod
    def start_job(self, job_id: str) -> Job:
        """End the upload: IN_PROGRESS, or FAILED when no item is runnable (all bad, or none)."""

    @abc.abstractmethod
    def discard_job(self, job_id: str) -> None:
        """Delete a job whose upload broke off (its creator never got its id)."""

    @abc.abstractmethod
    def get_job(self, tenant: str, job_id: str) -> Job | None:
        """The job with counts, usage and errors; None if absent or another tenant's."""

    @abc.abstractmethod
    def list_jobs(self, tenant: str, limit: int, page_token: str = "") -> tuple[list[Job], str]:
        """A page of the tenant's jobs, newest first (no errors), and the next page's token ("" at the end);
        ``job_cursor(job)`` is the token that continues after ``job``."""

    @abc.abstractmethod
    def cancel_job(self, tenant: str, job_id: str) -> Job | None:
        """Queued items -> cancelled; job CANCELLING (running items left) or CANCELLED; a final job is unchanged."""

    @abc.abstractmethod
    def claim(self, limit: int) -> list[Claim]:
        """Up to ``limit`` queued items of IN_PROGRESS jobs, marked RUNNING (attempt + 1) and committed.

        Jobs of the interactive class first, then oldest job first, sharing
        ``limit`` round-robin between jobs; within a job, sort_key then upload order.
        """

    @abc.abstractmethod
    def finish(self, claim: Claim, state: ItemState, result: ItemResult) -> bool:
        """Record the claim's outcome if it is still current; closes the job when it was its last item."""

    @abc.abstractmethod
    def requeue(self, claim: Claim, started: bool = False) -> None:
        """A current claim goes back to queued (the engine refused it, or a drain or an engine failure
        cancelled it: ``started``, which keeps its attempt counted); a stale one is ignored."""

    @abc.abstractmethod
    def recover(self) -> int:
        """Start-up: running items -> queued, broken uploads deleted, CANCELLING jobs closed; returns items requeued."""

    @abc.abstractmethod
    def sweep(self) -> None:
        """Expire jobs past their completion window (queued items cancelled); delete jobs past retention."""

    @abc.abstractmethod
    def stopping_jobs(self) -> dict[str, JobState]:
        """Jobs whose running items must be cancelled (CANCELLING, or EXPIRED with items running) and their state."""

    @abc.abstractmethod
    def results(
        self, tenant: str, job_id: str, by_completion: bool, cursor: str, limit: int
    ) -> list[StoredResult]:
        """Up to ``limit`` finished items after ``cursor``, by custom_id or by completion order."""

    @abc.abstractmethod
    def state_counts(self) -> dict[str, int]:
        """Jobs per state, and the store-wide backlog as ``queued_items`` / ``running_items``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's resources."""
