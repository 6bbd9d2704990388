"""TLS, mTLS and token authentication end to end: a real server with the default model.

One server for the module: TLS with a client CA (so client certificates are
required) and a tenants file. Certificates are made here (tests/support/certs.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.certs import CA, Pem
from tests.support.helpers import EngineHold, OpenStream, collect, req, run_stream, wait_for
from tests.support.server import RunningServer, start_server, wait_idle

pytestmark = pytest.mark.model

TOKENS = {"alpha": "tok-alpha-0123", "ops": "tok-ops-4567", "tight": "tok-tight-89ab"}


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tenants_doc(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    tenants: dict[str, Any] = {
        "alpha": {"token_sha256": [sha(TOKENS["alpha"])], "identities": ["spiffe://test/alpha"]},
        "ops": {"token_sha256": sha(TOKENS["ops"]), "roles": ["admin"]},
        "tight": {
            "token_sha256": [sha(TOKENS["tight"])],
            "max_concurrent": 1,
            "tokens_per_minute": 400,
        },
    }
    tenants.update(extra or {})
    return {"tenants": tenants}


class Setup:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca = CA()
        self.ca_file = folder / "ca.crt"
        self.ca_file.write_bytes(self.ca.pem)
        self.cert, self.key = self.ca.issue("localhost", server=True).write(folder, "server")
        self.tenants = folder / "tenants.json"
        self.tenants.write_text(json.dumps(tenants_doc()))
        self.client = self.ca.issue("someone", uri="spiffe://test/alpha")
        self.anonymous_client = self.ca.issue("nobody")

    def channel(self, port: int, client: Pem | None = None) -> grpc.Channel:
        client = client or self.anonymous_client
        creds = grpc.ssl_channel_credentials(self.ca.pem, client.key, client.cert)
        return grpc.secure_channel(f"localhost:{port}", creds)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("security"))


@pytest.fixture(scope="module")
def secure(setup: Setup) -> Iterator[RunningServer]:
    srv = start_server(
        tls_cert=str(setup.cert),
        tls_key=str(setup.key),
        tls_client_ca=str(setup.ca_file),
        auth_tokens=str(setup.tenants),
        max_running=4,
    )
    yield srv
    srv.close()


def bearer(tenant: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {TOKENS[tenant]}"),)


def generate(ch: grpc.Channel, metadata: Any = None, max_tokens: int = 4, **kw: Any) -> Any:
    return run_stream(ch, [req("r1", "Hello", max_tokens, **kw)], metadata=metadata, timeout=600)["r1"]


def test_token_and_certificate_identity_authenticate(secure: RunningServer, setup: Setup) -> None:
    with setup.channel(secure.port) as ch:
        result = generate(ch, bearer("alpha"))
        assert result.done is not None and result.error is None
    with setup.channel(secure.port, setup.client) as ch:  # SAN URI names tenant alpha, no token
        assert generate(ch).done is not None
        metrics = pb_grpc.InferenceServiceStub(ch).GetMetrics(
            pb.GetMetricsRequest(), metadata=bearer("ops"), timeout=10
        )
    rows = {t.tenant: t for t in metrics.tenants}
    assert set(rows) == {"alpha", "ops", "tight"}
    assert rows["alpha"].requests_finished == 2 and rows["alpha"].generated_tokens > 0
    assert rows["ops"].requests_total == 0


@pytest.mark.parametrize(
    ("metadata", "method", "code"),
    [
        (None, "Generate", grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer wrong-token"),), "Generate", grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Basic " + TOKENS["alpha"]),), "GenerateJSON", grpc.StatusCode.UNAUTHENTICATED),
        (None, "GenerateJSON", grpc.StatusCode.UNAUTHENTICATED),
        (bearer("alpha"), "GetMetrics", grpc.StatusCode.PERMISSION_DENIED),
        (None, "GetMetrics", grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_refused_calls_never_reach_the_engine(
    secure: RunningServer, setup: Setup, metadata: Any, method: str, code: grpc.StatusCode
) -> None:
    wait_idle(secure)
    engine = secure.engine
    before = (engine.metrics.snapshot()["tiers"], engine.metrics.steps)
    prepared: list[str] = []
    intake = secure.server.intake
    original = intake.prepare

    async def spy(ask: Any, *args: Any) -> Any:
        prepared.append(ask.request_id)
        return await original(ask, *args)

    intake.prepare = spy  # type: ignore[method-assign]
    try:
        with setup.channel(secure.port) as ch:
            stub = pb_grpc.InferenceServiceStub(ch)
            with pytest.raises(grpc.RpcError) as info:
                if method == "Generate":
                    list(stub.Generate(iter([req("x", "Hello", 8)]), metadata=metadata, timeout=10))
                elif method == "GenerateJSON":
                    stub.GenerateJSON(
                        pb.GenerateJSONRequest(prompt="Hi", json_schema='{"type":"object"}'),
                        metadata=metadata,
                        timeout=10,
                    )
                else:
                    stub.GetMetrics(pb.GetMetricsRequest(), metadata=metadata, timeout=10)
    finally:
        del intake.prepare
    assert info.value.code() == code, info.value.details()
    assert TOKENS["alpha"] not in info.value.details()
    assert prepared == []
    assert (engine.metrics.snapshot()["tiers"], engine.metrics.steps) == before
    assert not engine.scheduler.has_work()


def test_health_and_reflection_need_no_token(secure: RunningServer, setup: Setup) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with setup.channel(secure.port) as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        answers = list(
            stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        )
        names = {s.name for s in answers[0].list_services_response.service}
        assert "inference.v1.InferenceService" in names


@pytest.mark.parametrize("kind", ["missing", "expired", "wrong_ca"])
def test_bad_client_certificates_fail_the_handshake(secure: RunningServer, setup: Setup, kind: str) -> None:
    if kind == "missing":
        creds = grpc.ssl_channel_credentials(setup.ca.pem)
    else:
        issuer = setup.ca if kind == "expired" else CA("Other CA")
        client = issuer.issue("someone", uri="spiffe://test/alpha", expired=kind == "expired")
        creds = grpc.ssl_channel_credentials(setup.ca.pem, client.key, client.cert)
    with grpc.secure_channel(f"localhost:{secure.port}", creds) as ch, pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_is_refused(secure: RunningServer) -> None:
    with grpc.insecure_channel(secure.target) as ch, pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_quota_max_concurrent_in_stream(secure: RunningServer, setup: Setup) -> None:
    with setup.channel(secure.port) as ch, EngineHold(secure.engine) as hold:
        stream = OpenStream(ch, timeout=600, metadata=bearer("tight"))
        stream.send(req("long", "Count:", 32, ignore_eos=True))
        stream.send(req("second", "Hi", 4))
        stream.close()
        # "long" is held after its first step until "second" has its answer: it provably still runs then
        events = [stream.next_event()]
        while events[-1].request_id != "second":
            events.append(stream.next_event())
        hold.release()
        stream.join()
    results = collect([*events, *stream.events.queue])
    assert results["long"].done is not None and results["long"].done.usage.completion_tokens == 32
    err = results["second"].error
    assert err is not None and err.status == "RESOURCE_EXHAUSTED", results["second"]
    assert "max_concurrent quota" in err.message and "not server overload" in err.message
    assert err.retry_after_ms > 0


def test_quota_tokens_per_minute_trailing_metadata(secure: RunningServer, setup: Setup) -> None:
    with setup.channel(secure.port) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.GenerateJSON(
                pb.GenerateJSONRequest(
                    prompt="Hi", json_schema='{"type":"object"}', sampling=pb.SamplingParams(max_tokens=500)
                ),
                metadata=bearer("tight"),
                timeout=10,
            )
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(info.value.trailing_metadata() or ())
    assert trailers.get("inference-quota") == "tokens_per_minute"
    assert int(trailers["retry-after-ms"]) > 0
    assert "tokens_per_minute quota" in info.value.details()


def test_tenants_file_reload(secure: RunningServer, setup: Setup) -> None:
    late = "tok-late-cdef"
    doc = tenants_doc({"late": {"token_sha256": [sha(late)]}})
    doc["tenants"]["alpha"]["token_sha256"] = []  # alpha's token revoked
    setup.tenants.write_text(json.dumps(doc))
    secure.server.tenancy.reload()  # what SIGHUP does
    try:
        with setup.channel(secure.port) as ch:
            assert generate(ch, (("authorization", f"Bearer {late}"),)).done is not None
            with pytest.raises(grpc.RpcError) as info:
                generate(ch, bearer("alpha"))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            setup.tenants.write_text("{not json")  # a broken file keeps the tenants in force
            assert not secure.server.tenancy.file.reload()  # type: ignore[union-attr]
            assert generate(ch, (("authorization", f"Bearer {late}"),)).done is not None
            setup.tenants.write_text(json.dumps(tenants_doc()))  # picked up by mtime, no signal

            def alpha_served() -> bool:
                try:
                    return generate(ch, bearer("alpha")).done is not None
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
                    return False

            assert wait_for(alpha_served, timeout=30), "the changed tenants file was not picked up"
    finally:
        setup.tenants.write_text(json.dumps(tenants_doc()))
        secure.server.tenancy.reload()


def test_python_client_and_cli_with_tls_and_token(
    secure: RunningServer, setup: Setup, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from inference_client import InferenceClient, InferenceError, secure_credentials
    from inference_client.cli import main

    files = setup.folder
    client_cert, client_key = setup.anonymous_client.write(files, "client")
    creds = secure_credentials(setup.ca_file, client_cert, client_key)
    target = f"localhost:{secure.port}"
    with InferenceClient(target, credentials=creds, token=TOKENS["alpha"]) as client:
        text = "".join(getattr(e, "text", "") for e in client.generate("Hello", max_tokens=4, temperature=0))
        assert text
        with pytest.raises(InferenceError) as info:
            client.metrics()
        assert info.value.status == "PERMISSION_DENIED"
    tls = ["--target", target, "--tls-ca", str(setup.ca_file), "--tls-cert", str(client_cert)]
    tls += ["--tls-key", str(client_key), "--retries", "1"]
    monkeypatch.setenv("INFERENCE_TOKEN", TOKENS["ops"])
    assert main([*tls, "metrics", "--json"]) == 0
    assert '"tenant": "alpha"' in capsys.readouterr().out
    assert main([*tls, "--token", "not-a-token", "generate", "Hi", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "UNAUTHENTICATED" in err and "not-a-token" not in err
