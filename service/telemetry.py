"""Request tracing hooks (OpenTelemetry). Tracing off means these are no-ops."""

from __future__ import annotations

from typing import Any


class Telemetry:
    """Per-request tracing; the no-op base used when tracing is off."""

    enabled = False

    def on_submit(self, seq: Any) -> None:
        """Event loop thread: the request was validated and is about to be queued."""
        return None

    def on_finish(self, seq: Any, event: Any) -> None:
        """Event loop thread: the request's final event (Done or Error) was produced."""
        return None

    # -- engine thread hooks: must be cheap; called between decodes --------------------------
    def on_scheduled(self, seq: Any) -> None:
        """The request left the queue and its prefill started (first time only)."""
        return None

    def on_first_token(self, seq: Any) -> None:
        return None

    def on_preempted(self, seq: Any, reason: str) -> None:
        return None

    def shutdown(self) -> None:
        return None
