"""BatchService without its database: an in-process server whose PostgreSQL store is not there yet.

The server starts anyway (Generate serves); BatchService answers UNAVAILABLE with a retry hint and
its gRPC health is NOT_SERVING; once the database comes up (here: a throwaway cluster started on
the port the server was given), the store opens (schema migrated), BatchService turns SERVING and
runs jobs. The outage in the middle of a job, across replicas, is in
tests/model/scale/test_replicas_netns.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.batch.test_batch import PROMPTS, create, final, gen
from tests.support.pg import PgCluster, free_port, require
from tests.support.server import ROOT, RunningServer, start_server, wait_batch_store

pytestmark = pytest.mark.model
BATCH = "inference.v1.BatchService"


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
    out = pb_grpc.InferenceServiceStub(ch).Generate(iter([req]), timeout=60)
    return "".join(m.delta.text for m in out if m.HasField("delta"))


@pytest.mark.timeout(180)
def test_a_database_down_at_start_leaves_generate_serving_and_batch_unavailable_until_it_comes(
    late_db: PgCluster,
) -> None:
    srv: RunningServer = start_server(batch_db=late_db.url("postgres"), replica_id="solo")
    try:
        with grpc.insecure_channel(srv.target) as ch:
            stub = bpb_grpc.BatchServiceStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                stub.GetBatch(bpb.GetBatchRequest(batch_id="batch_x"), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert ("retry-after-ms", "1000") in (err.value.trailing_metadata() or ())
            assert "unavailable" in (err.value.details() or "") and "127.0.0.1" not in (err.value.details() or "")
            assert (health(ch, BATCH), health(ch, "inference.v1.InferenceService")) == ("NOT_SERVING", "SERVING")
            assert generate_text(ch) != ""
            late_db.start()
            wait_batch_store(srv, timeout=60)
            assert health(ch, BATCH) == "SERVING"
            job = create(stub, [gen(f"i{n}", PROMPTS[n % 4]) for n in range(4)])
            assert final(stub, job.id).counts.completed == 4
    finally:
        srv.close()


def test_an_unknown_batch_db_scheme_exits_2_before_the_model_loads() -> None:
    done = subprocess.run([sys.executable, "-m", "service", "--batch-db", "mysql://u:secret@db/jobs"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown scheme 'mysql'" in done.stderr and "secret" not in done.stderr
    assert "loading" not in done.stderr
