"""The server process's own paths (``python -m service``): start-up failures exit 2 with one clear line,
SIGHUP re-reads the tenants file, and ``--no-exit-on-engine-failure`` keeps a failed server up."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.__main__ import ENGINE_FAILED_EXIT, run_until_stopped
from tests.support.certs import CA
from tests.support.helpers import req, run_stream, wait_for
from tests.support.server import ROOT, ServerProcess, server_argv, start_server

pytestmark = pytest.mark.model


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _tls_mismatch(tmp: Path) -> list[str]:
    ca = CA()
    cert, key = ca.issue("localhost", server=True).write(tmp, "server")
    key.write_bytes(ca.issue("localhost", server=True).key)  # a key of another pair
    return ["--tls-cert", str(cert), "--tls-key", str(key)]


# (case, extra arguments given a temporary folder, words of the one error line)
FAILURES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("model file missing", lambda tmp: ["--model", str(tmp / "missing.gguf")], "not found"),
    ("tenants file missing", lambda tmp: ["--auth-tokens", str(tmp / "none.json")], "cannot start: --auth-tokens"),
    (
        "tenants file not JSON",
        lambda tmp: ["--auth-tokens", str((tmp / "t.json", (tmp / "t.json").write_text("{nope"))[0])],
        "cannot start: --auth-tokens",
    ),
    ("TLS files missing", lambda tmp: ["--tls-cert", str(tmp / "a.crt"), "--tls-key", str(tmp / "a.key")], "cannot start"),
    ("TLS key of another pair", _tls_mismatch, "cannot start"),
    ("a refused flag value", lambda tmp: ["--max-running", "0"], "--max-running must be >= 1"),
]


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        server_argv("--threads", "1", *args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(("case", "args", "words"), FAILURES, ids=[f[0] for f in FAILURES])
def test_a_start_up_failure_exits_2_with_one_clear_line(
    tmp_path: Path, case: str, args: Callable[[Path], list[str]], words: str
) -> None:
    proc = _start(args(tmp_path))
    assert proc.returncode == 2, (case, proc.stderr[-2000:])
    assert words in proc.stderr, (case, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_a_taken_prometheus_port_exits_2() -> None:
    for port in taken_port():
        proc = _start(["--prometheus-port", str(port)])
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "cannot start telemetry" in proc.stderr and "Traceback" not in proc.stderr


def test_a_bad_environment_variable_exits_2() -> None:
    proc = _start([], env={"INFERENCE_MAX_RUNNING": "many"})
    assert proc.returncode == 2
    assert "INFERENCE_MAX_RUNNING='many' is not a valid int" in proc.stderr and "Traceback" not in proc.stderr


def test_sighup_reloads_the_tenants_file(tmp_path: Path) -> None:
    """Only the signal can have reloaded it: the new file has the same size and mtime as the old one,
    so the file watcher (mtime and size, every second) sees no change."""
    old, new = "tok-old-0000", "tok-new-1111"
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": {"t": {"token_sha256": [sha(old)]}}}))
    stamp = os.stat(path)
    server = ServerProcess("--auth-tokens", str(path), "--log-format", "json")
    try:
        target = json.loads(server.wait_for("listening on"))["msg"].split()[2].rstrip(";")
        server.wait_for("SERVING after")

        def status(token: str) -> grpc.StatusCode:
            with grpc.insecure_channel(target) as ch:
                try:
                    pb_grpc.InferenceServiceStub(ch).CountTokens(
                        pb.CountTokensRequest(text="Hi"), metadata=(("authorization", f"Bearer {token}"),), timeout=10
                    )
                except grpc.RpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

        assert (status(old), status(new)) == (grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED)
        path.write_text(json.dumps({"tenants": {"t": {"token_sha256": [sha(new)]}}}))
        os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        assert os.stat(path).st_size == stamp.st_size and os.stat(path).st_mtime_ns == stamp.st_mtime_ns
        server.proc.send_signal(signal.SIGHUP)
        line = json.loads(server.wait_for("tenants file"))
        assert line["level"] == "INFO" and "loaded: 1 tenants" in line["msg"], line
        assert (status(old), status(new)) == (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OK)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0
    finally:
        server.kill()


def _health(target: str) -> int:
    with grpc.insecure_channel(target) as ch:
        return int(health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status)


def test_no_exit_on_engine_failure_keeps_the_failed_server_up_until_stopped(caplog: Any) -> None:
    srv = start_server(exit_on_engine_failure=False)
    try:

        def boom(seq: Any) -> None:
            raise RuntimeError("injected: engine loop broke")

        stop = asyncio.Event()
        running = asyncio.run_coroutine_threadsafe(run_until_stopped(srv.server, stop, srv.config), srv.loop)
        srv.engine.scheduler.add = boom  # type: ignore[method-assign]
        with grpc.insecure_channel(srv.target) as ch:
            out = run_stream(ch, [req("a", "Hi", 4)], timeout=600)
        assert out["a"].error is not None and out["a"].error.status == "UNAVAILABLE"
        assert wait_for(lambda: srv.server.failed.is_set(), timeout=600)
        assert wait_for(lambda: "staying up NOT_SERVING" in caplog.text, timeout=600), caplog.text
        # up: it answers, NOT_SERVING, and has not returned an exit code
        assert _health(srv.target) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert not running.done()
        srv.loop.call_soon_threadsafe(stop.set)  # SIGTERM
        assert running.result(60) == ENGINE_FAILED_EXIT
    finally:
        srv.close()
