"""Chooses the telemetry implementation from the configuration."""

from __future__ import annotations

from service.config import ServerConfig
from service.telemetry import Telemetry


def make_telemetry(config: ServerConfig) -> Telemetry:
    return Telemetry()
