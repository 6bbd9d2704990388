"""The model-server-protocol metrics under vLLM's names, for the inference gateway and autoscalers.

The Gateway API Inference Extension's endpoint picker (and llm-d, and common
KEDA recipes) read a model server's load from a few Prometheus series named as
vLLM names them. ``ModelServerCollector`` is a ``prometheus_client`` collector
that computes them at each scrape from the engine's own state, so they are in
step with GetMetrics and the ``inference_*`` series:

* ``vllm:num_requests_waiting``  gauge: requests queued (GetMetrics ``waiting``);
* ``vllm:num_requests_running``  gauge: sequences in the running batch (<= ``--max-running``);
* ``vllm:kv_cache_usage_perc``   gauge: fraction 0-1 of KV blocks referenced by running
  sequences (cached prefix blocks nobody references are free to evict: not counted);
* ``vllm:cache_config_info``     gauge 1 with labels ``block_size`` and ``num_gpu_blocks``
  (the KV pool's blocks: the prefix-cache scorer's page size and capacity) and ``cache_dtype``
  (``--kv-cache-type``: ``f16``, ``q8_0`` or ``q4_0``, where vLLM says ``auto`` or ``fp8``);
* ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:num_preemptions_total``,
  ``vllm:request_success_total{finished_reason}`` counters (``stop`` counts JSON documents
  closed within their budget too, ``length`` those cut off);
* ``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds``,
  ``vllm:request_queue_time_seconds``, ``vllm:time_per_output_token_seconds`` histograms
  (``EngineMetrics.histograms``, recorded when a request ends in the engine).

They read typed views only (``EngineView``: ``Engine.view()`` and ``EngineMetrics.cumulative()``).

Every series carries ``model_name``. Scrapes run on the scraping thread; they
read gauges as they are (``Scheduler.view()`` counts copies of its lists) and counters under
the metrics lock, never stopping the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from service.observability.sources import EngineView
from service.observability.views import Histogram, Histograms, Totals

HISTOGRAMS: tuple[tuple[str, str, Callable[[Histograms], Histogram]], ...] = (
    ("vllm:time_to_first_token_seconds", "time from arrival to the first generated token", lambda h: h.ttft),
    ("vllm:e2e_request_latency_seconds", "time from arrival to the end of a completed request", lambda h: h.e2e),
    ("vllm:request_queue_time_seconds", "time from arrival to the first engine step that ran it", lambda h: h.queue),
    ("vllm:time_per_output_token_seconds", "mean time per generated token after the first", lambda h: h.tpot),
)


def _histogram(name: str, doc: str, snap: Histogram, model: str) -> Metric:
    buckets, running = [], 0
    for bound, n in zip((*[repr(float(b)) for b in snap.bounds], "+Inf"), snap.counts, strict=True):
        running += n
        buckets.append((bound, running))
    family = HistogramMetricFamily(name, doc, labels=["model_name"])
    family.add_metric([model], buckets, snap.total)
    return family


class ModelServerCollector(Collector):
    """vLLM-named series of one engine; register it on the registry ``/metrics`` serves."""

    def __init__(self, engine: EngineView, model_name: str) -> None:
        self.engine = engine
        self.model = model_name

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.model], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.model], value)
        return family

    def collect(self) -> Iterator[Metric]:
        view = self.engine.view()
        load, kv = view.scheduler, view.kv
        yield self._gauge("vllm:num_requests_waiting", "requests waiting to run", load.num_waiting)
        yield self._gauge("vllm:num_requests_running", "requests in the running batch", load.num_running)
        yield self._gauge("vllm:kv_cache_usage_perc", "fraction of KV blocks in use (0-1)", kv.usage)
        labels = ["model_name", "block_size", "num_gpu_blocks", "cache_dtype"]
        info = GaugeMetricFamily("vllm:cache_config_info", "KV cache configuration", labels=labels)
        info.add_metric([self.model, str(kv.block_size), str(kv.blocks_total), view.model.kv_cache_type], 1.0)
        yield info
        yield from self._counters(self.engine.metrics.cumulative(), load.num_preemptions)

    def _counters(self, c: Totals, preemptions: int) -> Iterator[Metric]:
        # NOTE: CounterMetricFamily appends "_total" to names that lack it; these already end in it.
        yield self._counter("vllm:prompt_tokens_total", "prompt tokens of accepted requests", c.prompt_tokens)
        yield self._counter("vllm:generation_tokens_total", "tokens generated", c.generated_tokens)
        yield self._counter("vllm:num_preemptions_total", "preemptions", preemptions)
        success = CounterMetricFamily(
            "vllm:request_success_total", "requests finished in the engine", labels=["model_name", "finished_reason"]
        )
        done = c.finished_by_reason
        # NOTE: a JSON document closed within its budget ("closed") ended complete: vLLM's "stop"
        success.add_metric([self.model, "stop"], done.get("stop", 0) + done.get("closed", 0))
        success.add_metric([self.model, "length"], done.get("length", 0))
        yield success
        for name, doc, pick in HISTOGRAMS:
            yield _histogram(name, doc, pick(c.histograms), self.model)
