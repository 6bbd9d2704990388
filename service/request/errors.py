"""Errors a request can end with before it reaches the engine."""

from __future__ import annotations


class BadRequest(ValueError):
    """Invalid input; ``status`` is the gRPC status name to answer with (default INVALID_ARGUMENT);
    ``reason`` the machine-readable why when there is one (``service.request.events``' constants)."""

    def __init__(self, message: str, status: str = "INVALID_ARGUMENT", reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class Unavailable(Exception):
    """Something the call needs (the batch job store) cannot serve it now: retry later.

    Front ends answer UNAVAILABLE (gRPC) or 503 with ``Retry-After`` (HTTP) and
    ``public_message``; ``str(exc)`` may name hosts or driver errors, so it is
    logged, never sent.
    """

    public_message = "a service this call needs is unavailable; retry later"
