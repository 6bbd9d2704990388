"""The ``inference-client`` CLI, run as a subprocess against the real server (``server`` fixture)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

CLI = [sys.executable, "-m", "inference_client.cli"]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, env=env, check=False)


def assert_clean_error(proc: subprocess.CompletedProcess[str], status: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {status}: "), proc.stderr
    assert "Traceback" not in proc.stderr


def dead_target() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.model
def test_generate_streams_text_and_prints_summary(server: Any) -> None:
    options = "--max-tokens 8 --temperature 0 --ignore-eos --stop zzzz --top-k 20 --top-p 0.9 --min-p 0.01"
    proc = run("--target", server.target, "generate", "Once upon a time", *options.split(), "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    summary = proc.stderr.strip().splitlines()[-1]
    assert "finish=length" in summary and "completion=8" in summary and "ttft=" in summary


@pytest.mark.model
def test_generate_flushes_each_delta_and_handles_interrupt(server: Any) -> None:
    args = ["--target", server.target, "generate", "A long story:", "--max-tokens", "2000", "--ignore-eos"]
    proc = subprocess.Popen(
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        first = os.read(proc.stdout.fileno(), 64)  # arrives while generation is still running
        assert first and proc.poll() is None
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert b"Traceback" not in err


@pytest.mark.model
def test_generate_chat_from_stdin(server: Any) -> None:
    proc = subprocess.run(
        [
            *CLI,
            "--target",
            server.target,
            "generate",
            "-",
            "--chat",
            "--system",
            "Be brief.",
            "--max-tokens",
            "5",
        ],
        input="Hello!",
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "finish=" in proc.stderr


@pytest.mark.model
def test_generate_error_is_reported_without_traceback(server: Any) -> None:
    assert_clean_error(run("--target", server.target, "generate", ""), "INVALID_ARGUMENT")
    assert_clean_error(
        run("--target", server.target, "generate", "hi", "--max-tokens", "0"), "INVALID_ARGUMENT"
    )


@pytest.mark.model
def test_json_prints_the_document(server: Any, tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    proc = run(
        "--target", server.target, "json", "--schema", str(schema), "A person as JSON:", "--temperature", "0"
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"name", "age"} and isinstance(doc["age"], int)


@pytest.mark.model
def test_json_closes_within_max_tokens_by_default_and_cut_off_asks_for_the_old_error(server: Any, tmp_path: Path) -> None:
    schema = tmp_path / "team.json"
    schema.write_text(json.dumps({"type": "object", "required": ["names"], "properties": {
        "names": {"type": "array", "minItems": 6, "items": {"type": "string", "minLength": 3}}}}))
    args = ["--target", server.target, "json", "--schema", str(schema), "A team as JSON:", "--temperature", "0",
            "--max-tokens", "30"]
    closed = run(*args)
    assert closed.returncode == 0, closed.stderr
    assert len(json.loads(closed.stdout)["names"]) >= 6 and "closed-early" in closed.stderr
    assert_clean_error(run(*args, "--cut-off"), "OUT_OF_RANGE")


def test_json_with_unreadable_or_malformed_schema(tmp_path: Path) -> None:
    proc = run("--target", dead_target(), "json", "--schema", str(tmp_path / "missing.json"), "x")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    proc = run("--target", dead_target(), "json", "--schema", str(bad), "x")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


@pytest.mark.model
def test_metrics_table_and_json(server: Any) -> None:
    proc = run("--target", server.target, "metrics")
    assert proc.returncode == 0, proc.stderr
    needles = [
        "requests",
        "tokens",
        "engine steps",
        "mean batch size",
        "running",
        "waiting",
        "interactive ttft",
    ]
    needles += ["batch e2e", "p50", "p95", "p99", "kv blocks", "prefix cache", "hit rate", "preemptions"]
    for needle in [*needles, "rejections", "throughput"]:
        assert needle in proc.stdout, needle
    from inference.v1 import inference_pb2 as pb
    from inference.v1 import inference_pb2_grpc as pb_grpc

    with grpc.insecure_channel(server.target) as ch:  # nothing else runs meanwhile: one value
        stub = pb_grpc.InferenceServiceStub(ch)
        before = stub.GetMetrics(pb.GetMetricsRequest()).requests_total
        proc = run("--target", server.target, "metrics", "--json")
        after = stub.GetMetrics(pb.GetMetricsRequest()).requests_total
    assert proc.returncode == 0, proc.stderr
    assert before == json.loads(proc.stdout)["requests_total"] == after > 0


@pytest.mark.model
def test_health_serving_with_env_target(server: Any) -> None:
    env = {**os.environ, "INFERENCE_TARGET": server.target}
    proc = run("health", env=env)
    assert (proc.returncode, proc.stdout.strip()) == (0, "SERVING"), proc.stderr
    proc = run("health", "--service", "inference.v1.InferenceService", env=env)
    assert (proc.returncode, proc.stdout.strip()) == (0, "SERVING"), proc.stderr


@pytest.fixture()
def not_serving_target() -> Iterator[str]:
    """A stub server whose grpc.health.v1 reports NOT_SERVING."""
    from concurrent import futures

    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}"
    srv.stop(0)


def test_health_not_serving_exits_1(not_serving_target: str) -> None:
    proc = run("--target", not_serving_target, "health")
    assert (proc.returncode, proc.stdout.strip()) == (1, "NOT_SERVING")


def test_unreachable_server_reports_unavailable() -> None:
    proc = run("--target", dead_target(), "--retries", "2", "metrics")
    assert_clean_error(proc, "UNAVAILABLE")
    assert_clean_error(run("--target", dead_target(), "--retries", "1", "generate", "hi"), "UNAVAILABLE")


def test_usage_errors_and_console_script() -> None:
    proc = run("generate")  # missing PROMPT: argparse usage error
    assert proc.returncode == 2 and "usage:" in proc.stderr
    script = Path(sys.executable).with_name("inference-client")
    if not script.exists():
        pytest.skip("console script not installed (pip install -e .)")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "generate" in done.stdout
