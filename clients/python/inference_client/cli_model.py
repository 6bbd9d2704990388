"""``inference-client`` commands about the model: ``tokenize``, ``detokenize``, ``count`` and ``info``.

::

    inference-client tokenize TEXT [--chat] [--system S] [--add-special|--no-add-special]
                                   [--parse-special|--no-parse-special] [--ids | --json]
    inference-client detokenize ID [ID ...] [--render-special]
    inference-client count TEXT [--chat] [--system S]     # prints the count; context on stderr
    inference-client info [--json]

Unset flags take the server's defaults, which are Generate's: a raw prompt
gets the model's BOS and no special-token parsing; chat messages are rendered
with the model's template and their special tokens parsed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .cli_input import add_tool_options, prompt_input, tool_input
from .client import InferenceClient
from .model_calls import format_model_info, format_tokens, model_info_to_dict


def _add_text(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="text, or - to read it from stdin")
    p.add_argument("--chat", action="store_true", help="the text is a single user chat message")
    p.add_argument("--system", help="system message (implies --chat)")
    p.add_argument(
        "--add-special",
        action=argparse.BooleanOptionalAction,
        help="add the model's special tokens (BOS); default: as Generate does",
    )
    p.add_argument(
        "--parse-special",
        action=argparse.BooleanOptionalAction,
        help="parse special-token text such as <|im_start|>; default: as Generate does",
    )
    add_tool_options(p, choice_only=True)


def add_commands(sub: Any) -> None:
    """Add the model commands to ``inference-client``'s subparsers."""
    tok = sub.add_parser("tokenize", help="print the token ids and pieces of a prompt")
    _add_text(tok)
    out = tok.add_mutually_exclusive_group()
    out.add_argument("--ids", action="store_true", help="print only the ids, space-separated")
    out.add_argument("--json", action="store_true", help="print the response as JSON")

    detok = sub.add_parser("detokenize", help="print the text of token ids")
    detok.add_argument("token_ids", nargs="+", type=int, metavar="ID", help="token id")
    detok.add_argument("--render-special", action="store_true", help="render BOS, EOS, chat markers as text")

    count = sub.add_parser("count", help="print the number of tokens Generate would prefill for a prompt")
    _add_text(count)

    info = sub.add_parser("info", help="describe the served model, its limits and request options")
    info.add_argument("--json", action="store_true", help="print every field as JSON")


def _text_input(args: argparse.Namespace) -> dict[str, Any]:
    given = prompt_input(args)
    flags = {"add_special": args.add_special, "parse_special": args.parse_special}
    return {"text": given.get("prompt"), "messages": given.get("messages"), **flags, **tool_input(args)}


def cmd_tokenize(client: InferenceClient, args: argparse.Namespace) -> int:
    """Token ids and pieces (one per line), ids only, or JSON; the count on stderr."""
    resp = client.tokenize(**_text_input(args))
    if args.json:
        fields = {"token_ids": list(resp.token_ids), "pieces": [p.decode("utf-8", "replace") for p in resp.pieces]}
        print(json.dumps({**fields, "prompt": resp.prompt}, ensure_ascii=False, indent=2))
    elif args.ids:
        print(" ".join(str(t) for t in resp.token_ids))
    else:
        print(format_tokens(resp))
    print(f"[tokens={len(resp.token_ids)}]", file=sys.stderr)
    return 0


def cmd_detokenize(client: InferenceClient, args: argparse.Namespace) -> int:
    """The text of the ids, exactly (no newline added)."""
    sys.stdout.write(client.detokenize(args.token_ids, render_special=args.render_special).text)
    if sys.stdout.isatty():
        sys.stdout.write("\n")
    return 0


def cmd_count(client: InferenceClient, args: argparse.Namespace) -> int:
    """The token count on stdout; context size and room left on stderr."""
    resp = client.count_tokens(**_text_input(args))
    print(resp.count)
    print(f"[context={resp.context_size} max_new_tokens={resp.max_new_tokens}]", file=sys.stderr)
    return 0


def cmd_info(client: InferenceClient, args: argparse.Namespace) -> int:
    """The model info table (or every field as JSON)."""
    info = client.model_info()
    print(json.dumps(model_info_to_dict(info), indent=2) if args.json else format_model_info(info))
    return 0


COMMANDS = {"tokenize": cmd_tokenize, "detokenize": cmd_detokenize, "count": cmd_count, "info": cmd_info}
