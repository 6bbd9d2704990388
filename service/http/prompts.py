"""The ``prompt`` of a Completions request, in every form OpenAI accepts.

``prompt`` is a string, an array of strings, an array of token ids (one prompt), or an array of
token-id arrays; each prompt becomes its own request through the lifecycle (``service.http.runs``),
with ``n`` choices each: choice ``j`` of prompt ``i`` has index ``i * n + j`` (OpenAI's order).

Token ids are the caller's: they go to the engine as they are (no tokenization, no BOS added),
each checked against the vocabulary (``check_ids``: a 400 naming ``prompt``). Bounds, per request:
``MAX_CHOICES`` choices in all (prompts times ``n``), ``MAX_PROMPT_IDS`` token ids in all its
token-id prompts; a text prompt is bounded by the body limit and, like any prompt, the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.http.errors import bad_param

Prompt = str | tuple[int, ...]
MAX_CHOICES = 64  # prompts x n of one completions request (each prompt is a request of its own)
MAX_PROMPT_IDS = 1 << 18  # token ids in all the token-id prompts of one request
SHAPES = "a string, an array of strings, an array of token ids, or an array of token-id arrays"


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def prompts_of(raw: Any) -> tuple[Prompt, ...]:
    """The request's prompts, in order; a 400 naming ``prompt`` for any other shape or over the bounds."""
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list) or not raw:
        raise bad_param("prompt", f"prompt must be {SHAPES}")
    out: tuple[Prompt, ...]
    if all(isinstance(p, str) for p in raw):
        out = tuple(raw)
    elif all(_is_id(t) for t in raw):
        out = (tuple(raw),)
    elif all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in raw):
        out = tuple(tuple(p) for p in raw)
    else:
        raise bad_param("prompt", f"prompt must be {SHAPES} (not a mix, and no empty token-id array)")
    if len(out) > MAX_CHOICES:
        raise bad_param("prompt", f"{len(out)} prompts; at most {MAX_CHOICES} per request")
    if (ids := sum(len(p) for p in out if isinstance(p, tuple))) > MAX_PROMPT_IDS:
        raise bad_param("prompt", f"{ids} prompt token ids; at most {MAX_PROMPT_IDS} per request")
    return out


def check_choices(prompts: int, n: int) -> None:
    """Prompts times ``n`` within ``MAX_CHOICES`` (a 400 naming ``n``)."""
    if prompts * n > MAX_CHOICES:
        raise bad_param("n", f"{prompts} prompts x n={n} = {prompts * n} choices; at most {MAX_CHOICES} per request")


def check_ids(prompts: Sequence[Prompt], n_vocab: int) -> None:
    """Every token id of the token-id prompts in the vocabulary (a 400 naming ``prompt``)."""
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            continue
        for j, t in enumerate(p):
            if not 0 <= t < n_vocab:
                where = f"prompt[{i}][{j}]" if len(prompts) > 1 else f"prompt[{j}]"
                raise bad_param("prompt", f"{where} = {t} is not a token id of this model (0 .. {n_vocab - 1})")


def text_of(prompt: Prompt, token_bytes: Sequence[bytes]) -> str:
    """A prompt's text (token ids decoded; bytes that are not UTF-8 as U+FFFD): what ``echo`` shows."""
    if isinstance(prompt, str):
        return prompt
    return b"".join(token_bytes[t] for t in prompt).decode("utf-8", "replace")
