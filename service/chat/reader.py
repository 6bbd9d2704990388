"""Reading a model's output as it is generated: the parse of a call syntax as a generator that waits.

A syntax writes its parser as a generator over a ``Reader`` (``yield from`` its
helpers); the generator yields whenever it needs text that has not arrived yet.
``Stream`` drives it: ``feed`` adds text and runs it as far as the text allows,
``close`` ends the text and runs it to its end. Each helper reads from where the
last one stopped and never reads a character twice (except ``until``'s look for
its stop strings, which starts just before the new text), so a whole output is
read in time linear in its length however it is split.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

from service.chat.calls import Args, Begin, CallSyntaxError, Content, Piece

T = TypeVar("T")
Wait = Generator[None, None, T]  # a helper: yields while it waits for text, returns its result
Emit = Callable[[str], None]
_SCALAR = frozenset("0123456789+-.eEtrufalsn")


class Reader:
    """The output so far (``buf``), how far the parse has read (``pos``), and the pieces it emitted."""

    def __init__(self) -> None:
        self.buf = ""
        self.pos = 0
        self.closed = False
        self.out: list[Piece] = []

    # -- pieces ---------------------------------------------------------------------------------
    def content(self, text: str) -> None:
        if text:
            self.out.append(Content(text))

    def begin(self, index: int, name: str, call_id: str = "") -> None:
        self.out.append(Begin(index, name, call_id))

    def args(self, index: int) -> Emit:
        """An emitter of call ``index``'s argument pieces."""
        return lambda text: self.out.append(Args(index, text)) if text else None

    # -- reading --------------------------------------------------------------------------------
    def take(self, lit: str) -> Wait[bool]:
        """Whether ``lit`` comes next: consumed if so; False (nothing consumed) if other text does or the
        output ends first."""
        while True:
            have = self.buf[self.pos : self.pos + len(lit)]
            if have == lit:
                self.pos += len(lit)
                return True
            if not lit.startswith(have) or self.closed:
                return False
            yield

    def expect(self, lit: str) -> Wait[None]:
        """``lit`` must come next (CallSyntaxError otherwise)."""
        if not (yield from self.take(lit)):
            raise CallSyntaxError(f"expected {lit!r} at {self.pos}, got {self.buf[self.pos:self.pos + 20]!r}")

    def at_end(self) -> Wait[bool]:
        """The output ends here (waits until that is known)."""
        while self.pos >= len(self.buf) and not self.closed:
            yield
        return self.pos >= len(self.buf)

    def until(self, stops: tuple[str, ...], emit: Emit | None = None) -> Wait[tuple[str, str | None]]:
        """The text up to the earliest of ``stops`` and that stop (consumed); the stop is None when the output
        ends first (all the rest is read). ``emit`` gets the text as soon as it cannot be part of a stop."""
        start, sent, look = self.pos, self.pos, self.pos
        longest = max(len(s) for s in stops)
        while True:
            hits = [(i, s) for s in stops if (i := self.buf.find(s, look)) >= 0]
            if hits:
                i, stop = min(hits)
                if emit:
                    emit(self.buf[sent:i])
                self.pos = i + len(stop)
                return self.buf[start:i], stop
            if self.closed:
                if emit:
                    emit(self.buf[sent:])
                self.pos = len(self.buf)
                return self.buf[start:], None
            safe = len(self.buf) - _held(self.buf, stops, longest)
            if emit and safe > sent:
                emit(self.buf[sent:safe])
                sent = safe
            look = max(start, len(self.buf) - longest + 1)
            yield

    def rest(self) -> Wait[None]:
        """Everything up to the output's end, as content."""
        while not self.closed:
            self.content(self.buf[self.pos :])
            self.pos = len(self.buf)
            yield
        self.content(self.buf[self.pos :])
        self.pos = len(self.buf)

    def json_value(self, emit: Emit | None = None) -> Wait[str]:
        """One JSON value's raw text (as written; checked by ``json.loads`` where it is used), emitted as read."""
        start = i = self.pos
        depth, in_str, esc, scalar = 0, False, False, False
        while True:
            end = None
            while i < len(self.buf):
                c = self.buf[i]
                if in_str:
                    if esc:
                        esc = False
                    elif c == "\\":
                        esc = True
                    elif c == '"':
                        in_str = False
                        if depth == 0:
                            end = i + 1
                            break
                elif scalar:
                    if c not in _SCALAR:
                        end = i
                        break
                elif c == '"':
                    in_str = True
                elif c in "{[":
                    depth += 1
                elif c in "}]":
                    depth -= 1
                    if depth == 0:
                        end = i + 1
                        break
                elif depth == 0 and c in _SCALAR:
                    scalar = True
                elif depth == 0 and not c.isspace():
                    raise CallSyntaxError(f"expected a JSON value at {i}, got {c!r}")
                i += 1
            if end is None and scalar and self.closed:
                end = i
            if end is not None:
                if emit:
                    emit(self.buf[self.pos : end])
                self.pos = end
                return self.buf[start:end]
            if self.closed:
                raise CallSyntaxError("the output ended inside a JSON value")
            if emit and i > self.pos:
                emit(self.buf[self.pos : i])
                self.pos = i
            yield


def _held(text: str, stops: tuple[str, ...], longest: int) -> int:
    """The length of the longest end of ``text`` that is the start of one of ``stops`` (held back)."""
    for n in range(min(len(text), longest - 1), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0


class Stream:
    """Drives one parse (``parse(reader)``, a generator) over an output fed in pieces."""

    def __init__(self, parse: Callable[[Reader], Iterator[None]]) -> None:
        self.reader = Reader()
        self._run: Iterator[None] | None = parse(self.reader)

    def feed(self, text: str) -> list[Piece]:
        """The pieces that ``text`` (the next part of the output) completes."""
        self.reader.buf += text
        return self._advance()

    def close(self) -> list[Piece]:
        """The last pieces, at the output's end; raises CallSyntaxError when a call is left unfinished."""
        self.reader.closed = True
        out = self._advance()
        if self._run is not None:
            raise CallSyntaxError("the output ended inside a tool call")
        return out

    def _advance(self) -> list[Piece]:
        if self._run is not None:
            try:
                next(self._run)
            except StopIteration:
                self._run = None
        out, self.reader.out = self.reader.out, []
        return out
