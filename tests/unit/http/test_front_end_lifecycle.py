"""The HTTP front end before the model is loaded: it listens at once and answers 503 with Retry-After and the
reason ``loading`` (error code and header)."""

from __future__ import annotations

import httpx2
import pytest

from service.api.cache_front import CacheFront
from service.api.intake import Intake
from service.http.config import HttpConfig
from service.http.server import HttpFrontEnd
from service.observability.telemetry import Telemetry
from service.security.tenancy import Tenancy


async def test_requests_while_loading_are_503_with_retry_after() -> None:
    telemetry = Telemetry()
    intake = Intake(telemetry, Tenancy(), CacheFront(None))  # never attached: "loading"
    front = HttpFrontEnd(HttpConfig(host="127.0.0.1", port=0, model_name="m"), intake, Tenancy())
    port = await front.start()
    try:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("GET", "/metrics"),
                                 ("POST", "/v1/chat/completions")):
                r = await http.request(method, path, json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
                assert r.status_code == 503, path
                assert r.json()["error"]["type"] == "service_unavailable_error"
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == r.headers["inference-unavailable-reason"] == "loading"
    finally:
        await front.stop()
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5)


async def test_a_taken_port_fails_the_start() -> None:
    telemetry = Telemetry()
    intake = Intake(telemetry, Tenancy(), CacheFront(None))
    first = HttpFrontEnd(HttpConfig(host="127.0.0.1", port=0, model_name="m"), intake, Tenancy())
    port = await first.start()
    try:
        second = HttpFrontEnd(HttpConfig(host="127.0.0.1", port=port, model_name="m"), intake, Tenancy())
        with pytest.raises(OSError):
            await second.start()
        second.files.close()
    finally:
        await first.stop()
