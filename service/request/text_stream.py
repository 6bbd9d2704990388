"""Incremental detokenization with UTF-8 safety and stop strings.

Tokens arrive as raw byte pieces. ``TextStream.push`` returns only text that is
final:

* bytes of a multi-byte UTF-8 character split across tokens are held until the
  character is complete, so a delta never contains a broken character;
* text that could still become the start of a stop string is held back, so a
  stop string never leaks into the output (the text before it is released).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Turns byte pieces into safe text deltas for one request."""

    def __init__(self, token_bytes: Sequence[bytes], stop: tuple[str, ...] = ()) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self._pending = ""  # decoded text not yet released (stop-string lookahead)
        self.emitted = ""  # all text released so far
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became final (may be empty).

        After a stop string is found, ``stopped`` is True and further pushes
        return nothing.
        """
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(self._token_bytes[token_id])
        return self._release(final=False)

    def flush(self) -> str:
        """Release everything held back (end of generation)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        text = self._pending
        if self._stop:
            # NOTE: search from just before the new text so a stop string spanning
            # earlier released text cannot be missed: released text never ends with
            # a proper prefix of a stop string (that part is always held back).
            cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                self._pending = ""
                self.emitted += text[:cut]
                return text[:cut]
            keep = 0 if final else self._holdback(text)
        else:
            keep = 0
        out, self._pending = text[: len(text) - keep], text[len(text) - keep :]
        self.emitted += out
        return out

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a prefix of a stop string."""
        for n in range(min(len(text), self._max_stop - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stop):
                return n
        return 0
