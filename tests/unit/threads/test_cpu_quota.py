"""Threads from the cgroup CPU quota (fake cgroup trees) and the connection flags (no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.api.grpc_options import server_options
from service.config import ServerConfig, load_config
from service.threads.cpu_quota import cpu_quota, default_threads

V2_SELF = "0::/kubepods/pod1/ctr\n"
V1_SELF = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"


def _v2(root: Path, rel: str, cpu_max: str) -> None:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.max").write_text(cpu_max + "\n")


def _v1(root: Path, rel: str, quota: int, period: int = 100000) -> None:
    d = root / "cpu,cpuacct" / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text(f"{period}\n")


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("200000 100000", 2), ("250000 100000", 2), ("50000 100000", 1), ("max 100000", 64)],
)
def test_v2_quota_rounded_down_at_least_one(tmp_path: Path, cpu_max: str, expected: int) -> None:
    _v2(tmp_path, "kubepods/pod1/ctr", cpu_max)
    assert default_threads(tmp_path, V2_SELF, cpus=64) == expected


def test_v2_tightest_ancestor_wins(tmp_path: Path) -> None:
    _v2(tmp_path, "kubepods/pod1/ctr", "max 100000")
    _v2(tmp_path, "kubepods/pod1", "300000 100000")
    _v2(tmp_path, "kubepods", "800000 100000")
    assert cpu_quota(tmp_path, V2_SELF) == 3.0
    assert default_threads(tmp_path, V2_SELF, cpus=64) == 3


def test_v2_namespaced_root(tmp_path: Path) -> None:
    """Inside a container the cgroup namespace shows '/' and the quota sits at the root."""
    _v2(tmp_path, "", "400000 100000")
    assert default_threads(tmp_path, "0::/\n", cpus=64) == 4


def test_v1_quota(tmp_path: Path) -> None:
    _v1(tmp_path, "docker/abc", 150000)
    assert default_threads(tmp_path, V1_SELF, cpus=8) == 1
    _v1(tmp_path, "docker/abc", -1)
    assert default_threads(tmp_path, V1_SELF, cpus=8) == 8


def test_no_cgroup_files_means_core_count(tmp_path: Path) -> None:
    assert cpu_quota(tmp_path, V2_SELF) is None
    assert default_threads(tmp_path, V2_SELF, cpus=6) == 6


def test_quota_never_above_usable_cpus(tmp_path: Path) -> None:
    _v2(tmp_path, "", "1600000 100000")
    assert default_threads(tmp_path, "0::/\n", cpus=2) == 2


def test_malformed_file_is_ignored(tmp_path: Path) -> None:
    _v2(tmp_path, "", "lots 100000")
    assert default_threads(tmp_path, "0::/\n", cpus=3) == 3


def test_connection_flags_become_grpc_options() -> None:
    config = load_config(
        ["--max-connection-age-s", "30", "--max-connection-age-grace-s", "5", "--keepalive-time-s", "0"],
        env={},
    )
    opts = dict(server_options(config))
    assert opts["grpc.max_connection_age_ms"] == 30_000
    assert opts["grpc.max_connection_age_grace_ms"] == 5_000
    assert "grpc.keepalive_time_ms" not in opts
    defaults = dict(server_options(ServerConfig()))
    assert "grpc.max_connection_age_ms" not in defaults  # off by default
    assert defaults["grpc.keepalive_time_ms"] == 60_000
    # the name gRPC core reads (an unknown one is ignored: clients pinging every 10 s got too_many_pings)
    assert defaults["grpc.http2.min_ping_interval_without_data_ms"] == 10_000
    # the flood limits (names as gRPC core spells them; grpcio 1.85 knows each)
    assert defaults["grpc.max_allowed_incoming_connections"] == 1000
    assert defaults["grpc.max_concurrent_streams"] == 256
    assert defaults["grpc.server_handshake_timeout_ms"] == 10_000
    assert defaults["grpc.max_connection_idle_ms"] == 300_000
    off = dict(server_options(load_config(["--grpc-max-connection-idle-s", "0"], env={})))
    assert "grpc.max_connection_idle_ms" not in off


def test_connection_flags_from_environment_and_validation(capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config([], env={"INFERENCE_MAX_CONNECTION_AGE_S": "12.5"})
    assert config.max_connection_age_s == 12.5
    for argv, message in (
        (["--max-connection-age-s", "-1"], "--max-connection-age-s, --max-connection-age-grace-s and"),
        (["--keepalive-timeout-s", "0"], "--keepalive-timeout-s must be > 0"),
    ):
        with pytest.raises(SystemExit) as info:
            load_config(argv, env={})
        assert info.value.code == 2, argv  # argparse's usage error
        assert message in capsys.readouterr().err, argv
