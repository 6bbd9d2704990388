"""Quantized KV caches (``--kv-cache-type q8_0`` / ``q4_0``) with the real model and a real server.

One server per type, shared by this module's tests (``--prefix-cache-tokens 0``: every finished
request's prefix is evicted from the pool and spilled to the host tier, as in
test_host_prefix_tier.py). Each server must generate, spill a prefix to host memory and copy it
back with the output unchanged, and report the bytes per token of its own type, checked against
the model's shape and ggml's block sizes as the ``gguf`` package lists them, and against the buffer
llama.cpp says it allocated. A build or model that cannot run a quantized cache refuses to start with llama.cpp's reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import grpc
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

import service.model.runner as runner_module
from service.model.runner import ModelLoadError, ModelRunner
from tests.support.helpers import MarginRecorder, assert_same_greedy, req, run_stream, wait_for
from tests.support.server import DEFAULT_MODEL, RunningServer, assert_kv_clean, start_server, wait_idle

pytestmark = pytest.mark.model

SYSTEM = (
    "You are a meticulous assistant for a shipping company. Answer questions about parcels, tracking "
    "numbers, delivery windows, customs forms and refunds. Always be polite, concise and precise. "
) * 3
GGML_TYPES = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
              "q4_0": gguf.GGMLQuantizationType.Q4_0}


# SmolLM2 135M: 30 layers, each caching K and V rows of 3 KV heads x 64 values per token
# (llama.block_count, llama.attention.head_count_kv, embedding_length / head_count in its GGUF).
LAYERS, KV_VALUES = 30, 3 * 64


def expected_bytes_per_token(kind: str) -> int:
    """K and V rows of every layer in ``kind``, at ggml's block sizes as the ``gguf`` package lists them."""
    values_per_block, bytes_per_block = gguf.GGML_QUANT_SIZES[GGML_TYPES[kind]]
    return LAYERS * 2 * (KV_VALUES // values_per_block) * bytes_per_block


@pytest.fixture(scope="module", params=["q8_0", "q4_0"])
def quantized(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    srv = start_server(kv_cache_type=request.param, prefix_cache_tokens=0)
    yield srv
    srv.close()


def ask(srv: RunningServer, rid: str, question: str, rec: MarginRecorder) -> Any:
    srv.engine.logits_hook = rec
    try:
        with grpc.insecure_channel(srv.target) as ch:
            result = run_stream(ch, [req(rid, SYSTEM + question, 24, ignore_eos=True)])[rid]
    finally:
        srv.engine.logits_hook = None
    wait_idle(srv)
    return result


def test_the_server_reports_the_bytes_per_token_of_its_kv_cache_type(quantized: RunningServer) -> None:
    kind, runner = quantized.config.kv_cache_type, quantized.engine.runner
    per_token = expected_bytes_per_token(kind)
    assert per_token == {"q8_0": 12_240, "q4_0": 6_480}[kind]  # f16: 23,040
    with grpc.insecure_channel(quantized.target) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        info = stub.GetModelInfo(pb.GetModelInfoRequest())
        kv = stub.GetMetrics(pb.GetMetricsRequest()).kv
    assert (info.kv_cache_type, info.kv_bytes_per_token) == (kind, per_token)
    assert (kv.cache_type, kv.bytes_per_block) == (kind, per_token * kv.block_size)
    # llama.cpp's own figure for the buffer it allocated (logged in MiB, two decimals)
    assert abs(kv.kv_buffer_bytes - per_token * runner.n_ctx) <= 0.01 * 2**20
    # the host tier's budget, in tokens of this type
    assert quantized.engine.kv.host.max_tokens == quantized.config.prefix_host_cache_mib * 2**20 // per_token


def test_the_shared_default_server_reports_its_own_type(server: RunningServer, channel: grpc.Channel) -> None:
    kind = server.config.kv_cache_type
    info = pb_grpc.InferenceServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest())
    assert (info.kv_cache_type, info.kv_bytes_per_token) == (kind, expected_bytes_per_token(kind))


def test_a_quantized_cache_generates_and_a_prefix_comes_back_from_host_memory_unchanged(
    quantized: RunningServer,
) -> None:
    kv, runner, rec = quantized.engine.kv, quantized.engine.runner, MarginRecorder()
    spilled_before, hits_before = runner.spilled_bytes, kv.stats.host_hit_tokens
    cold = ask(quantized, "cold", "Where is my parcel?", rec)
    assert cold.done.usage.completion_tokens == 24 and cold.text.strip()
    assert kv.num_cached == 0 and len(kv.host) >= 1  # evicted, spilled
    assert wait_for(lambda: runner.spilled_bytes > spilled_before, timeout=600), "no copy to host memory"
    spilled_tokens = len(kv.host._entries[next(reversed(kv.host._entries))].tokens)
    spilled = runner.spilled_bytes - spilled_before
    # the state llama.cpp wrote holds this type's rows, plus a few bytes of cell metadata per token
    assert spilled_tokens * runner.kv_bytes_per_token < spilled < spilled_tokens * runner.kv_bytes_per_token * 1.01
    warm = ask(quantized, "warm", "Where is my parcel?", rec)
    prompt = warm.done.usage.prompt_tokens
    assert warm.done.usage.cached_tokens == prompt - 1  # every prompt token but the last came back
    assert kv.stats.host_hit_tokens - hits_before == prompt - 1
    assert_same_greedy(cold.token_ids, warm.token_ids, rec.rows["cold"])
    assert_kv_clean(quantized)


def test_a_context_llama_cpp_refuses_stops_the_start_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build without flash attention cannot read a quantized V cache: llama.cpp refuses the context
    (forced here by asking for flash attention off), and the start-up error carries its reason."""
    made = runner_module._context_params

    def without_flash_attention(*args: Any) -> Any:
        params = made(*args)
        params.flash_attn_type = runner_module.L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        return params

    monkeypatch.setattr(runner_module, "_context_params", without_flash_attention)
    with pytest.raises(ModelLoadError) as info:
        ModelRunner(DEFAULT_MODEL, n_ctx=256, step_tokens=8, n_lanes=1, n_threads=1, kv_cache_type="q8_0")
    message = str(info.value)
    assert "KV cache q8_0): quantized V cache requires flash_attn to be enabled" in message
    assert "--kv-cache-type f16 needs neither" in message
