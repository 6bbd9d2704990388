"""The test servers: a real in-process gRPC server on port 0 with the real default model.

The server runs on its own event loop in a background thread, so both sync
tests (blocking stubs) and async tests can talk to it. After every engine
step ``service.kv.integrity.check_integrity`` runs; violations are collected and
asserted empty by ``assert_kv_clean``. The fixtures over these (``server``,
``channel``) are in tests/conftest.py.

Tests of the server process itself (start-up, signals, shutdown, replicas) run
``python -m service`` instead: ``server_argv`` is its command line, ``ServerProcess``
one such process sized like the in-process servers (``PROCESS_FLAGS``).
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from service.config import ServerConfig
from service.kv.integrity import check_integrity
from service.server import InferenceServer

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class RunningServer:
    """A server on its own loop thread; ``call`` runs a coroutine there."""

    config: ServerConfig
    telemetry: Any = None  # service.observability.setup.make_telemetry(config), or the no-op default
    server: InferenceServer = field(init=False)
    loop: asyncio.AbstractEventLoop = field(init=False)
    violations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-server-loop", daemon=True)
        self._thread.start()
        self.server = InferenceServer(self.config, self.telemetry)
        self.call(self.server.start())
        assert self.server.engine is not None
        self.server.engine.step_hook = self._check

    def _check(self, engine: Any) -> None:
        try:
            check_integrity(engine.kv, engine.scheduler.running)
        except AssertionError as exc:  # recorded, asserted by tests
            self.violations.append(str(exc))

    def call(self, coro: Any, timeout: float = 300) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def engine(self) -> Any:
        return self.server.engine

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def server_config(**overrides: Any) -> ServerConfig:
    """The test servers' configuration: the default model, port 0, a small pool; ``overrides`` win."""
    if not DEFAULT_MODEL.is_file():
        pytest.fail(f"{DEFAULT_MODEL} missing: run `make model`")
    base: dict[str, Any] = dict(
        model=str(DEFAULT_MODEL),
        host="127.0.0.1",
        port=0,
        ctx=4096,
        max_running=8,
        kv_lanes=64,
        step_tokens=128,
        threads=2,
        # batch jobs of one test server never outlive it (tests/model/batch/test_batch.py uses files)
        batch_db=":memory:",
        http_port=0,  # no HTTP API (tests/model/http/ pass a free port)
        # NOTE: off for the engine tests (a repeated greedy request would be replayed, identical ones
        # coalesced); the response-cache tests turn it on
        # (tests/model/response_cache/test_response_cache.py).
        response_cache_bytes=0,
    )
    return ServerConfig(**{**base, **overrides})


def start_server(**overrides: Any) -> RunningServer:
    return RunningServer(server_config(**overrides))


def wait_idle(srv: RunningServer, timeout: float = 30.0) -> None:
    """Block until the engine has no waiting or running sequences."""
    end = time.monotonic() + timeout
    while srv.engine.scheduler.has_work() and time.monotonic() < end:
        time.sleep(0.01)
    assert not srv.engine.scheduler.has_work(), "engine still busy"


def wait_batch_store(srv: RunningServer, timeout: float = 30.0) -> None:
    """Block until the BatchService's store answers (a PostgreSQL store opens after the server starts)."""
    end = time.monotonic() + timeout
    while not srv.server.batch.available and time.monotonic() < end:
        time.sleep(0.01)
    assert srv.server.batch.available, f"batch store not open: {srv.server.batch.db.last_error}"


def assert_kv_clean(srv: RunningServer) -> None:
    """No integrity violation so far, nothing running, and no block referenced."""
    wait_idle(srv)
    assert srv.violations == [], srv.violations[:3]
    kv = srv.engine.kv
    assert kv.num_used == 0, f"{kv.num_used} blocks still referenced after all requests ended"
    check_integrity(kv, [])


def free_port() -> int:
    """A port free on loopback now (for servers whose flag has no "pick one" value, e.g. --http-port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# server_config's engine as flags: a server process sized like the in-process test servers.
# NOTE: the response cache is off here too: identical greedy requests must each run, not be coalesced.
PROCESS_FLAGS = (
    "--threads", "2", "--ctx", "4096", "--max-running", "8", "--kv-lanes", "64", "--step-tokens", "128",
    "--response-cache-bytes", "0",
)


def server_argv(*args: str, host: str = "127.0.0.1", port: int = 0) -> list[str]:
    """The command line of a server process: ``python -m service`` with the default model on
    ``host:port`` (0: a free port), then ``args`` (where a flag given again wins, ``--model`` too).
    Run it with ``cwd=ROOT``."""
    return [sys.executable, "-m", "service", "--model", str(DEFAULT_MODEL),
            "--host", host, "--port", str(port), *args]


class ServerProcess:
    """``python -m service`` on a free port (``PROCESS_FLAGS``, then ``args``); stderr lines are collected
    on a thread."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            server_argv(*PROCESS_FLAGS, *args),
            cwd=ROOT,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            self.lines.put(line)

    def wait_for(self, needle: str, timeout: float = 120) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                assert self.proc.poll() is None, "server exited:\n" + "\n".join(self.log)
                continue
            if needle in line:
                return line
        raise AssertionError(f"no {needle!r} in the log:\n" + "\n".join(self.log))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
