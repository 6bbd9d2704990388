"""Server subprocesses under test: our gRPC server and llama-cpp-python's OpenAI server.

Each server runs in its own process (the load generators run in the bench
process), its stderr goes to ``bench/results/logs/<label>.log``, and it is
stopped with SIGTERM (SIGKILL after a grace period) when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness.config import PYTHON, ROOT, logs_dir
from bench.harness.results import Skipped

STARTUP_TIMEOUT_S = 180.0


class ServerFailed(RuntimeError):
    """The server process exited or never became ready."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (or, with None, remove) environment variables for the duration (subprocesses inherit them)."""

    def apply(items: dict[str, str | None]) -> None:
        for k, v in items.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    saved = {k: os.environ.get(k) for k in values}
    apply(values)
    try:
        yield
    finally:
        apply(saved)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler:
    """Samples a process's RSS on a thread every ``interval_s``; ``peak`` is the maximum seen."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self.samples += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _Process:
    """A server subprocess with its log file; subclasses say how to start it and when it is ready."""

    def __init__(self, label: str, argv: list[str], source: Path = ROOT) -> None:
        self.label = label
        self.source = source  # the checkout whose code runs (another revision for bench/studies/revisions_ab.py)
        self.port = free_port()
        self.argv = [a.replace("{port}", str(self.port)) for a in argv]
        self.log_path = logs_dir() / f"{label}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.startup_s = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        self._log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.source != ROOT:
            env["PYTHONPATH"] = f"{self.source}:{self.source / 'clients' / 'python'}"
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv, cwd=self.source, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready(time.monotonic() + STARTUP_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise ServerFailed(f"{self.label} exited with code {code}; see {self.log_path}")
            if self.ready():
                return
            time.sleep(0.25)
        raise ServerFailed(f"{self.label} not ready after {STARTUP_TIMEOUT_S:.0f} s; see {self.log_path}")

    def ready(self) -> bool:
        raise NotImplementedError

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> _Process:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class GrpcServer(_Process):
    """``python -m service`` on a free port; ready when grpc health says SERVING."""

    def __init__(
        self,
        label: str,
        model: str | Path,
        *flags: str,
        threads: int | None = None,
        source: Path = ROOT,
        response_cache_off: bool = True,
    ) -> None:
        argv = [PYTHON, "-m", "service", "--model", str(model), "--host", "127.0.0.1", "--port", "{port}"]
        if threads is not None:
            argv += ["--threads", str(threads)]
        if "--http-port" not in flags:
            argv += ["--http-port", "0"]  # NOTE: no HTTP API unless asked: several servers would all want :8000
        if response_cache_off and not any(f.startswith("--response-cache") for f in flags):
            # NOTE: the scenarios measure the engine: repeated greedy prompts must not be replayed
            # from the response cache (scenario K measures the cache and sets its flags).
            argv += ["--response-cache-bytes", "0"]
        super().__init__(label, argv + list(flags), source)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ready(self) -> bool:
        with grpc.insecure_channel(self.target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
            except grpc.RpcError:
                return False
            return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    def __enter__(self) -> GrpcServer:
        self.start()
        return self


class _HttpProcess(_Process):
    """An HTTP server process on loopback; ready when ``READY_PATH`` answers 200."""

    READY_PATH = "/"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        import httpx

        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(self.base_url + self.READY_PATH, timeout=1.0).status_code == 200
        return False


class LlamaCppServer(_HttpProcess):
    """``python -m llama_cpp.server`` (OpenAI-compatible HTTP); ready when /v1/models answers."""

    READY_PATH = "/v1/models"

    def __init__(self, label: str, model: str | Path, n_ctx: int = 4096, threads: int = 2) -> None:
        argv = [
            PYTHON,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--n_ctx",
            str(n_ctx),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            # NOTE: the default (True) aborts the streaming request whenever another one
            # arrives; off, concurrent requests queue on the server's lock and all complete.
            "--interrupt_requests",
            "False",
        ]
        super().__init__(label, argv)

    def __enter__(self) -> LlamaCppServer:
        self.start()
        return self


def llama_server_binary() -> Path:
    """llama.cpp's ``llama-server`` from ``make llama-tools`` (``$LLAMA_SERVER`` overrides the path).

    Raises ``Skipped`` when it is not built, so a scenario that needs it is recorded as skipped.
    """
    path = Path(os.environ.get("LLAMA_SERVER", ROOT / ".llama-tools" / "bin" / "llama-server"))
    if not path.is_file():
        raise Skipped(f"{path} missing: run `make llama-tools` (or set LLAMA_SERVER)")
    return path


class LlamaServer(_HttpProcess):
    """llama.cpp's ``llama-server`` (``make llama-tools``; OpenAI-compatible HTTP); ready when /health is 200.

    ``parallel`` slots (``-np``) over one unified KV cache (``-kvu``) of ``ctx`` tokens, continuous batching.
    """

    READY_PATH = "/health"

    def __init__(self, label: str, binary: Path, model: str | Path, *, parallel: int, ctx: int, threads: int,
                 extra: Sequence[str] = ()) -> None:
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", "{port}", "-np", str(parallel),
                "-kvu", "-c", str(ctx), "-t", str(threads), "-tb", str(threads), "--no-webui", *extra]
        super().__init__(label, argv)

    def __enter__(self) -> LlamaServer:
        self.start()
        return self
