"""The prompt options every CLI command shares: a prompt (``-`` reads stdin), ``--chat`` and ``--system``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .spec import MessageLike


def prompt_input(args: argparse.Namespace) -> dict[str, Any]:
    """``prompt=`` or ``messages=`` keyword arguments from the parsed options."""
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not (args.chat or args.system):
        return {"prompt": prompt}
    messages: list[MessageLike] = [("system", args.system)] if args.system else []
    messages.append(("user", prompt))
    return {"messages": messages}
