"""Counts past the limits (service/api/input_limits.py) and prompts too long for the context are refused
before the work that grows with them: the template never renders, the tokenizer never runs."""

from __future__ import annotations

from typing import Any

import pytest
from inference.v1 import inference_pb2 as pb

from service.api.input_limits import InputLimits
from service.api.request_builder import PromptLimits, RequestBuilder
from service.model.chat import ChatTemplate
from service.request.errors import BadRequest


class Counted:
    """How often the builder's template rendered and its vocabulary tokenized (spies on the real ones)."""

    def __init__(self, builder: RequestBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
        self.renders = self.tokenizes = 0
        render, tokenize = builder.template.render, builder.vocab.tokenize

        def counted_render(*args: Any, **kw: Any) -> Any:
            self.renders += 1
            return render(*args, **kw)

        def counted_tokenize(*args: Any, **kw: Any) -> Any:
            self.tokenizes += 1
            return tokenize(*args, **kw)

        monkeypatch.setattr(builder.template, "render", counted_render)
        monkeypatch.setattr(builder.vocab, "tokenize", counted_tokenize)


def builder(vocab: Any, context: int = 4096, **limits: int) -> RequestBuilder:
    template = ChatTemplate(vocab.chat_template, vocab.bos_text, vocab.eos_text)
    return RequestBuilder(vocab, template, PromptLimits(context, InputLimits(**limits)))


def turns(n: int, content: str = "hi") -> list[pb.ChatMessage]:
    return [pb.ChatMessage(role=("user", "assistant")[i % 2], content=content) for i in range(n)]


def test_more_messages_than_max_messages_are_refused_before_rendering(
    tiny_vocab: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = builder(tiny_vocab, max_messages=8)
    assert b.prompt_ids("", turns(8))  # at the limit: accepted
    counted = Counted(b, monkeypatch)
    for call in (lambda: b.prompt_ids("", turns(9)), lambda: b.render_tokens("", turns(9))):
        with pytest.raises(BadRequest) as err:
            call()
        assert str(err.value) == "messages has 9 entries; at most 8 are accepted (server flag --max-messages)"
        assert err.value.status == "INVALID_ARGUMENT"
    assert (counted.renders, counted.tokenizes) == (0, 0)


def test_80000_markers_in_one_message_are_refused_before_rendering(
    tiny_vocab: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's 960 KB message: no tokenization of it can fit the context, known from its length."""
    b = builder(tiny_vocab, context=8192)
    counted = Counted(b, monkeypatch)
    with pytest.raises(BadRequest, match=r"^prompt is at least \d+ tokens \(960000 characters"):
        b.prompt_ids("", [pb.ChatMessage(role="user", content="<|im_start|>" * 80_000)])
    assert (counted.renders, counted.tokenizes) == (0, 0)


def test_a_chat_whose_markup_alone_exceeds_the_context_is_refused_before_tokenizing(
    tiny_vocab: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many short turns: each costs control tokens and a run of text; their count is a lower bound."""
    b = builder(tiny_vocab, context=256)
    counted = Counted(b, monkeypatch)
    with pytest.raises(BadRequest, match=r"^prompt is at least \d+ tokens \(its chat markup alone\)"):
        b.prompt_ids("", turns(100, "a"))
    assert counted.renders == 1 and counted.tokenizes == 0


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"stop": ["a", "b", "c"]}, "stop has 3 entries; at most 2 are accepted (server flag --max-stop-strings)"),
        ({"logit_bias": {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}},
         "logit_bias has 4 entries; at most 3 are accepted (server flag --max-logit-bias)"),
    ],
)
def test_stop_strings_and_logit_bias_past_their_flags_are_invalid_argument(
    tiny_vocab: Any, sampling: dict[str, Any], message: str
) -> None:
    b = builder(tiny_vocab, max_stop_strings=2, max_logit_bias=3)
    with pytest.raises(BadRequest) as err:
        b.sampling(pb.SamplingParams(**sampling), 10)
    assert str(err.value) == message and err.value.status == "INVALID_ARGUMENT"
