"""Sticky, key-balanced homes for prefix keys (pure logic, no model, no network)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from inference_client.placement import HomeTable
from inference_client.ring import HashRing

from tests.support.helpers import assert_loads_stay_bounded

BACKENDS = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]


def _keys(seed: int, n: int = 32) -> list[bytes]:
    rng = random.Random(seed)
    return [f"system prompt {rng.getrandbits(64)}".encode() for _ in range(n)]


def test_keys_per_replica_stay_near_the_mean_where_the_ring_alone_is_lumpy() -> None:
    """200 random sets of 32 keys: never more than ceil(1.1 x 32 / 3) = 12 keys on one replica, mostly 11/11/10."""
    ring = HashRing(BACKENDS)
    table_spreads, ring_spreads = [], []
    for seed in range(200):
        keys, table = _keys(seed), HomeTable()
        homes = Counter(table.home(ring, k) for k in keys)
        assert max(homes.values()) <= 12, homes
        assert homes == table.keys_per_backend
        table_spreads.append(max(homes.values()) - min(homes.get(b, 0) for b in BACKENDS))
        by_ring = Counter(ring.pick(k) for k in keys)
        ring_spreads.append(max(by_ring.values()) - min(by_ring.get(b, 0) for b in BACKENDS))
    assert max(table_spreads) <= 4 and sum(s <= 1 for s in table_spreads) >= 180
    assert max(ring_spreads) >= 8 and sum(s <= 1 for s in ring_spreads) < 40  # what the table fixes


def test_a_home_is_nearly_always_one_of_the_keys_two_ring_choices_and_is_sticky() -> None:
    ring, table = HashRing(BACKENDS), HomeTable()
    keys = _keys(1, 300)
    first = {k: table.home(ring, k) for k in keys}
    assert sum(first[k] in ring.preference(k)[:2] for k in keys) >= 0.95 * len(keys)
    assert {k: table.home(ring, k) for k in reversed(keys)} == first


def test_adding_a_backend_gives_it_keys_and_moves_keys_only_to_it() -> None:
    ring, table = HashRing(BACKENDS), HomeTable()
    keys = _keys(7, 300)
    before = {k: table.home(ring, k) for k in keys}
    ring.add("10.0.0.4:50051")
    after = {k: table.home(ring, k) for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    # the keys whose two choices now include the new backend and not their home (blake2b: the same
    # 40 of these 300 keys every run)
    assert len(moved) == 40
    assert all(after[k] == "10.0.0.4:50051" for k in moved)


def test_requests_go_home_until_it_is_over_the_bound_then_to_the_other_choice() -> None:
    ring, table = HashRing(BACKENDS, epsilon=0.5), HomeTable()
    key = _keys(2, 1)[0]
    home = table.home(ring, key)
    loads = {b: 2 for b in BACKENDS}  # cap = ceil(1.5 * 7 / 3) = 4: home has room
    assert table.pick(ring, key, loads) == home
    loads[home] = 5  # cap = ceil(1.5 * 10 / 3) = 5: home is full
    spill = table.pick(ring, key, loads)
    assert spill != home and spill == next(b for b in ring.preference(key) if b != home)
    assert table.home(ring, key) == home  # a spill does not move the home


@pytest.mark.parametrize("epsilon", [0.1, 0.25, 0.5])
def test_bounded_loads_never_exceed_the_capacity(epsilon: float) -> None:
    ring, table = HashRing(BACKENDS, epsilon=epsilon), HomeTable()
    assert_loads_stay_bounded(
        lambda key, loads: table.pick(ring, key, loads), _keys(3, 5), BACKENDS, epsilon, 11
    )


def test_removing_a_backend_moves_only_the_keys_homed_there() -> None:
    ring, table = HashRing(BACKENDS), HomeTable()
    keys = _keys(4, 300)
    before = {k: table.home(ring, k) for k in keys}
    ring.remove(BACKENDS[0])
    table.forget_backend(BACKENDS[0])
    after = {k: table.home(ring, k) for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == BACKENDS[0]}
    assert BACKENDS[0] not in after.values()
    assert sum(table.keys_per_backend.values()) == len(table) == len(keys)


def test_a_backend_that_left_the_ring_is_replaced_even_without_forget() -> None:
    ring, table = HashRing(BACKENDS), HomeTable()
    keys = _keys(5, 100)
    homes = {k: table.home(ring, k) for k in keys}
    ring.remove(BACKENDS[1])  # e.g. its channel went down: the pool takes it off the ring only
    assert all(table.home(ring, k) != BACKENDS[1] for k in keys)
    assert all(table.home(ring, k) == homes[k] for k in keys if homes[k] != BACKENDS[1])
    assert table.keys_per_backend[BACKENDS[1]] == 0


def test_lru_bound_forgets_the_oldest_keys_and_keeps_counts_exact() -> None:
    ring, table = HashRing(BACKENDS), HomeTable(max_keys=10)
    keys = _keys(6, 25)
    for k in keys:
        table.home(ring, k)
    assert len(table) == 10
    assert sum(table.keys_per_backend.values()) == 10
    assert Counter(table.home(ring, k) for k in keys[-10:]) == table.keys_per_backend


def test_empty_ring_and_bad_parameters() -> None:
    with pytest.raises(LookupError):
        HomeTable().home(HashRing(), b"x")
    with pytest.raises(ValueError):
        HomeTable(max_keys=0)
