"""Scenario R — tool calling vs llama.cpp's ``llama-server --jinja`` on the same GGUF (issue #36's benchmark).

``python -m bench.run --only R`` (or ``bench.studies.tool_calls``, which can run some parts only).
Targets: 100% of returned calls parse and validate, streamed calls equal the unstreamed ones in
100% of answers with calls, the auto-mode grammar's overhead per token <= 3%. It runs on the
default model and the 1.1B shape whatever ``--model`` says.

What: the fixed conversations of ``bench.harness.tool_conversations`` (single calls, parallel calls,
multi-turn with a tool result, irrelevant tools whose answer should be text), ``tool_choice: "auto"``,
greedy, each sent unstreamed and then streamed to this server's Chat Completions route and to
``llama-server --jinja`` (``make llama-tools``), both serving the same GGUF, both up for the whole
run, after one unmeasured warm-up answer each (the first grammar compile), the arms' order
alternating conversation by conversation (the machine's load recorded before each arm). Per server:
answers with calls, calls that parse, calls that validate against their function's schema
(``jsonschema``), answers whose streamed calls (names, arguments concatenated from their deltas) equal
the unstreamed ones, and the time per unstreamed answer (p50, p99).

Models: the default model and the 1.1B shape (``make bench-model-1b``), each given a tool-capable
chat template for the run: a derived GGUF in a temporary directory (deleted afterwards, never
committed) whose ``tokenizer.chat_template`` is Qwen 2.5's vendored template (``.chat-templates/``,
``make templates``), written by the gguf package's own ``gguf_new_metadata``. Both models share the
default model's tokenizer, whose ``<|im_start|>``/``<|im_end|>`` that template uses. Part
"default-own" serves the default model as shipped (its own template renders no tools: this
server's generic family, llama-server's generic JSON format). Part "default-required" sends the
same conversations to the default model with Qwen 2.5's template and ``tool_choice: "required"``:
these models seldom call a tool on their own, so "auto" compares no calls; forced, both servers
write calls, and their parse and validate rates compare.

Also (``grammar_cost``, this server only, the default model as shipped): the auto-mode tool
grammar's decode cost per token. Arm "tools": a chat with the tools and ``tool_choice: "auto"``;
arm "plain": the same prompt tokens (``/v1/chat/completions/render``) sent to ``/v1/completions``
without a grammar; both greedy, ``ignore_eos``, the same number of tokens, streamed. Per request
(total - first token) / (tokens - 1); arms alternate within each round; the result is each arm's
median and the median of the rounds' paired ratios.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx  # NOTE: the test client of requirements.lock (httpx is bench-env only)

from bench.harness.config import PYTHON, ROOT, BenchConfig
from bench.harness.procs import GrpcServer, LlamaServer, free_port, llama_server_binary
from bench.harness.results import load_now
from bench.harness.stats import pct
from bench.harness.tables import fmt, table, verdict
from bench.harness.tool_conversations import TOOLS, Conversation, conversations, score_chunks, score_message

DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_1B = ROOT / "models" / "tinyllama-shape-1.1b-q4_k_m.gguf"
TEMPLATE = ROOT / ".chat-templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
THREADS = 1  # NOTE: both servers; at 2 threads beside other work llama-server's OpenMP spun at 1.6 s/token
CTX = 4096
MAX_TOKENS = 64
MAX_TOKENS_REQUIRED = 160  # NOTE: forced calls of a tiny model write long arguments: 64 cut most off
MAX_TOKENS_1B = 40  # NOTE: ~8x the default model's time per token: the run stays within ~15 min
COST_TOKENS = 128
COST_PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


def derive(source: Path, dest: Path) -> Path:
    """``source`` with Qwen 2.5's chat template, written to ``dest`` by gguf's ``gguf_new_metadata``."""
    if not TEMPLATE.is_file():
        sys.exit(f"{TEMPLATE} is missing: run `make templates`")
    subprocess.run([PYTHON, "-m", "gguf.scripts.gguf_new_metadata", str(source), str(dest),
                    "--chat-template-file", str(TEMPLATE), "--force"], check=True, capture_output=True)
    return dest


class Peer(LlamaServer):
    """``LlamaServer`` whose readiness check needs no bench-only package (``make bench-env``'s httpx)."""

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + self.READY_PATH, timeout=1.0) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False


@contextlib.contextmanager
def servers(label: str, model: Path) -> Iterator[dict[str, str]]:
    """This server and llama-server on ``model``, both up: {arm: base url}."""
    http_port = free_port()
    ours = GrpcServer(f"tools-ours-{label}", model, "--http-port", str(http_port), "--max-running", "4",
                      threads=THREADS)
    peer = Peer(f"tools-llama-server-{label}", llama_server_binary(), model, parallel=1, ctx=CTX,
                       threads=THREADS, extra=["--jinja"])
    with ours, peer:
        yield {"ours": f"http://127.0.0.1:{http_port}", "llama-server": peer.base_url}


def _body(conv: Conversation, model: str, stream: bool, max_tokens: int, choice: str) -> dict[str, Any]:
    return {"model": model, "messages": conv.messages, "tools": TOOLS, "tool_choice": choice,
            "parallel_tool_calls": True, "temperature": 0, "seed": 36, "max_tokens": max_tokens, "stream": stream}


def ask(client: httpx.Client, conv: Conversation, model: str, max_tokens: int, choice: str = "auto") -> dict[str, Any]:
    """One conversation unstreamed, then streamed: the scores, the time per unstreamed answer, any error."""
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=_body(conv, model, False, max_tokens, choice))
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        return {"conversation": conv.name, "kind": conv.kind, "error": f"HTTP {r.status_code}: {r.text[:300]}"}
    whole = score_message(r.json())
    finish = r.json()["choices"][0].get("finish_reason")
    chunks: list[dict[str, Any]] = []
    with client.stream("POST", "/v1/chat/completions", json=_body(conv, model, True, max_tokens, choice)) as s:
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    errors = [c["error"] for c in chunks if "error" in c]
    streamed = score_chunks(chunks)
    return {"conversation": conv.name, "kind": conv.kind, "seconds": seconds, "finish": finish, "calls": len(whole.calls),
            "parsed": whole.parsed, "valid": whole.valid, "names": [n for n, _ in whole.calls],
            "stream_status": s.status_code, "stream_error": errors[0] if errors else None,
            "stream_equal": s.status_code == 200 and not errors and streamed.calls == whole.calls,
            "text": whole.text[:120], "arguments": [a for _, a in whole.calls]}


def model_id(client: httpx.Client) -> str:
    return str(client.get("/v1/models").json()["data"][0]["id"])


def run_model(label: str, model: Path, convs: list[Conversation], max_tokens: int,
              choice: str = "auto") -> dict[str, Any]:
    """Both servers on ``model``, one warm-up answer each (its first grammar compile), then every
    conversation on both, the arms' order alternating conversation by conversation."""
    out: dict[str, Any] = {"model": model.name, "conversations": len(convs), "max_tokens": max_tokens,
                           "tool_choice": choice, "warmup": {},
                           "answers": {"ours": [], "llama-server": []}}
    with servers(label, model) as urls:
        # NOTE: a fresh connection per request: llama-server may close an idle kept-alive one under the
        # client's feet (a RemoteProtocolError on its next request); both arms pay the same loopback connect.
        clients = {arm: httpx.Client(base_url=url, timeout=900, headers={"connection": "close"})
                   for arm, url in urls.items()}
        names = {arm: model_id(c) for arm, c in clients.items()}
        for arm, c in clients.items():
            out["warmup"][arm] = ask(c, convs[0], names[arm], max_tokens, choice)
        for i, conv in enumerate(convs):
            for arm in (list(urls) if i % 2 == 0 else list(reversed(urls))):
                load = load_now()
                out["answers"][arm].append(ask(clients[arm], conv, names[arm], max_tokens, choice)
                                          | {"load_before": load})
            print(f"  {label} {conv.name}: " + ", ".join(
                f"{arm} {out['answers'][arm][-1].get('calls', 'error')} calls" for arm in urls), flush=True)
        for c in clients.values():
            c.close()
    out["summary"] = {arm: summary(rows) for arm, rows in out["answers"].items()}
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one server's answers."""
    ok = [a for a in rows if "error" not in a]
    with_calls = [a for a in ok if a["calls"]]
    calls = sum(a["calls"] for a in ok)
    secs = [a["seconds"] * 1000 for a in ok]
    by_kind: dict[str, dict[str, int]] = {}
    for a in ok:
        k = by_kind.setdefault(a["kind"], {"answers": 0, "with_calls": 0})
        k["answers"] += 1
        k["with_calls"] += bool(a["calls"])
    loads = [a["load_before"]["load1"] for a in rows if "load_before" in a]
    return {"answers": len(rows), "errors": len(rows) - len(ok),
            "load1_range": [min(loads), max(loads)] if loads else None, "answers_with_calls": len(with_calls),
            "calls": calls, "calls_parse": sum(a["parsed"] for a in ok), "calls_valid": sum(a["valid"] for a in ok),
            "streamed_equal": sum(a["stream_equal"] for a in with_calls), "stream_errors": sum(
                bool(a["stream_error"]) for a in ok),
            "answer_ms_p50": pct(secs, 50), "answer_ms_p99": pct(secs, 99), "by_kind": by_kind,
            "finish": {f: sum(a.get("finish") == f for a in ok) for f in sorted({str(a.get("finish")) for a in ok})}}


# -- the auto-mode grammar's cost per decoded token ------------------------------------------------------------
def _timed_stream(client: httpx.Client, path: str, body: dict[str, Any]) -> float | None:
    """ms per decoded token of one streamed request: (end - first text) / (completion tokens - 1)."""
    first: float | None = None
    tokens = 0
    with client.stream("POST", path, json=body) as s:
        for line in s.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            row = (chunk.get("choices") or [{}])[0]
            if first is None and ((row.get("delta") or {}).get("content") or row.get("text")):
                first = time.perf_counter()
    end = time.perf_counter()
    return None if first is None or tokens < 2 else (end - first) * 1000 / (tokens - 1)


def grammar_cost(rounds: int, per_arm: int) -> dict[str, Any]:
    """Arms "tools" (auto grammar) and "plain" (the same prompt tokens, no grammar), alternating."""
    http_port = free_port()
    with GrpcServer("tools-grammar-cost", DEFAULT_MODEL, "--http-port", str(http_port), threads=THREADS), \
            httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=600) as client:
        model = model_id(client)
        same = {"model": model, "temperature": 0, "max_tokens": COST_TOKENS, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        chat = {**same, "messages": COST_PROMPT, "tools": TOOLS, "tool_choice": "auto"}
        ids = client.post("/v1/chat/completions/render", json={k: v for k, v in chat.items() if k != "stream_options"})
        ids.raise_for_status()
        plain = {**same, "prompt": ids.json()["token_ids"]}
        arms = {"tools": ("/v1/chat/completions", chat), "plain": ("/v1/completions", plain)}
        _timed_stream(client, *arms["tools"])  # warm-up (the prompt's prefix enters the cache)
        rows: list[dict[str, Any]] = []
        for r in range(rounds):
            for arm in (("tools", "plain") if r % 2 == 0 else ("plain", "tools")):
                load = load_now()
                ms = [_timed_stream(client, *arms[arm]) for _ in range(per_arm)]
                rows.append({"round": r, "arm": arm, "load_before": load, "ms_per_token": ms})
    return cost_summary(rows, rounds, per_arm)


def cost_summary(rows: list[dict[str, Any]], rounds: int, per_arm: int) -> dict[str, Any]:
    def med(arm: str, r: int | None = None) -> float:
        vals = [v for x in rows if x["arm"] == arm and (r is None or x["round"] == r) for v in x["ms_per_token"]
                if v is not None]
        return statistics.median(vals)

    pairs = [med("tools", r) / med("plain", r) - 1 for r in range(rounds)]
    return {"rounds": rounds, "requests_per_arm_per_round": per_arm, "tokens": COST_TOKENS,
            "median_ms_per_token": {"tools": med("tools"), "plain": med("plain")},
            "overhead_by_medians": med("tools") / med("plain") - 1, "overhead_by_round": pairs,
            "overhead_median_of_rounds": statistics.median(pairs), "rows": rows}


PARTS = ("grammar", "default", "default-own", "default-required", "1.1b")
TITLE = "Tool calling (tool_choice auto) vs llama.cpp's llama-server --jinja; the auto-mode grammar's cost per token"


def measure(per_kind: int, per_kind_1b: int, grammar_rounds: int, per_arm: int = 2,
            parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """The study's ``parts``: the grammar's cost; the default model with Qwen 2.5's template
    ("default") and with its own ("default-own": this server's generic family, llama-server's generic
    format); the 1.1B shape with Qwen 2.5's template (when built)."""
    doc: dict[str, Any] = {"template": TEMPLATE.name, "threads": THREADS, "parts": list(parts), "models": {}}
    with tempfile.TemporaryDirectory(prefix="tool-calls-") as tmp:
        if "grammar" in parts:
            doc["grammar_cost"] = grammar_cost(grammar_rounds, per_arm)  # NOTE: first: the quietest minutes
            print(f"grammar cost: {doc['grammar_cost']['overhead_by_medians']:+.1%} by medians", flush=True)
        if "default" in parts:
            small = derive(DEFAULT_MODEL, Path(tmp) / "smollm2-135m-qwen25-template.gguf")
            doc["models"]["default"] = run_model("135m", small, conversations(per_kind), MAX_TOKENS)
        if "default-own" in parts:
            doc["models"]["default-own"] = run_model("135m-own", DEFAULT_MODEL, conversations(per_kind), MAX_TOKENS)
        if "default-required" in parts:  # NOTE: tiny models seldom call on their own: calls forced to compare
            small = derive(DEFAULT_MODEL, Path(tmp) / "smollm2-135m-qwen25-template-required.gguf")
            doc["models"]["default-required"] = run_model("135m-required", small, conversations(per_kind),
                                                          MAX_TOKENS_REQUIRED, "required")
        if "1.1b" in parts and MODEL_1B.is_file():
            big = derive(MODEL_1B, Path(tmp) / "tinyllama-shape-1.1b-qwen25-template.gguf")
            doc["models"]["1.1b"] = run_model("1b", big, conversations(per_kind_1b), MAX_TOKENS_1B)
        elif "1.1b" in parts:
            doc["models"]["1.1b"] = {"skipped": f"{MODEL_1B} missing: run `make bench-model-1b`"}
    doc["load_at_end"] = load_now()
    return doc


def run(cfg: BenchConfig) -> dict[str, Any]:
    llama_server_binary()  # skip early when the peer is not built
    if cfg.quick:
        return measure(per_kind=1, per_kind_1b=1, grammar_rounds=2, per_arm=1)
    return measure(per_kind=5, per_kind_1b=2, grammar_rounds=6)


def _share(k: int, n: int) -> str:
    return f"{k}/{n}" + (f" ({k / n:.0%})" if n else "")


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario R."""
    rows = []
    for model, m in r["models"].items():
        if "skipped" in m:
            rows.append([model, "skipped: " + m["skipped"], *["-"] * 6])
            continue
        for arm, s in m["summary"].items():
            rows.append([model, arm, _share(s["answers_with_calls"], s["answers"] - s["errors"]),
                         _share(s["calls_parse"], s["calls"]), _share(s["calls_valid"], s["calls"]),
                         _share(s["streamed_equal"], s["answers_with_calls"]),
                         f"{fmt(s['answer_ms_p50'], 0)} / {fmt(s['answer_ms_p99'], 0)}",
                         " - ".join(fmt(x, 1) for x in s["load1_range"] or [])])
    head = ["model", "server", "answers with calls", "calls parse", "calls validate", "streamed = unstreamed",
            "answer p50 / p99 ms", "load1"]
    g = r["grammar_cost"]
    cost = (f"Auto-mode tool grammar per decoded token: {fmt(g['median_ms_per_token']['tools'], 2)} vs "
            f"{fmt(g['median_ms_per_token']['plain'], 2)} ms = {g['overhead_by_medians']:+.1%} by medians, "
            f"{g['overhead_median_of_rounds']:+.1%} by the median of {g['rounds']} paired rounds "
            f"(<= 3% by both: {verdict(max(g['overhead_by_medians'], g['overhead_median_of_rounds']), 0.03, False)}).")
    return table(head, rows) + "\n\n" + cost
