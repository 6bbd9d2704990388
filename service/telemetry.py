"""Request tracing hooks (OpenTelemetry). Tracing off means these are no-ops."""

from __future__ import annotations

from typing import Any


class Telemetry:
    """Per-request tracing; the no-op base used when tracing is off."""

    def on_submit(self, seq: Any) -> None:
        return None

    def on_finish(self, seq: Any, event: Any) -> None:
        return None

    def shutdown(self) -> None:
        return None
