"""Connection floods against a server process (issue #35 item 3): raw sockets that never finish a request
head or a body, heads too large, more connections than the caps, and descriptors running out.

Each server is ``python -m service`` with small caps and short timeouts given as flags, so every
verdict is a condition waited for under a generous ceiling: the server closes the slow socket,
refuses or reclaims the connections past the cap, answers /health and finishes an admitted stream
meanwhile, gives its descriptors back (``/proc/<pid>/fd``) and logs a bounded number of lines.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import time
from collections.abc import Callable, Iterator

import grpc
import httpx2
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.server import ServerProcess, free_port

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct.Q4_1"
CEILING_S = 30.0  # a generous bound for anything the server should do within a second or two
PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nhost: flood\r\nx-slow: "  # never finished


class Server:
    """A server process and its two ports."""

    def __init__(self, *flags: str) -> None:
        self.http_port = free_port()
        self.proc = ServerProcess("--http-port", str(self.http_port), "--batch-db", ":memory:", *flags)
        line = self.proc.wait_for("listening on")
        found = re.search(r"listening on [\d.]+:(\d+);", line)
        assert found, line
        self.grpc_port = int(found[1])
        self.proc.wait_for("SERVING after")
        self.pid = self.proc.proc.pid

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def settled_fds(self) -> int:
        """The descriptor count once two readings a quarter second apart agree."""
        last = -1
        for _ in range(int(CEILING_S / 0.25)):
            now = self.fds()
            if now == last:
                return now
            last = now
            time.sleep(0.25)
        raise AssertionError(f"descriptor count never settled (last {last})")

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in list(self.proc.log) if needle in line]

    def close(self) -> None:
        self.proc.kill()


def wait_until(condition: Callable[[], bool], what: str, ceiling: float = CEILING_S) -> None:
    end = time.monotonic() + ceiling
    while not condition():
        assert time.monotonic() < end, f"not within {ceiling:g} s: {what}"
        time.sleep(0.05)


def connect(port: int, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=CEILING_S)
    if first:
        sock.sendall(first)
    return sock


def read_until_closed(sock: socket.socket, ceiling: float = CEILING_S) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed); fails past ``ceiling``."""
    sock.settimeout(ceiling)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open {ceiling:g} s; got {out[:200]!r}") from None
    return out


def closed_by_server(sock: socket.socket) -> bool:
    """Non-blocking: has the server closed ``sock`` (EOF or reset)? Data before the EOF is dropped."""
    sock.setblocking(False)
    try:
        while chunk := sock.recv(65536):
            del chunk
        return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def status_and_error(response: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def grpc_health(port: int, timeout: float = CEILING_S) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout,
                                                          wait_for_ready=True)
        return int(reply.status)


# -- timeouts and sizes: a server with 1 s head and body deadlines ---------------------------------------
@pytest.fixture(scope="module")
def strict() -> Iterator[Server]:
    srv = Server("--http-header-timeout-s", "1", "--http-body-timeout-s", "1", "--http-body-min-rate", "1000",
                 "--http-keep-alive-s", "60", "--grpc-handshake-timeout-s", "1")
    yield srv
    srv.close()


def test_a_slowloris_head_gets_408_and_is_closed(strict: Server) -> None:
    with connect(strict.http_port, PARTIAL_HEAD) as sock:
        status, error = status_and_error(read_until_closed(sock))
    assert status == 408 and error["code"] == "request_timeout" and error["type"] == "invalid_request_error"


def test_a_slow_head_on_a_kept_alive_connection_is_closed_too(strict: Server) -> None:
    with connect(strict.http_port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n") as sock:
        first = b""
        while b'{"status":"ok"}' not in first:
            chunk = sock.recv(65536)
            assert chunk, first
            first += chunk
        sock.sendall(PARTIAL_HEAD)  # the next request never finishes its head (keep-alive is 60 s here)
        status, _ = status_and_error(read_until_closed(sock))
    assert first.startswith(b"HTTP/1.1 200") and status == 408


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(strict: Server) -> None:
    with connect(strict.http_port) as sock:
        assert read_until_closed(sock) == b""


def test_a_body_shorter_than_its_content_length_gets_408(strict: Server) -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n{\"mo")
    with connect(strict.http_port, head) as sock:
        status, error = status_and_error(read_until_closed(sock))
    assert status == 408 and error["code"] == "request_timeout"
    assert strict.log_lines("Traceback") == []  # the route saw the client leave: no 500, no stack trace


def test_a_trickled_body_is_cut_off_however_long_it_keeps_coming(strict: Server) -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000000\r\n\r\n")
    with connect(strict.http_port, head) as sock:
        end = time.monotonic() + CEILING_S
        while not closed_by_server(sock):  # one byte every 50 ms: far below --http-body-min-rate 1000
            assert time.monotonic() < end, "a trickled body held its connection open"
            try:
                sock.send(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)


def test_a_body_trickled_on_after_an_early_answer_is_cut_off_too(strict: Server) -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 9000000\r\n\r\n")  # over the 8 MiB body limit: a 413 before the body is read
    with connect(strict.http_port, head) as sock:
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
        end = time.monotonic() + CEILING_S
        while not closed_by_server(sock):  # the client goes on sending the body, one byte every 50 ms
            assert time.monotonic() < end, "a body trickled after the answer held its connection open"
            try:
                sock.send(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)


@pytest.mark.parametrize("size", [20_000, 200_000])
def test_an_oversized_head_gets_431_not_a_reset(strict: Server, size: int) -> None:
    with connect(strict.http_port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * size + b"\r\n\r\n")
        status, error = status_and_error(read_until_closed(sock))
    assert status == 431 and error["code"] == "request_header_fields_too_large"
    assert "16384" in str(error["message"])


def test_a_grpc_connection_without_a_handshake_is_closed(strict: Server) -> None:
    socks = [connect(strict.grpc_port) for _ in range(5)]
    try:
        for sock in socks:  # gRPC's own default held it 120 s; now its SETTINGS and a GOAWAY, then closed
            got = read_until_closed(sock)
            assert got == b"" or b"handshake timeout" in got, got
        assert grpc_health(strict.grpc_port) == health_pb2.HealthCheckResponse.SERVING
    finally:
        for sock in socks:
            sock.close()


# -- the caps: 50 HTTP connections, 8 gRPC connections, heads and bodies given a minute -------------------
@pytest.fixture(scope="module")
def capped() -> Iterator[Server]:
    srv = Server("--http-max-connections", "50", "--http-header-timeout-s", "60", "--http-body-timeout-s", "60",
                 "--http-keep-alive-s", "600", "--grpc-max-connections", "8", "--grpc-handshake-timeout-s", "60")
    with httpx2.Client(base_url=srv.base, timeout=CEILING_S) as http:  # warm: the lazily opened descriptors
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}).status_code == 200
    yield srv
    srv.close()


def test_a_flood_past_the_cap_is_shed_while_health_and_an_admitted_stream_go_on(capped: Server) -> None:
    baseline = capped.settled_fds()
    body = {"model": MODEL, "prompt": "Count: 1, 2,", "max_tokens": 256, "temperature": 0, "stream": True,
            "ignore_eos": True}
    flood: list[socket.socket] = []
    with httpx2.Client(base_url=capped.base, timeout=CEILING_S) as http, \
            http.stream("POST", "/v1/completions", json=body) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")  # admitted
        try:
            flood = [connect(capped.http_port, PARTIAL_HEAD) for _ in range(400)]
            wait_until(lambda: sum(closed_by_server(s) for s in flood) >= 350, "350 of 400 flood connections closed")
            wait_until(lambda: capped.fds() <= baseline + 1 + 50, "the server holds at most 50 HTTP connections")
            with httpx2.Client(base_url=capped.base, timeout=CEILING_S) as fresh:
                assert fresh.get("/health").json() == {"status": "ok"}  # a new connection, during the flood
            assert grpc_health(capped.grpc_port) == health_pb2.HealthCheckResponse.SERVING
            events = [line for line in lines if line.startswith("data: ")]
        finally:
            for sock in flood:
                sock.close()
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
    wait_until(lambda: capped.fds() <= baseline, f"descriptors back to {baseline}")
    assert len(capped.log_lines("HTTP connection cap (50) reached")) <= 3  # one line per 10 s at most


def health_on(sock: socket.socket) -> bytes:
    """``GET /health`` on an open connection (kept alive), read to the end of its body."""
    sock.setblocking(True)
    sock.settimeout(CEILING_S)
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    got = b""
    while b'{"status":"ok"}' not in got:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the kept-alive connection; got {got[:200]!r}"
        got += chunk
    return got


def test_a_kept_alive_connection_that_served_a_request_outlives_a_half_sent_flood(capped: Server) -> None:
    # the health probe's case in issue #35's benchmark: idle between its checks, its connection was
    # reclaimed by a flood of half-sent heads; connections that never completed a request go first
    with connect(capped.http_port) as kept:
        assert health_on(kept).startswith(b"HTTP/1.1 200")  # it served a request; idle now
        flood = [connect(capped.http_port, PARTIAL_HEAD) for _ in range(200)]  # 4x the cap of 50
        try:
            # 150 places had to be freed (the cap holds 50: the kept connection and 49 others)
            wait_until(lambda: sum(closed_by_server(s) for s in flood) >= 150, "150 flood connections reclaimed")
            assert not closed_by_server(kept), "the kept-alive connection was reclaimed before the flood's"
            assert health_on(kept).startswith(b"HTTP/1.1 200")  # the same connection, during the flood
        finally:
            for sock in flood:
                sock.close()


def test_when_every_place_is_in_a_request_a_new_connection_gets_503(capped: Server) -> None:
    baseline = capped.settled_fds()
    # a head, then a body that does not come (60 s allowed here); the route asking for the body sends
    # "100 Continue", which shows the connection is in a request
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 10\r\nexpect: 100-continue\r\n\r\n")
    held = [connect(capped.http_port, head) for _ in range(50)]
    try:
        for sock in held:
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        with connect(capped.http_port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n") as extra:
            status, error = status_and_error(read_until_closed(extra))
        assert status == 503 and error["code"] == "too_many_connections"
        assert not any(closed_by_server(s) for s in held)  # admitted requests are never reclaimed
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: capped.fds() <= baseline, f"descriptors back to {baseline}")
    with httpx2.Client(base_url=capped.base, timeout=CEILING_S) as http:
        assert http.get("/health").status_code == 200


def test_grpc_connections_past_the_cap_are_closed_at_once(capped: Server) -> None:
    socks = [connect(capped.grpc_port) for _ in range(30)]  # no handshake: 60 s allowed here
    try:
        wait_until(lambda: sum(closed_by_server(s) for s in socks) >= 22, "22 of 30 gRPC connections closed")
        open_ = [s for s in socks if not closed_by_server(s)]
        assert len(open_) <= 8
    finally:
        for sock in socks:
            sock.close()
    assert grpc_health(capped.grpc_port) == health_pb2.HealthCheckResponse.SERVING  # places freed


# -- a burst of connections already queued in the kernel: the loop takes them in batches ---------------------
def accept_queue(port: int) -> int:
    """Connections the kernel holds for ``accept()`` on the listening socket of ``port`` (/proc/net/tcp)."""
    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:  # LISTEN
                return int(fields[4].split(":")[1], 16)  # rx_queue of a listener: its accept queue
    raise AssertionError(f"no listening socket on port {port}")


def test_a_kept_alive_request_is_answered_before_a_queued_burst_of_connections_is_all_accepted() -> None:
    # issue #35: asyncio accepted up to the backlog (2,048) connections in one go and set each up before
    # anything else ran, so a health check waited for a whole burst of a flood. The burst is made certain
    # here: the server is stopped (SIGSTOP) while the connections queue in the kernel and the request is sent.
    srv = Server("--http-max-connections", "4000", "--http-header-timeout-s", "60")
    flood: list[socket.socket] = []
    try:
        with connect(srv.http_port) as kept:
            assert health_on(kept).startswith(b"HTTP/1.1 200")
            os.kill(srv.pid, signal.SIGSTOP)
            try:
                flood = [connect(srv.http_port, PARTIAL_HEAD) for _ in range(1900)]
                assert accept_queue(srv.http_port) == 1900
                kept.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            finally:
                os.kill(srv.pid, signal.SIGCONT)
            answer = b""
            while b'{"status":"ok"}' not in answer:
                chunk = kept.recv(65536)
                assert chunk, answer
                answer += chunk
            queued = accept_queue(srv.http_port)  # at the answer: most of the burst still waits
        assert answer.startswith(b"HTTP/1.1 200")
        assert queued > 0, "every queued connection was set up before the kept-alive request was answered"
        wait_until(lambda: accept_queue(srv.http_port) == 0, "the whole burst accepted")
    finally:
        for sock in flood:
            sock.close()
        srv.close()


# -- out of descriptors: accept() fails, and says so once, not 2,000 times a second -------------------------
def test_accept_errors_are_logged_a_bounded_number_of_times() -> None:
    srv = Server("--http-max-connections", "1000", "--http-header-timeout-s", "60")

    def reports() -> list[str]:  # ours, or asyncio's "socket.accept() out of system resource"
        return srv.log_lines("accept() failed") + srv.log_lines("out of system resource")

    try:
        limit = srv.settled_fds() + 20
        resource.prlimit(srv.pid, resource.RLIMIT_NOFILE, (limit, limit))  # far below the HTTP cap
        flood = [connect(srv.http_port, PARTIAL_HEAD) for _ in range(200)]
        started = time.monotonic()
        try:
            wait_until(lambda: bool(reports()), "an accept() failure reported")
            # NOTE: the flood is held 2 s more: asyncio's own handler logged ~5,000 reports a second
            # (with a traceback each) from here on; the bound below grows with the time held
            time.sleep(2.0)
            held_s = time.monotonic() - started
        finally:
            for sock in flood:
                sock.close()
        assert len(reports()) <= held_s / 10 + 2, f"{len(reports())} lines in {held_s:.1f} s"
        assert srv.log_lines("Traceback") == []
        with httpx2.Client(base_url=srv.base, timeout=CEILING_S) as http:
            wait_until(lambda: http.get("/health").status_code == 200, "health once the flood is gone")
    finally:
        srv.close()
