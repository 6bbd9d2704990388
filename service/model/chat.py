"""Chat template rendering from the model's GGUF metadata, with llama-cpp-python's formatter.

NOTE: rendering goes through ``llama_cpp.llama_chat_format.Jinja2ChatFormatter``
(via ``runner.chat_formatter``): the same sandboxed jinja2 environment as
Transformers' chat templates (loop controls, HF-style ``tojson``,
``raise_exception``, ``strftime_now``), so a GGUF's template renders as its
authors tested it. A template that does not compile, or cannot render a plain
user turn, is reported at start-up as one clear message, never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from service.model.runner import chat_formatter

# NOTE: used only when the GGUF carries no template (e.g. the Gemma 3 benchmark
# model's file); ChatML is the most common instruction format.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ROLES = ("system", "user", "assistant")


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (bad role, the template raised), or the template is unusable."""


class ChatTemplate:
    """Renders ``[(role, content), ...]`` into a prompt string ending with the assistant turn.

    Raises ChatTemplateError at construction when the template does not compile
    or fails on a single user message (a start-up error, not a request error).
    """

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or FALLBACK_TEMPLATE
        self.from_model = source is not None
        try:
            self._render: Callable[[list[dict[str, Any]]], str] = chat_formatter(self.source, bos_token, eos_token)
        except Exception as exc:  # jinja2.TemplateSyntaxError and friends
            raise ChatTemplateError(f"chat template does not compile: {type(exc).__name__}: {exc}") from None
        try:
            self.render([("user", "Hello")])
        except ChatTemplateError as exc:
            raise ChatTemplateError(f"chat template cannot render a single user message: {exc}") from None

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        if not messages:
            raise ChatTemplateError("messages is empty")
        for i, (role, _content) in enumerate(messages):
            if role not in ROLES:
                raise ChatTemplateError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        try:
            return self._render([{"role": r, "content": c} for r, c in messages])
        except ValueError as exc:  # the template's raise_exception(): the conversation is not allowed
            raise ChatTemplateError(f"chat template rejected the messages: {exc}") from None
        except Exception as exc:  # a template bug hit by this input
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
