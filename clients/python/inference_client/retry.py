"""Client-side retries: exponential backoff with jitter, honouring server hints.

Only UNAVAILABLE and RESOURCE_EXHAUSTED are retried (configurable); never
INVALID_ARGUMENT or any other code, since repeating a rejected request cannot
help. When the server attaches a hint — trailing metadata ``retry-after-ms`` or
"retry after N ms" in the message — the wait is at least that long.

The retry budget is bounded by both ``max_attempts`` and the call's deadline:
a wait that would end past the deadline is not started, and the last error is
raised instead.

Retries apply to unary calls (:func:`call_with_retry`, :func:`acall_with_retry`)
and to Generate streams (see ``_mux.py``): a stream that failed before any
response, a request refused before any of its tokens, and a request that a
replica going away ("draining", "engine_failed") ended before any of its
tokens, which moves to a new stream (another replica).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from .errors import (
    ELSEWHERE_REASONS,
    InferenceError,
    hint_from_message,
    hint_from_metadata,
    reason_from_metadata,
    rpc_error_parts,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before trying again.

    ``max_attempts`` counts the first try (1 disables retries). Without a server
    hint, attempt n waits ``min(max_backoff, initial_backoff * multiplier**(n-1))``
    scaled by a random factor in ``[1 - jitter, 1 + jitter]``. With a hint of h
    seconds the wait is ``h * [1, 1 + jitter]`` (never shorter than the hint).
    """

    max_attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.2
    retryable_codes: frozenset[grpc.StatusCode] = RETRYABLE_CODES

    def delay(self, code: grpc.StatusCode, attempt: int, hint: float | None = None) -> float | None:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), or None to give up."""
        if code not in self.retryable_codes or attempt >= self.max_attempts:
            return None
        if hint is not None:
            return hint * random.uniform(1.0, 1.0 + self.jitter)
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return base * random.uniform(1.0 - self.jitter, 1.0 + self.jitter)


NO_RETRY = RetryPolicy(max_attempts=1)


class Deadline:
    """An absolute deadline from a relative timeout (None = no deadline)."""

    def __init__(self, timeout: float | None) -> None:
        self.at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        """Seconds left (may be <= 0), or None without a deadline."""
        return None if self.at is None else self.at - time.monotonic()

    def allows(self, wait: float) -> bool:
        """True if waiting ``wait`` seconds still leaves time for another attempt."""
        left = self.remaining()
        return left is None or wait < left

    def check(self, attempts: int) -> float | None:
        """The timeout for the next attempt; raises DEADLINE_EXCEEDED if none is left."""
        left = self.remaining()
        if left is not None and left <= 0:
            raise InferenceError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "client deadline exceeded", attempts=attempts
            )
        return left


def retry_delay(exc: grpc.RpcError, policy: RetryPolicy, attempt: int, deadline: Deadline) -> float | None:
    """How long to wait before retrying after ``exc``, or None to give up.

    NOTE: a replica that is going away (reason "draining" or "engine_failed") hints how long
    to wait before asking *it* again; the retry goes to another replica, so the hint is not
    used and the policy's own (short) backoff applies.
    """
    code, message, trailers = rpc_error_parts(exc)
    hint = hint_from_metadata(trailers)
    if hint is None:
        hint = hint_from_message(message)
    if reason_from_metadata(trailers) in ELSEWHERE_REASONS:
        hint = None
    wait = policy.delay(code, attempt, hint)
    if wait is None or not deadline.allows(wait):
        return None
    log.debug("attempt %d failed with %s; retrying in %.3fs", attempt, code.name, wait)
    return wait


def call_with_retry(fn: Callable[[float | None], T], policy: RetryPolicy, timeout: float | None) -> T:
    """Call ``fn(timeout_for_this_attempt)`` until it succeeds or retrying must stop.

    Raises:
        InferenceError: the last failure (``attempts`` tells how many were made).
    """
    deadline = Deadline(timeout)
    attempt = 1
    while True:
        try:
            return fn(deadline.check(attempt - 1))
        except grpc.RpcError as exc:
            wait = retry_delay(exc, policy, attempt, deadline)
            if wait is None:
                raise InferenceError.from_rpc_error(exc, attempts=attempt) from None
        time.sleep(wait)
        attempt += 1


async def acall_with_retry(
    fn: Callable[[float | None], Awaitable[T]], policy: RetryPolicy, timeout: float | None
) -> T:
    """Asyncio flavour of :func:`call_with_retry`."""
    deadline = Deadline(timeout)
    attempt = 1
    while True:
        try:
            return await fn(deadline.check(attempt - 1))
        except grpc.RpcError as exc:
            wait = retry_delay(exc, policy, attempt, deadline)
            if wait is None:
                raise InferenceError.from_rpc_error(exc, attempts=attempt) from None
        await asyncio.sleep(wait)
        attempt += 1
