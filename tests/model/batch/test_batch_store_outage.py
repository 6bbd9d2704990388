"""BatchService without its database: an in-process server whose PostgreSQL store is not there yet.

The server starts anyway (Generate serves); every BatchService method answers UNAVAILABLE with a
retry hint and its gRPC health is NOT_SERVING; once the database comes up (here: a throwaway cluster
started on the port the server was given), the store opens (schema migrated), BatchService turns
SERVING and runs jobs. The outage in the middle of a job, across replicas, is in
tests/model/scale/test_replicas_netns.py.

The drain rule (tests/model/server/test_drain_rule.py) and a store outage together: while a server
drains with its database down, CreateBatch is refused for the drain (reason "draining": retry on
another replica) and the reads and CancelBatch for the store (a retry hint, no drain reason); once
the database is back they are answered again, still draining.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.batch.test_batch import PROMPTS, create, final, gen
from tests.model.server.test_drain_rule import ANSWERED_WHILE_DRAINING, REASON_KEY, calls, wait_for
from tests.support.helpers import OpenStream, req
from tests.support.pg import PgCluster, free_port, require
from tests.support.server import ROOT, RunningServer, server_argv, start_server, wait_batch_store

pytestmark = pytest.mark.model
BATCH = "inference.v1.BatchService"
STORE_DOWN = "the batch job store is unavailable"


def batch_calls(ch: grpc.Channel, batch_id: str) -> dict[str, Any]:
    """One minimal, valid call of every BatchService method (the drain rule test's table)."""
    return {m: call for m, call in calls(ch, batch_id).items() if m.startswith(BATCH + ".")}


def refused(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


def assert_store_unavailable(err: grpc.RpcError, method: str) -> None:
    """UNAVAILABLE for the store: a retry hint, no drain reason, no database address."""
    meta = tuple(err.trailing_metadata() or ())
    assert err.code() == grpc.StatusCode.UNAVAILABLE, (method, err)
    assert STORE_DOWN in (err.details() or "") and "127.0.0.1" not in (err.details() or ""), method
    assert ("retry-after-ms", "1000") in meta and not any(k == REASON_KEY for k, _ in meta), (method, meta)


@pytest.fixture()
def late_db() -> Iterator[PgCluster]:
    """A cluster not started yet, on a port fixed now (the server is pointed at it first)."""
    pg = PgCluster(require(), port=free_port())
    yield pg
    pg.stop()


def health(ch: grpc.Channel, service: str) -> str:
    resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def generate_text(ch: grpc.Channel) -> str:
    req = pb.GenerateRequest(request_id="g", prompt="Hello", sampling=pb.SamplingParams(max_tokens=4))
    out = pb_grpc.InferenceServiceStub(ch).Generate(iter([req]), timeout=600)
    return "".join(m.delta.text for m in out if m.HasField("delta"))


@pytest.mark.timeout(180)
def test_a_database_down_at_start_leaves_generate_serving_and_batch_unavailable_until_it_comes(
    late_db: PgCluster,
) -> None:
    srv: RunningServer = start_server(batch_db=late_db.url("postgres"), replica_id="solo")
    try:
        with grpc.insecure_channel(srv.target) as ch:
            stub = bpb_grpc.BatchServiceStub(ch)
            for method, call in batch_calls(ch, "batch_x").items():
                assert_store_unavailable(refused(call), method)
            assert (health(ch, BATCH), health(ch, "inference.v1.InferenceService")) == ("NOT_SERVING", "SERVING")
            assert generate_text(ch) != ""
            late_db.start()
            wait_batch_store(srv, timeout=600)
            assert health(ch, BATCH) == "SERVING"
            job = create(stub, [gen(f"i{n}", PROMPTS[n % 4]) for n in range(4)])
            assert final(stub, job.id).counts.completed == 4
    finally:
        srv.close()


@pytest.mark.timeout(120)
def test_the_http_batch_api_answers_503_with_a_retry_hint_while_the_database_is_down(late_db: PgCluster) -> None:
    port = free_port()
    srv: RunningServer = start_server(batch_db=late_db.url("postgres"), replica_id="solo", http_port=port)
    try:
        for method, path in (("GET", "/v1/batches/batch_x"), ("POST", "/v1/batches/batch_x/cancel")):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=30)
            body = json.loads(err.value.read())
            assert err.value.code == 503 and err.value.headers["Retry-After"] == "1", path
            assert body["error"]["message"] == "the batch job store is unavailable; retry later", body
            assert body["error"]["type"] == "service_unavailable_error", body
        # the uploaded files live in the same database: their routes answer 503 too, never a 500
        boundary = "b0undary"
        upload = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
                  f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
                  f"Content-Type: application/jsonl\r\n\r\n{{}}\r\n--{boundary}--\r\n").encode()
        for method, path, data in (("POST", "/v1/files", upload), ("GET", "/v1/files/file-x", None),
                                   ("GET", "/v1/files/file-x/content", None), ("DELETE", "/v1/files/file-x", None)):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                             headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=30)
            body = json.loads(err.value.read())
            assert err.value.code == 503 and err.value.headers["Retry-After"] == "1", (method, path, body)
            assert body["error"]["message"] == "the file store is unavailable; retry later", body
            assert str(late_db.port) not in json.dumps(body), body
    finally:
        srv.close()


def test_an_unknown_batch_db_scheme_exits_2_before_the_model_loads() -> None:
    done = subprocess.run(server_argv("--batch-db", "mysql://u:secret@db/jobs"), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    assert "unknown scheme 'mysql'" in done.stderr and "secret" not in done.stderr
    assert "loading" not in done.stderr


@pytest.mark.timeout(240)
def test_while_draining_with_the_store_down_work_is_refused_for_the_drain_and_reads_for_the_store(
    late_db: PgCluster,
) -> None:
    late_db.start()
    srv: RunningServer = start_server(batch_db=late_db.url("postgres"), replica_id="solo")
    try:
        wait_batch_store(srv, timeout=600)
        with grpc.insecure_channel(srv.target) as ch:
            job = create(bpb_grpc.BatchServiceStub(ch), [gen("i0", PROMPTS[0])])
            hold = OpenStream(ch)  # one long request keeps the server in its grace period
            hold.send(req("hold", "Tell me a long story.", 4000, ignore_eos=True))
            assert hold.next_event().WhichOneof("event") == "delta"
            drained = asyncio.run_coroutine_threadsafe(srv.server.drain(300.0), srv.loop)
            wait_for(lambda: health(ch, "inference.v1.InferenceService") == "NOT_SERVING")
            for_the_drain: list[str] = []

            def while_down() -> None:
                for method, call in batch_calls(ch, job.id).items():
                    err = refused(call)
                    if ANSWERED_WHILE_DRAINING[method]:  # a read: the store's refusal, not the drain's
                        assert_store_unavailable(err, method)
                        continue
                    assert err.code() == grpc.StatusCode.UNAVAILABLE, method
                    assert "shutting down" in (err.details() or ""), method
                    assert (REASON_KEY, "draining") in tuple(err.trailing_metadata() or ()), method
                    for_the_drain.append(method)

            late_db.restart(while_down)
            assert for_the_drain == [f"{BATCH}.CreateBatch"]
            wait_batch_store(srv, timeout=600)
            for method, call in batch_calls(ch, job.id).items():  # the store is back: the drain rule alone
                if ANSWERED_WHILE_DRAINING[method]:
                    call()
                else:
                    assert (REASON_KEY, "draining") in tuple(refused(call).trailing_metadata() or ()), method
            hold.send(pb.GenerateRequest(request_id="hold", cancel=True))
            hold.close()
            drained.result(60)
    finally:
        srv.close()
