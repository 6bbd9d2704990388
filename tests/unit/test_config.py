"""Every ServerConfig validation rule and every environment-variable parse error (service/config.py),
table-driven: the value that breaks the rule, and the one line the server exits with (code 2)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from service.config import ServerConfig, load_config, validate

BASE = ServerConfig(model="models/x.gguf", threads=2)

# (overrides that break exactly one rule, the message naming it); one row per rule of ``validate``.
RULES: list[tuple[dict[str, Any], str]] = [
    ({"max_running": 0}, "--max-running must be >= 1"),
    ({"max_running": 64, "kv_lanes": 64}, "--kv-lanes must be greater than --max-running and at most 254"),
    ({"kv_lanes": 255}, "--kv-lanes must be greater than --max-running and at most 254"),
    ({"step_tokens": 16, "max_running": 32}, "--step-tokens must be >= --max-running"),
    ({"batch_rows_with_interactive": -1}, "--batch-rows-with-interactive must be >= 0"),
    ({"long_prompt_tokens": -1}, "--long-prompt-tokens must be >= 0"),
    ({"batch_prefill_tokens": 0}, "--batch-prefill-tokens must be >= 1"),
    ({"kv_cache_type": "q5_1"}, "--kv-cache-type must be one of f16, q8_0, q4_0"),
    ({"block_size": 0}, "--ctx must be at least one block"),
    ({"ctx": 8, "block_size": 16}, "--ctx must be at least one block"),
    ({"prefix_cache_tokens": -1}, "--prefix-cache-tokens and --prefix-host-cache-mib must be >= 0"),
    ({"prefix_host_cache_mib": -1}, "--prefix-cache-tokens and --prefix-host-cache-mib must be >= 0"),
    ({"threads": 0}, "--threads must be >= 1"),
    ({"max_messages": 0}, "--max-messages, --max-tools, --max-stop-strings and --max-logit-bias must be >= 1"),
    ({"max_tools": 0}, "--max-messages, --max-tools, --max-stop-strings and --max-logit-bias must be >= 1"),
    ({"max_stop_strings": 0}, "--max-messages, --max-tools, --max-stop-strings and --max-logit-bias must be >= 1"),
    ({"max_logit_bias": 0}, "--max-messages, --max-tools, --max-stop-strings and --max-logit-bias must be >= 1"),
    ({"step_timeout_s": -1.0}, "--step-timeout-s must be >= 0, --stream-stall-timeout-s > 0"),
    ({"stream_stall_timeout_s": 0.0}, "--step-timeout-s must be >= 0, --stream-stall-timeout-s > 0"),
    ({"stream_backlog": 3}, "--stream-backlog >= 4"),
    ({"stream_write_pending_s": -1.0}, "--stream-write-pending-s must be >= 0"),
    ({"max_connection_age_s": -1.0}, "--max-connection-age-s, --max-connection-age-grace-s and --keepalive"),
    ({"max_connection_age_grace_s": -1.0}, "--max-connection-age-s, --max-connection-age-grace-s and"),
    ({"keepalive_time_s": -1.0}, "--max-connection-age-s, --max-connection-age-grace-s and --keepalive-time-s"),
    ({"keepalive_timeout_s": 0.0}, "--keepalive-timeout-s must be > 0"),
    ({"keepalive_min_client_interval_s": -1.0}, "--keepalive-min-client-interval-s >= 0"),
    ({"grpc_max_connections": 0}, "--grpc-max-connections, --grpc-max-concurrent-streams and --http-max-connections"),
    ({"grpc_max_concurrent_streams": 0}, "--grpc-max-connections, --grpc-max-concurrent-streams and"),
    ({"http_max_connections": 0}, "--grpc-max-connections, --grpc-max-concurrent-streams and --http-max-connections"),
    ({"grpc_handshake_timeout_s": 0.0}, "--grpc-handshake-timeout-s must be > 0"),
    ({"grpc_max_connection_idle_s": -1.0}, "--grpc-max-connection-idle-s >= 0"),
    ({"http_header_timeout_s": 0.0}, "--http-header-timeout-s, --http-body-timeout-s and --http-keep-alive-s must"),
    ({"http_body_timeout_s": 0.0}, "--http-header-timeout-s, --http-body-timeout-s and --http-keep-alive-s must"),
    ({"http_keep_alive_s": 0.0}, "--http-header-timeout-s, --http-body-timeout-s and --http-keep-alive-s must"),
    ({"http_body_min_rate": 0}, "--http-body-min-rate must be >= 1"),
    ({"http_max_header_bytes": 1000}, "--http-max-header-bytes must be >= 1024"),
    ({"response_cache_bytes": -1}, "--response-cache-bytes must be >= 0"),
    ({"response_cache_max_ttl_s": 0.0}, "--response-cache-max-ttl-s > 0"),
    ({"semantic_cache_threshold": 0.0}, "--semantic-cache-threshold must be in (0, 1]"),
    ({"semantic_cache_threshold": 1.5}, "--semantic-cache-threshold must be in (0, 1]"),
    ({"json_repeat_penalty": -0.1}, "--json-repeat-penalty must be in [0, 5]"),
    ({"json_repeat_penalty": 5.5}, "--json-repeat-penalty must be in [0, 5]"),
    ({"batch_retention_hours": 0.0}, "--batch-retention-hours and --batch-lease-s must be > 0"),
    ({"batch_lease_s": 0.0}, "--batch-retention-hours and --batch-lease-s must be > 0"),
    ({"batch_max_running": -1}, "--batch-max-running >= 0"),
    ({"batch_db": ""}, "--batch-db is empty"),
    ({"batch_db": "mysql://db/jobs"}, "--batch-db: unknown scheme 'mysql'"),
    ({"tls_cert": "a.crt"}, "--tls-cert and --tls-key go together"),
    ({"tls_key": "a.key"}, "--tls-cert and --tls-key go together"),
    ({"tls_client_ca": "ca.crt"}, "--tls-client-ca needs them"),
    ({"http_port": 70000}, "--http-port must be in 0..65535 (0 = off) and differ from --port"),
    ({"http_port": 50051, "port": 50051}, "--http-port must be in 0..65535 (0 = off) and differ from --port"),
    ({"kv_events_endpoint": "*:5557"}, "--kv-events-endpoint must be a tcp:// or ipc:// endpoint, got '*:5557'"),
    ({"kv_events_endpoint": "tcp://*:1", "kv_events_replay_endpoint": "udp://x"}, "--kv-events-replay-endpoint must"),
    ({"kv_events_replay_endpoint": "tcp://*:5558"}, "--kv-events-replay-endpoint needs --kv-events-endpoint"),
    ({"kv_events_topic": "kv@{pod}"}, "--kv-events-topic may use {host}, {port} and {model} only (KeyError('pod'))"),
    ({"kv_events_topic": "kv@{"}, "--kv-events-topic may use {host}, {port} and {model} only"),
    ({"kv_events_hwm": -1}, "--kv-events-buffer-steps and --kv-events-hwm must be >= 0, --kv-events-max-queue >= 1"),
    ({"kv_events_max_queue": 0}, "--kv-events-max-queue >= 1"),
]


def test_the_defaults_and_the_base_are_valid() -> None:
    assert validate(ServerConfig()) is None and validate(BASE) is None


@pytest.mark.parametrize(("overrides", "message"), RULES, ids=[",".join(r[0]) for r in RULES])
def test_each_rule_names_the_setting_it_refuses(overrides: dict[str, Any], message: str) -> None:
    problem = validate(replace(BASE, **overrides))
    assert problem is not None and message in problem, problem


def test_every_rule_of_validate_has_a_row() -> None:
    """The table covers every ``return "..."`` of ``validate`` (a new rule needs a row here)."""
    import inspect
    import re

    import service.config

    messages = set(re.findall(r'return "([^"]+)"', inspect.getsource(service.config.validate)))
    covered = {m for m in messages if any(m.startswith(row) or row in m for _, row in RULES)}
    assert covered == messages


@pytest.mark.parametrize(("overrides", "message"), RULES[:6], ids=[",".join(r[0]) for r in RULES[:6]])
def test_a_refused_command_line_exits_2_with_the_rule(
    overrides: dict[str, Any], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in {"threads": 2, **overrides}.items()]
    with pytest.raises(SystemExit) as info:
        load_config(argv, env={})
    assert info.value.code == 2
    assert message in capsys.readouterr().err


# (variable, raw value, the message): one row per kind of parse error.
ENV_ERRORS = [
    ("INFERENCE_MAX_RUNNING", "eight", "INFERENCE_MAX_RUNNING='eight' is not a valid int"),
    ("INFERENCE_MAX_RUNNING", "8.5", "INFERENCE_MAX_RUNNING='8.5' is not a valid int"),
    ("INFERENCE_AGING_S", "soon", "INFERENCE_AGING_S='soon' is not a valid float"),
    ("INFERENCE_PREFIX_CACHE", "maybe", "INFERENCE_PREFIX_CACHE='maybe' is not a valid bool"),
    ("INFERENCE_SCHEDULING", "lifo", "INFERENCE_SCHEDULING must be one of priority, fcfs"),
    ("INFERENCE_LOG_FORMAT", "xml", "INFERENCE_LOG_FORMAT must be one of text, json"),
    ("INFERENCE_KV_CACHE_TYPE", "fp8", "INFERENCE_KV_CACHE_TYPE must be one of f16, q8_0, q4_0"),
    ("INFERENCE_MAX_RUNNING", "0", "--max-running must be >= 1"),  # parses, then a rule refuses it
]


@pytest.mark.parametrize(("name", "raw", "message"), ENV_ERRORS, ids=[f"{n}={r}" for n, r, _ in ENV_ERRORS])
def test_a_bad_environment_variable_exits_2_naming_it(
    name: str, raw: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        load_config([], env={"INFERENCE_THREADS": "2", name: raw})
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("raw", "value"), [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("off", False)]
)
def test_boolean_environment_values(raw: str, value: bool) -> None:
    assert load_config([], env={"INFERENCE_THREADS": "2", "INFERENCE_PREFIX_CACHE": raw}).prefix_cache is value


def test_a_flag_wins_over_the_environment() -> None:
    env = {"INFERENCE_THREADS": "2", "INFERENCE_MAX_RUNNING": "4", "INFERENCE_SCHEDULING": "fcfs"}
    config = load_config(["--max-running", "6", "--no-prefix-cache"], env=env)
    assert (config.max_running, config.scheduling, config.prefix_cache) == (6, "fcfs", False)


def test_a_kv_cache_type_outside_the_three_is_refused_at_start_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load_config(["--threads", "2", "--kv-cache-type", "q4_1"], env={})
    assert info.value.code == 2
    assert "argument --kv-cache-type: invalid choice: 'q4_1' (choose from 'f16', 'q8_0', 'q4_0')" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["f16", "q8_0", "q4_0"])
def test_each_kv_cache_type_is_accepted_from_the_flag_and_the_environment(kind: str) -> None:
    assert load_config(["--threads", "2", "--kv-cache-type", kind], env={}).kv_cache_type == kind
    assert load_config([], env={"INFERENCE_THREADS": "2", "INFERENCE_KV_CACHE_TYPE": kind}).kv_cache_type == kind


def test_the_flags_kv_cache_types_are_the_runners() -> None:
    """config.py names the types without importing llama.cpp; the runner maps each to a ggml type."""
    from service.config import KV_CACHE_TYPES
    from service.model.runner import KV_CACHE_TYPES as RUNNER_TYPES

    assert tuple(RUNNER_TYPES) == KV_CACHE_TYPES
