"""Assembles the service: model, engine, gRPC server, health and reflection, and the HTTP API.

Start-up order (health stays NOT_SERVING until the last step)::

    listen -> load model -> build engine -> warm-up decode -> SERVING

Shutdown (``drain``): NOT_SERVING -> refuse new requests (UNAVAILABLE) -> let
in-flight requests finish within the grace period -> cancel the rest -> stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from inference.v1 import inference_pb2 as pb

from service.api.cache_front import CacheFront
from service.api.grammar_service import GrammarService
from service.api.grpc_options import server_options
from service.api.intake import Intake
from service.api.request_builder import JsonDefaults, PromptLimits, RequestBuilder
from service.api.tolerant_decoding import add_servicer
from service.api.unsent import limit_listeners
from service.assembly import (
    adaptive_threads,
    batch_config,
    build_engine,
    cache_config,
    ensure_descriptors,
    http_config,
    input_limits,
    kv_event_publisher,
    load_runner,
    served_model_name,
    stream_limits,
)
from service.batch.service import BATCH_SERVICE_NAME, BatchService
from service.config import ServerConfig
from service.continuous_batcher import Engine
from service.engine.wiring import Collaborators
from service.http.server import HttpFrontEnd
from service.kv_events.metrics import KVEventsCollector
from service.model.chat import ChatTemplate, ChatTemplateError
from service.model.runner import ModelLoadError, ModelRunner
from service.observability.engine_metrics import EngineMetrics
from service.observability.model_server import ModelServerCollector
from service.observability.telemetry import Telemetry
from service.request.sequence import Priority
from service.response_cache import bind_model, build_cache
from service.security.tenancy import Tenancy
from service.security.tls import CertificateFiles, server_credentials
from service.servicer import InferenceServicer

if TYPE_CHECKING:
    from service.kv_events.publisher import KVEventPublisher

log = logging.getLogger("service.server")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class InferenceServer:
    """One gRPC server with one engine; ``start``/``drain``/``stop`` from the event loop."""

    def __init__(self, config: ServerConfig, telemetry: Telemetry | None = None) -> None:
        self.config = config
        self.telemetry = telemetry or Telemetry()
        self.health = HealthServicer()
        # a bad tenants file fails here, before listening
        self.tenancy = Tenancy.from_file(config.auth_tokens, config.fair_share)
        self.response_cache = build_cache(cache_config(config))  # a bad --response-cache-db fails here too
        self.cache_front = CacheFront(self.response_cache)
        self.intake = Intake(self.telemetry, self.tenancy, self.cache_front)
        self.servicer = InferenceServicer(self.intake, stream_limits(config))
        self.batch = BatchService(batch_config(config), self.intake, self.telemetry)  # opens --batch-db
        self.batch.on_health = self._on_batch_store
        self.serving = False  # health as last set for the server as a whole
        http = http_config(config)  # the OpenAI-compatible API: same intake, tenants and TLS files
        self.http = HttpFrontEnd(http, self.intake, self.tenancy, self.batch.jobs) if http is not None else None
        self.tls_files: CertificateFiles | None = None
        self.engine: Engine | None = None
        self.grammar: GrammarService | None = None
        self.kv_events: KVEventPublisher | None = None  # --kv-events-endpoint: opened in start()
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.http_port = 0
        self.failed = asyncio.Event()  # set when the engine fails (see Engine.fail); serve() exits then

    async def start(self) -> int:
        """Listen, load, warm up, then report SERVING; returns the bound port."""
        await self._set_health(NOT_SERVING)
        if (warning := ensure_descriptors(self.config)) is not None:
            log.warning("%s", warning)
        self.server = self._grpc_server()
        self.port = self._add_port()
        limit_listeners(self.port)  # a client that does not read: its connection holds KiB, not MiB
        await self.server.start()
        if self.http is not None:
            self.http_port = await self.http.start()  # answers 503 until the model is loaded
        self.kv_events = kv_event_publisher(self.config)  # NOTE: a taken port fails here, before the load
        log.info("listening on %s:%d; loading %s", self.config.host, self.port, self.config.model)
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        engine, builder, grammar = await loop.run_in_executor(None, self._load, loop)
        self.engine, self.grammar = engine, grammar
        self.intake.attach(engine, builder, grammar)
        self.servicer.attach()
        if self.http is not None:  # /tokenize and /detokenize answer as the gRPC model RPCs (the same ModelApi)
            self.http.api.model_api = self.servicer.model_api
        self._serve_metrics(engine)
        await self.batch.start()  # requeues items a previous run left running
        await self._set_health(SERVING)
        log.info(
            "SERVING after %.1f s (KV pool %d tokens in %d blocks)",
            time.monotonic() - t0,
            engine.kv.capacity_tokens,
            engine.kv.num_blocks,
        )
        return self.port

    def _grpc_server(self) -> grpc.aio.Server:
        """The gRPC server with both services, health and reflection (not listening yet)."""
        # NOTE: tracing first, so refused calls still get an RPC span (with the refusal's status).
        interceptors = self.telemetry.server_interceptors() + self.tenancy.interceptors(
            mtls=bool(self.config.tls_client_ca)
        )
        server = grpc.aio.server(interceptors=interceptors, options=server_options(self.config))
        add_servicer(server, self.servicer, pb.DESCRIPTOR.services_by_name["InferenceService"])
        self.batch.register(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                BATCH_SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        return server

    def _load(self, loop: asyncio.AbstractEventLoop) -> tuple[Engine, RequestBuilder, GrammarService]:
        """Load the model and start the engine (its thread runs the warm-up decode)."""
        config = self.config
        runner = load_runner(config)
        template = self._chat_template(runner)
        metrics = EngineMetrics()  # shared by the engine and the grammar service (compile counters)
        grammar = GrammarService(
            runner.vocab, metrics, max_source_bytes=config.max_schema_bytes, timeout_s=config.grammar_timeout_s
        )
        threads = adaptive_threads(config, runner)
        parts = Collaborators(
            metrics=metrics,
            hooks=self.telemetry,
            mask_batch=grammar.mask_batch(runner.vocab.n_vocab, config.max_running),
            thread_control=threads,
            on_failure=self._on_engine_failure,
            loop=loop,
        )
        engine = build_engine(config, runner, parts, fair=self.tenancy.fair, kv_events=self.kv_events)
        self.telemetry.observe(engine, self.tenancy, self.cache_front, threads)  # OTel metric callbacks
        bind_model(self.response_cache, config.model, template.source)
        limit = min(engine.kv.capacity_tokens, runner.n_ctx_train)
        json = JsonDefaults(config.json_finish == "close", config.json_repeat_penalty)
        builder = RequestBuilder(runner.vocab, template, PromptLimits(limit, input_limits(config)), json,
                                 grammar.is_special_token)
        _ = builder.tokenizer  # NOTE: reads every token's attributes (~50 ms): at load, not in the first request
        _ = builder.shown_bytes  # (and the tool-call family's markers)
        log.info("chat template: tool-call family %s, tools via the %s", template.family.name,
                 builder.tool_format.tools_path.replace("_", " "))
        engine.start()
        return engine, builder, grammar

    def _chat_template(self, runner: ModelRunner) -> ChatTemplate:
        """The model's chat template (ChatML if it has none); a broken one closes ``runner`` and fails the load."""
        vocab = runner.vocab
        try:
            template = ChatTemplate(vocab.chat_template, vocab.bos_text, vocab.eos_text)
        except ChatTemplateError as exc:
            runner.close()
            raise ModelLoadError(f"{self.config.model}: {exc}") from None
        if not template.from_model:
            log.warning("model has no chat template; using ChatML for messages")
        return template

    def _serve_metrics(self, engine: Engine) -> None:
        """The vLLM-named series (the inference gateway's model server protocol) beside today's metrics,
        on the telemetry's Prometheus registry (--prometheus-port and /metrics) or one for /metrics alone."""
        registry = self.telemetry.prometheus_registry
        if registry is None and self.http is None:
            return
        if registry is None:
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry()
        registry.register(ModelServerCollector(engine, served_model_name(self.config)))
        if self.kv_events is not None:
            registry.register(KVEventsCollector(self.kv_events))
        if self.http is not None:
            self.http.attach(registry)

    def _on_engine_failure(self, cause: str) -> None:
        """The engine failed (event loop): report NOT_SERVING; ``serve`` then exits non-zero."""
        log.error("engine failed: %s; health NOT_SERVING, every request ended UNAVAILABLE", cause)
        self.failed.set()
        asyncio.get_running_loop().create_task(self._set_health(NOT_SERVING))

    def _add_port(self) -> int:
        """Plaintext by default; TLS with --tls-cert/--tls-key (mTLS with --tls-client-ca), rotated on change."""
        assert self.server is not None
        address = f"{self.config.host}:{self.config.port}"
        if not self.config.tls_cert:
            return self.server.add_insecure_port(address)
        creds, self.tls_files = server_credentials(
            self.config.tls_cert, self.config.tls_key, self.config.tls_client_ca or None
        )
        return self.server.add_secure_port(address, creds)

    async def _set_health(self, status: Any) -> None:
        """The server's health; BatchService's is NOT_SERVING too while its store does not answer."""
        self.serving = status == SERVING
        await self.health.set("", status)
        await self.health.set(SERVICE_NAME, status)
        await self.health.set(BATCH_SERVICE_NAME, status if self.batch.available else NOT_SERVING)

    def _on_batch_store(self, up: bool) -> None:
        """The batch store became (un)reachable (event loop): BatchService health follows; Generate's not."""
        status = SERVING if up and self.serving else NOT_SERVING
        asyncio.get_running_loop().create_task(self.health.set(BATCH_SERVICE_NAME, status))

    async def drain(self, grace_s: float) -> None:
        """Graceful shutdown: stop accepting, give in-flight work ``grace_s``, cancel the rest."""
        await self._set_health(NOT_SERVING)
        if self.engine is None:
            return
        self.engine.draining = True
        deadline = time.monotonic() + grace_s
        while self._in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.engine.cancel_all("server is shutting down: grace period over; retry on another replica")
        deadline = time.monotonic() + 5.0
        while self._in_flight() and time.monotonic() < deadline:  # cancelled between two steps
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # let the final events reach their streams

    def _in_flight(self) -> bool:
        """Accepted requests not finished: queued, running, or submitted but not yet seen by the engine."""
        assert self.engine is not None
        return self.engine.scheduler.has_work() or any(self.engine.admission.depth(p) for p in Priority)

    async def stop(self, grace_s: float = 0.0) -> None:
        if self.engine is not None and grace_s > 0:
            await self.drain(grace_s)
        if self.http is not None:
            await self.http.stop()
        if self.server is not None:
            await self.server.stop(1.0)
        await self.batch.stop()  # before the engine: items still in it stay RUNNING in the store
        # NOTE: a failed engine's thread may be stuck in a step: do not wait long for it.
        if self.engine is not None and self.engine.stop(timeout=2.0 if self.failed.is_set() else 30.0):
            self.engine.runner.close()  # NOTE: never while the engine thread may still be in llama_decode
        if self.kv_events is not None:
            await asyncio.to_thread(self.kv_events.close)  # after the engine: its last AllBlocksCleared
        if self.grammar is not None:
            self.grammar.close()
        self.intake.cache.close()
        self.intake.close()
        self.telemetry.shutdown()
