"""Chat templates rendered as Hugging Face's ``apply_chat_template`` renders them: the model's own language.

The environment is Transformers' (``ImmutableSandboxedEnvironment`` with
``trim_blocks``/``lstrip_blocks``, loop controls, the ``{% generation %}`` tag,
``tojson`` as Transformers defines it, ``raise_exception`` and ``strftime_now``);
the input is the whole conversation in the shape Hugging Face passes it
(``service.chat.conversation``: ``tools``, calls, tool messages, template
variables such as ``enable_thinking`` and ``reasoning_effort``), adapted to what
the template renders (``Caps``, found at start-up by ``service.chat.caps``), with
the family of the template (``service.chat.families``) that says how the model
writes calls. A template that does not compile, or cannot render a plain user
turn, is reported at start-up as one clear message, never a traceback.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

from service.chat.caps import family_of, probe
from service.chat.conversation import ROLES, Caps, Conversation, TemplateInput, Turn, template_input
from service.chat.families import GENERIC, Family
from service.chat.thinking import Start, Thinking
from service.chat.thinking import detect as detect_thinking

# NOTE: used only when the GGUF carries no template (e.g. the Gemma 3 benchmark
# model's file); ChatML is the most common instruction format.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
Chat = Conversation | Sequence[tuple[str, str]]


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (bad role, the template raised), or the template is unusable."""


class _Raised(ValueError):
    """The template's ``raise_exception``."""


class _Generation(jinja2.ext.Extension):
    """Transformers' ``{% generation %}...{% endgeneration %}`` (marks assistant text): rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it so)

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Environment(ImmutableSandboxedEnvironment):
    """Transformers' sandbox, except that a template may append to and pop from its own lists.

    NOTE: Kimi K2's templates keep a queue of call ids that way (llama.cpp's engine allows it, Transformers'
    sandbox does not); the input is built afresh for every render, so nothing outside the render can change.
    """

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in ("append", "pop"):
            return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return bool(super().is_safe_attribute(obj, attr, value))


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Transformers' ``tojson``; an iterator (jinja's ``map``) is written as a list, as llama.cpp's engine does."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=lambda o: list(o) if hasattr(o, "__iter__") else str(o))


def _raise(message: str) -> None:
    raise _Raised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    """The template in Transformers' environment (raises what jinja2 raises for a bad template)."""
    env = _Environment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def conversation(chat: Chat) -> Conversation:
    """A ``Conversation`` (``[(role, content), ...]`` is one of plain turns)."""
    return chat if isinstance(chat, Conversation) else Conversation([Turn(r, c) for r, c in chat])


def _same(text: str) -> str:
    return text


class ChatTemplate:
    """Renders conversations into a prompt string ending with the assistant turn (see the module doc).

    Raises ChatTemplateError at construction when the template does not compile
    or fails on a single user message (a start-up error, not a request error).
    """

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or FALLBACK_TEMPLATE
        self.from_model = source is not None
        self.bos_token, self.eos_token = bos_token, eos_token
        try:
            self._template = compile_template(self.source)
        except Exception as exc:  # jinja2.TemplateSyntaxError and friends
            raise ChatTemplateError(f"chat template does not compile: {type(exc).__name__}: {exc}") from None
        self.family: Family = family_of(source, self._lenient)
        self.thinking: Thinking | None = detect_thinking(source)
        self.caps = Caps()
        try:
            self.render([("user", "Hello")])
        except ChatTemplateError as exc:
            self.caps = Caps(empty_tools=True)  # NOTE: a template that iterates ``tools`` unchecked (Hermes 3)
            try:
                self.render([("user", "Hello")])
            except ChatTemplateError:
                raise ChatTemplateError(f"chat template cannot render a single user message: {exc}") from None
        caps = probe(self._checked, self.family, self.caps)
        if self.family is GENERIC:
            # NOTE: the server speaks for a template of no known family: its own description of the tools and
            # its <tool_call> syntax for calls, so that what the model is told is what the grammar allows
            caps = replace(caps, tools=False, calls=False, multi_calls=False)
        if not caps.calls:  # NOTE: a tool message after calls the template did not see: results are text too
            caps = replace(caps, results=False)
        self.caps = caps

    @property
    def tools_path(self) -> str:
        """How tools reach the model: "template" (it renders them) or "system_turn" (the server's text)."""
        return "template" if self.caps.tools else "system_turn"

    def thought_start(self, variables: Mapping[str, Any]) -> Start | None:
        """Where generation starts for a request with template ``variables`` (None: the model does not reason
        in markers): read from the generation prompt of a probe render with them (``Thinking.start``)."""
        if self.thinking is None:
            return None
        return self._thought_start(json.dumps(dict(variables), sort_keys=True, ensure_ascii=False))

    @functools.lru_cache(maxsize=64)  # noqa: B019 (one template per process; the key is bounded JSON)
    def _thought_start(self, variables: str) -> Start:
        assert self.thinking is not None
        conv = Conversation([Turn("user", "probe_user_text")], variables=json.loads(variables))
        try:
            text = self.render_input(template_input(conv, self.family, self.caps, _same))
        except ChatTemplateError:
            return Start.MAYBE  # NOTE: a template that refuses the variables: the request's render will say so
        return self.thinking.start(text[text.rfind("probe_user_text") + len("probe_user_text"):])

    def _checked(self, inp: TemplateInput) -> str:
        return self.render_input(inp)

    def _lenient(self, inp: TemplateInput) -> str:
        """``inp`` rendered, with ``tools`` [] rather than None if the template needs a list."""
        try:
            return self.render_input(inp)
        except ChatTemplateError:
            if inp.tools is not None:
                raise
            return self.render_input(TemplateInput(inp.messages, [], inp.variables))

    def render_input(self, inp: TemplateInput) -> str:
        """The template's output for ``inp``; raises ChatTemplateError."""
        try:
            return str(self._template.render(
                messages=inp.messages, tools=inp.tools, add_generation_prompt=True,
                bos_token=self.bos_token, eos_token=self.eos_token, **inp.variables))
        except _Raised as exc:  # the template's raise_exception(): the conversation is not allowed
            raise ChatTemplateError(f"chat template rejected the messages: {exc}") from None
        except Exception as exc:  # a template bug hit by this input
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None

    def render(self, chat: Chat, esc: Callable[[str], str] = _same) -> str:
        """The prompt of ``chat``, every caller string passed through ``esc``; raises ChatTemplateError."""
        conv = conversation(chat)
        if not conv.turns:
            raise ChatTemplateError("messages is empty")
        for i, turn in enumerate(conv.turns):
            if turn.role not in ROLES:
                raise ChatTemplateError(f"messages[{i}].role {turn.role!r} is not one of {', '.join(ROLES)}")
        return self.render_input(template_input(conv, self.family, self.caps, esc))
