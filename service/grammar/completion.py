"""The shortest valid completion of a JSON document, searched from a matcher's current state.

Budget-aware completion (``SamplingParams.json_finish``) needs, at any point of
a generation, a short token sequence that ends the document validly: close the
open string, give the required properties short valid values, close every
container. llguidance does not expose one, so ``Completer`` searches for it byte
by byte on a copy of the llguidance matcher (the grammar stays the judge of
every byte):

* bytes the grammar forces (``compute_ff_bytes``) are taken as they are;
* otherwise, outside a string, the first allowed byte of ``OUTSIDE_ORDER``: the
  closers, then ``,`` (a required property or ``minItems`` item still to come),
  then the shortest values (``0``, ``""``, ``[]``, ``{}``, ``null``, ...);
* at the first byte of an object key, the byte whose completion is shortest
  (one non-branching search for each of the first ``KEY_OPTIONS`` allowed bytes:
  the quote, then content bytes by rank, see below), so a required key wins over
  an optional one the schema lists first;
* inside a string, the closing quote (in an object key, only if the key is not
  already in its object: the search records the keys of the document and its
  own, and never repeats one, since llguidance's grammar would allow it); else
  the best-ranked allowed content byte (``a``, ``1``, ``A``, then the rest), repeated: first as many as dry runs
  say close the string (a long ``minLength`` in a few steps), else one by one
  (forced bytes between them, as in a uuid); a string still open
  after ``RUN_CAP`` such bytes is redone: as the first of the schema's
  pattern examples (``service.grammar.examples``) that the grammar takes
  whole, else with varied bytes (``_StringRun``), so a pattern such as
  ``[a-z]+@[a-z]+`` gets its ``@``.

The bytes are then tokenized by the model's tokenizer (far fewer tokens than
one per byte) and replayed on a copy of the matcher; should that tokenization
be refused, the one-byte tokens the search consumed are used instead. Bytes the
grammar forces that would close a key already present end that branch of the
search (no completion through it).

NOTE: this is a greedy search, not a proof of minimality: the completion found
is short (it never writes an optional property, an extra item or a longer value
than needed), and its length is what budget-aware completion reserves and then
forces, so "the shortest completion" in the service always means this one.
Each search is bounded by ``max_bytes``; a document it cannot close within that
bound has no completion (None), and the request then behaves as without
budget-aware completion.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import llguidance as llg
import numpy as np

from service.grammar.json_keys import JsonScan

QUOTE, BACKSLASH = 0x22, 0x5C
# Outside strings: close first, then continue a container, then the shortest values.
OUTSIDE_ORDER = b'}],0"[{ntf-123456789.eE+'
# Inside strings, after the closing quote: preferred content bytes (ties of least use).
CONTENT_FIRST = b"a1A0"
MAX_BYTES = 2048
RUN_CAP = 48  # string bytes written by repeating one byte before the search varies them
VARIED_CAP = 256  # string bytes written varied before the search gives up
KEY_OPTIONS = 16  # first bytes of an object key tried (each with a non-branching search of the rest)


def _content_rank() -> np.ndarray:
    """Rank of each byte as string content (lower is preferred); escapes and control bytes last."""
    rank = np.full(256, 1000, dtype=np.int64)
    for i, b in enumerate(CONTENT_FIRST):
        rank[b] = i
    for b in range(0x20, 0x7F):
        if rank[b] == 1000 and b not in (QUOTE, BACKSLASH):
            rank[b] = 10 + b
    for b in range(0x80, 0x100):
        rank[b] = 500 + b  # UTF-8 lead and continuation bytes: only when nothing ASCII fits
    rank[BACKSLASH] = 900
    return rank


CONTENT_RANK = _content_rank()


class ByteTokens:
    """The one-byte token of every byte value for a tokenizer (-1 where the vocabulary has none)."""

    def __init__(self, tokenizer: llg.LLTokenizer) -> None:
        ids = np.full(256, -1, dtype=np.int64)
        for b in range(256):
            toks = tokenizer.tokenize_bytes(bytes([b]))
            if len(toks) == 1 and tokenizer.decode_bytes(toks) == bytes([b]):
                ids[b] = toks[0]
        self.ids = ids
        self._valid = ids >= 0

    def allowed(self, mask: bytes) -> np.ndarray:
        """Which byte values a token bitmask (one bit per token, little-endian) allows as one-byte tokens."""
        bits = np.frombuffer(mask, dtype=np.uint8)
        ids = np.where(self._valid, self.ids, 0)
        ok = (bits[ids >> 3] >> (ids & 7)) & 1
        return (ok == 1) & self._valid


class Completer:
    """Finds short valid completions for the matchers of one tokenizer (any thread; no shared state)."""

    def __init__(self, tokenizer: llg.LLTokenizer, max_bytes: int = MAX_BYTES) -> None:
        self.tokenizer = tokenizer
        self.bytes = ByteTokens(tokenizer)
        self.max_bytes = max_bytes

    def complete(
        self, matcher: llg.LLMatcher, scan: JsonScan, limit: int, hints: Sequence[bytes] = ()
    ) -> list[int] | None:
        """Tokens that end the document from ``matcher``'s state (``scan``: the JSON written so far).

        ``hints`` are whole string contents to try where repeating one byte does
        not close a string (``service.grammar.examples``). Neither argument is
        changed. None when the search finds no completion within ``max_bytes``,
        or the one it finds is longer than ``limit`` tokens. The completion
        never writes an object key already present in its object (``scan``'s
        key sets, as ``JsonScan.feed`` records them).
        """
        work = matcher.deep_copy()
        data = self._search(work, scan.deep_copy(), min(self.max_bytes, 16 * max(limit, 1) + 64), hints)
        if data is None:
            return None
        tokens = self._tokenize(matcher, data)
        return tokens if len(tokens) <= limit else None

    def _search(
        self, m: llg.LLMatcher, scan: JsonScan, cap: int, hints: Sequence[bytes], branch: bool = True
    ) -> bytes | None:
        out = bytearray()
        run = _StringRun()
        run.track(scan, False, 0)  # a document cut inside a string: its rest is the current string
        while not m.is_accepting():
            if len(out) > cap or m.is_error() or run.hopeless(len(out)):
                return None
            if run.too_long(len(out)):  # the repeated byte makes no progress: redo this string
                if not m.rollback(len(out) - run.start):
                    return None
                del out[run.start :]
                scan = run.restart()
                hint = self._fitting_hint(m, hints)
                if hint is not None and not self._take(m, scan, hint, out, run):
                    return None
                continue
            forced = m.compute_ff_bytes()
            if forced:
                if not self._take(m, scan, forced, out, run):
                    return None
                continue
            allowed = self.bytes.allowed(m.compute_bitmask())
            if run.start == len(out) and not scan.is_key and not run.varied and not allowed[QUOTE]:
                whole = self._repeated_content(m, run.choose(allowed, scan), cap - len(out))
                if whole is not None:
                    if not self._take(m, scan, whole, out, run):
                        return None
                    continue
            b = self._best_key(m, scan, allowed, cap - len(out), hints) if branch and _key_start(scan) else None
            b = run.choose(allowed, scan) if b is None else b
            if b is None or not self._take(m, scan, bytes([b]), out, run):
                return None
        return bytes(out)

    def _repeated_content(self, m: llg.LLMatcher, b: int | None, cap: int) -> bytes | None:
        """At the start of a string's content: the fewest ``b`` bytes then the closing quote that the
        grammar takes (``minLength: 1200`` in a few dry runs), or None (the byte-by-byte search goes on).

        Dry runs (``validate_tokens``) of ``b * k + '"'`` for k = 1, 2, 4, ... until one is taken,
        then a bisection for a smaller k; it stops when ``b`` itself is refused after some bytes.
        """
        if b is None or b == QUOTE or self.bytes.ids[b] < 0:
            return None
        tb, tq = int(self.bytes.ids[b]), int(self.bytes.ids[QUOTE])

        def closes(k: int) -> int:  # k + 1: taken whole; k: the quote refused; fewer: b refused
            return int(m.validate_tokens([tb] * k + [tq]))

        lo, k = 0, 1
        while (taken := closes(k)) != k + 1:
            if taken < k or 2 * k > cap:
                return None
            lo, k = k, 2 * k
        while lo + 1 < k:
            mid = (lo + k) // 2
            lo, k = (lo, mid) if closes(mid) == mid + 1 else (mid, k)
        return bytes([b]) * k + b'"'

    def _best_key(
        self, m: llg.LLMatcher, scan: JsonScan, allowed: np.ndarray, cap: int, hints: Sequence[bytes]
    ) -> int | None:
        """At the first byte of an object key with several allowed: the one whose (non-branching)
        completion is shortest, so a required key wins over an optional one listed before it.
        The first ``KEY_OPTIONS`` allowed bytes are tried: the quote (an empty key), then content
        bytes by rank; of equally short completions, the first tried wins."""
        options = np.flatnonzero(allowed)
        if len(options) < 2:
            return None
        order = np.where(options == QUOTE, -1, CONTENT_RANK[options])  # "" (the empty key), a, 1, A, 0, ...
        options = options[np.argsort(order, kind="stable")]
        best: tuple[int, int] | None = None
        for b in options[:KEY_OPTIONS]:
            trial, trial_scan, data = m.deep_copy(), scan.deep_copy(), bytearray()
            if not self._take(trial, trial_scan, bytes([int(b)]), data, _StringRun()):
                continue
            rest = self._search(trial, trial_scan, cap, hints, branch=False)
            if rest is not None and (best is None or len(rest) < best[1]):  # ties: the first tried
                best = (int(b), len(rest))
        return None if best is None else best[0]

    def _fitting_hint(self, m: llg.LLMatcher, hints: Sequence[bytes]) -> bytes | None:
        """The first hint that the grammar takes as this whole string (with its closing quote)."""
        for hint in hints:
            data = hint + b'"'
            ids = [int(self.bytes.ids[b]) for b in data]
            if min(ids) >= 0 and m.validate_tokens(ids) == len(ids):
                return data
        return None

    def _take(self, m: llg.LLMatcher, scan: JsonScan, data: bytes, out: bytearray, run: _StringRun) -> bool:
        """Consume ``data`` byte by byte; False if the grammar refuses a byte or it would close an
        object key already present (the grammar allows that; the service never writes it)."""
        for b in data:
            t = int(self.bytes.ids[b])
            if t < 0 or (b == QUOTE and scan.quote_repeats_key()) or not m.consume_token(t):
                return False
            was_in = scan.in_string
            scan.feed(bytes([b]))
            out.append(b)
            run.track(scan, was_in, len(out))
        return True

    def _tokenize(self, matcher: llg.LLMatcher, data: bytes) -> list[int]:
        """The model's tokenization of ``data`` if the grammar takes it to an accepting state, else one token per byte."""
        if not data:
            return []
        tokens = list(self.tokenizer.tokenize_bytes(data))
        trial = matcher.deep_copy()
        if trial.consume_tokens(tokens) and trial.is_accepting():
            return tokens
        return [int(self.bytes.ids[b]) for b in data]


def _key_start(scan: JsonScan) -> bool:
    """The next byte is the first of an object key."""
    return scan.in_string and scan.is_key and not scan.buf


class _StringRun:
    """How the search writes the content of the string it is in.

    First the best-ranked allowed byte over and over (``aaaaa`` for a
    ``minLength``, ``aaaaaaaa-aaaa-...`` for a uuid: few tokens); if the string
    is still open after ``RUN_CAP`` bytes, the search goes back to the string's
    start and varies the bytes instead: each time the allowed byte of the least
    used class (lower, upper, digit, or the byte itself), so a pattern such as
    ``[a-z]+@[a-z]+\\.com`` gets its ``@`` and ``.``.
    """

    def __init__(self) -> None:
        self.start = -1  # position in the completion where the current string's content starts
        self.varied = False
        self.saved: JsonScan | None = None
        self.uses: Counter[int] = Counter()

    def track(self, scan: JsonScan, was_in: bool, pos: int) -> None:
        """After each byte (and once at the start): a string was opened (content from ``pos`` on) or closed."""
        if scan.in_string and not was_in:
            self.start, self.varied, self.saved = pos, False, scan.deep_copy()
            self.uses.clear()
        elif was_in and not scan.in_string:
            self.start, self.varied, self.saved = -1, False, None

    def too_long(self, pos: int) -> bool:
        return self.start >= 0 and not self.varied and pos - self.start > RUN_CAP

    def hopeless(self, pos: int) -> bool:
        """Varied bytes did not close the string either."""
        return self.start >= 0 and self.varied and pos - self.start > VARIED_CAP

    def restart(self) -> JsonScan:
        assert self.saved is not None
        self.varied = True
        self.uses.clear()
        return self.saved.deep_copy()

    def choose(self, allowed: np.ndarray, scan: JsonScan) -> int | None:
        """The next byte: see the module docstring for the order."""
        if scan.in_string:
            if allowed[QUOTE] and not scan.quote_repeats_key():
                return QUOTE
            options = np.flatnonzero(allowed)
            options = options[options != QUOTE]  # a quote here would repeat a key
            if not len(options):
                return None
            if not self.varied:
                return int(options[np.argmin(CONTENT_RANK[options])])
            b = int(min(options, key=lambda o: (self.uses[_class(int(o))], CONTENT_RANK[o])))
            self.uses[_class(b)] += 1
            return b
        for b in OUTSIDE_ORDER:
            if allowed[b]:
                return b
        options = np.flatnonzero(allowed)
        return int(options[0]) if len(options) else None


def _class(b: int) -> int:
    """Content byte classes for varied strings: lower letters, upper letters, digits; else the byte."""
    if 0x61 <= b <= 0x7A:
        return -1
    if 0x41 <= b <= 0x5A:
        return -2
    if 0x30 <= b <= 0x39:
        return -3
    return b


def scan_of(token_bytes: Sequence[bytes]) -> JsonScan:
    """A JSON scan that has read ``token_bytes`` (the document so far)."""
    scan = JsonScan()
    for data in token_bytes:
        scan.feed(data)
    return scan
