"""``python -m service`` / ``inference-server``: run the gRPC inference server."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

from opentelemetry import trace

from service.config import ServerConfig, load_config
from service.model.runner import ModelLoadError
from service.security.tenants import TenantFileError
from service.server import InferenceServer

log = logging.getLogger("service")


REQUEST_FIELDS = ("request_id", "tenant", "trace_id", "span_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TraceContextFilter(logging.Filter):
    """Gives records without a trace_id the ids of the current OpenTelemetry span (if any).

    Request log lines carry ``request_id``/``trace_id`` explicitly (``extra=``,
    see ``Telemetry.log_fields``); lines logged inside an RPC handler with
    tracing on get the RPC span's ids from here.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "trace_id"):
            ctx = trace.get_current_span().get_span_context()
            if ctx.is_valid:
                record.trace_id = f"{ctx.trace_id:032x}"
                record.span_id = f"{ctx.span_id:016x}"
        return True


class TextFormatter(logging.Formatter):
    """The classic text line, followed by ``[request_id=... trace_id=...]`` when the record has them."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={getattr(record, k)}" for k in REQUEST_FIELDS if hasattr(record, k)]
        return f"{line} [{' '.join(fields)}]" if fields else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; request_id, trace_id and span_id are included when the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in REQUEST_FIELDS:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(config: ServerConfig) -> None:
    """Root logging to stderr in ``config.log_format`` at ``config.log_level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if config.log_format == "json" else TextFormatter())
    handler.addFilter(TraceContextFilter())
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler], force=True)
    logging.getLogger("service.llama").setLevel(logging.WARNING)


async def serve(config: ServerConfig) -> int:
    """Run until SIGTERM/SIGINT, then drain gracefully; returns the exit code (0, or 2 if the model fails).

    Shutdown: health NOT_SERVING, new requests refused with UNAVAILABLE,
    in-flight requests get ``config.grace_seconds`` to finish, the rest end
    with an UNAVAILABLE error event; then the server, engine and exporters stop.
    """
    from service.observability.setup import make_telemetry

    try:
        telemetry = make_telemetry(config)
    except OSError as exc:  # e.g. the Prometheus port is taken
        log.error("cannot start telemetry: %s", exc)
        return 2
    try:
        server = InferenceServer(config, telemetry)  # reads the tenants file
    except (TenantFileError, OSError) as exc:
        log.error("cannot start: --auth-tokens %s: %s", config.auth_tokens, exc)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, server.tenancy.reload)  # re-read the tenants file
    try:
        await server.start()
    except ModelLoadError as exc:
        log.error("%s", exc)
        await server.stop()
        return 2
    except OSError as exc:  # TLS files unreadable, or a key that does not fit its certificate
        log.error("cannot start: %s", exc)
        await server.stop()
        return 2
    return await run_until_stopped(server, stop, config)


ENGINE_FAILED_EXIT = 3


async def run_until_stopped(server: InferenceServer, stop: asyncio.Event, config: ServerConfig) -> int:
    """Serve until ``stop`` (drain, exit 0) or an engine failure (exit ``ENGINE_FAILED_EXIT``).

    With ``--no-exit-on-engine-failure`` a failed server stays up, NOT_SERVING,
    until ``stop``, for debugging; it still exits with the failure code.
    """
    waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(server.failed.wait())}
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if server.failed.is_set():
        if not config.exit_on_engine_failure:
            log.warning("engine failed; staying up NOT_SERVING until SIGTERM (--no-exit-on-engine-failure)")
            await stop.wait()
        log.error("exiting with code %d: the engine failed", ENGINE_FAILED_EXIT)
        await server.stop()
        return ENGINE_FAILED_EXIT
    log.info("shutting down: draining for up to %.1f s", config.grace_seconds)
    await server.drain(config.grace_seconds)
    await server.stop()
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> None:
    config = load_config(argv)
    setup_logging(config)
    log.info("configuration: %s", json.dumps(config.as_dict()))
    sys.exit(asyncio.run(serve(config)))


if __name__ == "__main__":
    main()
