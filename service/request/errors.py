"""Errors a request can end with before it reaches the engine."""

from __future__ import annotations


class BadRequest(ValueError):
    """Invalid input; ``status`` is the gRPC status name to answer with (default INVALID_ARGUMENT)."""

    def __init__(self, message: str, status: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.status = status
