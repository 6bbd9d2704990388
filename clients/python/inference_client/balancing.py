"""Client-side load balancing over several replicas.

Two modes (``InferenceClient(balancing=...)``):

* ``round_robin`` (default for ``dns:///``, ``ipv4:`` and ``ipv6:`` targets):
  gRPC's own policy, chosen by the channel's service config
  (:func:`~inference_client.service_config.load_balancing_service_config`).
  gRPC resolves the target, opens a subchannel per address and spreads calls;
  with ``healthCheckConfig`` it also watches ``grpc.health.v1`` and skips
  replicas that report NOT_SERVING (draining). Each Generate stream is one call,
  so each ``generate()`` may land on a different replica.
* ``prefix_affinity``: :class:`AffinityPool` keeps one channel per resolved
  backend and places each Generate stream with a bounded-load consistent-hash
  ring (``ring.py``) keyed by the request's prefix, so requests sharing a
  system prompt reach the replica that has it cached; a key's home is the
  less crowded of its two ring choices (``placement.py``). Backends whose channel
  is in TRANSIENT_FAILURE (down, or NOT_SERVING through the health check) leave
  the ring; only their keys move. DNS targets are re-resolved every
  ``resolve_every_s`` seconds.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from inference.v1 import inference_pb2_grpc as pb_grpc

from .placement import HomeTable
from .ring import HashRing
from .service_config import channel_options, load_balancing_service_config

BALANCING_MODES = ("auto", "pick_first", "round_robin", "prefix_affinity")
MULTI_SCHEMES = ("dns:", "ipv4:", "ipv6:")
ChannelFactory = Callable[[str, list[tuple[str, Any]]], grpc.Channel]
MAX_RECONNECT_BACKOFF_MS = 5000
DOWN = (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)


def is_multi_address(target: str) -> bool:
    """True for targets that may resolve to several backends (``dns:``, ``ipv4:``, ``ipv6:``)."""
    return target.startswith(MULTI_SCHEMES)


def _split_host_port(hostport: str) -> tuple[str, str]:
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        return host, rest.lstrip(":") or "443"
    host, _, port = hostport.rpartition(":")
    return (host, port) if host else (hostport, "443")


def resolve_backends(target: str) -> list[str]:
    """The ``host:port`` backends of a gRPC target, in a stable order.

    ``ipv4:a:1,b:2`` and ``ipv6:[::1]:1,...`` list them; ``dns:///name:port``
    (or ``dns:name:port``) is resolved now; any other target is one backend.
    """
    if target.startswith(("ipv4:", "ipv6:")):
        return [a for a in target.split(":", 1)[1].split(",") if a]
    if not target.startswith("dns:"):
        return [target]
    name = target[4:]
    if name.startswith("//"):
        name = name[2:].split("/", 1)[1] if "/" in name[2:] else name[2:]
    host, port = _split_host_port(name)
    infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    out = []
    for family, *_, addr in infos:
        ip = str(addr[0])
        hp = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if hp not in out:
            out.append(hp)
    return sorted(out)


class _PickingStub:
    """Stands in for a stub in a Generate stream: each (re-)opened call picks a backend.

    A re-opened call (after a stream failure) avoids the backend that failed
    when another one is available; the in-flight count is released when the call ends.
    """

    def __init__(self, pool: AffinityPool, key: bytes | None) -> None:
        self._pool = pool
        self._key = key
        self._last: str | None = None

    def Generate(self, requests: Any, timeout: float | None = None, metadata: Any = None) -> Any:
        backend = self._pool.acquire(self._key, avoid=self._last)
        self._last = backend
        try:
            call = self._pool.stub(backend).Generate(requests, timeout=timeout, metadata=metadata)
        except BaseException:
            self._pool.release(backend)
            raise
        call.add_done_callback(lambda _call: self._pool.release(backend))
        return call


class AffinityPool:
    """Per-backend channels, their in-flight counts and the bounded-load ring over the healthy ones.

    Args:
        target: a gRPC target (see :func:`resolve_backends`).
        options: channel options of every per-backend channel.
        epsilon: load bound of the ring (a replica takes a key unless over ``(1+epsilon)`` x mean).
        resolve_every_s: how often a ``dns:`` target is re-resolved (on the next pick).
        channel_factory: ``(address, options) -> channel`` (default: insecure channels).
    """

    def __init__(
        self,
        target: str,
        *,
        options: Sequence[tuple[str, Any]] = (),
        epsilon: float = 0.25,
        resolve_every_s: float = 30.0,
        channel_factory: ChannelFactory | None = None,
    ) -> None:
        self.target = target
        # one address per channel: round_robin only for its health checking (NOT_SERVING = down)
        self._options = balanced_options("round_robin", options)
        self._factory = channel_factory or (lambda addr, opts: grpc.insecure_channel(addr, options=opts))
        self._lock = threading.Lock()
        self.ring = HashRing(epsilon=epsilon)
        self.homes = HomeTable()
        self.balance_keys = True  # False: the ring's own pick (bench scenario I compares the two)
        self.in_flight: dict[str, int] = {}
        self.placements: Counter[str] = Counter()  # streams placed per backend
        self.over_bound = 0  # placements above the ring's bound (only when every backend is down)
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, Any] = {}
        self._resolve_every_s = resolve_every_s if target.startswith("dns:") else float("inf")
        self._resolved_at = 0.0
        self.refresh()

    def refresh(self) -> None:
        """Re-resolve the target: open channels to new backends, close those of vanished ones."""
        backends = resolve_backends(self.target)
        with self._lock:
            self._resolved_at = time.monotonic()
            gone = [b for b in self._channels if b not in backends]
            new = [b for b in backends if b not in self._channels]
            for b in gone:
                self.ring.remove(b)
                self.homes.forget_backend(b)
                self._stubs.pop(b)
                self._channels.pop(b).close()
            for b in new:
                ch = self._factory(b, self._options)
                self._channels[b], self._stubs[b] = ch, pb_grpc.InferenceServiceStub(ch)
                self.in_flight.setdefault(b, 0)
                self.ring.add(b)
        for b in new:
            self._channels[b].subscribe(lambda state, b=b: self._on_state(b, state), try_to_connect=True)

    def _on_state(self, backend: str, state: grpc.ChannelConnectivity) -> None:
        with self._lock:
            if backend not in self._channels:
                return
            if state in DOWN:
                self.ring.remove(backend)
            else:
                self.ring.add(backend)

    def stub(self, backend: str) -> Any:
        with self._lock:
            return self._stubs[backend]

    def acquire(self, key: bytes | None, avoid: str | None = None) -> str:
        """Choose a backend for ``key`` (None = the least loaded) and count one more call on it."""
        if time.monotonic() - self._resolved_at > self._resolve_every_s:
            self.refresh()
        with self._lock:
            ring = self.ring if len(self.ring) else HashRing(self._channels, epsilon=self.ring.epsilon)
            if key is None:
                backend = min(sorted(ring.backends), key=lambda b: self.in_flight.get(b, 0))
            elif avoid is not None and len(ring) > 1:
                # NOTE: a retry away from a failed backend does not move the key's home
                ring = HashRing(ring.backends - {avoid}, epsilon=ring.epsilon, vnodes=ring.vnodes)
                backend = ring.pick(key, self.in_flight)
            elif self.balance_keys:
                backend = self.homes.pick(ring, key, self.in_flight)
            else:
                backend = ring.pick(key, self.in_flight)
            self.in_flight[backend] = self.in_flight.get(backend, 0) + 1
            self.placements[backend] += 1
            self._check_bound(ring, backend)
            return backend

    def _check_bound(self, ring: HashRing, backend: str) -> None:
        total = sum(self.in_flight.get(b, 0) for b in ring.backends)
        if self.in_flight[backend] > math.ceil((1 + ring.epsilon) * total / len(ring)):
            self.over_bound += 1

    def release(self, backend: str) -> None:
        with self._lock:
            self.in_flight[backend] = max(0, self.in_flight.get(backend, 0) - 1)

    def picking_stub(self, key: bytes | None) -> _PickingStub:
        """A stub for one Generate stream placed by ``key``."""
        return _PickingStub(self, key)

    def any_stub(self) -> Any:
        """A stub of the least loaded healthy backend, for unary calls."""
        backend = self.acquire(None)
        self.release(backend)
        return self.stub(backend)

    def close(self) -> None:
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for ch in channels:
            ch.close()


def balancing_mode(balancing: str, target: str) -> str:
    """The effective mode: ``auto`` is ``round_robin`` for multi-address targets, else ``pick_first``."""
    if balancing not in BALANCING_MODES:
        raise ValueError(f"balancing must be one of {', '.join(BALANCING_MODES)}")
    if balancing == "auto":
        return "round_robin" if is_multi_address(target) else "pick_first"
    return balancing


def balanced_options(mode: str, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``options`` plus the service config of ``mode`` (a given service config's retry policy is kept)."""
    if mode == "pick_first":
        return list(options)
    given = [v for k, v in options if k == "grpc.service_config"]
    rest = [(k, v) for k, v in options if k not in ("grpc.service_config", "grpc.enable_retries")]
    enable = all(v for k, v in options if k == "grpc.enable_retries")
    config = load_balancing_service_config("round_robin", retry=given[-1] if given else None)
    if not any(k == "grpc.max_reconnect_backoff_ms" for k, _ in rest):
        # NOTE: gRPC's default backoff grows to 120 s: a replica back from a restart would wait
        # that long for traffic. Among a few replicas, a reconnect try every <= 5 s is cheap.
        rest.append(("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS))
    return rest + channel_options(config, enable_retries=enable)
