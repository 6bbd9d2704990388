"""Reasoning markers: which families think, in which markers, and whether a prompt leaves the thought open.

A reasoning model writes its thought between two markers before its answer
(``<think>...</think>``). ``detect(source)`` is the first row of ``MARKERS``
whose markers both occur in the chat template's source, the more specific first
(Seed-OSS's ``<seed:think>`` holds ``think>``).

gpt-oss's harmony (``Channels``) writes messages on channels after the
generation prompt's ``<|start|>assistant``: the thought is the analysis
channel's message (``<|channel|>analysis<|message|>...<|end|>``), after which
the model starts another message (``<|start|>assistant``), which is then where a
prompt leaves generation: the final channel's answer, whose header
(``<|channel|>final<|message|>``) is dropped from the answer and written by the
answer's grammar (``answer_open``), or a call (``service.chat.harmony``).

A family whose text answers start with a header but which does not think
(Functionary v3.2's ``all\\n``: ``Family.answer_open``) reads and writes that
header through the same row as harmony's final channel: a ``Header`` row (no
thought markers, never in ``MARKERS``), whose output is always the answer.

``NOTE:`` rows the table leaves out, and why: Gemma 4's ``<|channel>thought``
(not a built family here); Apriel's ``[BEGIN FINAL RESPONSE]`` has no opening
marker; Command R7B's ``<|START_THINKING|>`` is a plan before its calls, which
its call syntax reads.

Whether generation starts inside a thought depends on the rendered prompt, not
on the template alone: DeepSeek R1's and QwQ's generation prompts end with
``<think>\\n`` (the model writes the thought and then ``</think>``), Qwen3 with
``enable_thinking: false`` and SmolLM3 without ``/think`` write an empty
``<think>\\n\\n</think>`` (no thought follows), others leave it to the model to
open one. ``Thinking.start(prompt_tail)`` reads that from the text a render
ends with.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Start(enum.Enum):
    """Where a generation starts, as the rendered prompt leaves it."""

    INSIDE = "inside"  # the prompt opened the thought: the output is thought up to the end marker
    CLOSED = "closed"  # the prompt wrote an (empty) thought: the output is the answer
    MAYBE = "maybe"  # the output may open a thought with the start marker, at its very start


@dataclass(frozen=True)
class Thinking:
    """One row of ``MARKERS``: a family's thought markers (see the module doc)."""

    name: str
    open: str
    close: str
    notes: str = ""
    answer_open: str = ""  # the header a free answer starts with (dropped by the reader, written by the grammar)
    answer_close: str = ""  # where such an answer ends (the rest of the output is neither thought nor answer)

    def markers(self) -> list[str]:
        """Every marker of the row (for the vocabulary's special tokens)."""
        return [m for m in (self.open, self.close, self.answer_open, self.answer_close) if m]

    def matches(self, source: str) -> bool:
        return self.open in source and self.close in source

    def start(self, tail: str) -> Start:
        """Where generation starts after a prompt ending with ``tail`` (the prompt after the last caller text):
        INSIDE when its last marker is an open one, CLOSED when a close one, MAYBE when it has none."""
        opened, closed = tail.rfind(self.open), tail.rfind(self.close)
        if opened < 0 and closed < 0:
            return Start.MAYBE
        return Start.INSIDE if opened > closed else Start.CLOSED


@dataclass(frozen=True)
class Channels(Thinking):
    """Harmony's channels (see the module doc): found by its analysis and final headers; a generation prompt
    never opens or closes the thought, so the output may always open one (MAYBE)."""

    def matches(self, source: str) -> bool:
        return self.open in source and self.answer_open in source

    def start(self, tail: str) -> Start:
        return Start.MAYBE


@dataclass(frozen=True)
class Header(Thinking):
    """A family's answer header with no thought (see the module doc): never detected from a template (the
    family's own row gives it), and the output is always the answer (CLOSED)."""

    open: str = ""
    close: str = ""

    def matches(self, source: str) -> bool:
        return False

    def start(self, tail: str) -> Start:
        return Start.CLOSED


MARKERS: tuple[Thinking, ...] = (
    Channels("harmony", "<|channel|>analysis<|message|>", "<|end|><|start|>assistant", "gpt-oss",
             answer_open="<|channel|>final<|message|>", answer_close="<|end|>"),
    Thinking("seed-oss", "<seed:think>", "</seed:think>", "Seed-OSS"),
    Thinking("mistral-think", "[THINK]", "[/THINK]", "Ministral 3 Reasoning, Magistral"),
    Thinking("think", "<think>", "</think>",
             "DeepSeek R1 and its distills, V3.1+, Qwen3, QwQ, SmolLM3, GLM 4.5+, Kimi K2 Thinking, MiniMax M2, "
             "Granite 3.3 (its answer then in <response>), Nemotron, ..."),
)


def detect(source: str | None) -> Thinking | None:
    """The reasoning markers of a chat template's source (None: the model does not reason in markers)."""
    if source:
        for row in MARKERS:
            if row.matches(source):
                return row
    return None
