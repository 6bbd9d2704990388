"""A reasoning model's output split into its thought and its answer, as it is generated, and the grammar of both.

``ThoughtReader`` is fed the output's text in pieces (``feed``) and returns, for
each piece, the new thought text and the new answer text, the markers removed;
``close`` ends it. A marker split across pieces is held back until it is known
to be one (or not), so a split never leaks part of a marker into either side; a
character split across tokens never reaches it (the engine's text stream
releases whole characters). The leading whitespace of the thought and of the
answer is dropped (the ``\\n`` after ``<think>``, the ``\\n\\n`` after
``</think>``): the same pieces in every split, so streamed pieces concatenate to
the unstreamed text. A row with an answer header (harmony's final channel:
``Thinking.answer_open``) keeps the answer's leading text, drops the header
where the answer starts with it, and ends such an answer at ``answer_close``.
The tool-call reader and a JSON document's check read the answer alone.

``grammar`` builds the Lark grammar of a whole output: the free thought up to
the end marker (at most ``budget`` tokens: llguidance's ``max_tokens`` on the
thought's lexeme; at the budget the end marker is forced), then the answer's own
grammar (a JSON Schema, the call syntax) or free text, after the row's answer
header unless the answer's grammar writes its own (``framed``: harmony's call
syntax, whose text is a final-channel message and whose calls are not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from service.chat.markup import Markup, literal
from service.chat.thinking import Start, Thinking

_START = re.compile(r"^start\s*:", re.MULTILINE)
FREE_ANSWER = "start: /(?s:.*)/\n"


def _held(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that starts ``marker`` (held back: it may become one)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ThoughtReader:
    """One output's thought and answer (see the module doc); ``start``: where the prompt left generation."""

    thinking: Thinking
    start: Start
    thought: str = ""
    answer: str = ""
    _buf: str = ""
    # "lead" (may open), "think", "think_ws" (leading space), "ws", "answer"; with an answer header: "head" (may
    # start with it), "final" (after it, up to answer_close), "done" (after answer_close)
    _state: str = field(default="")

    def __post_init__(self) -> None:
        self._state = {Start.INSIDE: "think_ws", Start.MAYBE: "lead", Start.CLOSED: self._answer}[self.start]

    @property
    def _answer(self) -> str:
        """The state an answer starts in."""
        return "head" if self.thinking.answer_open else "answer"

    @property
    def thinking_now(self) -> bool:
        """The output is inside the thought (or may still open one)."""
        return self._state in ("lead", "think", "think_ws")

    def feed(self, text: str) -> tuple[str, str]:
        """(new thought text, new answer text) of the next piece of the output."""
        self._buf += text
        return self._run(final=False)

    def close(self) -> tuple[str, str]:
        """The last (thought, answer) at the output's end: held text is released (a thought the output left
        unfinished is thought)."""
        return self._run(final=True)

    def _run(self, final: bool) -> tuple[str, str]:
        thought, answer = "", ""
        while True:
            step = self._step(final)
            if step is None:
                break
            thought, answer = thought + step[0], answer + step[1]
        self.thought += thought
        self.answer += answer
        return thought, answer

    def _step(self, final: bool) -> tuple[str, str] | None:
        """One move of the reader: the text it releases, or None when it waits for more."""
        buf, t = self._buf, self.thinking
        if not buf:
            return None
        if self._state == "lead":
            lead = buf.lstrip()
            if lead.startswith(t.open):
                self._buf, self._state = lead[len(t.open):], "think_ws"
                return "", ""
            if t.open.startswith(lead) and not final:
                return None  # NOTE: blank so far, or a start of the marker: not known yet
            self._state = self._answer
            return "", ""
        if self._state in ("think_ws", "ws"):
            # NOTE: an answer with a header keeps its leading text (harmony's " to=functions." of a call)
            rest = buf if self._state == "ws" and t.answer_open else buf.lstrip()
            self._buf = rest
            if rest or final:
                self._state = "think" if self._state == "think_ws" else self._answer
            return ("", "") if rest else None
        if self._state == "think":
            return self._until(t.close, "ws", final, thought=True)
        if self._state == "head":
            return self._head(final)
        if self._state == "final" and t.answer_close:
            return self._until(t.answer_close, "done", final, thought=False)
        self._buf = ""
        return ("", "") if self._state == "done" else ("", buf)

    def _until(self, marker: str, then: str, final: bool, thought: bool) -> tuple[str, str] | None:
        """Text up to ``marker`` (thought or answer), then state ``then``; a possible start of it held back."""
        buf = self._buf
        i = buf.find(marker)
        if i >= 0:
            self._buf, self._state = buf[i + len(marker):], then
            text = buf[:i]
        else:
            keep = 0 if final else _held(buf, marker)
            self._buf = buf[len(buf) - keep:]
            if len(buf) <= keep:
                return None
            text = buf[:len(buf) - keep]
        return (text, "") if thought else ("", text)

    def _head(self, final: bool) -> tuple[str, str] | None:
        """An answer that starts with the row's header drops it (and ends at ``answer_close``); any other is
        read as it is (harmony: a call)."""
        buf, head = self._buf, self.thinking.answer_open
        if buf.startswith(head):
            self._buf, self._state = buf[len(head):], "final"
            return "", ""
        if head.startswith(buf) and not final:
            return None
        self._state = "answer"
        return "", ""


def _answer_rules(answer: str | None, header: str = "") -> list[str]:
    """The answer's grammar with its ``start`` rule renamed ``rsn_answer`` (free text when None), after
    ``header`` (Lark items) when there is one. NOTE: the definition only: a caller's grammar whose start rule
    refers to itself fails to compile (a 400 there)."""
    source = answer if answer is not None else FREE_ANSWER
    if not _START.search(source):
        raise ValueError("the answer's grammar has no start rule")
    if not header:
        return [_START.sub("rsn_answer:", source, count=1).rstrip("\n")]
    return [f"rsn_answer: {header} rsn_body", _START.sub("rsn_body:", source, count=1).rstrip("\n")]


def grammar(thinking: Thinking, markup: Markup, start: Start, budget: int | None = None,
            answer: str | None = None, framed: bool = False) -> str:
    """The Lark grammar of an output: the thought (``start`` INSIDE: the prompt opened it; MAYBE: the output
    may open it) of at most ``budget`` tokens, then ``answer`` (a Lark grammar with a ``start`` rule; None:
    free text) after the row's answer header unless ``framed``. ``start`` CLOSED: the answer alone."""
    header = "" if framed else markup.lark(thinking.answer_open)
    if start is Start.CLOSED:
        if header:
            return "\n".join(["start: rsn_answer", *_answer_rules(answer, header)]) + "\n"
        return answer if answer is not None else FREE_ANSWER
    limit = f"max_tokens={budget}" if budget is not None else ""
    close = markup.lark(thinking.close)
    if isinstance(markup.parts(thinking.close)[0], int):  # NOTE: free text never holds a special token
        text = f"rsn_text[{limit}]: /(?s:.*)/" if limit else "rsn_text: /(?s:.*)/"
    else:  # NOTE: the text's lexeme stops at the end marker, which the rule then reads (llguidance's outer stop)
        text = f"rsn_text[stop={literal(thinking.close)}{', ' + limit if limit else ''}]: /(?s:.*)/"
    # NOTE: rsn_* names, not to meet the answer grammar's own rules
    rules = [f"rsn_thought: rsn_text {close}", text]
    head = "start: rsn_thought rsn_answer" if start is Start.INSIDE else \
        f"start: rsn_answer | {markup.lark(thinking.open)} rsn_thought rsn_answer"
    return "\n".join([head, *rules, *_answer_rules(answer, header)]) + "\n"


@dataclass(frozen=True)
class Reasoning:
    """One loaded model's reasoning: its markers (``Thinking``) placed in its vocabulary (``Markup``)."""

    thinking: Thinking
    markup: Markup

    def reader(self, start: Start) -> ThoughtReader:
        return ThoughtReader(self.thinking, start)

    def grammar(self, start: Start, budget: int | None = None, answer: str | None = None,
                framed: bool = False) -> str:
        return grammar(self.thinking, self.markup, start, budget, answer, framed)

    def describe(self) -> dict[str, str]:
        """How the model reasons, as ``GetModelInfo`` and ``/v1/models`` report it."""
        return {"markers": self.thinking.name, "open": self.thinking.open, "close": self.thinking.close}
