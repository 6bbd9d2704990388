"""The HTTP API does not outlive a token either: every request is checked against the tenants file in force
(a revoked token's next request is a 401), and a request still running when its token is revoked ends as a
Generate stream's requests do (UNAUTHENTICATED: an error event in its event stream); other tenants go on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer, assert_kv_clean, free_port, start_server

pytestmark = pytest.mark.model
TOKENS = {"a": "tok-http-revoked-a", "b": "tok-http-kept-b"}


def doc(*tenants: str) -> str:
    return json.dumps({"tenants": {t: {"token_sha256": [hashlib.sha256(TOKENS[t].encode()).hexdigest()]}
                                   for t in tenants}})


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(doc("a", "b"))
    srv = start_server(http_port=free_port(), auth_tokens=str(tenants))
    yield srv, tenants
    srv.close()


def sdk(srv: RunningServer, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.server.http_port}/v1", api_key=TOKENS[tenant],
                         max_retries=0, timeout=600)


def test_revoked_token_is_refused_next_request_and_ends_its_running_stream(
    served: tuple[RunningServer, Path],
) -> None:
    srv, tenants = served
    with sdk(srv, "a") as a, sdk(srv, "b") as b:
        assert a.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0).usage.completion_tokens == 2
        stream = a.completions.create(model=MODEL, prompt="Tell me a long story.", max_tokens=4000, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        assert next(chunks).choices[0].text is not None  # running: the status line and a first chunk are sent

        tenants.write_text(doc("b"))  # a's token revoked
        srv.server.tenancy.reload()  # what SIGHUP does
        with pytest.raises(openai.AuthenticationError) as refused:
            a.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
        assert refused.value.status_code == 401 and "invalid bearer token" in refused.value.message

        with pytest.raises(openai.APIError) as ended:
            for _ in chunks:
                pass
        assert "no longer valid" in ended.value.message
        assert isinstance(ended.value.body, dict) and ended.value.body["type"] == "authentication_error"
        stream.close()

        kept = b.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert kept.usage is not None and kept.usage.completion_tokens == 2
    assert_kv_clean(srv)
