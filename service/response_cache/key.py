"""Cache keys: what makes two requests "the same request".

The exact key is a SHA-256 over everything that can change a deterministic
answer: the model file's sha256, the chat template, the prompt token ids after
templating, every sampling field (``dataclasses.asdict`` of
``service.request.sequence.SamplingParams``, so a field added there is covered without
touching this module), the response format (kind and source text), whether it
is a GenerateJSON request, and the tenant. ``ignore_eos`` is a sampling field.

The semantic *scope* is the same hash with the final user message left out
(the other messages stay in): a semantic hit needs an equal scope and a
similar final user message.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from service.request.sequence import SamplingParams

KEY_VERSION = 1  # bump when the stored entry format or the key recipe changes
_SHA_MEMO: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True)
class ModelIdentity:
    """The model half of every key."""

    sha256: str
    chat_template: str


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, memoised per (path, size, mtime) for this process."""
    st = os.stat(path)
    memo = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _SHA_MEMO:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        _SHA_MEMO[memo] = h.hexdigest()
    return _SHA_MEMO[memo]


def deterministic(params: SamplingParams) -> bool:
    """Greedy (temperature 0 / top_k 1) or an explicit seed: the only requests ever cached."""
    return params.greedy or params.seed is not None


def replayable(params: SamplingParams) -> bool:
    """Whether a stored text replays the full answer.

    NOTE: requests with several choices or with log-probabilities are not cached
    (their answer is more than one text); checked by name so this module does not
    depend on when those fields land in SamplingParams.
    """
    fields = asdict(params)
    return (
        int(fields.get("n", 1) or 1) == 1
        and not fields.get("logprobs", False)
        and not fields.get("top_logprobs", 0)
        and not fields.get("echo_prompt_logprobs", False)
    )


def _digest(parts: dict[str, Any]) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(text.encode()).hexdigest()


def _base(
    model: ModelIdentity, tenant: str, params: SamplingParams, fmt: tuple[str, str] | None, json_mode: bool
) -> dict[str, Any]:
    return {
        "v": KEY_VERSION,
        "model": model.sha256,
        "template": model.chat_template,
        "tenant": tenant,
        "sampling": asdict(params),
        "format": list(fmt) if fmt is not None else None,
        "json": json_mode,
    }


def exact_key(
    model: ModelIdentity,
    tenant: str,
    token_ids: list[int],
    params: SamplingParams,
    fmt: tuple[str, str] | None,
    json_mode: bool = False,
) -> str:
    """The exact-cache key (64 hex digits)."""
    return _digest({**_base(model, tenant, params, fmt, json_mode), "prompt": list(token_ids)})


def semantic_scope(
    model: ModelIdentity,
    tenant: str,
    context: list[tuple[str, str]],
    params: SamplingParams,
    fmt: tuple[str, str] | None,
    json_mode: bool = False,
) -> str:
    """Everything but the final user message: ``context`` is the other messages (role, content)."""
    return _digest({**_base(model, tenant, params, fmt, json_mode), "context": [list(m) for m in context]})


def split_user_message(prompt: str, messages: list[tuple[str, str]]) -> tuple[str, list[tuple[str, str]]]:
    """(final user message, every other message); a raw prompt is all "user message" with no context.

    NOTE: the raw-prompt case gets a distinct marker in its context, so a prompt
    never shares a scope with a chat whose only message is the same text.
    """
    if not messages:
        return prompt, [("raw-prompt", "")]
    for i in range(len(messages) - 1, -1, -1):
        if messages[i][0] == "user":
            return messages[i][1], [*messages[:i], ("user", "<final>"), *messages[i + 1 :]]
    return "", messages
