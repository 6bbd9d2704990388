"""gRPC server channel arguments: client-side load balancing, and the limits that keep a flood of
connections from taking the process's descriptors.

``max_connection_age`` makes the server send GOAWAY to every connection after
a while: clients then reconnect, re-resolve DNS (a headless Service lists the
pods) and new replicas receive traffic; calls open at that moment get
``max_connection_age_grace`` to finish. Keepalive pings detect dead peers on
idle connections; ``min_ping_interval_without_data`` is how often a client may
ping before the server answers GOAWAY ``too_many_pings``.

The limits (gRPC core's own, checked in grpcio 1.85): ``max_allowed_incoming_connections``
closes a connection past the cap at once, before its handshake; ``server_handshake_timeout_ms``
closes one whose TLS and HTTP/2 handshake (the client's SETTINGS) is not done in time (gRPC's
default is 120 s: a connection that sends nothing held a descriptor that long);
``max_concurrent_streams`` bounds the calls of one connection (a client queues the rest);
``max_connection_idle_ms`` sends GOAWAY to a connection without calls.

NOTE: gRPC ignores channel arguments it does not know, silently: the names
here are the ones gRPC core spells (``GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS``
is ``grpc.http2.min_ping_interval_without_data_ms``).
"""

from __future__ import annotations

from typing import Protocol

INT32_MAX = 2**31 - 1


def _ms(seconds: float) -> int:
    return min(INT32_MAX, round(seconds * 1000))


class ConnectionSettings(Protocol):
    """The connection flags, in seconds (``ServerConfig`` has them: ``--max-connection-age-s`` ...)."""

    @property
    def max_connection_age_s(self) -> float: ...
    @property
    def max_connection_age_grace_s(self) -> float: ...
    @property
    def keepalive_time_s(self) -> float: ...
    @property
    def keepalive_timeout_s(self) -> float: ...
    @property
    def keepalive_min_client_interval_s(self) -> float: ...
    @property
    def grpc_max_connections(self) -> int: ...
    @property
    def grpc_max_concurrent_streams(self) -> int: ...
    @property
    def grpc_handshake_timeout_s(self) -> float: ...
    @property
    def grpc_max_connection_idle_s(self) -> float: ...


def server_options(config: ConnectionSettings) -> list[tuple[str, int]]:
    """Channel arguments for ``grpc.aio.server(options=...)`` from the connection flags.

    Zero means "off" (gRPC's own default) for the age, the grace period, the keepalive time and the idle
    limit.
    """
    opts: list[tuple[str, int]] = [("grpc.so_reuseport", 0)]
    if config.max_connection_age_s > 0:
        opts.append(("grpc.max_connection_age_ms", _ms(config.max_connection_age_s)))
        if config.max_connection_age_grace_s > 0:
            opts.append(("grpc.max_connection_age_grace_ms", _ms(config.max_connection_age_grace_s)))
    if config.keepalive_time_s > 0:
        opts.append(("grpc.keepalive_time_ms", _ms(config.keepalive_time_s)))
        opts.append(("grpc.keepalive_timeout_ms", _ms(config.keepalive_timeout_s)))
    opts.append(("grpc.keepalive_permit_without_calls", 1))
    opts.append(
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(config.keepalive_min_client_interval_s))
    )
    opts.append(("grpc.http2.max_pings_without_data", 0))
    opts.append(("grpc.max_allowed_incoming_connections", min(INT32_MAX, config.grpc_max_connections)))
    opts.append(("grpc.max_concurrent_streams", min(INT32_MAX, config.grpc_max_concurrent_streams)))
    opts.append(("grpc.server_handshake_timeout_ms", _ms(config.grpc_handshake_timeout_s)))
    if config.grpc_max_connection_idle_s > 0:
        opts.append(("grpc.max_connection_idle_ms", _ms(config.grpc_max_connection_idle_s)))
    return opts
