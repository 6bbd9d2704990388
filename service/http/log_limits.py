"""Logging that a flood of connections cannot turn into a flood of lines.

* ``LogLimiter``: at most one line per interval for one kind of event; the events in
  between are counted and the count goes into the next line.
* ``limit_accept_errors``: the event loop's exception handler for a failed ``accept()``
  (out of descriptors, ENFILE, ENOBUFS, ENOMEM). NOTE: asyncio reports each such failure
  with a traceback and, on that error, keeps calling ``accept()`` up to the server's accept batch
  (then the listen backlog, 2048; now ``service.http.server.ACCEPT_BATCH``) times per wake-up: with the descriptors gone that was ~2 MB of tracebacks a second
  (issue #35: 45 MB in 20 s). Through here it is one line, without a traceback, every
  ``every_s``, with the count.
* ``limit_invalid_requests``: the same for uvicorn's "Invalid HTTP request received." warning,
  one line per malformed request otherwise.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable
from typing import Any

REPORT_EVERY_S = 10.0
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
UVICORN_INVALID = "Invalid HTTP request received."


class LogLimiter:
    """``note(...)`` logs at most once per ``every_s`` (the first event at once); the events it did
    not log are counted and reported with the next line it logs."""

    def __init__(self, log: logging.Logger, every_s: float = REPORT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.every_s, self.clock = log, every_s, clock
        self.last = -float("inf")
        self.held = 0  # events since the last line
        self.total = 0

    def due(self) -> int | None:
        """Count one event; when a line is due now, the events it reports (this one included), else None."""
        self.total += 1
        self.held += 1
        now = self.clock()
        if now - self.last < self.every_s:
            return None
        held, self.last, self.held = self.held, now, 0
        return held

    def note(self, message: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Count one event and log ``message`` (with the count) if a line is due; True when logged."""
        held = self.due()
        if held is None:
            return False
        self.log.log(level, message + " (%d such events since the last report)", *args, held)
        return True


def limit_accept_errors(loop: asyncio.AbstractEventLoop, log: logging.Logger) -> LogLimiter:
    """Put ``accept()`` resource errors of ``loop`` through a ``LogLimiter``; any other report goes
    to the handler that was there (or asyncio's default). Returns the limiter (its ``total`` counts)."""
    previous = loop.get_exception_handler()
    limiter = LogLimiter(log)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS and "accept" in context.get("message", ""):
            limiter.note("accept() failed: %s; new connections wait in the listen backlog", exc.strerror)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return limiter


class _InvalidRequestFilter(logging.Filter):
    """Lets through at most one "Invalid HTTP request received." per interval, with the count."""

    def __init__(self) -> None:
        super().__init__()
        self.limiter = LogLimiter(logging.getLogger("uvicorn.error"))

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != UVICORN_INVALID:
            return True
        held = self.limiter.due()
        if held is None:
            return False
        record.msg, record.args = UVICORN_INVALID + " (%d such requests since the last report)", (held,)
        return True


def limit_invalid_requests() -> None:
    """Install the filter on uvicorn's logger once per process (idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _InvalidRequestFilter) for f in logger.filters):
        logger.addFilter(_InvalidRequestFilter())
