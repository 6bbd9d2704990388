"""The suite's scenarios in run order: letter, result name, title, module and expected duration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from bench.harness.config import BenchConfig
from bench.scenarios import (
    a_throughput,
    b_kv_memory,
    c_prefix_reuse,
    d_many_prefixes,
    e_priority,
    f_structured_output,
    g_tracing,
    h_fairness,
    i_scale,
    j_batch_jobs,
    k_response_cache,
    l_contention,
    m_api,
    n_speculative,
    o_replicas,
    p_http,
    q_prefix_defaults,
    r_tool_calls,
    s_goodput,
    t_mixed_peer,
    u_kv_cache_types,
)


@dataclass(frozen=True)
class Scenario:
    key: str
    name: str  # the result file: bench/results/<name>.json
    title: str
    module: ModuleType  # with run(cfg) -> dict and render(results) -> str
    full_estimate_s: int  # expected duration of the full (non-quick) run on a quiet 2-core machine

    @property
    def run(self) -> Callable[[BenchConfig], dict[str, Any]]:
        return self.module.run

    @property
    def render(self) -> Callable[[dict[str, Any]], str]:
        return self.module.render


SCENARIOS = [
    Scenario(
        "A",
        "throughput",
        "Throughput: continuous batching vs sequential vs raw engine vs llama_cpp.server",
        a_throughput,
        420,
    ),
    Scenario(
        "B", "kv_memory", "KV memory: shared block pool vs naive per-request reservation", b_kv_memory, 90
    ),
    Scenario("C", "prefix_reuse", "Prefix reuse: cold vs warm TTFT", c_prefix_reuse, 60),
    Scenario("D", "many_prefixes", "Many prefixes: 32 system prompts round-robin", d_many_prefixes, 120),
    Scenario(
        "E", "priority", "Mixed priority load: interactive latency and batch throughput", e_priority, 270
    ),
    Scenario(
        "F", "structured_output", "Structured output: overhead; documents that finish (120 dev schemas)",
        f_structured_output, 90 + 3600,
    ),
    Scenario("G", "tracing", "Tracing overhead", g_tracing, 180),
    Scenario("H", "fairness", "Fair share between tenants; cost of TLS and token auth", h_fairness, 600),
    Scenario("I", "scale", "Scale-out routing: 3 replicas, round_robin vs prefix_affinity", i_scale, 540),
    Scenario(
        "L",
        "contention",
        "Noisy neighbours: adaptive vs fixed threads beside busy processes",
        l_contention,
        600,
    ),
    Scenario("K", "response_cache", "Response cache: exact replay and semantic reuse", k_response_cache, 420),
    Scenario(
        "J",
        "batch_jobs",
        "Batch jobs: throughput, interactive latency beside a job, kill -9 chaos",
        j_batch_jobs,
        900,
    ),
    Scenario("M", "api", "Logprobs cost; n choices vs n separate requests", m_api, 240),
    Scenario(
        "N",
        "speculative",
        "One caller alone: prompt-lookup speculative decoding on vs off",
        n_speculative,
        420,
    ),
    Scenario(
        "O",
        "replicas",
        "One batch job on 3 replicas sharing PostgreSQL vs 1 replica vs 3 SQLite replicas",
        o_replicas,
        1500,
    ),
    Scenario(
        "P",
        "http",
        "The OpenAI HTTP API: HTTP vs gRPC vs llama.cpp's llama-server, 1-32 streams",
        p_http,
        900,
    ),
    Scenario(
        "Q",
        "prefix_defaults",
        "Many system prompts at default flags vs llama.cpp's llama-server; a prefix-free request beside them",
        q_prefix_defaults,
        420,
    ),
    Scenario(
        "R",
        "tool_calls",
        r_tool_calls.TITLE,
        r_tool_calls,
        900,
    ),
    Scenario("S", "goodput", s_goodput.TITLE, s_goodput, 4600),
    Scenario(
        "T",
        "mixed_peer",
        "Mixed load vs llama.cpp's llama-server: 32 batch streams plus an interactive client, both models",
        t_mixed_peer,
        2400,  # NOTE: llama-server's interactive tail (its TTFT was 30-54 s in the issue) lengthens its mixed phases
    ),
    Scenario("U", "kv_cache_types", "KV-cache quantization: f16 vs q8_0 vs q4_0 (memory, speed, drift)",
             u_kv_cache_types, 420),
]
BY_KEY = {s.key: s for s in SCENARIOS}
