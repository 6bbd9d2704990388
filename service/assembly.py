"""The server assembly: the one place that reads ``ServerConfig`` and hands each subsystem its own config.

Every other package receives what it needs (a small config dataclass, a
Protocol that ``ServerConfig`` satisfies, or plain values) from here or from
``service.server``; none of them imports ``service.config``.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from service.api.generate_stream import StreamLimits
from service.api.input_limits import InputLimits
from service.batch.open_store import parse_batch_db
from service.batch.service import BatchConfig
from service.config import ServerConfig
from service.continuous_batcher import Engine
from service.engine.speculator import SpecConfig
from service.engine.wiring import Collaborators, EngineConfig
from service.http.config import ConnectionLimits, HttpConfig
from service.kv.events import EventOutlet, KVEventLog
from service.kv.host_prefixes import HostPrefixes
from service.kv_events.config import KVEventsConfig
from service.model.runner import ModelRunner
from service.paged_kv import KVBlockManager
from service.priority import TenantOrder, make_policy
from service.response_cache import CacheConfig
from service.threads.adaptive import AdaptiveThreads

if TYPE_CHECKING:
    from service.kv_events.publisher import KVEventPublisher

log = logging.getLogger("service.assembly")


def load_runner(config: ServerConfig) -> ModelRunner:
    """Load the model (raises ModelLoadError)."""
    return ModelRunner(
        config.model,
        n_ctx=config.ctx,
        step_tokens=config.step_tokens,
        n_lanes=config.kv_lanes,
        n_threads=config.threads,
        kv_cache_type=config.kv_cache_type,
    )


def adaptive_threads(config: ServerConfig, runner: ModelRunner) -> AdaptiveThreads | None:
    """The decode's adaptive thread count (``--adaptive-threads`` with more than one thread), or None."""
    if config.adaptive_threads and config.threads > 1:
        return AdaptiveThreads.for_runner(runner, config.threads)
    return None


def build_engine(
    config: ServerConfig,
    runner: ModelRunner | None = None,
    parts: Collaborators | None = None,
    fair: TenantOrder | None = None,
    kv_events: EventOutlet | None = None,
) -> Engine:
    """The engine (not started) on ``runner`` (loaded here if None), complete with ``parts``.

    ``parts`` None: no tracing, masks, failure callback or loop, adaptive threads as configured
    (tests and tools); ``fair`` shares tiers between tenants; ``kv_events`` takes each step's
    changes of the prefix index (None: they are not recorded).
    """
    runner = runner if runner is not None else load_runner(config)
    parts = parts if parts is not None else Collaborators(thread_control=adaptive_threads(config, runner))
    # NOTE: the host tier's budget in tokens, at the cache's own bytes per token (a q8_0 cache's
    # prefixes take about half of f16's host memory, so the same MiB hold about twice the tokens)
    host_tokens = config.prefix_host_cache_mib * 2**20 // runner.kv_bytes_per_token
    events = KVEventLog(kv_events, config.block_size) if kv_events is not None else None
    kv = KVBlockManager(
        runner.n_ctx // config.block_size,
        config.block_size,
        config.kv_lanes,
        prefix_cache=config.prefix_cache,
        max_cached_blocks=config.prefix_cache_tokens // config.block_size,
        host=HostPrefixes(host_tokens, config.block_size, events=events) if host_tokens else None,
        events=events,
        pin_lane=runner.pin_lane if runner.sliding_window else None,  # NOTE: see service.kv.window_pins
    )
    engine_config = EngineConfig(
        max_running=config.max_running,
        step_tokens=config.step_tokens,
        batch_prefill_budget=config.batch_prefill_tokens,
        queue_limits=(config.queue_limit_interactive, config.queue_limit_batch),
        step_timeout_s=config.step_timeout_s,
        speculation=SpecConfig(config.speculative, config.spec_tokens, config.spec_max_running),
        batch_rows_with_interactive=config.batch_rows_with_interactive,
        long_prompt_tokens=config.long_prompt_tokens,
    )
    return Engine(runner, kv, make_policy(config.scheduling, config.aging_s, fair), engine_config, parts)


def stream_limits(config: ServerConfig) -> StreamLimits:
    """Backpressure of one Generate stream: pause past ``--stream-backlog`` or a write pending
    ``--stream-write-pending-s``, resume at a quarter of the backlog."""
    return StreamLimits(config.stream_backlog, max(1, config.stream_backlog // 4), config.stream_stall_timeout_s,
                        config.stream_write_pending_s)


def input_limits(config: ServerConfig) -> InputLimits:
    """The counts one request may carry: messages, tools, stop strings, logit_bias entries."""
    return InputLimits(config.max_messages, config.max_tools, config.max_stop_strings, config.max_logit_bias)


def batch_config(config: ServerConfig) -> BatchConfig:
    """The batch service's store, cap (default: half of ``--max-running``), replica id (default: the host
    name, i.e. the pod name in Kubernetes) and lease."""
    cap = config.batch_max_running or max(1, config.max_running // 2)
    replica_id = config.replica_id or socket.gethostname()
    return BatchConfig(config.batch_db, config.batch_retention_hours * 3600, cap, replica_id, config.batch_lease_s)


def cache_config(config: ServerConfig) -> CacheConfig:
    """The response cache's settings (capacity 0: no cache)."""
    return CacheConfig(
        capacity_bytes=config.response_cache_bytes,
        db_path=config.response_cache_db,
        max_ttl_s=config.response_cache_max_ttl_s,
        semantic=config.semantic_cache,
        semantic_threshold=config.semantic_cache_threshold,
    )


def served_model_name(config: ServerConfig) -> str:
    """The model id of the HTTP API and the metrics: ``--served-model-name``, else the file name without .gguf."""
    return config.served_model_name or Path(config.model).name.removesuffix(".gguf")


def kv_events_config(config: ServerConfig) -> KVEventsConfig | None:
    """The KV-event publisher's settings (None: ``--kv-events-endpoint`` unset), its topic filled in:
    ``{host}`` is ``$POD_IP`` (Kubernetes' downward API), else the host name; ``{port}`` the HTTP port,
    else the gRPC one; ``{model}`` the served model name."""
    if not config.kv_events_endpoint:
        return None
    host = os.environ.get("POD_IP") or socket.gethostname()
    topic = config.kv_events_topic.format_map(
        {"host": host, "port": config.http_port or config.port, "model": served_model_name(config)}
    )
    return KVEventsConfig(
        endpoint=config.kv_events_endpoint,
        topic=topic,
        replay_endpoint=config.kv_events_replay_endpoint,
        buffer_steps=config.kv_events_buffer_steps,
        hwm=config.kv_events_hwm,
        max_queue=config.kv_events_max_queue,
    )


def kv_event_publisher(config: ServerConfig) -> KVEventPublisher | None:
    """The KV-event publisher, its sockets open and its thread running (OSError if an endpoint cannot
    be bound), or None when events are off."""
    settings = kv_events_config(config)
    if settings is None:
        return None
    from service.kv_events.publisher import KVEventPublisher  # NOTE: pyzmq is imported only when used

    return KVEventPublisher(settings).start()


def http_config(config: ServerConfig) -> HttpConfig | None:
    """The HTTP front end's settings (None: ``--http-port 0``, no HTTP API).

    Uploaded batch input files live where the batch store does: beside a SQLite store
    (``data/batch.db`` -> ``data/batch-files.db``; in memory when the store is), in the database of a
    PostgreSQL store (shared by the replicas, as the jobs are).
    """
    if not config.http_port:
        return None
    files_store, files_db = files_location(config.batch_db)
    return HttpConfig(
        host=config.host,
        port=config.http_port,
        model_name=served_model_name(config),
        tls_cert=config.tls_cert,
        tls_key=config.tls_key,
        tls_client_ca=config.tls_client_ca,
        stream=stream_limits(config),
        limits=input_limits(config),
        files_store=files_store,
        files_db=files_db,
        files_retention_s=config.batch_retention_hours * 3600,
        connections=ConnectionLimits(
            max_connections=config.http_max_connections,
            header_timeout_s=config.http_header_timeout_s,
            body_timeout_s=config.http_body_timeout_s,
            body_min_rate=config.http_body_min_rate,
            max_header_bytes=config.http_max_header_bytes,
            keep_alive_s=config.http_keep_alive_s,
        ),
    )


def files_location(batch_db: str) -> tuple[Literal["sqlite", "postgres"], str]:
    """Where the HTTP API keeps uploaded files for ``--batch-db``: ("postgres", the URL) for a PostgreSQL
    store, else ("sqlite", the path beside the store's file, or ":memory:")."""
    target = parse_batch_db(batch_db)
    if target.kind == "postgres":
        return "postgres", target.location
    if target.location == ":memory:":
        return "sqlite", ":memory:"
    path = Path(target.location)
    return "sqlite", str(path.with_name(path.stem + "-files.db"))


# NOTE: descriptors beside the connections: the model file, SQLite stores, the thread pools' pipes,
# the listeners, the event loop's own (measured idle: 18).
DESCRIPTOR_RESERVE = 256


def ensure_descriptors(config: ServerConfig) -> str | None:
    """Raise the soft open-files limit to what the connection caps need (within the hard limit).

    Both caps plus ``DESCRIPTOR_RESERVE`` must fit, or a flood reaches the limit before the caps
    and every ``accept()`` and file open fails. Returns a warning when the hard limit is too low.
    """
    need = config.grpc_max_connections + (config.http_max_connections if config.http_port else 0)
    need += DESCRIPTOR_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < need:
        return (f"open-files limit {soft} is below what --grpc-max-connections and --http-max-connections need "
                f"({need} with a reserve of {DESCRIPTOR_RESERVE}): lower them, or raise the limit (ulimit -n)")
    return None
