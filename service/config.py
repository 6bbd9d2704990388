"""Server configuration: every flag has a default, a --help text and an environment variable.

The environment variable of ``--max-running`` is ``INFERENCE_MAX_RUNNING``, and
so on; a flag given on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from service.batch.open_store import parse_batch_db, redact
from service.threads.cpu_quota import default_threads

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
ENV_PREFIX = "INFERENCE_"


@dataclass(frozen=True)
class ServerConfig:
    model: str = DEFAULT_MODEL
    host: str = "0.0.0.0"
    port: int = 50051
    threads: int = default_threads()
    adaptive_threads: bool = True
    ctx: int = 8192
    kv_cache_type: str = "f16"
    max_running: int = 32
    kv_lanes: int = 64
    block_size: int = 16
    step_tokens: int = 128
    batch_prefill_tokens: int = 64
    batch_rows_with_interactive: int = 0
    long_prompt_tokens: int = 512
    prefix_cache: bool = True
    prefix_cache_tokens: int = 512
    prefix_host_cache_mib: int = 512
    scheduling: str = "priority"
    aging_s: float = 30.0
    queue_limit_interactive: int = 256
    queue_limit_batch: int = 1024
    grace_seconds: float = 10.0
    max_schema_bytes: int = 64_000
    max_messages: int = 10_000
    max_tools: int = 128
    max_stop_strings: int = 16
    max_logit_bias: int = 1024
    grammar_timeout_s: float = 5.0
    json_finish: str = "close"
    json_repeat_penalty: float = 0.8
    log_format: str = "text"
    log_level: str = "INFO"
    trace_console: bool = False
    prometheus_port: int = 0
    step_timeout_s: float = 60.0
    speculative: bool = True
    spec_tokens: int = 7
    spec_max_running: int = 1
    exit_on_engine_failure: bool = True
    stream_backlog: int = 256
    stream_stall_timeout_s: float = 60.0
    stream_write_pending_s: float = 1.0
    max_connection_age_s: float = 0.0
    max_connection_age_grace_s: float = 0.0
    keepalive_time_s: float = 60.0
    keepalive_timeout_s: float = 20.0
    keepalive_min_client_interval_s: float = 10.0
    grpc_max_connections: int = 1000
    grpc_max_concurrent_streams: int = 256
    grpc_handshake_timeout_s: float = 10.0
    grpc_max_connection_idle_s: float = 300.0
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    auth_tokens: str = ""
    fair_share: bool = True
    response_cache_bytes: int = 64 << 20
    response_cache_db: str = ""
    response_cache_max_ttl_s: float = 3600.0
    semantic_cache: bool = False
    semantic_cache_threshold: float = 0.95
    batch_db: str = "data/batch.db"
    batch_retention_hours: float = 168.0
    batch_max_running: int = 0
    batch_lease_s: float = 60.0
    replica_id: str = ""
    http_port: int = 8000
    served_model_name: str = ""
    http_max_connections: int = 1000
    http_header_timeout_s: float = 10.0
    http_body_timeout_s: float = 30.0
    http_body_min_rate: int = 16384
    http_max_header_bytes: int = 16384
    http_keep_alive_s: float = 5.0
    kv_events_endpoint: str = ""
    kv_events_topic: str = "kv@{host}:{port}@{model}"
    kv_events_replay_endpoint: str = ""
    kv_events_buffer_steps: int = 10_000
    kv_events_hwm: int = 100_000
    kv_events_max_queue: int = 100_000

    def as_dict(self) -> dict[str, Any]:
        """Every setting, for the start-up log: a password in ``--batch-db`` is masked."""
        out = asdict(self)
        out["batch_db"] = redact(self.batch_db)
        return out


HELP = {
    "model": "GGUF model file",
    "host": "address to listen on",
    "port": "port to listen on (0 picks a free one)",
    "threads": "llama.cpp compute threads (default: the cgroup CPU quota rounded down, else the cores)",
    "adaptive_threads": "measure step times and drop to fewer compute threads while that is faster "
    "(CPU contention from other processes); probes back periodically",
    "ctx": "KV pool size in tokens (shared by all sequences)",
    "kv_cache_type": "data type of the KV cache's keys and values: f16, q8_0 (34 bytes per 32 values: 0.53x "
    "f16's memory per token) or q4_0 (18 per 32: 0.28x); quantized values turn llama.cpp's flash attention on "
    "(a build or model that cannot use it refuses to start); see docs/benchmarks.md",
    "max_running": "maximum concurrently running sequences (1 = sequential baseline)",
    "kv_lanes": "llama.cpp sequence ids: running sequences plus holders of cached prefixes (<= 254: llama.cpp's 256 "
    "less the host tier's scratch lane and the pin of cached blocks; each costs one vocabulary-sized logits row of memory)",
    "block_size": "tokens per KV block",
    "step_tokens": "per-step token budget (decode tokens + prefill chunks)",
    "batch_prefill_tokens": "per-step cap on batch-tier prompt tokens (bounds the wait of arriving interactive work)",
    "batch_rows_with_interactive": "while interactive requests run or wait, decode at most this many "
    "batch-tier rows per step (skipped rows rotate: they lose a step, not their place; 0 = no cap; "
    "measured at 32 batch streams, 8 cost 30-50%% of batch tok/s for no clear gain in interactive p99)",
    "long_prompt_tokens": "prompts with more than this many tokens left to compute go after shorter ones of "
    "their tier and get no first-token step of their own, so a short request never waits for a long prefill "
    "(0 = arrival order)",
    "prefix_cache": "reuse KV of shared prompt prefixes",
    "prefix_cache_tokens": "most tokens of finished requests kept cached for reuse in the KV pool (idle "
    "cached cells slow other requests a little; what this evicts goes to the host tier, "
    "--prefix-host-cache-mib)",
    "prefix_host_cache_mib": "host memory (MiB) for prefixes evicted from the KV pool: their cells are "
    "copied out and copied back on a later hit instead of being computed again (0 = off)",
    "scheduling": "queue policy: priority (interactive before batch, preemption) or fcfs",
    "aging_s": "a batch request waiting longer than this is treated as interactive",
    "queue_limit_interactive": "waiting interactive requests before RESOURCE_EXHAUSTED",
    "queue_limit_batch": "waiting batch requests before RESOURCE_EXHAUSTED",
    "grace_seconds": "on SIGTERM, time given to in-flight requests before they are cancelled",
    "max_schema_bytes": "largest JSON Schema / grammar accepted",
    "max_messages": "most chat messages one request may carry (counted before the chat is rendered: "
    "HTTP 400 naming messages, gRPC INVALID_ARGUMENT); raise it for long agent conversations on long contexts",
    "max_tools": "most tools one chat completion may offer (OpenAI's documented maximum; counted before any "
    "tool's schema is checked)",
    "max_stop_strings": "most stop strings one request may carry",
    "max_logit_bias": "most logit_bias entries one request may carry",
    "grammar_timeout_s": "longest grammar compilation accepted",
    "json_finish": "JSON output that would not end within max_tokens, when a request leaves "
    "SamplingParams.json_finish unset: close (budget-aware completion: closed early with its shortest valid "
    "completion, FINISH_REASON_CLOSED; a max_tokens below the shortest document is OUT_OF_RANGE) or cut-off "
    "(OUT_OF_RANGE / FINISH_REASON_LENGTH, the behaviour before close was the default)",
    "json_repeat_penalty": "GenerateJSON's repetition control when a request leaves json_repeat_penalty unset: "
    "DRY-style penalty on tokens that would repeat a run of the document where it is free text "
    "(0 = off; docs/structured_output.md)",
    "log_format": "text or json (JSON lines)",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "trace_console": "also print OpenTelemetry spans to the console",
    "prometheus_port": "serve OpenTelemetry metrics for Prometheus on this port (0 = off)",
    "speculative": "prompt-lookup speculative decoding while few sequences run (greedy output unchanged, "
    "sampled output has the same distribution)",
    "spec_tokens": "most speculative tokens per step and sequence",
    "spec_max_running": "speculate only while at most this many sequences run",
    "step_timeout_s": "watchdog: an engine step running longer than this fails the engine (0 = no watchdog)",
    "exit_on_engine_failure": "exit with code 3 when the engine fails (dead thread, stalled step) so an "
    "orchestrator restarts the process; --no-exit-on-engine-failure keeps it up (NOT_SERVING) for debugging",
    "stream_backlog": "messages a Generate stream's client has not read after which its requests pause "
    "(they resume at a quarter of it); counted by the client's acknowledgements when it sends them (the "
    "Python client does), else by what the transport has taken",
    "stream_stall_timeout_s": "a Generate stream paused this long for an unread backlog has its requests cancelled",
    "stream_write_pending_s": "a Generate stream whose write to the transport has been pending this long "
    "(the client's flow-control window or receive buffer is full) pauses its requests until the write "
    "completes, whatever --stream-backlog counts (0 = only the backlog pauses)",
    "max_connection_age_s": "close each client connection (GOAWAY) after this long so clients re-resolve "
    "and new replicas get traffic (0 = never)",
    "max_connection_age_grace_s": "after that GOAWAY, time left to open calls before the connection is "
    "closed (0 = unlimited)",
    "keepalive_time_s": "ping an idle client connection after this long (0 = never)",
    "keepalive_timeout_s": "close a connection whose keepalive ping is not answered within this",
    "keepalive_min_client_interval_s": "shortest interval between client keepalive pings accepted "
    "(more frequent ones get GOAWAY too_many_pings)",
    "grpc_max_connections": "most open gRPC connections (grpc.max_allowed_incoming_connections): one more is "
    "closed at once, before its handshake",
    "grpc_max_concurrent_streams": "most calls open at once on one gRPC connection (HTTP/2 "
    "MAX_CONCURRENT_STREAMS; a client queues the rest)",
    "grpc_handshake_timeout_s": "a gRPC connection that has not completed its TLS and HTTP/2 handshake "
    "(client SETTINGS) within this is closed",
    "grpc_max_connection_idle_s": "a gRPC connection with no call open for this long gets GOAWAY (clients "
    "reconnect on their next call; 0 = never)",
    "tls_cert": "PEM server certificate (chain): serve TLS instead of plaintext; re-read when it changes",
    "tls_key": "PEM private key of --tls-cert",
    "tls_client_ca": "PEM CA bundle: require client certificates signed by it (mTLS)",
    "auth_tokens": "tenants file (JSON/TOML: token SHA-256s, weights, roles, quotas; see docs/security.md); "
    "calls need a tenant's bearer token; reloaded on change or SIGHUP (empty = no authentication)",
    "fair_share": "with --auth-tokens: share each priority tier fairly between tenants (virtual token counter)",
    "response_cache_bytes": "response cache bound in bytes: answers of deterministic requests replayed on an "
    "exact repeat (0 = off; docs/response-cache.md)",
    "response_cache_db": "SQLite file that keeps the response cache across restarts (empty = memory only)",
    "response_cache_max_ttl_s": "longest time an answer stays cached (also the default TTL)",
    "semantic_cache": "allow requests with semantic_cache=true to reuse answers to similar final user messages "
    "(needs `make semantic`)",
    "semantic_cache_threshold": "cosine similarity a semantic hit needs (the fact guard must also pass: "
    "numbers, negations, units, names, word order and contrast words; see docs/response-cache.md)",
    "batch_db": "the batch job store (BatchService): a SQLite file for one server (created with its "
    "directory; sqlite:///path also works; :memory: = not durable), or postgresql://user@host:port/db for a "
    "store shared by every replica (docs/batch.md; a password is better given as PGPASSWORD); other schemes "
    "are refused",
    "batch_retention_hours": "finished batch jobs and their results are deleted this long after they end",
    "batch_max_running": "most batch-job items in the engine at once (0 = half of --max-running), leaving "
    "batch-tier streams their share",
    "batch_lease_s": "shared (PostgreSQL) batch store: a claimed item's lease, renewed every third of it; a "
    "replica that dies or loses the database leaves its items to the others after this long",
    "replica_id": "this replica's stable name in a shared batch store (owner of its leases; a restart "
    "with the same name requeues its own running items at once; empty = the host name, which is the pod name "
    "in Kubernetes)",
    "http_port": "OpenAI-compatible HTTP API, /metrics and /health on this port, in the same process and event "
    "loop (same --host, TLS files and tenants as gRPC; 0 = off; docs/openai.md)",
    "http_max_connections": "most open HTTP connections; one more takes the place of the oldest connection "
    "still waiting for its request head (one that never completed a request before an idle kept-alive one "
    "that did), or is answered 503 and closed when every open one is in a request "
    "(docs/security.md)",
    "http_header_timeout_s": "an HTTP request head (request line and headers) not complete this long after "
    "the connection opened (on a kept-alive connection, after its first byte) gets 408 and the connection is "
    "closed",
    "http_body_timeout_s": "an HTTP request body gets this long, plus one second per --http-body-min-rate "
    "bytes received; slower, it gets 408 and the connection is closed",
    "http_body_min_rate": "bytes per second of request body that extend --http-body-timeout-s (see there)",
    "http_max_header_bytes": "largest HTTP request head (request line and headers); a larger one gets 431",
    "http_keep_alive_s": "an idle HTTP keep-alive connection is closed after this long",
    "served_model_name": "model id of the HTTP API (/v1/models, the request's model field) and the model_name "
    "label of the vllm:* metrics (default: the model file name without .gguf)",
    "kv_events_endpoint": "publish the prefix cache's KV-cache events in vLLM's format (msgpack over ZMQ PUB) "
    "on this endpoint, e.g. tcp://*:5557, for prefix-aware routers such as llm-d (bound when it has * or is "
    "ipc://, else connected; empty = off; docs/scale-out.md)",
    "kv_events_topic": "topic frame of every KV-event message; {host} is $POD_IP (else the host name), {port} "
    "the HTTP port (--port when HTTP is off), {model} the served model name (llm-d reads kv@POD@MODEL)",
    "kv_events_replay_endpoint": "ROUTER endpoint answering replay requests (batches since a sequence "
    "number, from the last --kv-events-buffer-steps), e.g. tcp://*:5558 (empty = no replay)",
    "kv_events_buffer_steps": "KV-event batches (one per engine step that changed the index) kept for replay",
    "kv_events_hwm": "send high-water mark of the PUB socket: messages queued per subscriber before ZMQ drops "
    "that subscriber's (0 = no limit)",
    "kv_events_max_queue": "KV-event batches waiting for the publisher thread; past it the engine drops a "
    "batch (counted) and resynchronises subscribers with the whole index",
}
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
CHOICES = {
    "kv_cache_type": KV_CACHE_TYPES,
    "scheduling": ("priority", "fcfs"),
    "log_format": ("text", "json"),
    "json_finish": ("cut-off", "close"),
}


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inference-server",
        description="gRPC LLM inference service (inference.v1.InferenceService) over llama.cpp.",
        epilog="Every flag can also be set through the environment variable shown in its help.",
    )
    for f in fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{HELP[f.name]} (default: {f.default}) [env {_env_name(f.name)}]"
        if f.type == "bool" or isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            kind: Any = type(f.default)
            parser.add_argument(flag, type=kind, default=None, help=help_text, choices=CHOICES.get(f.name))
    return parser


def load_config(argv: list[str] | None = None, env: dict[str, str] | None = None) -> ServerConfig:
    """Flags over environment over defaults; raises SystemExit with a message on bad values."""
    env = dict(os.environ) if env is None else env
    parser = build_parser()
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for f in fields(ServerConfig):
        given = getattr(args, f.name)
        if given is None and _env_name(f.name) in env:
            raw = env[_env_name(f.name)]
            kind: Any = type(f.default)
            try:
                given = _parse_bool(raw) if isinstance(f.default, bool) else kind(raw)
            except ValueError:
                parser.error(f"{_env_name(f.name)}={raw!r} is not a valid {type(f.default).__name__}")
            if f.name in CHOICES and given not in CHOICES[f.name]:
                parser.error(f"{_env_name(f.name)} must be one of {', '.join(CHOICES[f.name])}")
        if given is not None:
            values[f.name] = given
    config = ServerConfig(**values)
    problem = validate(config)
    if problem:
        parser.error(problem)
    return config


def validate(c: ServerConfig) -> str | None:
    """A message naming the first inconsistent setting, or None."""
    if c.max_running < 1:
        return "--max-running must be >= 1"
    if not 1 <= c.max_running < c.kv_lanes <= 254:
        return "--kv-lanes must be greater than --max-running and at most 254"
    if c.step_tokens < c.max_running:
        return "--step-tokens must be >= --max-running"
    if c.batch_rows_with_interactive < 0:
        return "--batch-rows-with-interactive must be >= 0"
    if c.long_prompt_tokens < 0:
        return "--long-prompt-tokens must be >= 0"
    if c.batch_prefill_tokens < 1:
        return "--batch-prefill-tokens must be >= 1"
    if c.kv_cache_type not in KV_CACHE_TYPES:
        return "--kv-cache-type must be one of f16, q8_0, q4_0"
    if c.block_size < 1 or c.ctx < c.block_size:
        return "--ctx must be at least one block"
    if c.prefix_cache_tokens < 0 or c.prefix_host_cache_mib < 0:
        return "--prefix-cache-tokens and --prefix-host-cache-mib must be >= 0"
    if c.threads < 1:
        return "--threads must be >= 1"
    if min(c.max_messages, c.max_tools, c.max_stop_strings, c.max_logit_bias) < 1:
        return "--max-messages, --max-tools, --max-stop-strings and --max-logit-bias must be >= 1"
    if c.stream_write_pending_s < 0:
        return "--stream-write-pending-s must be >= 0"
    if c.step_timeout_s < 0 or c.stream_stall_timeout_s <= 0 or c.stream_backlog < 4:
        return "--step-timeout-s must be >= 0, --stream-stall-timeout-s > 0 and --stream-backlog >= 4"
    if min(c.max_connection_age_s, c.max_connection_age_grace_s, c.keepalive_time_s) < 0:
        return "--max-connection-age-s, --max-connection-age-grace-s and --keepalive-time-s must be >= 0"
    if c.keepalive_timeout_s <= 0 or c.keepalive_min_client_interval_s < 0:
        return "--keepalive-timeout-s must be > 0 and --keepalive-min-client-interval-s >= 0"
    if min(c.grpc_max_connections, c.grpc_max_concurrent_streams, c.http_max_connections) < 1:
        return "--grpc-max-connections, --grpc-max-concurrent-streams and --http-max-connections must be >= 1"
    if c.grpc_handshake_timeout_s <= 0 or c.grpc_max_connection_idle_s < 0:
        return "--grpc-handshake-timeout-s must be > 0 and --grpc-max-connection-idle-s >= 0"
    if min(c.http_header_timeout_s, c.http_body_timeout_s, c.http_keep_alive_s) <= 0:
        return "--http-header-timeout-s, --http-body-timeout-s and --http-keep-alive-s must be > 0"
    if c.http_body_min_rate < 1:
        return "--http-body-min-rate must be >= 1"
    if c.http_max_header_bytes < 1024:
        return "--http-max-header-bytes must be >= 1024"
    if c.response_cache_bytes < 0 or c.response_cache_max_ttl_s <= 0:
        return "--response-cache-bytes must be >= 0 and --response-cache-max-ttl-s > 0"
    if not 0.0 < c.semantic_cache_threshold <= 1.0:
        return "--semantic-cache-threshold must be in (0, 1]"
    if not 0.0 <= c.json_repeat_penalty <= 5.0:
        return "--json-repeat-penalty must be in [0, 5]"
    if c.batch_retention_hours <= 0 or c.batch_max_running < 0 or c.batch_lease_s <= 0:
        return "--batch-retention-hours and --batch-lease-s must be > 0, --batch-max-running >= 0"
    try:
        parse_batch_db(c.batch_db)
    except ValueError as exc:
        return str(exc)
    if not 0 <= c.http_port <= 65535 or (c.http_port and c.http_port == c.port):
        return "--http-port must be in 0..65535 (0 = off) and differ from --port"
    if bool(c.tls_cert) != bool(c.tls_key) or (c.tls_client_ca and not c.tls_cert):
        return "--tls-cert and --tls-key go together, and --tls-client-ca needs them"
    return _kv_events_problem(c)


KV_EVENTS_SCHEMES = ("tcp://", "ipc://")


def _kv_events_problem(c: ServerConfig) -> str | None:
    """The KV-event flags: endpoints ZMQ can use, a topic whose placeholders are known, sane sizes."""
    for flag, endpoint in (("endpoint", c.kv_events_endpoint), ("replay-endpoint", c.kv_events_replay_endpoint)):
        if endpoint and not endpoint.startswith(KV_EVENTS_SCHEMES):
            return f"--kv-events-{flag} must be a tcp:// or ipc:// endpoint, got {endpoint!r}"
    if c.kv_events_replay_endpoint and not c.kv_events_endpoint:
        return "--kv-events-replay-endpoint needs --kv-events-endpoint"
    try:
        c.kv_events_topic.format_map({"host": "", "port": 0, "model": ""})
    except (KeyError, ValueError, IndexError) as exc:
        return f"--kv-events-topic may use {{host}}, {{port}} and {{model}} only ({exc!r})"
    if c.kv_events_buffer_steps < 0 or c.kv_events_hwm < 0 or c.kv_events_max_queue < 1:
        return "--kv-events-buffer-steps and --kv-events-hwm must be >= 0, --kv-events-max-queue >= 1"
    return None
