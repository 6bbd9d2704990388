"""``inference-client generate`` output for several choices, log-probabilities and tool calls."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from .events import Result, TokenLogprob
from .tools import ToolCall


def call_line(call: ToolCall) -> str:
    """A tool call as one JSON line: ``{"tool_call": {"id", "name", "arguments"}}`` (arguments parsed)."""
    return json.dumps({"tool_call": {"id": call.id, "name": call.name, "arguments": call.args}}, ensure_ascii=False)


def _piece(token: bytes) -> str:
    return repr(token.decode("utf-8", "replace"))


def logprob_lines(entries: list[TokenLogprob]) -> list[str]:
    """One tab-separated line per token: its text, its logprob, then the alternatives (``text:logprob``)."""
    lines = []
    for e in entries:
        alts = "  ".join(f"{_piece(t)}:{lp:.3f}" for _, t, lp in e.top)
        lines.append(f"{_piece(e.token)}\t{e.logprob:.4f}\t{alts}")
    return lines


def print_result(result: Result, out: TextIO = sys.stdout) -> None:
    """Each choice's text (with a header when there are several), then logprob tables."""
    if result.prompt_logprobs:
        total = sum(e.logprob for e in result.prompt_logprobs)
        print(f"--- prompt log-probabilities (sum {total:.4f}) ---", file=out)
        print("\n".join(logprob_lines(result.prompt_logprobs)), file=out)
    several = len(result.choices) > 1
    for i in sorted(result.choices):
        if several:
            print(f"--- choice {i} ---", file=out)
        print(result.choices[i], file=out)
        done = result.dones.get(i)
        for call in done.tool_calls if done is not None else ():
            print(call_line(call), file=out)
    if result.logprobs:
        total = sum(e.logprob for e in result.logprobs)
        print(f"--- log-probabilities of choice 0 (sum {total:.4f}) ---", file=out)
        print("\n".join(logprob_lines(result.logprobs)), file=out)
