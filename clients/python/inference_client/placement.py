"""Sticky homes for prefix keys, balanced by how many keys each replica holds.

Pure logic, no I/O. The ring (``ring.py``) alone balances *load* but not the
*working set*: with a few dozen system prompts over three replicas, hashing
routinely gives one replica three times the prompts of another (32 keys seen
here as 15 / 12 / 5). The crowded replica's prefix cache overflows, its
requests spill to the bound, and every spilled request evicts someone else's
prompt on the replica that takes it.

:class:`HomeTable` remembers a home per key. A key seen for the first time
goes to whichever of its first two ring choices holds fewer keys ("the power
of two choices", Azar et al. 1994), or, when both hold more than 1.1 x the mean,
to the next replica clockwise under that bound. The keys per replica then stay
within a key or two of the mean instead of spreading with the square root of
the key count. Each request then goes to its key's home unless the home is over the
ring's load bound, in which case it walks the ring as before. The key's other
choice comes first in that walk, so a spilled prompt keeps landing on the same
second replica.

NOTE: homes are per client. Two client processes that see keys in a different
order may give a key different homes, but (unless both of its choices are
crowded) one of its two ring choices, so a prefix is usually cached on at most
two replicas across all clients.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict
from collections.abc import Mapping

from .ring import HashRing

CHOICES = 2
# a key's two choices may both be crowded (three replicas give only three pairs): then the ring walks on
KEY_EPSILON = 0.1


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


class HomeTable:
    """An LRU map from prefix keys to home backends, with per-backend key counts.

    Args:
        max_keys: most keys remembered; the least recently used is forgotten first.
    """

    def __init__(self, max_keys: int = 4096) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self.max_keys = max_keys
        self._homes: OrderedDict[bytes, str] = OrderedDict()
        self.keys_per_backend: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._homes)

    def home(self, ring: HashRing, key: bytes) -> str:
        """The home of ``key`` on ``ring``: the remembered one while it is still valid, else placed now.

        Raises ``LookupError`` on an empty ring.
        """
        choices = ring.preference(key)[:CHOICES]
        if not choices:
            raise LookupError("no backends on the ring")
        digest = _digest(key)
        home = self._homes.get(digest)
        if home is not None and self._still_home(ring, home, choices):
            self._homes.move_to_end(digest)
            return home
        # NOTE: ties go to the ring's first choice, so an empty table behaves exactly like the ring
        best = min(choices, key=lambda b: (self.keys_per_backend[b], choices.index(b)))
        cap = self._key_cap(ring)
        if self.keys_per_backend[best] + 1 > cap:
            best = next(b for b in ring.preference(key) if self.keys_per_backend[b] + 1 <= cap)
        self._set(digest, best)
        return best

    def _still_home(self, ring: HashRing, home: str, choices: list[str]) -> bool:
        """A home stays while it is one of the key's two choices, or those are still both full."""
        if home in choices:
            return True
        cap = self._key_cap(ring)
        return home in ring.backends and all(self.keys_per_backend[c] + 1 > cap for c in choices)

    def _key_cap(self, ring: HashRing) -> int:
        known = sum(self.keys_per_backend[b] for b in ring.backends)
        return math.ceil((1 + KEY_EPSILON) * (known + 1) / len(ring))

    def pick(self, ring: HashRing, key: bytes, loads: Mapping[str, int]) -> str:
        """The backend for one request: the key's home unless it is over the ring's load bound.

        Over the bound, the first backend under it in the key's ring order (the
        home excluded); some backend always is, see :meth:`HashRing.capacity`.
        """
        home = self.home(ring, key)
        cap = ring.capacity(loads)
        if loads.get(home, 0) + 1 <= cap:
            return home
        for backend in ring.preference(key):
            if backend != home and loads.get(backend, 0) + 1 <= cap:
                return backend
        return home

    def forget_backend(self, backend: str) -> None:
        """Drop every key homed on ``backend`` (it left); they are placed again on next use."""
        gone = [d for d, b in self._homes.items() if b == backend]
        for d in gone:
            del self._homes[d]
        self.keys_per_backend.pop(backend, None)

    def _set(self, digest: bytes, backend: str) -> None:
        old = self._homes.pop(digest, None)
        if old is not None:
            self.keys_per_backend[old] -= 1
        self._homes[digest] = backend
        self.keys_per_backend[backend] += 1
        while len(self._homes) > self.max_keys:
            _, evicted = self._homes.popitem(last=False)
            self.keys_per_backend[evicted] -= 1
