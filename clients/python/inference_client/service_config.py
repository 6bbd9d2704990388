"""gRPC's native retry policy, configured through the channel's service config.

Instead of (or in addition to) the client's own :class:`~inference_client.retry.RetryPolicy`,
gRPC core can retry by itself when the channel carries a service config with a
``retryPolicy`` (gRFC A6). Build the JSON with :func:`retry_service_config` and
pass it as a channel option::

    from inference_client import InferenceClient, NO_RETRY, channel_options, retry_service_config

    config = retry_service_config(max_attempts=5, initial_backoff=0.05)
    client = InferenceClient("localhost:50051", options=channel_options(config), retry=NO_RETRY)

Differences from the client-side retries, worth knowing before choosing:

* gRPC caps ``maxAttempts`` at 5 and requires at least 2.
* gRPC's only server pushback is the ``grpc-retry-pushback-ms`` trailer; it does
  not read this service's ``retry-after-ms`` trailer or "retry after N ms"
  message hint, so RESOURCE_EXHAUSTED is retried on plain backoff.
* gRPC retries a stream only until it is committed (first response, or the
  retry buffer is exceeded); per-request ``error`` events on the Generate
  stream are ordinary messages to gRPC and are never retried natively.
* Both layers together multiply attempts, hence ``retry=NO_RETRY`` above.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

INFERENCE_SERVICE = "inference.v1.InferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"


def _duration(seconds: float) -> str:
    if seconds <= 0:
        raise ValueError("backoff durations must be positive")
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def retry_service_config(
    *,
    max_attempts: int = 4,
    initial_backoff: float = 0.1,
    max_backoff: float = 5.0,
    backoff_multiplier: float = 2.0,
    retryable_status_codes: Iterable[str] = ("UNAVAILABLE", "RESOURCE_EXHAUSTED"),
    services: Iterable[str] = (INFERENCE_SERVICE, HEALTH_SERVICE),
    wait_for_ready: bool = False,
) -> str:
    """The service-config JSON enabling gRPC's native retries for ``services``.

    ``max_attempts`` must be 2..5 (gRPC's limits); backoffs are in seconds.
    ``wait_for_ready`` makes calls wait for the channel to connect instead of
    failing fast with UNAVAILABLE while the server is unreachable.
    """
    if not 2 <= max_attempts <= 5:
        raise ValueError("gRPC's native max_attempts must be between 2 and 5")
    codes = [c.upper() for c in retryable_status_codes]
    if not codes:
        raise ValueError("at least one retryable status code is required")
    method_config: dict[str, Any] = {
        "name": [{"service": s} for s in services],
        "retryPolicy": {
            "maxAttempts": max_attempts,
            "initialBackoff": _duration(initial_backoff),
            "maxBackoff": _duration(max_backoff),
            "backoffMultiplier": backoff_multiplier,
            "retryableStatusCodes": codes,
        },
    }
    if wait_for_ready:
        method_config["waitForReady"] = True
    return json.dumps({"methodConfig": [method_config]})


def channel_options(
    service_config: str | Mapping[str, Any] | None = None, *, enable_retries: bool = True
) -> list[tuple[str, Any]]:
    """Channel options carrying ``service_config`` (JSON text or a dict).

    Pass the result as ``options=`` to the client (or to ``grpc.insecure_channel``).
    """
    options: list[tuple[str, Any]] = [("grpc.enable_retries", 1 if enable_retries else 0)]
    if service_config is not None:
        text = service_config if isinstance(service_config, str) else json.dumps(service_config)
        options.append(("grpc.service_config", text))
    return options


def load_balancing_service_config(
    policy: str = "round_robin",
    *,
    health_service: str | None = INFERENCE_SERVICE,
    retry: str | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A service config choosing gRPC's load-balancing ``policy`` for a multi-address target.

    With ``health_service`` the channel watches ``grpc.health.v1.Health/Watch``
    of that service on every backend (client-side health checking) and sends
    nothing to a backend reporting NOT_SERVING, such as a draining replica.
    ``retry`` (e.g. :func:`retry_service_config`'s JSON) adds its ``methodConfig``.
    The same JSON works in Go and Java clients (see docs/scale-out.md).
    """
    config: dict[str, Any] = {"loadBalancingConfig": [{policy: {}}]}
    if health_service is not None:
        config["healthCheckConfig"] = {"serviceName": health_service}
    if retry is not None:
        parsed = json.loads(retry) if isinstance(retry, str) else dict(retry)
        config["methodConfig"] = parsed.get("methodConfig", [])
    return config
