"""Prompt text -> token ids, where caller text is never control tokens and cost is linear.

The rule (docs/security.md, "Caller text is never control tokens"): in a chat,
only the template's own text (and the server's, written for what the template
does not render: ``service.chat``) becomes control tokens; every string a caller
wrote (message contents, tools' names, descriptions and schemas, earlier calls'
names and arguments, call ids, template variables) is tokenized as text, whatever
it contains. A raw prompt is text too; ``parse_special=True`` (Tokenize and
CountTokens only) asks for every control token's text to be parsed.

How: every caller string is escaped (``ControlTokens.escape``) before the
template renders it, the render is split at the control tokens left unmarked
(the template's), and each run of text between them is tokenized by llama.cpp
without special parsing. llama.cpp splits a prompt at the same places before it
tokenizes the pieces, so a conversation whose contents hold no control-token
text gets exactly the token ids of llama.cpp's whole-prompt tokenization.

llama.cpp matches user-defined tokens in any text. gpt-oss's harmony markers are
control tokens that its loader retypes as user-defined (``RETYPED_CONTROL``), so
text tokenized without special parsing can still come out as them: every such
token in the ids of text is spelled out as the ids of its own text, cut inside
(``ControlTokens.pieces``), so text never becomes one (``_as_text``). llama.cpp's
search for user-defined tokens (those, and genuine ones such as Qwen's
``<tool_call>``, which are text as the vocabulary has them) is quadratic in how
many occur in one call, so no call holds more than ``CHUNK`` of them: a run holding
more is cut where that keeps its ids (``UserTokens.batches``).

NOTE: escaping changes only strings that hold a control token's text (or a mark
character). For those, the render is checked against a second one with other
mark characters: a template that treats the marks as anything but opaque
characters (dropping or encoding them) would make the two differ, and the
request is refused rather than tokenized unsafely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.model.chat import Chat, ChatTemplate, ChatTemplateError, conversation
from service.model.control_tokens import ControlTokens, Part, free_chars
from service.model.runner import SpecialText, Vocab
from service.model.user_tokens import UserTokens

# Control tokens, and occurrences of user-defined tokens, per llama.cpp call.
CHUNK = 32


def _text(part: Part) -> str:
    return part if isinstance(part, str) else part.text


@dataclass(frozen=True)
class Rendered:
    """A chat as the template rendered it: its text, and its runs of plain text and control tokens."""

    text: str
    parts: list[Part]


class PromptTokenizer:
    """Tokenizes raw prompts and rendered chats for one vocabulary and chat template (see the module doc)."""

    def __init__(self, vocab: Vocab, template: ChatTemplate) -> None:
        self.vocab, self.template = vocab, template
        specials = vocab.special_texts()
        avoid = "".join((template.source, vocab.bos_text, vocab.eos_text, *(s.text for s in specials)))
        brk, esc, brk2, esc2 = free_chars(4, avoid)
        self.controls = ControlTokens(specials, (brk, esc))
        self._check = ControlTokens(specials, (brk2, esc2))
        self._special_ids = frozenset(s.id for s in specials)
        self.users = UserTokens(vocab.user_defined())
        # NOTE: llama.cpp's partition tokenizes the text between the user-defined tokens it matched apart,
        # so spelling a match out as the ids of its text's pieces gives the ids of the text tokenized in
        # pieces cut inside each marker, in a call per ``CHUNK`` markers rather than per piece (a call
        # costs a fixed ~0.15 ms: see ``ids``). Byte-level BPE (gpt-oss's) adds no space before a piece.
        self._spelled = {s.id: [t for piece in self.controls.pieces(s.text) for t in self._plain(piece)]
                         for s in specials if s.in_any_text}

    @property
    def specials(self) -> dict[str, SpecialText]:
        """The control tokens by text."""
        return self.controls.by_text

    def render(self, chat: Chat) -> Rendered:
        """The chat rendered with every caller string escaped, split at the template's control tokens.

        Raises ChatTemplateError (bad role, the template refused) and when the template
        transforms escaped text in a way that keeps it from being told apart.
        """
        changed = False

        def esc(text: str) -> str:
            nonlocal changed
            out = self.controls.escape(text)
            changed = changed or out != text
            return out

        conv = conversation(chat)
        raw = self.template.render(conv, esc)
        parts = self.controls.split(raw)
        if changed and self._check.split(self.template.render(conv, self._check.escape)) != parts:
            raise ChatTemplateError(
                "the chat template transforms message text that contains control-token text in a way "
                "that cannot be tokenized as text; remove the control-token text from the messages"
            )
        return Rendered(self.controls.reveal(raw), parts)

    def starts_with_bos(self, rendered: Rendered) -> bool:
        """The template wrote BOS itself (so none is added)."""
        return bool(self.vocab.bos_text) and rendered.text.startswith(self.vocab.bos_text)

    def ids(self, parts: Sequence[Part], add_special: bool) -> list[int]:
        """Token ids of ``parts``: runs as text, control tokens as themselves; ``add_special`` adds BOS
        (and EOS) where the vocabulary wants them, as llama.cpp does.

        NOTE: llama.cpp spends a fixed ~0.15 ms per call (this model's pre-tokenizer), so runs that hold
        no control-token text are tokenized together with their control tokens, up to ``CHUNK`` control
        tokens and ``CHUNK`` occurrences of user-defined tokens a call, with special parsing: the same
        ids as one run a call, with far fewer calls (its quadratic search stays small at that size). A
        run that holds control-token text (caller text that was escaped) or more than ``CHUNK``
        user-defined tokens is tokenized on its own as text; a chunk whose control tokens come out
        other than placed is tokenized again one part a call.
        """
        out: list[int] = []
        chunk: list[Part] = []
        tokens = users = 0  # control tokens, user-defined occurrences in ``chunk``
        for part in parts:
            found = 0
            if isinstance(part, str):
                found = self.users.count(part, CHUNK + 1)
                if found > CHUNK or self.controls.holds_control(part):
                    out += self._chunk(chunk) + self._as_text(part)
                    chunk, tokens, users = [], 0, 0
                    continue
            if tokens >= CHUNK or users + found > CHUNK:
                out += self._chunk(chunk)
                chunk, tokens, users = [], 0, 0
            chunk.append(part)
            tokens, users = tokens + (not isinstance(part, str)), users + found
        out += self._chunk(chunk)
        return self._framed(out, add_special)

    def _framed(self, ids: list[int], add_special: bool) -> list[int]:
        """``ids`` with BOS (and EOS) where the vocabulary wants them, if ``add_special``, as llama.cpp adds them."""
        if not add_special:
            return ids
        return [self.vocab.bos_id] * self.vocab.add_bos + ids + [self.vocab.eos_id] * self.vocab.add_eos

    def _chunk(self, parts: Sequence[Part]) -> list[int]:
        """Parts without control-token text in their runs, tokenized in one call (see ``ids``)."""
        if not parts:
            return []
        ids = self.vocab.tokenize("".join(_text(p) for p in parts), add_special=False, parse_special=True)
        placed = [p.id for p in parts if not isinstance(p, str)]
        if [t for t in ids if t in self._special_ids] == placed:
            return ids
        out: list[int] = []  # NOTE: not expected; kept so that no run can ever yield a control token
        for p in parts:
            out += self._as_text(p) if isinstance(p, str) else [p.id]
        return out

    def _plain(self, text: str) -> list[int]:
        return self.vocab.tokenize(text, add_special=False, parse_special=False)

    def _as_text(self, text: str) -> list[int]:
        """Token ids of ``text`` as text: llama.cpp without special parsing, at most ``CHUNK`` user-defined
        tokens a call (``UserTokens.batches``: the same ids as one call), each control token it matches
        anyway (``in_any_text``) spelled out as the ids of its text (see the module doc)."""
        ids: list[int] = []
        for batch in self.users.batches(text, CHUNK):
            ids += self._plain(batch)
        if self._spelled.keys().isdisjoint(ids):
            return ids
        return [t for token in ids for t in self._spelled.get(token, (token,))]

    def text_ids(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of raw text; ``parse_special`` turns every control token's text into the token
        (found here in linear time, not by llama.cpp's quadratic search)."""
        if not parse_special:
            return self._framed(self._as_text(text), add_special)
        return self.ids(self.controls.split(text, marked=False), add_special)
