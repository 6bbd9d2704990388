"""Unit tests of the hardening pieces that need no model weights.

Duplicate-key guard, grammar cache bounds, grammar head-of-line blocking,
watchdog, chat templates through llama-cpp-python's formatter.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from service.engine.watchdog import Watchdog
from service.grammar.cache import GrammarCache
from service.grammar.json_keys import KeyGuard, KeyVocab
from service.model.chat import ChatTemplate, ChatTemplateError
from tests.support.waiting import scaled, until

# A toy vocabulary: whole keys, split keys and JSON punctuation.
TOKENS = [b"{", b'"', b"a", b"b", b'"a"', b'"b"', b'":', b":", b"1", b",", b"}", b'a"', b'b":', b'{"', b',"', b"]"]


def guard_after(text: bytes) -> KeyGuard:
    g = KeyGuard(KeyVocab(TOKENS))
    g.feed(text)
    return g


def banned(g: KeyGuard) -> set[bytes]:
    return {TOKENS[t] for t in g.duplicates(np.zeros(len(TOKENS), dtype=np.float32))}


def test_key_guard_bans_tokens_that_repeat_a_key_of_the_same_object() -> None:
    assert banned(guard_after(b'{"a":1,')) == {b'"a"'}  # a whole key in one token
    assert banned(guard_after(b'{"a":1,"')) == {b'a"'}  # closing the key string on "a"
    assert banned(guard_after(b'{"a":1,"b":1,"')) == {b'a"', b'b":'}
    assert banned(guard_after(b'{"a":1')) == set()  # not at a key
    assert banned(guard_after(b'{"a":{')) == set()  # a nested object has keys of its own
    assert banned(guard_after(b'{"a":{"b":1},"')) == {b'a"'}  # back in the outer object
    assert banned(guard_after(b'["a",')) == set()  # array strings are not keys
    assert banned(guard_after(b'{"a":"a\\"b","')) == {b'a"'}  # an escaped quote does not end a string


def test_key_guard_apply_masks_only_allowed_duplicates_and_never_everything() -> None:
    g = guard_after(b'{"a":1,"')
    row = np.zeros(len(TOKENS), dtype=np.float32)
    assert g.apply(row) == 1 and row[TOKENS.index(b'a"')] == -np.inf
    only = np.full(len(TOKENS), -np.inf, dtype=np.float32)
    only[TOKENS.index(b'a"')] = 0.0  # the grammar allows nothing else: leave it to final validation
    assert g.apply(only) == 0 and only[TOKENS.index(b'a"')] == 0.0


def test_grammar_cache_is_bounded_by_bytes_and_count_but_keeps_pending_entries() -> None:
    cache: GrammarCache[str] = GrammarCache(max_entries=3, max_bytes=100, size_of=len)

    def done(value: str) -> Future[str]:
        f: Future[str] = Future()
        f.set_result(value)
        return f

    pending: Future[str] = Future()
    cache.get_or_start(("k", "pending"), lambda: pending)
    for i in range(3):
        cache.get_or_start(("k", str(i)), lambda: done("x" * 40))
    stats = cache.stats()
    assert stats["bytes"] <= 100 and stats["entries"] <= 3 and stats["evictions"] >= 1
    fut, hit = cache.get_or_start(("k", "pending"), lambda: done("new"))
    assert hit and fut is pending  # never evicted while compiling
    fut, hit = cache.get_or_start(("k", "0"), lambda: done("x" * 40))
    assert not hit  # the least recently used finished entry went first


@pytest.fixture(scope="module")
def vocab(tiny_vocab: Any) -> Any:
    return tiny_vocab


def test_cached_grammar_is_served_while_slow_compiles_hold_the_pool(vocab: Any) -> None:
    from service.api.grammar_service import GrammarService
    from service.observability.engine_metrics import EngineMetrics

    # NOTE: the slow compiles time out after timeout_s; the check that they are still compiling when the
    # hit is served must not race that timer on a busy machine.
    svc = GrammarService(vocab, EngineMetrics(), max_source_bytes=64_000, timeout_s=scaled(0.5))
    release = threading.Event()
    inside: list[str] = []  # slow compiles a worker has started
    real_build = svc.compiler._build

    def build(kind: str, source: str) -> Any:
        if "slow" in source:
            inside.append(source)
            release.wait(60)
        return real_build(kind, source)

    svc.compiler._build = build  # type: ignore[method-assign]
    fast = json.dumps({"type": "object", "properties": {"ok": {"type": "integer"}}})
    slow = [json.dumps({"type": "string", "description": f"slow {i}"}) for i in range(3)]

    async def scenario() -> None:
        await svc.matcher_for("json_schema", fast)  # now cached
        waits = [asyncio.ensure_future(svc.matcher_for("json_schema", s)) for s in slow]
        assert await until(lambda: len(inside) == 2)  # the slow compiles occupy both workers
        # A hit queued behind the blocked compiles would time out (RESOURCE_EXHAUSTED) here.
        await svc.matcher_for("json_schema", fast)
        assert not any(w.done() for w in waits)  # ...while the slow ones are still compiling
        results = await asyncio.gather(*waits, return_exceptions=True)
        assert all(getattr(r, "status", "") == "RESOURCE_EXHAUSTED" for r in results), results
        release.set()
        for s in slow:  # the timeout was not cached: the finished compile serves the retry
            assert await until(lambda s=s: svc.compiler.start("json_schema", s)[0].done())
            _matcher, compiled = await svc.matcher_for("json_schema", s)
            assert compiled.kind == "json_schema"

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        svc.close()


class _Engine:
    def __init__(self) -> None:
        self.step_started: float | None = None
        self.failure: str | None = None

    def fail(self, cause: str) -> None:
        self.failure = cause


def test_watchdog_reports_a_stalled_step_and_a_dead_thread() -> None:
    engine = _Engine()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    dog = Watchdog(engine, thread, step_timeout_s=2.0)
    now = time.monotonic()
    assert dog.check(now) is None
    engine.step_started = now - 1.0
    assert dog.check(now) is None
    engine.step_started = now - 3.0
    assert dog.check(now) == "engine step running for over 2 s"
    stop.set()
    thread.join()
    assert dog.check(now) == "engine thread exited"


def test_chat_template_uses_the_library_environment() -> None:
    # Loop controls, HF-style tojson (non-ASCII kept) and raise_exception all work.
    source = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and m['content'] == 'no' %}"
        "{{ raise_exception('not that') }}{% endif %}"
        "{% if loop.index > 2 %}{% break %}{% endif %}{{ m | tojson }}\n{% endfor %}"
    )
    tmpl = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    out = tmpl.render([("user", "héllo"), ("assistant", "b"), ("user", "dropped")])
    assert out == '{"role": "user", "content": "héllo"}\n{"role": "assistant", "content": "b"}\n'
    with pytest.raises(ChatTemplateError, match="not that"):
        tmpl.render([("user", "s"), ("assistant", "no")])


def test_a_template_without_a_system_role_gets_the_system_text_in_the_first_user_turn() -> None:
    """As llama.cpp does for such templates (Gemma's raise on a system turn)."""
    source = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
              "{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    tmpl = ChatTemplate(source)
    assert not tmpl.caps.system
    assert tmpl.render([("system", "Be brief."), ("user", "Hi")]) == "[user] Be brief.\n\nHi\n"


def test_broken_chat_templates_fail_at_start_up_with_one_clear_message() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}{{ m.content }")
    with pytest.raises(ChatTemplateError, match="cannot render a single user message"):
        ChatTemplate("{{ raise_exception('unsupported') }}")


def test_constraint_the_vocabulary_cannot_start_is_refused_at_compile_time(vocab: Any) -> None:
    """A raw control byte no token produces: llguidance's mask and parser disagree (fuzz finding)."""
    from service import json_grammar as jg

    compiler = jg.GrammarCompiler(vocab.ll_tokenizer())
    try:
        with pytest.raises(jg.GrammarError) as info:
            compiler.compile("regex", "\x1d\x00\x82i@")
        assert info.value.status == "INVALID_ARGUMENT" and "cannot produce" in str(info.value)
        compiled, _, _ = compiler.compile("regex", "[0-9]{3}")  # an ordinary regex still compiles
        matcher = compiler.matcher(compiled)
        assert matcher.forced_tokens() == [] and not matcher.is_stopped()
    finally:
        compiler.close()
