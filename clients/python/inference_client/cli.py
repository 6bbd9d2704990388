"""``inference-client``: command-line access to the inference service.

Commands::

    inference-client generate PROMPT [sampling options] [--chat] [--priority batch] [--thinking-budget N]
                              [--tools FILE [--tool-choice CHOICE] [--no-parallel-tool-calls]]
    inference-client json --schema FILE PROMPT [--close | --cut-off] [--raw] [--repeat-penalty X] [--thinking-budget N]
    inference-client metrics [--json]
    inference-client health [--service NAME]
    inference-client tokenize TEXT [--chat] [--ids|--json]   (and detokenize, count, info: cli_model.py)
    inference-client batch submit|status|results|cancel|list ...   (batch jobs: batch_cli.py)

Global options: ``--target`` (default ``$INFERENCE_TARGET`` or localhost:50051),
``--timeout`` seconds, ``--retries`` attempts; TLS with ``--tls-ca`` (and
``--tls-cert``/``--tls-key`` for mTLS), a bearer token with ``--token`` (default
``$INFERENCE_TOKEN``; see docs/security.md). A PROMPT of ``-`` is read from stdin.

Exit status: 0 on success; 1 when ``health`` finds the server not SERVING;
2 on any error, reported on stderr as ``error: <STATUS_NAME>: <message>``;
130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from inference.v1 import inference_pb2 as pb

from .batch_cli import COMMANDS as BATCH_COMMANDS
from .batch_cli import add_commands as add_batch_commands
from .cli_input import add_tool_options, prompt_input, tool_input
from .cli_logprobs import call_line, print_result
from .cli_model import COMMANDS as MODEL_COMMANDS
from .cli_model import add_commands as add_model_commands
from .client import DEFAULT_TARGET, InferenceClient
from .errors import InferenceError
from .events import Delta, Done
from .metrics import format_metrics, metrics_to_dict
from .retry import RetryPolicy
from .security import TOKEN_ENV, secure_credentials

EXIT_NOT_SERVING = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="prompt text, or - to read it from stdin")
    p.add_argument("--chat", action="store_true", help="send the prompt as a single user chat message")
    p.add_argument("--system", help="system message (implies --chat)")
    p.add_argument("--priority", choices=("interactive", "batch"), help="scheduling tier")
    p.add_argument("--max-tokens", type=int, help="maximum generated tokens")
    p.add_argument("--temperature", type=float, help="softmax temperature; 0 = greedy")
    p.add_argument("--top-p", type=float, help="nucleus sampling mass")
    p.add_argument("--top-k", type=int, help="keep the k most likely tokens; 0 disables")
    p.add_argument("--min-p", type=float, help="drop tokens below min-p times the top probability")
    p.add_argument("--seed", type=int, help="random seed (reproducible output)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation")
    p.add_argument("-n", type=int, dest="n", help="independent choices for the prompt (1-16; generate only)")
    p.add_argument("--logprobs", action="store_true", help="print each token's log-probability")
    p.add_argument("--top-logprobs", type=int, help="... and this many alternatives per token (0-20)")
    p.add_argument(
        "--echo-prompt-logprobs", action="store_true", help="print the prompt tokens' log-probabilities"
    )
    p.add_argument("--frequency-penalty", type=float, help="OpenAI frequency penalty, -2..2")
    p.add_argument("--presence-penalty", type=float, help="OpenAI presence penalty, -2..2")
    p.add_argument("--repetition-penalty", type=float, help="llama.cpp repeat penalty over the last 64 tokens")
    p.add_argument("--thinking-budget", type=int, metavar="N", dest="thinking_budget_tokens",
                   help="a reasoning model's chat: at most N tokens of thought (0 = off); the thought goes to stderr")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``inference-client``."""
    parser = argparse.ArgumentParser(prog="inference-client", description="Client of inference.v1.")
    parser.add_argument(
        "--target",
        default=os.environ.get("INFERENCE_TARGET", DEFAULT_TARGET),
        help="server host:port (default: $INFERENCE_TARGET or %(default)s)",
    )
    parser.add_argument("--timeout", type=float, help="deadline of the call in seconds (default: none)")
    parser.add_argument("--retries", type=int, default=4, help="attempts on UNAVAILABLE/RESOURCE_EXHAUSTED")
    parser.add_argument("--tls-ca", metavar="FILE", help="use TLS, trusting this CA bundle (PEM)")
    parser.add_argument("--tls-cert", metavar="FILE", help="client certificate for mTLS (PEM; implies TLS)")
    parser.add_argument("--tls-key", metavar="FILE", help="key of --tls-cert (PEM)")
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token (default: ${TOKEN_ENV}); never printed",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a generation to stdout")
    _add_sampling(gen)
    fmt = gen.add_mutually_exclusive_group()
    fmt.add_argument("--json-schema", metavar="FILE", help="constrain the output to this JSON Schema")
    fmt.add_argument("--regex", help="constrain the output to this regular expression")
    add_tool_options(gen)

    js = sub.add_parser("json", help="generate one JSON document valid against a schema")
    js.add_argument("--schema", required=True, metavar="FILE", help="JSON Schema file")
    js.add_argument("--compact", action="store_true", help="print the document on one line")
    js.add_argument("--raw", action="store_true", help="send the prompt as it is (default: as one chat turn)")
    finish = js.add_mutually_exclusive_group()
    finish.add_argument(
        "--close", action="store_true",
        help="close the document within --max-tokens (budget-aware completion; the server's default)",
    )
    finish.add_argument(
        "--cut-off", action="store_true", help="cut the document off at --max-tokens instead (an OUT_OF_RANGE error)"
    )
    js.add_argument("--repeat-penalty", type=float, help="repetition control inside the document (0 = off)")
    _add_sampling(js)

    met = sub.add_parser("metrics", help="print the engine metrics")
    met.add_argument("--json", action="store_true", help="print all fields as JSON")

    health = sub.add_parser("health", help="print the health status (exit 0 if SERVING)")
    health.add_argument("--service", default="", help='service name ("" = the whole server)')
    add_model_commands(sub)
    add_batch_commands(sub)
    return parser


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "priority",
        "top_logprobs",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "thinking_budget_tokens",
    )
    options = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    for flag in ("logprobs", "echo_prompt_logprobs"):
        if getattr(args, flag):
            options[flag] = True
    if args.stop:
        options["stop"] = args.stop
    if args.ignore_eos:
        options["ignore_eos"] = True
    return options


def _read_schema(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    json.loads(text)  # fail early, with a clear message, on a malformed schema file
    return text


def summary_line(done: Done) -> str:
    """One line of usage and timing for stderr."""
    u, t = done.usage, done.timing
    decode_s = (t.total_ms - t.ttft_ms) / 1000.0
    rate = (u.completion_tokens - 1) / decode_s if u.completion_tokens > 1 and decode_s > 0 else 0.0
    return (
        f"[finish={done.finish_reason} prompt={u.prompt_tokens} cached={u.cached_tokens} "
        f"completion={u.completion_tokens} queue={t.queue_ms:.1f}ms ttft={t.ttft_ms:.1f}ms "
        f"total={t.total_ms:.1f}ms decode={rate:.1f}tok/s preemptions={done.preemptions}"
        f"{f' reasoning={u.reasoning_tokens}' if u.reasoning_tokens else ''}]"
    )


def cmd_generate(client: InferenceClient, args: argparse.Namespace) -> int:
    """Stream deltas to stdout as they arrive; summary to stderr."""
    options: dict[str, Any] = _sampling(args)
    if args.json_schema:
        options["json_schema"] = _read_schema(args.json_schema)
    if args.regex:
        options["regex"] = args.regex
    if args.n is not None:
        options["n"] = args.n
    options.update(tool_input(args))
    if (args.n or 1) > 1 or args.logprobs or args.echo_prompt_logprobs:
        with client.generate(**prompt_input(args), **options) as generation:
            result = generation.result()
        print_result(result)
        if result.done is not None:
            print(summary_line(result.done), file=sys.stderr)
        return 0
    with client.generate(**prompt_input(args), **options) as generation:
        for event in generation:
            if isinstance(event, Delta):
                if event.reasoning:  # NOTE: a reasoning model's thought: stderr, so stdout is the answer alone
                    sys.stderr.write(event.reasoning)
                    sys.stderr.flush()
                sys.stdout.write(event.text)
                for call in event.tool_calls:  # NOTE: one JSON line per call, once it is complete
                    sys.stdout.write(("\n" if event.text else "") + call_line(call) + "\n")
                sys.stdout.flush()
        if sys.stdout.isatty():
            sys.stdout.write("\n")
    if generation.done is not None:
        print(summary_line(generation.done), file=sys.stderr)
    return 0


def cmd_json(client: InferenceClient, args: argparse.Namespace) -> int:
    """Print the generated JSON document."""
    options = _sampling(args)
    if args.raw:
        options["raw_prompt"] = True
    if args.close or args.cut_off:
        options["json_finish"] = "close_within_budget" if args.close else "cut_off"
    if args.repeat_penalty is not None:
        options["json_repeat_penalty"] = args.repeat_penalty
    resp = client.generate_json_response(_read_schema(args.schema), **prompt_input(args), **options)
    if resp.reasoning:  # NOTE: a reasoning model's thought: stderr, so stdout is the document alone
        print(resp.reasoning, file=sys.stderr)
    doc = json.loads(resp.json)
    print(json.dumps(doc, separators=(",", ":")) if args.compact else json.dumps(doc, indent=2))
    t, u = resp.timing, resp.usage
    closed = " closed-early" if resp.finish_reason == pb.FINISH_REASON_CLOSED else ""
    print(
        f"[prompt={u.prompt_tokens} completion={u.completion_tokens}{closed} "
        f"ttft={t.ttft_ms:.1f}ms total={t.total_ms:.1f}ms{f' reasoning={u.reasoning_tokens}' if u.reasoning_tokens else ''}]",
        file=sys.stderr,
    )
    return 0


def cmd_metrics(client: InferenceClient, args: argparse.Namespace) -> int:
    """Print the metrics table (or JSON)."""
    snapshot = client.metrics()
    print(json.dumps(metrics_to_dict(snapshot), indent=2) if args.json else format_metrics(snapshot))
    return 0


def cmd_health(client: InferenceClient, args: argparse.Namespace) -> int:
    """Print the health status; exit 0 only if SERVING."""
    status = client.health(args.service)
    print(status)
    return 0 if status == "SERVING" else EXIT_NOT_SERVING


_COMMANDS = {"generate": cmd_generate, "json": cmd_json, "metrics": cmd_metrics, "health": cmd_health}
_COMMANDS.update(MODEL_COMMANDS)
_COMMANDS.update(BATCH_COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (errors are reported, never raised)."""
    args = build_parser().parse_args(argv)
    retry = RetryPolicy(max_attempts=max(1, args.retries))
    try:
        creds = None
        if args.tls_ca or args.tls_cert or args.tls_key:
            creds = secure_credentials(args.tls_ca, args.tls_cert, args.tls_key)
        with InferenceClient(
            args.target, timeout=args.timeout, retry=retry, credentials=creds, token=args.token
        ) as client:
            return _COMMANDS[args.command](client, args)
    except InferenceError as exc:
        print(f"error: {exc.status}: {exc.message}", file=sys.stderr)
    except (OSError, ValueError) as exc:  # schema file unreadable or malformed, bad option values
        print(f"error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
