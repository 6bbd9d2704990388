"""Qwen's user-defined tokens (``<tool_call>``, ``<think>``: matched by llama.cpp in any text) on a tiny
vocabulary that marks them as Qwen's GGUFs do, with Qwen 3's real chat template: a message or a raw prompt
full of them reaches llama.cpp with at most ``CHUNK`` of them a call (issue #35: llama.cpp's search for them
is quadratic in how many one call holds) and gets the ids llama.cpp gives the text in one call. No model file.
"""

from __future__ import annotations

import pytest

from service.model.chat import ChatTemplate
from service.model.prompt_tokens import CHUNK, PromptTokenizer
from service.model.runner import Vocab
from tests.support.chat_templates import chat_template
from tests.support.tiny_vocab import Family, build

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER = ["<tool_call>", "</tool_call>", "<think>", "</think>"]  # user-defined in Qwen's GGUFs
TOOL_CALL, THINK = len(CONTROL), len(CONTROL) + 2


@pytest.fixture(scope="module")
def pt(tmp_path_factory: pytest.TempPathFactory) -> PromptTokenizer:
    family = Family("qwen3-tiny", CONTROL, "<|endoftext|>", "<|im_end|>", chat_template("Qwen-Qwen3-0.6B"), USER)
    vocab = Vocab.load(build(tmp_path_factory.mktemp("qwen") / "qwen.gguf", family=family))
    return PromptTokenizer(vocab, ChatTemplate(vocab.chat_template, vocab.bos_text, vocab.eos_text))


def test_the_vocabulary_lists_qwens_user_defined_tokens_and_they_are_not_control_tokens(pt: PromptTokenizer) -> None:
    assert [(s.id, s.text) for s in pt.vocab.user_defined()] == [(len(CONTROL) + i, t) for i, t in enumerate(USER)]
    assert set(pt.specials) == set(CONTROL)
    assert pt.vocab.tokenize("a<think>b", add_special=False, parse_special=False)[1] == THINK


def test_a_message_of_80000_tool_calls_reaches_llama_cpp_a_chunk_at_a_time(
    pt: PromptTokenizer, calls: list[str]
) -> None:
    rendered = pt.render([("user", "<tool_call>" * 80_000)])
    ids = pt.ids(rendered.parts, add_special=False)
    assert ids.count(TOOL_CALL) == 80_000 and ids.count(1) == 2 and ids.count(2) == 1
    assert b"".join(pt.vocab.piece(t, special=True) for t in ids).decode() == rendered.text
    # <|im_start|> | "user\n" + the content, alone, in batches | <|im_end|> "\n" <|im_start|> "assistant\n"
    assert len(calls) == 2 + 80_000 // CHUNK
    assert max(pt.users.count(text, 10 * CHUNK) for text in calls) == CHUNK


def test_a_chat_holding_more_tool_calls_than_a_chunk_gets_llama_cpps_whole_prompt_ids(
    pt: PromptTokenizer, calls: list[str]
) -> None:
    content = "Weather? " + "<tool_call>{\"name\": \"x\"}</tool_call>\n" * 50 + "<think>ok</think> done"
    rendered = pt.render([("user", "hi <think>"), ("assistant", "sure"), ("user", content)])
    ids = pt.ids(rendered.parts, add_special=False)
    assert max(pt.users.count(text, 10 * CHUNK) for text in calls) <= CHUNK
    assert ids == pt.vocab.tokenize(rendered.text, add_special=False, parse_special=True)
    assert ids.count(TOOL_CALL) == 50 and ids.count(THINK) == 2


def test_a_raw_prompt_of_tool_calls_gets_llama_cpps_ids_a_chunk_at_a_time(
    pt: PromptTokenizer, calls: list[str]
) -> None:
    text = "<|im_start|>user\n" + "<tool_call> a <think>" * 100
    for parse in (False, True):
        calls.clear()
        ids = pt.text_ids(text, add_special=False, parse_special=parse)
        assert max(pt.users.count(t, 10 * CHUNK) for t in calls) <= CHUNK and len(calls) >= 200 // CHUNK
        assert ids == pt.vocab.tokenize(text, add_special=False, parse_special=parse)
        assert ids.count(TOOL_CALL) == ids.count(THINK) == 100
