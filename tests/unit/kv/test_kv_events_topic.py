"""The KV-event publisher's settings from the server's flags (no model): llm-d's topic filled in."""

from __future__ import annotations

import socket

import pytest

from service.assembly import kv_events_config
from service.config import ServerConfig


def test_events_are_off_without_an_endpoint() -> None:
    assert kv_events_config(ServerConfig()) is None


def test_the_default_topic_names_the_pod_ip_the_http_port_and_the_served_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    config = ServerConfig(model="models/m.gguf", kv_events_endpoint="tcp://*:5557", http_port=8080)
    settings = kv_events_config(config)
    assert settings is not None and settings.topic == "kv@10.1.2.3:8080@m"
    assert (settings.endpoint, settings.replay_endpoint, settings.buffer_steps, settings.hwm, settings.max_queue) == (
        "tcp://*:5557", "", 10_000, 100_000, 100_000,
    )


def test_without_a_pod_ip_the_host_name_and_without_http_the_grpc_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_IP", raising=False)
    config = ServerConfig(
        kv_events_endpoint="tcp://*:5557", http_port=0, port=6000, served_model_name="chat",
        kv_events_topic="{model}|{host}|{port}",
    )
    settings = kv_events_config(config)
    assert settings is not None and settings.topic == f"chat|{socket.gethostname()}|6000"
