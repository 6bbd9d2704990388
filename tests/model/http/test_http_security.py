"""The HTTP API over the gRPC port's TLS files and tenants: the SDK's error class for each refusal, and an
HTTP request and a gRPC request of one tenant share its quotas, fair-share counter and the response cache."""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2
import openai
import pytest

from tests.model.http.conftest import MODEL
from tests.support.certs import CA
from tests.support.helpers import EngineHold, OpenStream, req, run_stream
from tests.support.server import RunningServer, free_port, start_server

pytestmark = pytest.mark.model
TOKENS = {"alpha": "tok-alpha-http", "ops": "tok-ops-http", "nobody": "tok-norole-http", "tight": "tok-tight-http",
          "solo": "tok-solo-http"}


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Setup:
    def __init__(self, folder: Path) -> None:
        self.ca = CA()
        self.ca_file = folder / "ca.crt"
        self.ca_file.write_bytes(self.ca.pem)
        self.cert, self.key = self.ca.issue("localhost", server=True).write(folder, "server")
        self.tenants = folder / "tenants.json"
        self.tenants.write_text(json.dumps({
            "open_http_paths": ["/health"],  # /metrics then needs the admin role
            "tenants": {
                "alpha": {"token_sha256": [sha(TOKENS["alpha"])]},
                "ops": {"token_sha256": [sha(TOKENS["ops"])], "roles": ["admin"]},
                "nobody": {"token_sha256": [sha(TOKENS["nobody"])], "roles": []},
                "tight": {"token_sha256": [sha(TOKENS["tight"])], "tokens_per_minute": 100},
                "solo": {"token_sha256": [sha(TOKENS["solo"])], "max_concurrent": 1},
            },
        }))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("http-security"))


@pytest.fixture(scope="module")
def secure(setup: Setup) -> Iterator[RunningServer]:
    srv = start_server(http_port=free_port(), tls_cert=str(setup.cert), tls_key=str(setup.key),
                       auth_tokens=str(setup.tenants), response_cache_bytes=8 << 20, max_running=4)
    yield srv
    srv.close()


def sdk(srv: RunningServer, setup: Setup, tenant: str | None) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=setup.ca_file))
    key = TOKENS[tenant] if tenant else "not-a-token"
    return openai.OpenAI(base_url=f"https://localhost:{srv.server.http_port}/v1", api_key=key, max_retries=0,
                         http_client=http, timeout=600)


def raw(srv: RunningServer, setup: Setup) -> httpx2.Client:
    ca = ssl.create_default_context(cafile=setup.ca_file)
    return httpx2.Client(base_url=f"https://localhost:{srv.server.http_port}", verify=ca, timeout=600)


def grpc_channel(srv: RunningServer, setup: Setup) -> grpc.Channel:
    return grpc.secure_channel(f"localhost:{srv.port}", grpc.ssl_channel_credentials(setup.ca.pem))


def bearer(tenant: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {TOKENS[tenant]}"),)


def test_tls_and_a_token_admit_the_sdk(secure: RunningServer, setup: Setup) -> None:
    r = sdk(secure, setup, "alpha").chat.completions.create(model=MODEL, max_tokens=4,
                                                            messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content is not None
    with pytest.raises((httpx2.ConnectError, httpx2.RemoteProtocolError)):  # plaintext HTTP to the TLS port
        httpx2.get(f"http://localhost:{secure.server.http_port}/health", timeout=10)


def test_missing_or_wrong_token_is_authentication_error(secure: RunningServer, setup: Setup) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        sdk(secure, setup, None).models.list()
    assert info.value.status_code == 401 and info.value.body["type"] == "authentication_error"
    r = raw(secure, setup).get("/v1/models")
    assert r.status_code == 401 and "missing 'Authorization: Bearer" in r.json()["error"]["message"]


def test_tenant_without_the_role_is_permission_denied(secure: RunningServer, setup: Setup) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        sdk(secure, setup, "nobody").completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert info.value.status_code == 403 and info.value.body["type"] == "permission_error"
    http = raw(secure, setup)
    assert http.get("/metrics", headers={"authorization": f"Bearer {TOKENS['alpha']}"}).status_code == 403
    assert http.get("/metrics", headers={"authorization": f"Bearer {TOKENS['ops']}"}).status_code == 200
    assert http.get("/health").status_code == 200  # an open path: no token


def test_tokens_per_minute_quota_is_rate_limit_error_with_retry_after(secure: RunningServer, setup: Setup) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        sdk(secure, setup, "tight").completions.create(model=MODEL, prompt="hi", max_tokens=200)
    err = info.value
    assert err.status_code == 429 and err.body["type"] == "rate_limit_error" and err.body["code"] == "tokens_per_minute"
    assert int(err.response.headers["retry-after"]) >= 1


def test_http_and_grpc_share_the_tenants_concurrency_quota(secure: RunningServer, setup: Setup) -> None:
    with grpc_channel(secure, setup) as ch, EngineHold(secure.engine) as hold:
        stream = OpenStream(ch, metadata=bearer("solo"))
        stream.send(req("long", "Count slowly:", 64, ignore_eos=True))
        # the gRPC request holds solo's one slot (and is held after its first step: it cannot finish
        # before the HTTP request's turn on a busy machine)
        assert stream.next_event().WhichOneof("event") == "delta"
        with pytest.raises(openai.RateLimitError) as info:
            sdk(secure, setup, "solo").completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert info.value.body["code"] == "max_concurrent"
        hold.release()
        stream.close()
        while stream.next_event().WhichOneof("event") != "done":
            pass
    assert sdk(secure, setup, "solo").completions.create(model=MODEL, prompt="hi", max_tokens=2).choices


def tenant_row(srv: RunningServer, name: str) -> dict[str, Any]:
    return next(r for r in srv.server.tenancy.rows() if r["tenant"] == name)


def test_http_and_grpc_share_the_response_cache_and_the_fair_share_counter(secure: RunningServer,
                                                                          setup: Setup) -> None:
    prompt = "The three primary colors are"
    before, service0 = secure.server.intake.cache.metrics(), tenant_row(secure, "alpha")["service"]
    with grpc_channel(secure, setup) as ch:
        first = run_stream(ch, [req("c1", prompt, 8)], metadata=bearer("alpha"), timeout=600)["c1"]
    assert first.done is not None and not first.done.cache_hit
    service1 = tenant_row(secure, "alpha")["service"]
    r = sdk(secure, setup, "alpha").completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    after = secure.server.intake.cache.metrics()
    assert r.choices[0].text == first.text and after.hits == before.hits + 1
    assert service1 > service0  # the gRPC request was counted for alpha's fair share
    fresh = sdk(secure, setup, "alpha").completions.create(model=MODEL, prompt="Name a fruit:", max_tokens=8,
                                                           temperature=0)
    assert fresh.usage is not None and tenant_row(secure, "alpha")["service"] > service1  # and so is HTTP's


def test_concurrent_tenants_over_tls_all_answered(secure: RunningServer, setup: Setup) -> None:
    codes: list[int] = []

    def one(tenant: str) -> None:
        r = raw(secure, setup).post("/v1/completions", headers={"authorization": f"Bearer {TOKENS[tenant]}"},
                                    json={"model": MODEL, "prompt": "x", "max_tokens": 3})
        codes.append(r.status_code)

    threads = [threading.Thread(target=one, args=(t,)) for t in ("alpha", "ops", "alpha", "ops")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert codes == [200] * 4
