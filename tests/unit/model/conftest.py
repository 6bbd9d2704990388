"""Fixtures of the model package's unit tests."""

from __future__ import annotations

import pytest

from service.model.prompt_tokens import PromptTokenizer


@pytest.fixture
def calls(pt: PromptTokenizer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts of every llama.cpp tokenize call ``pt`` (the test module's tokenizer fixture) makes: the real
    calls, recorded as they pass."""
    seen: list[str] = []
    tokenize = pt.vocab.tokenize

    def spy(text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        seen.append(text)
        return tokenize(text, add_special, parse_special)

    monkeypatch.setattr(pt.vocab, "tokenize", spy)
    return seen
