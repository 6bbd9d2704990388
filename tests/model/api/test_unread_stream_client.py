"""Backpressure against a real client process that stops reading (tests/support/stop_reading_client.py).

The client (the Python library, which acknowledges what it reads) reads READ_FIRST events and stops.
The server must pause the stream's requests once --stream-backlog messages are unread *by the client*
(not merely taken by the transport, whose HTTP/2 windows hold megabytes), resume them when it reads
again, and cancel them once the stream stayed paused for --stream-stall-timeout-s.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import RunningServer, assert_kv_clean, start_server

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[3]
BACKLOG = 64
READ_FIRST = 32  # a multiple of the client's acknowledgement interval (16)
# NOTE: enough tokens that the stream pauses (BACKLOG unread of READ_FIRST + BACKLOG produced, plus what the
# engine makes before the pause reaches it) long before any request could finish: 4 x 128 messages.
REQUESTS, MAX_TOKENS = 4, 128
PAUSED = re.compile(r"Generate stream paused: produced (\d+), written (\d+), read (\d+) \(acks True\)")


def wait_for(cond: Callable[[], bool], timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met before the deadline"
        time.sleep(0.02)


class StopReadingClient:
    """The client process: started, it reads READ_FIRST events and stops; ``resume()`` reads the rest."""

    def __init__(self, target: str) -> None:
        args = [target, str(REQUESTS), str(MAX_TOKENS), str(READ_FIRST)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.stop_reading_client", *args],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == f"stopped {READ_FIRST}"

    def resume(self) -> dict[str, Any]:
        out, _ = self.proc.communicate("go\n", timeout=600)
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def all_paused(srv: RunningServer) -> bool:
    """The stream's requests are all there and none may run (the engine idles with work left)."""
    sched = srv.engine.scheduler
    seqs = sched.running + sched.waiting
    return len(seqs) == REQUESTS and all(s.paused for s in seqs) and not sched.has_runnable()


def paused_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any(PAUSED.search(r.getMessage()) for r in caplog.records)


def paused_at(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    """(messages produced, messages read by the client) when the stream paused, from the server's log."""
    found = [PAUSED.search(r.getMessage()) for r in caplog.records]
    produced, _written, read = (int(x) for x in next(m for m in found if m is not None).groups())
    return produced, read


@pytest.fixture()
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="service.rpc"):
        yield caplog


def test_stream_pauses_at_the_backlog_the_client_has_not_read_and_resumes_when_it_reads(
    logs: pytest.LogCaptureFixture,
) -> None:
    srv = start_server(stream_backlog=BACKLOG, stream_stall_timeout_s=600.0)
    client = None
    try:
        client = StopReadingClient(srv.target)
        wait_for(lambda: all_paused(srv))
        produced, read = paused_at(logs)
        # NOTE: acknowledgements travel on their own: under load the server may pause before the last
        # ones arrive (seen: 16 of 32 at load 6), so only the bounds are certain.
        assert 0 < read <= READ_FIRST
        assert produced - read == BACKLOG  # paused exactly at --stream-backlog messages the client has not read
        result = client.resume()
        assert result["finals"] == {
            rid: {"kind": "done", "completion_tokens": MAX_TOKENS} for rid in result["finals"]
        } and len(result["finals"]) == REQUESTS
        assert_kv_clean(srv)
    finally:
        if client is not None:
            client.kill()
        srv.close()


def test_stream_paused_past_the_stall_timeout_has_its_requests_cancelled(logs: pytest.LogCaptureFixture) -> None:
    srv = start_server(stream_backlog=BACKLOG, stream_stall_timeout_s=3.0)
    client = None
    try:
        client = StopReadingClient(srv.target)
        # NOTE: the log line, not all_paused(): the stall timer may end the paused requests before a
        # poll on a busy machine sees them (the test above checks the pause itself).
        wait_for(lambda: paused_logged(logs))
        produced, _read = paused_at(logs)
        wait_for(lambda: not srv.engine.scheduler.has_work())  # cancelled by the stall timer
        result = client.resume()
        finals = result["finals"]
        assert len(finals) == REQUESTS and all(
            f["kind"] == "error" and f["status"] == "CANCELLED" and "did not read its stream for 3 s" in f["message"]
            for f in finals.values()
        ), finals
        # after the pause: at least the cancellations; at most what READ_FIRST acknowledged messages
        # allow (the client read no more), what the engine had already made when the pause reached it,
        # and the cancellations. The pause goes to the engine through its inbox, read at the top of a
        # step, so what was already made is at most: the rest of the step whose delta crossed the backlog
        # (up to REQUESTS - 1: the stream counts one message at a time), the step running when the pause
        # was posted, and one more step started before the event loop got to the crossing delta (the loop
        # may lag the engine by a step on a loaded machine); one delta per request per step.
        # NOTE: not `produced + 2 * REQUESTS` below: an acknowledgement that arrives after the first pause
        # (seen under load: paused at 16 read of 32) lets the stream run on before the stall timer fires.
        # Above: CI saw 106 = 96 + 2 (rest of the step) + 4 (the running step) + 4 (cancellations).
        most = READ_FIRST + BACKLOG + (REQUESTS - 1) + 2 * REQUESTS + REQUESTS
        assert produced + REQUESTS <= result["read"] <= most
        assert_kv_clean(srv)
    finally:
        if client is not None:
            client.kill()
        srv.close()
