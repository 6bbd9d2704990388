"""No duplicate object keys in generated JSON: a per-sequence guard on top of the grammar mask.

llguidance's JSON grammar lets a key that is already present in an object be
written again (through ``additionalProperties``, which defaults to true). The
grammar cannot express "a key not used yet", so this guard tracks the document
as it is generated and, while an object key is being written, bans every
token that would close the key string on a key already present in that object.
The guard acts on sampled tokens only: budget-aware completion writes its
tokens without sampling, so its search (``service.grammar.completion``) keeps
the same rule on its own ``JsonScan`` (never a quote that repeats a key), and
the guard is fed every appended token, forced ones included.

The scan works on the raw JSON bytes (keys are compared as written, escapes
included); the final ``jsonschema`` validation remains the last safety net for
a duplicate spelled with different escapes.

Engine thread only; pure Python apart from one vectorised pre-filter per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

QUOTE, BACKSLASH = 0x22, 0x5C


class KeyVocab:
    """Per-model data shared by every guard: token bytes and the ids of tokens containing a quote."""

    def __init__(self, token_bytes: Sequence[bytes]) -> None:
        self.token_bytes = token_bytes
        self.quote_ids = np.asarray([t for t, b in enumerate(token_bytes) if b'"' in b], dtype=np.int64)


@dataclass
class JsonScan:
    """The scanner state; copied to try a token without committing it."""

    stack: list[set[bytes] | None] = field(default_factory=list)  # set: an object's keys; None: array
    expect_key: bool = False  # in an object, before a key
    in_string: bool = False
    is_key: bool = False
    escape: bool = False
    buf: bytearray = field(default_factory=bytearray)

    def copy(self) -> JsonScan:
        # NOTE: the stack's sets are shared, not copied: only for a trial that never records a
        # key (``KeyGuard._repeats`` stops at the first closed key). A copy that goes on reading
        # (``feed``) must be a ``deep_copy``, or its keys would appear in the original's objects.
        return JsonScan(
            list(self.stack), self.expect_key, self.in_string, self.is_key, self.escape, bytearray(self.buf)
        )

    def deep_copy(self) -> JsonScan:
        """An independent copy, the objects' key sets included (for a copy that records keys)."""
        return JsonScan(
            [None if keys is None else set(keys) for keys in self.stack],
            self.expect_key,
            self.in_string,
            self.is_key,
            self.escape,
            bytearray(self.buf),
        )

    def feed(self, data: bytes) -> None:
        """Advance over ``data``, recording every key it closes in its object."""
        for c in data:
            key = self.step(c)
            if key is not None:
                keys = self.stack[-1] if self.stack else None
                if keys is not None:
                    keys.add(key)

    def quote_repeats_key(self) -> bool:
        """A quote now would close an object key already present in its object."""
        if not (self.in_string and self.is_key and not self.escape and self.stack):
            return False
        keys = self.stack[-1]
        return keys is not None and bytes(self.buf) in keys

    def step(self, c: int) -> bytes | None:
        """Advance by one byte; returns a key when this byte closed one (not yet recorded)."""
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == BACKSLASH:
                self.escape = True
            elif c == QUOTE:
                self.in_string = False
                if self.is_key:
                    return bytes(self.buf)
                return None
            if self.is_key:
                self.buf.append(c)
            return None
        if c == QUOTE:
            self.in_string, self.escape = True, False
            self.is_key = bool(self.stack) and self.stack[-1] is not None and self.expect_key
            self.buf.clear()
        elif c == 0x7B:  # {
            self.stack.append(set())
            self.expect_key = True
        elif c == 0x5B:  # [
            self.stack.append(None)
            self.expect_key = False
        elif c in (0x7D, 0x5D):  # } ]
            if self.stack:
                self.stack.pop()
            self.expect_key = False
        elif c == 0x3A:  # :
            self.expect_key = False
        elif c == 0x2C:  # ,
            self.expect_key = bool(self.stack) and self.stack[-1] is not None
        return None


class KeyGuard:
    """Tracks one generated JSON document; bans tokens that would repeat a key in its object."""

    def __init__(self, vocab: KeyVocab) -> None:
        self.vocab = vocab
        self.scan = JsonScan()

    def feed(self, data: bytes) -> None:
        """The bytes of a token that was appended to the document (sampled or forced, every one)."""
        self.scan.feed(data)

    def _at_key(self) -> bool:
        s = self.scan
        in_object = bool(s.stack) and s.stack[-1] is not None
        return in_object and ((s.in_string and s.is_key) or (not s.in_string and s.expect_key))

    def duplicates(self, row: np.ndarray) -> np.ndarray:
        """Ids of the tokens still allowed in ``row`` that would close a key already in the object."""
        if not self._at_key() or not self.scan.stack[-1] or not len(self.vocab.quote_ids):
            return np.empty(0, dtype=np.int64)
        ids = self.vocab.quote_ids
        allowed = ids[np.isfinite(row[ids])]
        return np.asarray([t for t in allowed if self._repeats(self.vocab.token_bytes[t])], dtype=np.int64)

    def _repeats(self, data: bytes) -> bool:
        trial = self.scan.copy()
        depth = len(trial.stack)
        for c in data:
            key = trial.step(c)
            if key is not None:
                keys = trial.stack[-1] if len(trial.stack) == depth else None
                return keys is not None and key in keys
        return False

    def apply(self, row: np.ndarray) -> int:
        """Ban the duplicate-closing tokens in ``row`` (in place); returns how many were banned.

        Nothing is banned when that would leave no token at all: the grammar then
        has no other way on, and the final validation reports the document.
        """
        bad = self.duplicates(row)
        if len(bad) == 0 or len(bad) >= int(np.count_nonzero(np.isfinite(row))):
            return 0
        row[bad] = -np.inf
        return len(bad)
