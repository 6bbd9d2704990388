"""``inference-client batch ...``: batch jobs from the command line.

Commands::

    inference-client batch submit input.jsonl [--wait] [--name N] [--window-hours H] [--priority P]
    inference-client batch status ID [--once]      # live progress bar until the job ends
    inference-client batch results ID [--order completion] [--cursor C] > out.jsonl
    inference-client batch cancel ID
    inference-client batch list [--page-size N]

``input.jsonl`` is OpenAI batch-input JSONL (``custom_id`` and ``body`` with
``prompt`` or ``messages``, ``max_tokens``, ``temperature``, ``response_format``)
or simple lines (``custom_id`` plus those fields at the top level). ``-`` reads stdin.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from inference.v1 import batch_pb2 as bpb

from .batch import batch_to_dict, read_jsonl, result_to_dict


def add_commands(sub: Any) -> None:
    """Add the ``batch`` command and its subcommands to the CLI's subparsers."""
    batch = sub.add_parser("batch", help="durable batch jobs (submit, status, results, cancel, list)")
    cmds = batch.add_subparsers(dest="batch_command", required=True)
    submit = cmds.add_parser("submit", help="upload a JSONL file of requests as a job; prints its id")
    submit.add_argument("file", help="JSONL input (OpenAI batch format accepted), - for stdin")
    submit.add_argument("--name", default="", help="display name")
    submit.add_argument("--window-hours", type=float, default=24.0, help="completion window (default 24)")
    submit.add_argument("--priority", choices=("batch", "interactive"), default="batch", help="job class")
    submit.add_argument("--idempotency-key", help="a retried submit with this key returns the first job")
    submit.add_argument("--wait", action="store_true", help="then show progress until the job ends")
    status = cmds.add_parser("status", help="show a job's progress (live bar until it ends)")
    status.add_argument("id")
    status.add_argument("--once", action="store_true", help="print the job's state once, as JSON")
    results = cmds.add_parser("results", help="print the job's results as JSONL")
    results.add_argument("id")
    results.add_argument("--order", choices=("custom_id", "completion"), default="custom_id")
    results.add_argument("--cursor", default="", help="resume after this cursor")
    cancel = cmds.add_parser("cancel", help="cancel a job (finished results are kept)")
    cancel.add_argument("id")
    listing = cmds.add_parser("list", help="list your jobs, newest first")
    listing.add_argument("--page-size", type=int, default=20)
    listing.add_argument("--page-token", default="")


def _state(b: bpb.Batch) -> str:
    return bpb.BatchState.Name(b.state).removeprefix("BATCH_STATE_")


def summary(b: bpb.Batch) -> str:
    c = b.counts
    return (
        f"{b.id} {_state(b)}: {c.completed} completed, {c.failed} failed, {c.cancelled} cancelled "
        f"of {c.total}; {b.usage.prompt_tokens} prompt + {b.usage.completion_tokens} completion tokens"
    )


def _progress(client: Any, batch_id: str) -> bpb.Batch:
    """A tqdm bar on stderr until the job is final."""
    from tqdm import tqdm

    with tqdm(unit="item", file=sys.stderr, dynamic_ncols=True) as bar:

        def update(ev: bpb.WatchBatchResponse) -> None:
            c = ev.batch.counts
            bar.total = c.total
            bar.n = c.completed + c.failed + c.cancelled
            bar.set_description(_state(ev.batch))
            bar.set_postfix(running=c.running, failed=c.failed, refresh=False)
            bar.refresh()

        return client.batches.wait(batch_id, update)


def cmd_batch(client: Any, args: argparse.Namespace) -> int:
    """Run one ``batch`` subcommand; errors propagate to the CLI's handler."""
    api = client.batches
    what = args.batch_command
    if what == "submit":
        stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
        with stream:
            items = list(read_jsonl(stream))
        b = api.submit(items, display_name=args.name, completion_window_s=int(args.window_hours * 3600),
                       priority=args.priority, idempotency_key=args.idempotency_key)
        print(b.id)
        for e in b.errors:
            print(f"line {e.line} ({e.custom_id!r}): {e.status}: {e.message}", file=sys.stderr)
        if args.wait:
            print(summary(_progress(client, b.id)), file=sys.stderr)
    elif what == "status":
        if args.once:
            print(json.dumps(batch_to_dict(api.get(args.id)), indent=2))
        else:
            print(summary(_progress(client, args.id)))
    elif what == "results":
        for r in api.results(args.id, order=args.order, cursor=args.cursor):
            print(json.dumps(result_to_dict(r), ensure_ascii=False))
    elif what == "cancel":
        print(summary(api.cancel(args.id)))
    else:
        page = api.list(args.page_size, args.page_token)
        for b in page.batches:
            print(f"{summary(b)}  {b.options.display_name}".rstrip())
        if page.next_page_token:
            print(f"next page: --page-token {page.next_page_token}", file=sys.stderr)
    return 0


COMMANDS = {"batch": cmd_batch}
