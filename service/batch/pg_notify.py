"""Wake-ups between replicas: ``LISTEN`` on one connection, waiters woken per job id.

The store NOTIFYs its channel with a job id inside every transaction that
changes the job; PostgreSQL delivers it when (and only if) that transaction
commits, to every listening session of the database, the sender's included.

``ChangeListener`` owns one connection outside the pool (a LISTENing session must
stay the same session) and a daemon thread that reads notifications and wakes
``wait`` callers. It starts on the first ``wait``/``mark``.

NOTE: notifications are a latency optimisation, never the source of truth:
one sent while the listener is reconnecting is lost, so a waiter always gets a
timeout and then re-reads the store (polling is the fallback, by design).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from service.batch.pg_base import CONNECT_KWARGS
from service.batch.shared_store import WORK

log = logging.getLogger("service.batch")
MAX_TRACKED_JOBS = 10_000
POLL_S = 0.5  # how often the reader thread checks for stop()
RECONNECT_S = (0.5, 10.0)  # first and longest wait before reconnecting


class ChangeListener:
    """``wait(job_id, timeout)`` returns when a NOTIFY for that job (any job: None) arrives."""

    def __init__(self, dsn: str, channel: str) -> None:
        self.dsn, self.channel = dsn, channel
        self.connected = False
        self._cond = threading.Condition()
        self._seq = 0  # notifications seen
        self._last: collections.OrderedDict[str, int] = collections.OrderedDict()  # job id -> its last seq
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._callbacks: list[Callable[[str], None]] = []

    def start(self, ready_timeout: float = 5.0) -> None:
        """Start listening (once); waits up to ``ready_timeout`` for LISTEN to be in place."""
        with self._cond:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="batch-listen", daemon=True)
                self._thread.start()
        self._ready.wait(ready_timeout)

    def subscribe(self, callback: Callable[[str], None]) -> None:
        """``callback(payload)`` for every notification from now on (on the reader thread)."""
        with self._cond:
            self._callbacks.append(callback)
        self.start()

    def mark(self) -> int:
        self.start()
        with self._cond:
            return self._seq

    def wait(self, job_id: str | None, timeout: float, since: int | None = None) -> bool:
        """True when a change of ``job_id`` (any job: None) arrived after mark ``since`` (default: now)."""
        self.start()
        deadline = time.monotonic() + timeout
        with self._cond:
            since = self._seq if since is None else since
            while True:
                last = self._seq if job_id is None else self._last.get(job_id, 0)
                if last > since:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._cond.wait(left)

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=POLL_S * 4)

    def _seen(self, job_id: str) -> None:
        with self._cond:
            self._seq += 1
            self._last[job_id] = self._seq
            self._last.move_to_end(job_id)
            while len(self._last) > MAX_TRACKED_JOBS:
                self._last.popitem(last=False)
            self._cond.notify_all()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(job_id)
            except Exception:  # NOTE: a subscriber's bug must not stop the wake-ups of the others
                log.exception("batch change callback failed")

    def _run(self) -> None:
        backoff, outage = RECONNECT_S[0], False
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, **CONNECT_KWARGS) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.connected, backoff = True, RECONNECT_S[0]
                    self._ready.set()
                    if outage:  # NOTE: changes sent meanwhile were lost: wake the workers to re-read
                        self._seen(WORK)
                        log.info("batch store notifications are back")
                    outage = False
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=POLL_S):
                            self._seen(note.payload)
            except psycopg.Error as exc:
                if not outage:  # NOTE: once per outage, not per reconnect attempt
                    log.warning("batch store notifications down (%s); polling until they are back", exc)
                outage = True
            finally:
                self.connected = False
            self._ready.set()  # waiters poll meanwhile
            self._stop.wait(backoff)
            backoff = min(backoff * 2, RECONNECT_S[1])
