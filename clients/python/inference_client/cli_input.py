"""The prompt options every CLI command shares: a prompt (``-`` reads stdin), ``--chat``, ``--system``, and
the tools options (``--tools FILE``, ``--tool-choice``, ``--no-parallel-tool-calls``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .spec import MessageLike


def add_tool_options(p: argparse.ArgumentParser, choice_only: bool = False) -> None:
    """``--tools FILE`` (a JSON list of tools; implies --chat) and ``--tool-choice``; with ``choice_only``
    False also ``--no-parallel-tool-calls``."""
    p.add_argument("--tools", metavar="FILE", help="JSON list of tools the model may call (implies --chat)")
    p.add_argument("--tool-choice", metavar="CHOICE",
                   help="auto (default), required, none, or a function's name (one call of it)")
    if not choice_only:
        p.add_argument("--no-parallel-tool-calls", action="store_true", help="at most one call per answer")


def tool_input(args: argparse.Namespace) -> dict[str, Any]:
    """``tools=``, ``tool_choice=`` (and ``parallel_tool_calls=``) keyword arguments from the options."""
    out: dict[str, Any] = {}
    if getattr(args, "tools", None):
        with open(args.tools, encoding="utf-8") as f:
            tools = json.load(f)
        if not isinstance(tools, list):
            raise ValueError(f"{args.tools}: a JSON list of tools is expected")
        out["tools"] = tools
    if getattr(args, "tool_choice", None):
        out["tool_choice"] = args.tool_choice
    if getattr(args, "no_parallel_tool_calls", False):
        out["parallel_tool_calls"] = False
    return out


def prompt_input(args: argparse.Namespace) -> dict[str, Any]:
    """``prompt=`` or ``messages=`` keyword arguments from the parsed options."""
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not (args.chat or args.system or getattr(args, "tools", None)):
        return {"prompt": prompt}
    messages: list[MessageLike] = [("system", args.system)] if args.system else []
    messages.append(("user", prompt))
    return {"messages": messages}
