"""JSON objects whose keys are unique: the ``json.loads`` hook that refuses a key given twice.

NOTE: plain ``json.loads`` keeps the last of two same-named keys without a word; a document
that is checked (a generated one against its schema, a tenants file) must refuse them instead.
Each caller turns ``DuplicateKeyError`` (a ``ValueError``) into its own error.
"""

from __future__ import annotations

from typing import Any


class DuplicateKeyError(ValueError):
    """An object of the document gives ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads(text, object_pairs_hook=unique_keys)``: a key given twice raises ``DuplicateKeyError``,
    it does not mean "the last one wins"."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out
