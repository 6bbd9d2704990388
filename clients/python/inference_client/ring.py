"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018).

Pure logic, no I/O. Each backend owns ``vnodes`` points on a 64-bit ring. A key
hashes to a point; its preferred backend is the owner of the next point
clockwise. With loads, the key walks clockwise past every backend that is
already at capacity::

    capacity = ceil((1 + epsilon) * (total_in_flight + 1) / n_backends)

(the "+ 1" counts the request being placed), so no backend ever exceeds
``(1 + epsilon)`` times the mean by more than one request, and some backend
always has room. Adding or removing a backend moves only the keys whose
preferred owner changes: those of the removed backend, or those the new one
takes over (about ``1/n`` of them).

:func:`prefix_key` turns a request into a key: the first ``k_tokens`` worth of
its prompt text, or its system message, so requests sharing a prefix (and so a
prefix-cache entry on the server) map to one replica.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# NOTE: the client has no tokenizer; ~4 characters of English text per token is the usual figure.
CHARS_PER_TOKEN = 4


def hash64(data: bytes) -> int:
    """A stable 64-bit hash (the same in every process, unlike ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """A consistent-hash ring of backend names with bounded-load picks.

    Args:
        backends: initial backend names (e.g. "127.0.0.1:50051").
        epsilon: allowed overload over the mean (> 0); 0.25 lets a backend hold 25% more than the mean.
        vnodes: points per backend (more points, more even key spread).
    """

    def __init__(self, backends: Iterable[str] = (), *, epsilon: float = 0.25, vnodes: int = 160) -> None:
        if epsilon <= 0:
            raise ValueError("epsilon must be > 0")
        if vnodes < 1:
            raise ValueError("vnodes must be >= 1")
        self.epsilon = epsilon
        self.vnodes = vnodes
        self._points: list[int] = []
        self._owners: list[str] = []
        self._backends: set[str] = set()
        for b in backends:
            self.add(b)

    @property
    def backends(self) -> frozenset[str]:
        return frozenset(self._backends)

    def __len__(self) -> int:
        return len(self._backends)

    def add(self, backend: str) -> None:
        """Put ``backend`` on the ring (no-op if present)."""
        if backend in self._backends:
            return
        self._backends.add(backend)
        for i in range(self.vnodes):
            point = hash64(f"{backend}#{i}".encode())
            at = bisect.bisect_left(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, backend)

    def remove(self, backend: str) -> None:
        """Take ``backend`` off the ring (no-op if absent); only its keys move."""
        if backend not in self._backends:
            return
        self._backends.discard(backend)
        keep = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != backend]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]

    def preference(self, key: bytes) -> list[str]:
        """Every backend, in the order a key visits them clockwise (first = its preferred owner)."""
        if not self._points:
            return []
        start = bisect.bisect_right(self._points, hash64(key))
        order: list[str] = []
        seen: set[str] = set()
        n = len(self._points)
        for i in range(n):
            owner = self._owners[(start + i) % n]
            if owner not in seen:
                seen.add(owner)
                order.append(owner)
                if len(order) == len(self._backends):
                    break
        return order

    def capacity(self, loads: Mapping[str, int]) -> int:
        """Most requests a backend may hold after placing one more (the bound above)."""
        total = sum(loads.get(b, 0) for b in self._backends)
        return math.ceil((1 + self.epsilon) * (total + 1) / len(self._backends))

    def pick(self, key: bytes, loads: Mapping[str, int] | None = None) -> str:
        """The backend for ``key``: the first clockwise whose load is under capacity.

        ``loads`` maps backends to their in-flight requests (missing = 0); without it,
        the preferred owner. Raises ``LookupError`` on an empty ring.
        """
        order = self.preference(key)
        if not order:
            raise LookupError("no backends on the ring")
        if loads is None:
            return order[0]
        cap = self.capacity(loads)
        for backend in order:
            if loads.get(backend, 0) + 1 <= cap:
                return backend
        return order[0]  # unreachable: the least loaded backend is always under capacity


def _role_content(m: Any) -> tuple[str, str]:
    if isinstance(m, Mapping):
        return str(m.get("role", "")), str(m.get("content", ""))
    if isinstance(m, tuple):
        return str(m[0]), str(m[1])
    return str(getattr(m, "role", "")), str(getattr(m, "content", ""))


def prefix_key(
    prompt: str | None = None, messages: Sequence[Any] | None = None, *, k_tokens: int = 64
) -> bytes:
    """The affinity key of a request: its system message, else the first ``k_tokens`` worth of text.

    ``messages`` items are dicts, ``(role, content)`` tuples or ``ChatMessage``s.
    A prompt (or a chat without a system message) is keyed by its first
    ``k_tokens * CHARS_PER_TOKEN`` characters, so requests that share at least
    that much of a prefix share a key.
    """
    limit = max(1, k_tokens) * CHARS_PER_TOKEN
    if messages:
        pairs = [_role_content(m) for m in messages]
        for role, content in pairs:
            if role == "system":
                return ("system:" + content[:limit]).encode()
        return ("chat:" + "".join(c for _, c in pairs)[:limit]).encode()
    return ("prompt:" + (prompt or "")[:limit]).encode()
