"""Chat template rendering from the model's GGUF metadata (jinja2, sandboxed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# NOTE: used only when the GGUF carries no template (e.g. the Gemma 3 benchmark
# model's file); ChatML is the most common instruction format.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ROLES = ("system", "user", "assistant")


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (bad role, template raised)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


class ChatTemplate:
    """Renders ``[{role, content}, ...]`` into a prompt string ending with the assistant turn."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or FALLBACK_TEMPLATE
        self.from_model = source is not None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(self.source)
        self._bos, self._eos = bos_token, eos_token

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        if not messages:
            raise ChatTemplateError("messages is empty")
        for i, (role, _content) in enumerate(messages):
            if role not in ROLES:
                raise ChatTemplateError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        msgs: list[dict[str, Any]] = [{"role": r, "content": c} for r, c in messages]
        try:
            return self._template.render(
                messages=msgs, add_generation_prompt=True, bos_token=self._bos, eos_token=self._eos
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
