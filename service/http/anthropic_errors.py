"""Anthropic's error object for every failure under ``/v1/messages``.

::

    {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}

The HTTP status and type follow Anthropic's table: 400 ``invalid_request_error``,
401 ``authentication_error``, 403 ``permission_error``, 404 ``not_found_error``,
413 ``request_too_large``, 429 ``rate_limit_error`` (a tenant quota), 500
``api_error``, 504 ``timeout_error``; the server's own overload (its queue is
full: OpenAI's 429 ``server_is_overloaded``) is Anthropic's 529
``overloaded_error``, and a 503 (loading, draining, a failed engine) is a 503
``overloaded_error`` that keeps ``Retry-After`` and the
``inference-unavailable-reason`` header. The same ``ApiError`` feeds both
shapes, so a refusal means the same thing in every dialect.
"""

from __future__ import annotations

import json

from starlette.responses import Response

from service.http.errors import ApiError

PATH = "/v1/messages"
OVERLOADED = 529
TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
         503: "overloaded_error", 504: "timeout_error", OVERLOADED: "overloaded_error"}


def anthropic_status(exc: ApiError) -> int:
    """The HTTP status of ``exc`` under Anthropic's table (the server's overload is 529)."""
    return OVERLOADED if exc.status == 429 and exc.code == "server_is_overloaded" else exc.status


def anthropic_error(exc: ApiError) -> dict[str, object]:
    """The ``error`` object of ``exc`` (as the body of a refusal, or in a stream's ``error`` event)."""
    status = anthropic_status(exc)
    kind = TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": kind, "message": str(exc)}


def anthropic_response(exc: ApiError) -> Response:
    """``exc`` as Anthropic's error response."""
    body = {"type": "error", "error": anthropic_error(exc)}
    return Response(json.dumps(body), anthropic_status(exc), headers=exc.headers(), media_type="application/json")
