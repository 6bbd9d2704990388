"""UserTokens (count, batches): text cut into batches of at most a bound of user-defined tokens, which
llama.cpp tokenizes, one call each, into exactly the ids of the one call; on a tiny vocabulary with
user-defined tokens that overlap each other (a real llama.cpp vocabulary, no model file)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.model.runner import SpecialText, Vocab
from service.model.user_tokens import UserTokens
from tests.support.tiny_vocab import CHAT_TEMPLATE, CONTROL, Family, build

# "<t><" holds "<t>" and "t><", crossing; "<t>x" is longer than "<t>"; newline runs overlap themselves.
USER = ["<t>", "<t>x", "t><", "<tool_call>", "</tool_call>", "\n\n", "\n\n\n"]
PIECES = [*USER, "<", "t", ">", "x", " ", "\n", "a", "tool", "_call", "/"]


def users(*tokens: SpecialText) -> UserTokens:
    return UserTokens(list(tokens) or [SpecialText(i, t, in_any_text=True) for i, t in enumerate(USER)])


def test_batches_cut_before_isolated_occurrences_so_none_holds_more() -> None:
    u = users()
    assert u.batches("<t>a<t>b<t>c", 2) == ["<t>a<t>b", "<t>c"]
    assert u.batches("a<tool_call>b</tool_call>c", 1) == ["a<tool_call>b", "</tool_call>c"]
    assert u.batches("abc", 1) == ["abc"]
    assert [u.count(t, 99) for t in ("<t>a<t>b", "<t>c", "<t><", "\n\n\n\n")] == [2, 1, 2, 3]
    assert u.count("<t>" * 10, 4) == 4


def test_overlapping_occurrences_and_lstrip_tokens_are_never_a_cut() -> None:
    u = users()
    assert u.batches("<t>a<t><b<t>", 1) == ["<t>a<t><b", "<t>"]  # "<t>" and "t><" cross: no cut before "<t><"
    assert u.batches("\n\n\n\n\n\n", 1) == ["\n\n\n\n\n\n"]  # a newline run: every occurrence overlaps
    strip = users(SpecialText(1, "<m>", lstrip=True, in_any_text=True), SpecialText(2, "<n>", in_any_text=True))
    assert strip.batches("<n> <m> <n>", 1) == ["<n> <m> ", "<n>"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Vocab:
    family = Family("user-defined-tiny", CONTROL, "<s>", "<|im_end|>", CHAT_TEMPLATE, USER)
    return Vocab.load(build(tmp_path_factory.mktemp("user") / "user.gguf", family=family))


def test_the_vocabulary_lists_its_user_defined_tokens_which_llama_cpp_matches_in_any_text(vocab: Vocab) -> None:
    listed = vocab.user_defined()
    assert [(s.id, s.text, s.in_any_text) for s in listed] == [(len(CONTROL) + i, t, True) for i, t in enumerate(USER)]
    assert vocab.tokenize("a<tool_call>b", add_special=False, parse_special=False)[1] == len(CONTROL) + 3


def _plain(vocab: Vocab, text: str) -> list[int]:
    return vocab.tokenize(text, add_special=False, parse_special=False)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(text=st.lists(st.sampled_from(PIECES), max_size=40).map("".join), most=st.integers(1, 3))
def test_batches_get_exactly_the_ids_of_one_call(vocab: Vocab, text: str, most: int) -> None:
    u = UserTokens(vocab.user_defined())
    batches = u.batches(text, most)
    assert "".join(batches) == text
    assert [t for b in batches for t in _plain(vocab, b)] == _plain(vocab, text)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(text=st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "a", " ", "t", "<", "x"]),
                     max_size=40).map("".join), most=st.integers(1, 3))
def test_no_batch_holds_more_than_the_bound_where_occurrences_cannot_overlap(
    vocab: Vocab, text: str, most: int
) -> None:
    """Tokens that cannot overlap (as real chat models' ``<tool_call>``, ``<think>`` cannot): every batch
    holds at most ``most`` of them, and a batch is cut only when it holds ``most``."""
    u = UserTokens(vocab.user_defined())
    held = [u.count(b, 99) for b in u.batches(text, most)]
    assert all(n <= most for n in held) and all(n == most for n in held[:-1])
    assert sum(held) == u.count(text, 99)
