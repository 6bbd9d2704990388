"""Authentication before any work on the BatchService and the model RPCs, and TLS certificate rotation
on the real server (the server's own credentials, not a bare health server)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.batch.test_batch import gen
from tests.model.security.test_security import Setup, bearer
from tests.support.certs import CA
from tests.support.server import RunningServer, start_server

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def auth_setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("auth"))


@pytest.fixture(scope="module")
def authed(auth_setup: Setup) -> Iterator[RunningServer]:
    srv = start_server(
        tls_cert=str(auth_setup.cert), tls_key=str(auth_setup.key), auth_tokens=str(auth_setup.tenants)
    )
    yield srv
    srv.close()


def _channel(setup: Setup, srv: RunningServer) -> grpc.Channel:
    return grpc.secure_channel(f"localhost:{srv.port}", grpc.ssl_channel_credentials(setup.ca.pem))


BATCH_CALLS: dict[str, Callable[[bpb_grpc.BatchServiceStub, Any], Any]] = {
    "CreateBatch": lambda s, md: s.CreateBatch(iter([bpb.CreateBatchRequest(items=[gen("a")])]), metadata=md, timeout=10),
    "GetBatch": lambda s, md: s.GetBatch(bpb.GetBatchRequest(batch_id="batch_x"), metadata=md, timeout=10),
    "ListBatches": lambda s, md: s.ListBatches(bpb.ListBatchesRequest(), metadata=md, timeout=10),
    "CancelBatch": lambda s, md: s.CancelBatch(bpb.CancelBatchRequest(batch_id="batch_x"), metadata=md, timeout=10),
    "WatchBatch": lambda s, md: list(s.WatchBatch(bpb.WatchBatchRequest(batch_id="batch_x"), metadata=md, timeout=10)),
    "GetBatchResults": lambda s, md: list(
        s.GetBatchResults(bpb.GetBatchResultsRequest(batch_id="batch_x"), metadata=md, timeout=10)
    ),
}
MODEL_CALLS: dict[str, Callable[[pb_grpc.InferenceServiceStub, Any], Any]] = {
    "Tokenize": lambda s, md: s.Tokenize(pb.TokenizeRequest(text="Hi"), metadata=md, timeout=10),
    "Detokenize": lambda s, md: s.Detokenize(pb.DetokenizeRequest(token_ids=[1]), metadata=md, timeout=10),
    "CountTokens": lambda s, md: s.CountTokens(pb.CountTokensRequest(text="Hi"), metadata=md, timeout=10),
    "GetModelInfo": lambda s, md: s.GetModelInfo(pb.GetModelInfoRequest(), metadata=md, timeout=10),
}
WRONG = (("authorization", "Bearer not-a-token"),)


class Spy:
    """Stands in for an object and records every attribute asked of it (any use is work)."""

    def __init__(self, real: Any) -> None:
        self._real, self.used = real, []

    def __getattr__(self, name: str) -> Any:
        self.used.append(name)
        return getattr(self._real, name)

    def __call__(self, *args: Any) -> Any:
        self.used.append(args[0] if args else "__call__")
        return self._real(*args)


@pytest.mark.parametrize("metadata", [None, WRONG], ids=["no token", "wrong token"])
@pytest.mark.parametrize("method", [*BATCH_CALLS, *MODEL_CALLS])
def test_unauthenticated_calls_are_refused_before_any_work(
    authed: RunningServer, auth_setup: Setup, monkeypatch: pytest.MonkeyPatch, method: str, metadata: Any
) -> None:
    """No store call on the BatchService, no tokenizer or model use on the model RPCs."""
    store = Spy(authed.server.batch.servicer.db)
    model = Spy(authed.server.servicer.model_api)
    monkeypatch.setattr(authed.server.batch.servicer, "db", store)
    monkeypatch.setattr(authed.server.servicer, "model_api", model)
    with _channel(auth_setup, authed) as ch, pytest.raises(grpc.RpcError) as info:
        if method in BATCH_CALLS:
            BATCH_CALLS[method](bpb_grpc.BatchServiceStub(ch), metadata)
        else:
            MODEL_CALLS[method](pb_grpc.InferenceServiceStub(ch), metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value.details()
    assert "not-a-token" not in (info.value.details() or "")
    assert store.used == [] and model.used == []


@pytest.mark.parametrize("method", [*BATCH_CALLS, *MODEL_CALLS])
def test_the_same_calls_with_a_token_reach_the_service(
    authed: RunningServer, auth_setup: Setup, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """The other side of the test above: with alpha's token the spies see work (or NOT_FOUND)."""
    store = Spy(authed.server.batch.servicer.db)
    model = Spy(authed.server.servicer.model_api)
    monkeypatch.setattr(authed.server.batch.servicer, "db", store)
    monkeypatch.setattr(authed.server.servicer, "model_api", model)
    with _channel(auth_setup, authed) as ch:
        try:
            if method in BATCH_CALLS:
                BATCH_CALLS[method](bpb_grpc.BatchServiceStub(ch), bearer("alpha"))
            else:
                MODEL_CALLS[method](pb_grpc.InferenceServiceStub(ch), bearer("alpha"))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc.details()  # batch_x does not exist
    assert store.used or model.used


# -- TLS rotation on the real server ----------------------------------------------------------
def _moved_on(*paths: Path) -> None:
    """Move mtimes a second on (a rewrite within the mtime granularity would look unchanged)."""
    for path in paths:
        ns = os.stat(path).st_mtime_ns + 1_000_000_000
        os.utime(path, ns=(ns, ns))


def _serving(port: int, ca: CA) -> int:
    with grpc.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials(ca.pem)) as ch:
        return int(health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10).status)


def test_a_rotated_certificate_reaches_new_connections_of_the_real_server(tmp_path: Path) -> None:
    old_ca = CA("Old CA")
    cert, key = old_ca.issue("localhost", server=True).write(tmp_path, "server")
    srv = start_server(tls_cert=str(cert), tls_key=str(key))
    try:
        kept = grpc.secure_channel(f"localhost:{srv.port}", grpc.ssl_channel_credentials(old_ca.pem))
        stub = pb_grpc.InferenceServiceStub(kept)
        assert stub.Tokenize(pb.TokenizeRequest(text="Hi"), timeout=10).token_ids
        new_ca = CA("New CA")
        _moved_on(*new_ca.issue("localhost", server=True).write(tmp_path, "server"))  # no restart
        assert _serving(srv.port, new_ca) == health_pb2.HealthCheckResponse.SERVING
        assert srv.server.tls_files is not None and srv.server.tls_files.rotations == 1
        with pytest.raises(grpc.RpcError) as info:
            _serving(srv.port, old_ca)  # a new connection trusting only the old CA is refused
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert stub.Tokenize(pb.TokenizeRequest(text="Hi"), timeout=10).token_ids  # the open one goes on
        kept.close()
        with grpc.secure_channel(f"localhost:{srv.port}", grpc.ssl_channel_credentials(new_ca.pem)) as ch:
            out = list(pb_grpc.InferenceServiceStub(ch).Generate(
                iter([pb.GenerateRequest(request_id="r", prompt="Hi", sampling=pb.SamplingParams(max_tokens=2))]),
                timeout=600,
            ))
        assert out[-1].WhichOneof("event") == "done"
    finally:
        srv.close()


def test_a_half_rotated_pair_keeps_the_real_server_on_its_old_certificate(tmp_path: Path) -> None:
    ca = CA()
    good, other = ca.issue("localhost", server=True), ca.issue("localhost", server=True)
    cert, key = good.write(tmp_path, "server")
    srv = start_server(tls_cert=str(cert), tls_key=str(key))
    try:
        files = srv.server.tls_files
        assert files is not None and files.rotations == 0
        cert.write_bytes(other.cert)  # the new certificate, still the old key: they do not fit
        _moved_on(cert)
        assert _serving(srv.port, ca) == health_pb2.HealthCheckResponse.SERVING  # the old pair serves
        assert files.rotations == 0  # the handshake asked, the half-rotated pair was refused
        key.write_bytes(other.key)
        _moved_on(key)
        assert _serving(srv.port, ca) == health_pb2.HealthCheckResponse.SERVING
        assert files.rotations == 1  # the completed pair is served
    finally:
        srv.close()

