"""Versioned schema migrations, shared by both batch stores (``sqlite_schema``, ``pg_schema``).

A migration is ``(version, statements)``; versions only grow and a released
migration is never edited (a change is a new version). ``apply`` runs the
missing ones in order, inside the caller's transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("service.batch")
Migrations = tuple[tuple[int, tuple[str, ...]], ...]


def apply(migrations: Migrations, current: int, execute: Callable[[str], Any],
          done: Callable[[int], Any] = lambda version: None) -> int:
    """Run every migration past ``current`` through ``execute`` (``done(version)`` after each); the version
    after. A database newer than the last migration known here is logged and left as it is (a replica of an
    older release during a rolling upgrade goes on: migrations only add)."""
    latest = migrations[-1][0]
    if current > latest:
        log.warning("batch store schema is version %d, newer than this server's %d", current, latest)
    for version, statements in migrations:
        if version <= current:
            continue
        for sql in statements:
            execute(sql)
        done(version)
        log.info("batch store schema migrated to version %d", version)
        current = version
    return current
