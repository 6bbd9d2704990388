"""Consistent hashing with bounded loads and the prefix key (pure logic, no model, no network)."""

from __future__ import annotations

from collections import Counter

import pytest
from inference_client.balancing import balanced_options, balancing_mode, resolve_backends
from inference_client.ring import HashRing, prefix_key

from tests.support.helpers import assert_loads_stay_bounded

BACKENDS = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
KEYS = [f"system prompt {i}".encode() for i in range(600)]


def test_keys_spread_over_all_backends() -> None:
    ring = HashRing(BACKENDS)
    counts = Counter(ring.pick(k) for k in KEYS)
    assert set(counts) == set(BACKENDS)
    assert min(counts.values()) > len(KEYS) / len(BACKENDS) / 2  # 160 vnodes: roughly even


def test_same_key_same_backend_and_stable_across_instances() -> None:
    a, b = HashRing(BACKENDS), HashRing(reversed(BACKENDS))
    assert all(a.pick(k) == b.pick(k) for k in KEYS)


def test_removal_moves_only_the_removed_backends_keys() -> None:
    ring = HashRing(BACKENDS)
    before = {k: ring.pick(k) for k in KEYS}
    ring.remove(BACKENDS[1])
    after = {k: ring.pick(k) for k in KEYS}
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == BACKENDS[1]}
    assert BACKENDS[1] not in after.values()
    ring.add(BACKENDS[1])  # and back: every key returns to its old owner
    assert {k: ring.pick(k) for k in KEYS} == before


def test_adding_a_backend_moves_keys_only_to_it() -> None:
    ring = HashRing(BACKENDS)
    before = {k: ring.pick(k) for k in KEYS}
    ring.add("10.0.0.4:50051")
    after = {k: ring.pick(k) for k in KEYS}
    assert all(after[k] in (before[k], "10.0.0.4:50051") for k in KEYS)


@pytest.mark.parametrize("epsilon", [0.1, 0.25, 0.5, 1.0])
def test_bounded_loads_never_exceed_the_capacity(epsilon: float) -> None:
    """Random arrivals and departures, all on a few hot keys: no backend exceeds ceil((1+eps) * mean)."""
    ring = HashRing(BACKENDS, epsilon=epsilon)
    # hot keys: the unbounded ring would put all on <= 3 backends
    assert_loads_stay_bounded(ring.pick, KEYS[:3], BACKENDS, epsilon, 7)


def test_a_key_keeps_its_backend_while_under_the_bound() -> None:
    ring = HashRing(BACKENDS, epsilon=0.5)
    key = KEYS[0]
    home = ring.pick(key)
    loads = {b: 2 for b in BACKENDS}  # balanced: home has room (cap = ceil(1.5 * 7 / 3) = 4)
    assert ring.pick(key, loads) == home
    loads[home] = 5  # at capacity (cap = ceil(1.5 * 10 / 3) = 5): the next backend clockwise takes it
    assert ring.pick(key, loads) == ring.preference(key)[1]


def test_empty_ring_and_bad_parameters() -> None:
    with pytest.raises(LookupError):
        HashRing().pick(b"x")
    with pytest.raises(ValueError):
        HashRing(epsilon=0)


def test_prefix_key_uses_system_message_or_leading_text() -> None:
    sys_a = [{"role": "system", "content": "You are A."}, {"role": "user", "content": "hi"}]
    sys_a2 = [("system", "You are A."), ("user", "something else entirely")]
    assert prefix_key(messages=sys_a) == prefix_key(messages=sys_a2)
    assert prefix_key(messages=sys_a) != prefix_key(messages=[{"role": "system", "content": "You are B."}])
    long = "x" * 1000
    assert prefix_key(long + "one", k_tokens=64) == prefix_key(long + "two", k_tokens=64)
    assert prefix_key("short one", k_tokens=64) != prefix_key("short two", k_tokens=64)


def test_targets_and_modes() -> None:
    assert resolve_backends("ipv4:127.0.0.1:1,127.0.0.1:2") == ["127.0.0.1:1", "127.0.0.1:2"]
    assert resolve_backends("dns:///localhost:7") in (
        ["127.0.0.1:7"],
        ["127.0.0.1:7", "[::1]:7"],
        ["[::1]:7"],
    )
    assert resolve_backends("localhost:7") == ["localhost:7"]
    assert balancing_mode("auto", "dns:///svc:1") == "round_robin"
    assert balancing_mode("auto", "localhost:1") == "pick_first"
    with pytest.raises(ValueError):
        balancing_mode("random", "x")
    opts = dict(balanced_options("round_robin", [("grpc.max_receive_message_length", 1)]))
    assert '"round_robin"' in opts["grpc.service_config"]
    assert '"healthCheckConfig"' in opts["grpc.service_config"]
    assert opts["grpc.max_receive_message_length"] == 1
