"""``python -m service`` / ``inference-server``: run the gRPC inference server."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

from service.config import ServerConfig, load_config
from service.runner import ModelLoadError
from service.server import InferenceServer

log = logging.getLogger("service")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; request_id and trace_id are included when the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("request_id", "trace_id", "span_id"):
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(config: ServerConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler], force=True)
    logging.getLogger("service.llama").setLevel(logging.WARNING)


async def serve(config: ServerConfig) -> int:
    """Run until SIGTERM/SIGINT, then drain gracefully; returns the exit code."""
    from service.telemetry_setup import make_telemetry

    server = InferenceServer(config, make_telemetry(config))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except ModelLoadError as exc:
        log.error("%s", exc)
        await server.stop()
        return 2
    await stop.wait()
    log.info("shutting down: draining for up to %.1f s", config.grace_seconds)
    await server.stop(grace_s=config.grace_seconds)
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> None:
    config = load_config(argv)
    setup_logging(config)
    log.info("configuration: %s", json.dumps(config.as_dict()))
    sys.exit(asyncio.run(serve(config)))


if __name__ == "__main__":
    main()
