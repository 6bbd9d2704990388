"""Response cache without a model: keys, the store contract, TTL, persistence, policies, coalescing, tenants."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from inference.v1 import inference_pb2 as pb

from service.request.events import Delta, Done
from service.request.sequence import FinishReason, SamplingParams, Sequence
from service.response_cache.cache import CacheConfig, ResponseCache, Ticket
from service.response_cache.facts import facts, same_facts
from service.response_cache.key import ModelIdentity, exact_key, semantic_scope, split_user_message
from service.response_cache.lexicon import CONTRASTS, FUNCTION_WORDS, norm
from service.response_cache.relations import (
    DIRECTIONAL,
    FILLERS,
    added_qualifier,
    content_substitution,
    directions,
    ends,
    negated_by_prefix,
    opposite_ends,
    reversed_direction,
    swapped,
)
from service.response_cache.store import Entry, MemoryStore, SqliteStore
from tests.support.waiting import until

MODEL = ModelIdentity("a" * 64, "{{ messages }}")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
ENTRY = Entry("hello", (1, 2, 3), "stop", 4, 3)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# -- keys -------------------------------------------------------------------------------------
def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, tuple):
        return (*value, "x")
    if value is None:
        return 7
    raise AssertionError(f"no change rule for {value!r}")


def test_every_key_component_changes_the_key() -> None:
    base = dict(
        model=MODEL, tenant="t", token_ids=[1, 2, 3], params=GREEDY, fmt=("regex", "a+"), json_mode=False
    )
    key = exact_key(**base)  # type: ignore[arg-type]
    assert key == exact_key(**base)  # type: ignore[arg-type]
    variants: dict[str, dict[str, Any]] = {
        "model sha256": {"model": ModelIdentity("b" * 64, MODEL.chat_template)},
        "chat template": {"model": ModelIdentity(MODEL.sha256, "other")},
        "tenant": {"tenant": "u"},
        "prompt ids": {"token_ids": [1, 2, 4]},
        "format kind": {"fmt": ("lark", "a+")},
        "format text": {"fmt": ("regex", "a*")},
        "no format": {"fmt": None},
        "json mode": {"json_mode": True},
    }
    for f in dataclasses.fields(SamplingParams):  # every sampling field, including ones added later
        changed = dataclasses.replace(GREEDY, **{f.name: _changed(getattr(GREEDY, f.name))})
        variants[f"sampling.{f.name}"] = {"params": changed}
    keys = {name: exact_key(**{**base, **v}) for name, v in variants.items()}
    same = [name for name, k in keys.items() if k == key]
    assert same == [], f"changing {same} did not change the key"
    assert len(set(keys.values())) == len(keys)


def test_semantic_scope_ignores_only_the_final_user_message() -> None:
    user, context = split_user_message("", [("system", "be brief"), ("user", "What is 2+2?")])
    assert user == "What is 2+2?"
    _user2, context2 = split_user_message("", [("system", "be brief"), ("user", "what's 2 + 2")])
    assert semantic_scope(MODEL, "t", context, GREEDY, None) == semantic_scope(
        MODEL, "t", context2, GREEDY, None
    )
    _, other = split_user_message("", [("system", "be verbose"), ("user", "What is 2+2?")])
    assert semantic_scope(MODEL, "t", context, GREEDY, None) != semantic_scope(
        MODEL, "t", other, GREEDY, None
    )
    assert semantic_scope(MODEL, "t", context, GREEDY, None) != semantic_scope(
        MODEL, "u", context, GREEDY, None
    )
    raw, raw_context = split_user_message("What is 2+2?", [])
    assert raw == "What is 2+2?" and raw_context != [("user", "<final>")]


# -- the store contract, for every implementation ---------------------------------------------
StoreFactory = Callable[[int, Clock], Any]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "memory":
        return lambda capacity, clock: MemoryStore(capacity, clock)
    return lambda capacity, clock: SqliteStore(tmp_path / "cache.db", capacity, clock)


def test_store_returns_what_was_put(make_store: StoreFactory) -> None:
    store = make_store(1 << 20, Clock())
    assert store.get("k") is None
    assert store.put("k", ENTRY, 60)
    assert store.get("k") == ENTRY
    assert store.stats().entries == 1 and store.stats().bytes > 0


def test_store_expires_entries_after_their_ttl(make_store: StoreFactory) -> None:
    clock = Clock()
    store = make_store(1 << 20, clock)
    store.put("short", ENTRY, 10)
    store.put("long", ENTRY, 100)
    clock.now += 9.9
    assert store.get("short") == ENTRY
    clock.now += 0.2
    assert store.get("short") is None
    assert store.get("long") == ENTRY
    stats = store.stats()
    assert (stats.expirations, stats.entries) == (1, 1)


def test_store_evicts_least_recently_used_within_the_byte_bound(make_store: StoreFactory) -> None:
    size = MemoryStore.size_of("k0", ENTRY.to_bytes())
    store = make_store(3 * size, Clock())
    for k in ("k0", "k1", "k2"):
        assert store.put(k, ENTRY, 60)
    assert store.get("k0") == ENTRY  # k0 is now the most recently used: k1 goes first
    store.put("k3", ENTRY, 60)
    assert store.get("k1") is None
    assert all(store.get(k) == ENTRY for k in ("k0", "k2", "k3"))
    assert store.stats().evictions == 1
    assert store.stats().bytes <= 3 * size


def test_store_refuses_an_entry_larger_than_the_bound(make_store: StoreFactory) -> None:
    store = make_store(200, Clock())
    assert not store.put("big", Entry("x" * 500, (), "stop", 1, 1), 60)
    assert store.get("big") is None and store.stats().bytes == 0


def test_store_bytes_never_exceed_the_bound_under_random_traffic(make_store: StoreFactory) -> None:
    rnd = random.Random(7)
    capacity = 4000
    store = make_store(capacity, Clock())
    for i in range(300):
        store.put(f"k{rnd.randrange(60)}", Entry("y" * rnd.randrange(600), (i,), "stop", 1, 1), 60)
        assert store.stats().bytes <= capacity


def test_sqlite_store_keeps_entries_across_a_reopen(tmp_path: Path) -> None:
    clock = Clock()
    store = SqliteStore(tmp_path / "c.db", 1 << 20, clock)
    store.put("kept", ENTRY, 100)
    store.put("expires", ENTRY, 5)
    store.close()
    clock.now += 10
    reopened = SqliteStore(tmp_path / "c.db", 1 << 20, clock)
    assert reopened.get("kept") == ENTRY
    assert reopened.get("expires") is None
    assert reopened.stats().entries == 1
    reopened.close()


def test_sqlite_store_drops_evicted_entries_from_the_file(tmp_path: Path) -> None:
    size = MemoryStore.size_of("k0", ENTRY.to_bytes())
    store = SqliteStore(tmp_path / "c.db", 2 * size, Clock())
    for k in ("k0", "k1", "k2"):
        store.put(k, ENTRY, 60)
    rows = {r[0] for r in store.db.execute("SELECT key FROM entries")}
    assert rows == {"k1", "k2"}
    store.close()


def test_sqlite_store_reopened_with_a_smaller_bound_keeps_the_newest_that_fit(tmp_path: Path) -> None:
    clock = Clock()
    size = MemoryStore.size_of("k0", ENTRY.to_bytes())
    store = SqliteStore(tmp_path / "c.db", 4 * size, clock)
    for k in ("k0", "k1", "k2", "k3"):
        clock.now += 1
        store.put(k, ENTRY, 60)
    store.close()
    smaller = SqliteStore(tmp_path / "c.db", 2 * size, clock)
    assert smaller.stats().entries == 2 and smaller.stats().bytes <= 2 * size
    assert [smaller.get(k) for k in ("k0", "k1")] == [None, None]
    assert smaller.get("k2") == smaller.get("k3") == ENTRY
    assert {r[0] for r in smaller.db.execute("SELECT key FROM entries")} == {"k2", "k3"}  # the file too
    smaller.close()
    tiny = SqliteStore(tmp_path / "c.db", size - 1, clock)  # no entry fits at all
    assert tiny.stats().entries == 0 and tiny.db.execute("SELECT COUNT(*) FROM entries").fetchone() == (0,)
    tiny.close()


def test_sqlite_store_on_a_corrupt_file_starts_empty_and_keeps_the_file_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.db"
    path.write_bytes(b"not a database " * 100)
    store = SqliteStore(path, 1 << 20, Clock())
    assert store.stats().entries == 0
    store.put("k", ENTRY, 60)
    assert store.get("k") == ENTRY
    store.close()
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("c.db.corrupt-")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_bytes() == b"not a database " * 100
    assert "unreadable" in caplog.text and "starting empty" in caplog.text
    reopened = SqliteStore(path, 1 << 20, Clock())  # the new file is a good one
    assert reopened.get("k") == ENTRY
    reopened.close()


def test_sqlite_store_drops_rows_that_do_not_decode(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    store = SqliteStore(tmp_path / "c.db", 1 << 20, clock)
    store.put("good", ENTRY, 60)
    store.db.execute("INSERT INTO entries VALUES ('bad', X'7b6e6f', ?, ?)", (clock.now + 60, clock.now))
    store.close()
    reopened = SqliteStore(tmp_path / "c.db", 1 << 20, clock)
    assert reopened.get("bad") is None and reopened.get("good") == ENTRY  # never an exception on a hit
    assert {r[0] for r in reopened.db.execute("SELECT key FROM entries")} == {"good"}
    assert "1 unreadable entries dropped" in caplog.text
    reopened.close()


def test_sqlite_store_on_a_path_it_cannot_open_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError):
        SqliteStore(tmp_path, 1 << 20, Clock())  # a directory: a configuration error, not a corrupt cache
    assert list(tmp_path.iterdir()) == []


# -- the cache: tickets, policies, storing ----------------------------------------------------
def _cache(**config: Any) -> ResponseCache:
    cache = ResponseCache(CacheConfig(**config), MemoryStore(1 << 20))
    cache.bind(MODEL)
    return cache


def _seq(
    params: SamplingParams = GREEDY, tenant: str = "anonymous", ids: list[int] | None = None
) -> Sequence:
    seq = Sequence(request_id="r", token_ids=ids or [1, 2, 3], params=params)
    seq.tenant = tenant
    return seq


def _ticket(cache: ResponseCache, seq: Sequence, policy: int = 0, ttl: int | None = None) -> Ticket:
    return cache.ticket(seq, policy, ttl, False, "prompt", [], None)


def _done(reason: FinishReason = FinishReason.STOP) -> Done:
    return Done(reason, 3, 2, 0, 0.0, 1.0, 2.0, 0)


def _run(cache: ResponseCache, t: Ticket, reason: FinishReason = FinishReason.STOP, text: str = "ok") -> None:
    """What the lifecycle does for a request that ran: its deltas recorded, then its end."""
    cache.record(t, Delta(text, (5, 6)))
    cache.finish(t, _done(reason))


def test_only_deterministic_single_answer_requests_get_a_key() -> None:
    cache = _cache()
    assert _ticket(cache, _seq(GREEDY)).key is not None
    assert _ticket(cache, _seq(SamplingParams(temperature=0.8, seed=5))).key is not None
    assert _ticket(cache, _seq(SamplingParams(temperature=0.8))).key is None  # stochastic
    assert _ticket(cache, _seq(dataclasses.replace(GREEDY, n=2))).key is None
    assert _ticket(cache, _seq(dataclasses.replace(GREEDY, logprobs=True))).key is None
    assert _ticket(cache, _seq(dataclasses.replace(GREEDY, echo_prompt_logprobs=True))).key is None


def test_unknown_policy_is_refused_and_ttl_is_capped() -> None:
    cache = _cache(max_ttl_s=30)
    with pytest.raises(ValueError, match="cache_policy"):
        _ticket(cache, _seq(), policy=9)
    assert _ticket(cache, _seq(), ttl=10).ttl_s == 10
    assert _ticket(cache, _seq(), ttl=10_000).ttl_s == 30
    assert _ticket(cache, _seq()).ttl_s == 30


def test_default_policy_stores_and_then_hits() -> None:
    cache = _cache()
    first = _ticket(cache, _seq())
    assert asyncio.run(cache.lookup(first)) is None and first.leader
    _run(cache, first, text="answer")
    hit = asyncio.run(cache.lookup(_ticket(cache, _seq())))
    assert hit is not None and hit.entry.text == "answer" and hit.entry.token_ids == (5, 6)
    assert (cache.counters.misses, cache.counters.hits, cache.counters.stores) == (1, 1, 1)


def test_bypass_does_not_read_but_stores_and_no_store_reads_but_does_not_store() -> None:
    cache = _cache()
    _run(cache, _ticket(cache, _seq()), text="old")
    bypass = _ticket(cache, _seq(), policy=pb.CACHE_POLICY_BYPASS)
    assert asyncio.run(cache.lookup(bypass)) is None
    _run(cache, bypass, text="new")
    hit = asyncio.run(cache.lookup(_ticket(cache, _seq())))
    assert hit is not None and hit.entry.text == "new"
    other = _seq(ids=[9, 9])
    no_store = _ticket(cache, other, policy=pb.CACHE_POLICY_NO_STORE)
    assert asyncio.run(cache.lookup(no_store)) is None
    _run(cache, no_store)
    assert asyncio.run(cache.lookup(_ticket(cache, other, policy=pb.CACHE_POLICY_ONLY_IF_CACHED))) is None


def test_only_if_cached_miss_neither_runs_nor_leads() -> None:
    cache = _cache()
    t = _ticket(cache, _seq(), policy=pb.CACHE_POLICY_ONLY_IF_CACHED)
    assert asyncio.run(cache.lookup(t)) is None
    assert not t.leader and cache.flights.in_flight() == 0


@pytest.mark.parametrize("reason", [FinishReason.CANCELLED, FinishReason.ERROR])
def test_cancelled_or_failed_answers_are_not_stored(reason: FinishReason) -> None:
    cache = _cache()
    _run(cache, _ticket(cache, _seq()), reason)
    assert cache.store.get(_ticket(cache, _seq()).key or "") is None
    assert cache.counters.stores == 0


def test_length_is_stored_for_generate_but_not_for_json() -> None:
    cache = _cache()
    _run(cache, _ticket(cache, _seq()), FinishReason.LENGTH)
    assert cache.counters.stores == 1
    json_ticket = cache.ticket(_seq(), 0, None, False, "p", [], ("json_schema", "{}"), json_mode=True)
    _run(cache, json_ticket, FinishReason.LENGTH)
    assert cache.counters.stores == 1


def test_a_different_tenant_never_hits() -> None:
    cache = _cache()
    _run(cache, _ticket(cache, _seq(tenant="alice")))
    assert asyncio.run(cache.lookup(_ticket(cache, _seq(tenant="bob")))) is None
    assert asyncio.run(cache.lookup(_ticket(cache, _seq(tenant="alice")))) is not None


# -- coalescing -------------------------------------------------------------------------------
async def _coalescing(cancel_leader: bool) -> tuple[ResponseCache, list[Any], list[Ticket]]:
    cache = _cache()
    leader = _ticket(cache, _seq())
    assert await cache.lookup(leader) is None and leader.leader
    followers = [_ticket(cache, _seq()) for _ in range(3)]
    tasks = [asyncio.create_task(cache.lookup(t)) for t in followers]
    assert await until(lambda: cache.counters.coalesced == 3)  # every follower waits on the flight...
    assert not any(task.done() for task in tasks)  # ...for the leader
    if cancel_leader:
        _run(cache, leader, FinishReason.CANCELLED)
        # every follower woke: one leads (its lookup returned), the two others follow it
        assert await until(lambda: cache.counters.coalesced == 5 and any(task.done() for task in tasks))
        new_leaders = [t for t, task in zip(followers, tasks, strict=True) if task.done()]
        assert len(new_leaders) == 1 and new_leaders[0].leader  # exactly one follower runs
        _run(cache, new_leaders[0], text="second")
    else:
        _run(cache, leader, text="first")
    return cache, await asyncio.gather(*tasks), followers


def test_identical_requests_in_flight_wait_for_the_first() -> None:
    cache, results, _ = asyncio.run(_coalescing(cancel_leader=False))
    assert [r.entry.text for r in results] == ["first"] * 3
    assert all(r.coalesced for r in results)
    assert (cache.counters.misses, cache.counters.coalesced, cache.counters.hits) == (1, 3, 3)


def test_a_cancelled_leader_hands_the_computation_to_one_waiter() -> None:
    cache, results, _followers = asyncio.run(_coalescing(cancel_leader=True))
    assert sum(r is None for r in results) == 1  # the new leader ran it
    assert [r.entry.text for r in results if r is not None] == ["second"] * 2
    assert cache.counters.misses == 2 and cache.flights.in_flight() == 0


def test_a_waiter_that_gives_up_stops_waiting() -> None:
    async def scenario() -> Any:
        cache = _cache()
        await cache.lookup(_ticket(cache, _seq()))
        return await asyncio.wait_for(cache.lookup(_ticket(cache, _seq()), gave_up=lambda: True), 30)

    assert asyncio.run(scenario()) is None


def test_a_refused_leader_releases_its_waiters() -> None:
    async def scenario() -> Any:
        cache = _cache()
        leader = _ticket(cache, _seq())
        await cache.lookup(leader)
        waiter = asyncio.create_task(cache.lookup(_ticket(cache, _seq())))
        assert await until(lambda: cache.counters.coalesced == 1)  # it waits for the leader
        assert not waiter.done()
        cache.abandon(leader)  # e.g. QueueFull at submission
        return await until(waiter.done), await waiter

    done, result = asyncio.run(scenario())
    assert done and result is None  # it became the leader and runs itself


# -- facts: what a semantic near-miss changes ---------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 15 percent of 80?", "How much is 15 percent of 80?"),
        ("What is the capital of France?", "What city serves as France's capital?"),
        ("How many kilometers are in 5 miles?", "Convert 5 miles to kilometers."),
        ("Is 97 a prime number?", "Is the number 97 prime?"),
        ("Who was Albert Einstein?", "Tell me who Albert Einstein was."),
        (
            "What is the difference between Python and Java?",
            "What is the difference between Java and Python?",
        ),
        ("Send 20 dollars from Alice to Bob.", "Send 20 dollars to Bob from Alice."),  # same direction
        ("Is Pluto a planet?", "Is Pluto considered a planet?"),  # a hedge, not a qualifier
        ("Wait a second before retrying.", "Wait one second before retrying."),  # "second" the unit
    ],
)
def test_paraphrases_keep_their_facts(a: str, b: str) -> None:
    assert same_facts(facts(a), facts(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Is coffee bad for your heart?", "Is coffee not bad for your heart?"),  # negation
        ("What is 15 percent of 80?", "What is 15 percent of 90?"),  # number
        ("What is 2 to the power of 10?", "What is 10 to the power of 2?"),  # number order
        ("What is the capital of France?", "What is the capital of Germany?"),  # name
        ("How many ounces are in a cup?", "How many tablespoons are in a cup?"),  # unit
        (
            "Convert 100 degrees Fahrenheit to Celsius.",
            "Convert 100 degrees Celsius to Fahrenheit.",
        ),  # binding
        ("What is the largest ocean on Earth?", "What is the smallest ocean on Earth?"),  # superlative
        ("Who painted the Mona Lisa?", "When was the Mona Lisa painted?"),  # kind of question
        ("What is the boiling point of water?", "What is the freezing point of water?"),  # contrast
        ("How do I convert a string to an integer?", "How do I convert an integer to a string?"),  # swap
        ("Did Apple sue Samsung?", "Did Samsung sue Apple?"),  # role swap
        ("How many liters are in a gallon?", "How many gallons are in a liter?"),  # swap around "are in"
        ("How do I turn a PDF into Word?", "How can I convert Word to a PDF?"),  # reversed direction
        ("Is it safe to eat raw eggs?", "Is it unsafe to eat raw eggs?"),  # negating prefix
        ("How do I install numpy?", "How do I uninstall numpy?"),  # negating prefix
        ("Is a laptop cheaper than a desktop?", "Is a laptop more expensive than a desktop?"),  # comparative
        ("What was the weather like yesterday?", "What will the weather be like tomorrow?"),  # time word
        ("Who is the landlord here?", "Who is the tenant here?"),  # role
        ("What is the tallest building in Asia?", "What is the second tallest building in Asia?"),  # ordinal
        ("What is the GDP of Japan?", "What is the GDP per capita of Japan?"),  # added qualifier
        ("Does the store open at 9?", "Does the store close at 9?"),
        (
            "How long does shipping take to Canada?",
            "How long does shipping take from Canada?",
        ),  # opposite ends
    ],
)
def test_near_misses_change_their_facts(a: str, b: str) -> None:
    assert not same_facts(facts(a), facts(b))


# -- relations: word order and word choice --------------------------------------------------------
def _order(text: str) -> tuple[str, ...]:
    return facts(text).sequence


def test_a_swap_needs_two_spans_exchanged_around_a_non_symmetric_middle() -> None:
    assert swapped(_order("Flights from New York to Boston"), _order("Flights from Boston to New York"))
    assert not swapped(
        _order("Compare Python and Java"), _order("Compare Java and Python")
    )  # "and" is symmetric
    assert not swapped(
        _order("Is 97 a prime number?"), _order("Is the number 97 prime?")
    )  # adjacent: rewording
    assert not swapped(_order("Is 97 prime?"), _order("Is 97 prime?"))


def test_directions_relate_the_content_words_around_a_preposition() -> None:
    a = directions(_order("Convert my PDF into a Word file"))
    assert ("pdf", "to", "word") in a
    assert reversed_direction(a, directions(_order("convert Word to PDF")))
    assert not reversed_direction(a, directions(_order("convert PDF to Word please")))


def test_opposite_ends_need_the_same_word_as_destination_and_origin() -> None:
    to_paris = ends(_order("Trains to Paris"))
    assert opposite_ends(to_paris, ends(_order("Trains from Paris")))
    assert not opposite_ends(to_paris, ends(_order("Trains from Lyon to Paris")))
    assert not opposite_ends(ends(_order("from Lyon to Paris")), ends(_order("to Paris from Lyon")))


def test_a_negating_prefix_is_found_only_when_the_other_side_lacks_the_prefixed_word() -> None:
    assert negated_by_prefix(frozenset({"safe", "eat"}), frozenset({"unsafe", "eat"}))
    assert not negated_by_prefix(frozenset({"safe", "unsafe"}), frozenset({"unsafe"}))
    assert not negated_by_prefix(frozenset({"to"}), frozenset({"into"}))  # stems under 4 letters


def test_an_added_qualifier_needs_a_content_word() -> None:
    assert added_qualifier(_order("boil an egg"), _order("boil a duck egg"))
    assert not added_qualifier(_order("Is Pluto a planet?"), _order("Is Pluto really a planet?"))


def test_content_substitution_skips_function_words_and_shared_stems() -> None:
    assert content_substitution(_order("Can I eat raw chicken?"), _order("Can I eat raw salmon?")) == (
        "chicken",
        "salmon",
    )
    assert content_substitution(_order("Who painted it?"), _order("Who was the painter of it?")) is None
    assert content_substitution(_order("What is the capital?"), _order("Which is the capital?")) is None
    assert content_substitution(_order("a b c d e"), _order("v w x y z")) is None  # not one short span


def test_contrast_groups_include_inflected_adjectives_and_synonym_classes() -> None:
    assert (
        same_facts(facts("Which is the biggest planet?"), facts("Which is the largest planet?")) is False
    )  # superlative
    assert same_facts(facts("Is it a big house?"), facts("Is it a large house?"))  # one class
    assert not same_facts(facts("Is it a bigger house?"), facts("Is it a smaller house?"))


def test_word_lists_are_normalised_like_the_messages_words() -> None:
    lists = FUNCTION_WORDS | FILLERS | set(DIRECTIONAL) | {w for group in CONTRASTS for w in group}
    assert not {w for w in lists if norm(w) != w}  # e.g. "this" would never match the messages' "thi"
