"""A Generate stream does not outlive its credentials: once its token is removed from the tenants file
(and the file reloaded), a new request on the already open stream, and a request still running on it,
end with UNAUTHENTICATED; other tenants' streams go on."""

from __future__ import annotations

import hashlib
import json
import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.helpers import req, run_stream
from tests.support.server import RunningServer, assert_kv_clean, start_server

pytestmark = pytest.mark.model
TOKENS = {"a": "tok-revoked-a", "b": "tok-kept-b"}


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def doc(*tenants: str) -> str:
    return json.dumps({"tenants": {t: {"token_sha256": [sha(TOKENS[t])]} for t in tenants}})


def bearer(tenant: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {TOKENS[tenant]}"),)


class TokenStream:
    """A Generate stream opened with a tenant's token; requests are sent on demand."""

    def __init__(self, ch: grpc.Channel, tenant: str) -> None:
        self._q: queue.Queue[pb.GenerateRequest | None] = queue.Queue()
        self.call = pb_grpc.InferenceServiceStub(ch).Generate(iter(self._q.get, None), metadata=bearer(tenant))
        self._events = iter(self.call)

    def send(self, request: pb.GenerateRequest) -> None:
        self._q.put(request)

    def final(self, rid: str) -> pb.GenerateResponse:
        """Read until ``rid``'s terminal event (events of other requests are skipped)."""
        for ev in self._events:
            if ev.request_id == rid and ev.WhichOneof("event") != "delta":
                return ev
        raise AssertionError(f"stream ended before {rid} finished")

    def first_delta(self, rid: str) -> None:
        for ev in self._events:
            if ev.request_id == rid:
                assert ev.WhichOneof("event") == "delta", ev
                return

    def close(self) -> None:
        self._q.put(None)


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(doc("a", "b"))
    srv = start_server(auth_tokens=str(tenants))
    yield srv, tenants
    srv.close()


def test_revoked_token_ends_new_and_running_requests_on_its_open_stream(served: tuple[RunningServer, Path]) -> None:
    srv, tenants = served
    with grpc.insecure_channel(srv.target) as ch:
        stream = TokenStream(ch, "a")
        stream.send(req("before", "Hello", 4))
        assert stream.final("before").WhichOneof("event") == "done"
        stream.send(req("running", "Tell me a long story.", 4000, ignore_eos=True))
        stream.first_delta("running")

        tenants.write_text(doc("b"))  # a's token revoked
        srv.server.tenancy.reload()  # what SIGHUP does
        with pytest.raises(grpc.RpcError) as fresh:
            run_stream(ch, [req("fresh", "Hello", 4)], metadata=bearer("a"), timeout=600)
        assert fresh.value.code() == grpc.StatusCode.UNAUTHENTICATED

        stream.send(req("after", "Hello", 4))
        after = stream.final("after")
        assert after.WhichOneof("event") == "error" and after.error.status == "UNAUTHENTICATED", after
        assert "no longer valid" in after.error.message
        running = stream.final("running")
        assert running.WhichOneof("event") == "error" and running.error.status == "UNAUTHENTICATED", running
        stream.close()

        other = run_stream(ch, [req("b1", "Hello", 4)], metadata=bearer("b"), timeout=600)["b1"]
        assert other.done is not None and other.done.usage.completion_tokens == 4
    assert_kv_clean(srv)
