"""Renders ``summary.md`` (markdown tables) from the scenario JSON files in the results folder.

Each scenario file is ``{"scenario", "name", "title", "machine", "elapsed_s", "results"}``
(or ``error``/``skipped`` instead of ``results``). The summary is rebuilt from
every file present, so ``--only`` runs refresh their rows and keep the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import fmt

Row = list[str]


def table(header: list[str], rows: list[Row]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def verdict(value: float | None, target: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "NOT met"


def _g(d: Any, *keys: Any) -> Any:
    for k in keys:
        if not isinstance(d, dict) or str(k) not in d:
            return None
        d = d[str(k)]
    return d


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


# -- A --------------------------------------------------------------------------------------------
def render_a(r: dict[str, Any]) -> str:
    levels = list(r["loads"])
    rows = []
    for c in levels:
        b, s = _g(r, "batcher", "levels", c) or {}, _g(r, "sequential", "levels", c) or {}
        raw, peer = _g(r, "raw", "levels", c) or {}, _g(r, "llama_cpp_server", "levels", c) or {}
        rows.append(
            [
                c,
                fmt(b.get("tok_s")),
                fmt(b.get("req_s"), 2),
                fmt(_g(b, "ttft", "p50_ms"), 0),
                fmt(_g(b, "ttft", "p99_ms"), 0),
                fmt(b.get("mean_batch_size")),
                fmt(s.get("tok_s")),
                fmt(s.get("req_s"), 2),
                fmt(_g(s, "ttft", "p50_ms"), 0),
                fmt(_g(s, "ttft", "p99_ms"), 0),
                fmt(raw.get("tok_s")),
                fmt(peer.get("tok_s")),
                fmt(_g(peer, "ttft", "p50_ms"), 0),
                fmt(_g(peer, "ttft", "p99_ms"), 0),
            ]
        )
    head = [
        "C (=B)",
        "batcher tok/s",
        "req/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "mean batch",
        "sequential tok/s",
        "req/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "raw engine tok/s (B=C)",
        "llama_cpp.server tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
    ]
    out = [
        f"{sum(int(c) * n for c, n in r['loads'].items())} requests per server over C in "
        f"{', '.join(levels)}; unique {r['prompt_tokens']}-token prompts, {r['max_tokens']} greedy "
        "tokens each (ignore_eos); closed loop. Raw engine = ModelRunner decode loop with no server "
        "(decode steps only).",
        "",
        table(head, rows),
        "",
    ]
    targets = {"batcher_vs_sequential": (2.5, "x"), "batcher_vs_raw": (0.9, "")}
    for key, value in r.get("ratios", {}).items():
        base = key.rsplit("_", 1)[0]
        target = targets.get(base)
        pct_form = base.startswith("batcher_vs_raw")
        shown = "-" if value is None else (f"{value * 100:.0f}%" if pct_form else f"{value:.2f}x")
        note = ""
        if target:
            tgt = f"{target[0] * 100:.0f}%" if base == "batcher_vs_raw" else f"{target[0]}x"
            note = f" (target >= {tgt}: {verdict(value, target[0])})"
        out.append(f"- {key.replace('_', ' ')}: **{shown}**{note}")
    peer = r.get("llama_cpp_server", {})
    if "skipped" in peer:
        out.append(f"- llama_cpp.server: skipped ({peer['skipped']})")
    elif peer.get("note"):
        got = ", ".join(f"C={c}: {v['tokens']}/{v['tokens_requested']}" for c, v in peer["levels"].items())
        out.append(f"- llama_cpp.server: {peer['note']}; tokens received {got}")
    return "\n".join(out)


# -- B --------------------------------------------------------------------------------------------
def render_b(r: dict[str, Any]) -> str:
    rows = []
    for label, key in (("ours (shared pool)", "ours"), ("naive (8 x 4096)", "naive")):
        x = r[key]
        rows.append(
            [
                label,
                str(x["ctx"]),
                _mib(x["kv_buffer_bytes"]),
                _mib(x["rss_idle_bytes"]),
                _mib(x["rss_peak_bytes"]),
                f"{x['peak_blocks_used']}/{x['blocks_total']}",
                _mib(x["peak_blocks_used"] * x["bytes_per_block"]),
                f"{x['completed']}/{x['requests']}",
                str(x["preemptions"]),
            ]
        )
    head = [
        "server",
        "--ctx",
        "KV buffer MiB",
        "RSS idle MiB",
        "RSS peak MiB",
        "peak blocks used",
        "peak KV in use MiB",
        "completed",
        "preemptions",
    ]
    less = r["pct_less_kv_buffer"]
    return "\n".join(
        [
            f"{r['clients']} concurrent requests, prompts {min(r['prompt_tokens'])}-{max(r['prompt_tokens'])} "
            f"tokens, outputs {min(r['max_tokens'])}-{max(r['max_tokens'])} tokens (ignore_eos), up to "
            f"{r['per_request_context']} tokens of context each.",
            "",
            table(head, rows),
            "",
            f"- KV buffer allocated: **{fmt(less)}% less** than the naive layout "
            f"(target >= 80%: {verdict(less, 80)})",
            f"- Peak KV in use ({_mib(r['kv_bytes_peak_in_use'])} MiB) vs naive reservation "
            f"({_mib(r['kv_bytes_naive_layout'])} MiB): {fmt(r['pct_less_peak_in_use_vs_naive'])}% less",
            f"- Process RSS peak: {fmt(r['pct_less_rss_peak'])}% less "
            f"({_mib(r['rss_peak_saved_bytes'])} MiB saved; RSS includes weights and runtime)",
            f"- All requests completed on both servers: {'yes' if r['all_completed'] else 'NO'}",
        ]
    )


# -- C, D -----------------------------------------------------------------------------------------
def render_c(r: dict[str, Any]) -> str:
    rows = []
    for label in ("prefix_cache", "no_prefix_cache"):
        x = r[label]
        cached = [p["warm_cached_tokens"] for p in x["pairs"]]
        rows.append(
            [
                label.replace("_", " "),
                fmt(x["cold_ttft_p50_ms"], 0),
                fmt(x["warm_ttft_p50_ms"], 1),
                fmt(x["reduction_pct"]) + "%",
                f"{min(cached)}-{max(cached)}" if cached else "-",
            ]
        )
    red = r["prefix_cache"]["reduction_pct"]
    return "\n".join(
        [
            f"{r['prefixes']} different ~{r['prefix_tokens']}-token prefixes, each sent twice with a distinct "
            f"8-word suffix; {r['max_tokens']} output tokens; client-side TTFT medians.",
            "",
            table(
                ["server", "cold TTFT p50 ms", "warm TTFT p50 ms", "reduction", "warm cached tokens"], rows
            ),
            "",
            f"- Warm vs cold TTFT: **{fmt(red)}% less** (target >= 98%: {verdict(red, 98)})",
        ]
    )


def render_d(r: dict[str, Any]) -> str:
    rows = []
    for label in ("prefix_cache", "no_prefix_cache"):
        x = r[label]
        rate = x.get("prefix_hit_rate")
        rows.append(
            [
                label.replace("_", " "),
                "-" if rate is None else f"{rate * 100:.1f}%",
                fmt(_g(x, "ttft", "p50_ms"), 0),
                fmt(_g(x, "ttft", "p99_ms"), 0),
                fmt(_g(x, "first_pass", "ttft", "p50_ms"), 0),
                fmt(x.get("tok_s")),
                f"{x['completed']}/{x['requests']}",
            ]
        )
    rate = r["prefix_cache"].get("prefix_hit_rate")
    head = [
        "server",
        "prefix hit rate",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "first-pass TTFT p50 ms",
        "tok/s",
        "completed",
    ]
    return "\n".join(
        [
            f"{r['system_prompts']} distinct ~{r['system_prompt_tokens']}-token system prompts, round-robin, "
            f"{r['clients']} concurrent clients, --ctx {r['ctx']}; one pass fills the cache, then "
            f"{r['measured_requests']} measured requests ({r['max_tokens']} output tokens).",
            "",
            table(head, rows),
            "",
            f"- Prefix hit rate (GetMetrics kv counters over the measured requests): "
            f"**{'-' if rate is None else f'{rate * 100:.1f}%'}** (target >= 90%: "
            f"{verdict(None if rate is None else rate * 100, 90)})",
            f"- Slot-style baseline: {r['slot_baseline_note']}",
        ]
    )


# -- E --------------------------------------------------------------------------------------------
def render_e(r: dict[str, Any]) -> str:
    rows = []
    for policy in ("priority", "fcfs"):
        for label, x in r.get(policy, {}).items():
            t = x["interactive_ttft"]
            rows.append(
                [
                    policy,
                    label.replace("_", " "),
                    str(x["batch_streams"]),
                    fmt(t["p50_ms"], 0),
                    fmt(t["p99_ms"], 0),
                    str(t["n"]),
                    fmt(x["batch_tok_s"]),
                    fmt(x.get("interactive_tok_s")),
                    fmt(x.get("total_tok_s")),
                    str(x["preemptions_delta"]),
                ]
            )
    head = [
        "scheduling",
        "run",
        "batch streams",
        "interactive TTFT p50 ms",
        "p99 ms",
        "n",
        "batch tok/s",
        "interactive tok/s",
        "all tok/s",
        "preemptions",
    ]
    load = r["load"]
    out = [
        f"Batch streams: closed loop, {load['batch_tokens']} tokens each (PRIORITY_BATCH); interactive: "
        f"{load['interactive_tokens']} tokens every {load['interval_s'] * 1000:.0f} ms (open loop) over a "
        f"{load['window_s']:.0f} s window after a {load['ramp_s']:.0f} s ramp; batch tok/s counts tokens "
        "received inside the window.",
        "",
        table(head, rows),
        "",
    ]
    for n, c in r.get("checks", {}).items():
        p99, ratio_idle, loss = c["interactive_p99_loaded_ms"], c["p99_vs_idle"], c["batch_loss_pct_priority"]
        out.append(
            f"- N={n}, priority: interactive p99 **{fmt(p99, 0)} ms** = {fmt(ratio_idle, 2)}x idle "
            f"(targets <= 2x: {verdict(ratio_idle, 2, False)}; <= 300 ms: {verdict(p99, 300, False)}); "
            f"batch throughput loss **{fmt(loss)}%** vs batch-only "
            f"(target <= 10%: {verdict(loss, 10, False)}); "
            f"all tokens (batch + interactive) {fmt(c.get('total_loss_pct_priority'))}% below batch-only; "
            f"fcfs: p99 {fmt(c['fcfs_interactive_p99_ms'], 0)} ms, batch loss {fmt(c['batch_loss_pct_fcfs'])}%"
        )
    return "\n".join(out)


# -- F, G -----------------------------------------------------------------------------------------
def render_f(r: dict[str, Any]) -> str:
    rows = []
    for c, x in r["levels"].items():
        toks = x["completion_tokens"]
        share = x.get("forced_share")
        rows.append(
            [
                c,
                fmt(x["json_tok_s"]),
                fmt(x["plain_tok_s"]),
                fmt(x["overhead_pct"]) + "%",
                fmt(x["mask_us_p50"], 0),
                fmt(x["mask_us_p99"], 0),
                "-" if share is None else f"{share * 100:.1f}%",
                f"{min(toks)}-{max(toks)}" if toks else "-",
                f"{x['json_ok']}/{x['requests']}",
            ]
        )
    head = [
        "clients",
        "GenerateJSON tok/s",
        "unconstrained tok/s",
        "overhead (< 0: faster)",
        "mask p50 us",
        "mask p99 us",
        "forced tokens",
        "tokens per doc",
        "valid docs",
    ]
    return "\n".join(
        [
            "GenerateJSON (greedy, small bounded schema) first; then unconstrained Generate of the same prompts "
            "with max_tokens = each document's token count (ignore_eos). Mask percentiles are GetMetrics' window "
            "(cumulative over the levels). Forced tokens are fast-forwarded, several per decode step, "
            "which can make constrained generation faster than unconstrained.",
            "",
            table(head, rows),
        ]
    )


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, dict | list):
        return json.dumps(v, default=str)
    return str(v)


def render_g(r: dict[str, Any]) -> str:
    if isinstance(r.get("markdown"), str):
        return str(r["markdown"])
    return table(["measure", "value"], [[k.replace("_", " "), _cell(v)] for k, v in r.items()])


# -- H --------------------------------------------------------------------------------------------
def render_h(r: dict[str, Any]) -> str:
    load, c = r["load"], r["checks"]
    rows = []
    for label in ("on", "off"):
        f = r["fairness"][label]
        rows.append(
            [
                f"fair share {label}",
                f"{fmt(100 * f['b_share'], 1)}%" if f["b_share"] is not None else "-",
                fmt(f["jain_window"], 3),
                fmt(f["jain_bins_mean"], 3),
                fmt(f.get("jain_10s_bins_mean"), 3),
                fmt(f["total_tok_s"], 1),
                fmt(_g(f, "b_ttft", "p50_ms"), 0),
                fmt(_g(f, "b_ttft", "p99_ms"), 0),
            ]
        )
    out = [
        f"Batch tier, equal weights: tenant A {load['a_streams']} closed-loop streams, tenant B "
        f"{load['b_streams']}, {load['fair_tokens']} tokens each, --max-running {r['max_running']}, "
        f"{load['window_s']:.0f} s window (both backlogged throughout); Jain's index over the window and "
        "the mean over 5 s and 10 s bins (a bin holds only ~2 requests' tokens per tenant).",
        "",
        table(
            [
                "run",
                "B share",
                "Jain (window)",
                "Jain (5 s bins)",
                "Jain (10 s bins)",
                "tok/s",
                "B TTFT p50 ms",
                "B TTFT p99 ms",
            ],
            rows,
        ),
        "",
        f"- B share >= 45%: {verdict(c['b_share_on'], 0.45)}; Jain >= 0.95: {verdict(c['jain_on'], 0.95)}; "
        f"total on/off {fmt(c['total_on_vs_off'], 3)} (within 5%: {'met' if c['total_ok'] else 'NOT met'})",
    ]
    cost = r["cost"]
    med = cost["median_tok_s"]
    out += [
        f"- TLS/auth cost (scenario A shape, {load['cost_streams']} streams, medians of "
        f"{load['cost_repeats']} alternating runs): plaintext {fmt(med['plaintext'], 1)} tok/s, "
        f"auth {fmt(med['auth'], 1)} ({fmt(100 * c['auth_cost'], 1)}% cost), TLS + auth "
        f"{fmt(med['tls_auth'], 1)} ({fmt(100 * c['tls_auth_cost'], 1)}% cost); target <= 2%; runs "
        f"{json.dumps(cost['runs_tok_s'])}",
    ]
    if "median_server_cpu_ms_per_token" in cost:
        cpu = cost["median_server_cpu_ms_per_token"]
        out.append(
            f"- server CPU per token (medians): plaintext {fmt(cpu['plaintext'], 2)} ms, auth "
            f"{fmt(cpu['auth'], 2)} ms ({fmt(100 * ((cost['cpu_auth_vs_plaintext'] or 1) - 1), 1)}%), TLS + auth "
            f"{fmt(cpu['tls_auth'], 2)} ms ({fmt(100 * ((cost['cpu_tls_auth_vs_plaintext'] or 1) - 1), 1)}%)"
        )
    return "\n".join(out)


# -- I --------------------------------------------------------------------------------------------
def render_i(r: dict[str, Any]) -> str:
    rows = []
    labels = [k for k in r if isinstance(r[k], dict) and "balancing" in r[k]]
    for label in labels:
        m = r[label]
        t = m.get("targets", {})
        rows.append(
            [
                label,
                f"{fmt(100 * (m['prefix_hit_rate'] or 0), 1)}%",
                fmt(t.get("hit_rate_ratio"), 2, "x") if t else "-",
                fmt(_g(m, "ttft", "p50_ms"), 0),
                fmt(_g(m, "ttft", "p99_ms"), 0),
                fmt(_g(m, "in_flight", "max_over_mean"), 2),
                " / ".join(str(n) for n in m["requests_per_replica"]),
                str(m["failed"]),
            ]
        )
    head = ["routing", "prefix hit rate", "vs round_robin", "TTFT p50 ms", "TTFT p99 ms"]
    head += ["in-flight max/mean", "requests per replica", "failed"]
    out = [
        f"{r['replicas']} replicas x 1 thread on this machine (a routing experiment, not a throughput one): "
        f"{r['system_prompts']} system prompts x {r['system_prompt_tokens']} tokens round-robin from "
        f"{r['clients']} clients, {r['measured_requests']} measured requests, prefix cache "
        f"{r['prefix_cache_tokens_per_replica']} tokens per replica.",
        "",
        table(head, rows),
        "",
    ]
    for label in labels:
        t = r[label].get("targets")
        if t:
            out.append(
                f"- {label}: hit rate {fmt(t['hit_rate_ratio'], 2)}x round_robin's (target >= 2x: "
                f"{'met' if t['hit_rate_met'] else 'NOT met'}); in-flight max/mean "
                f"{fmt(t['in_flight_max_over_mean'], 2)} (target <= 1.5: {'met' if t['balance_met'] else 'NOT met'})"
            )
    return "\n".join(out)


from bench.s_api import render as render_api  # noqa: E402
from bench.s_batch import render as render_j  # noqa: E402
from bench.s_cache import render as render_k  # noqa: E402
from bench.s_contention import render as render_l  # noqa: E402
from bench.s_speculative import render as render_spec  # noqa: E402

RENDER: dict[str, Callable[[dict[str, Any]], str]] = {
    "A": render_a,
    "B": render_b,
    "C": render_c,
    "D": render_d,
    "E": render_e,
    "F": render_f,
    "G": render_g,
    "H": render_h,
    "I": render_i,
    "J": render_j,
    "K": render_k,
    "L": render_l,
    "M": render_api,
    "N": render_spec,
}


def _machine_line(m: dict[str, Any]) -> str:
    quick = " · QUICK (tiny loads, not for publishing)" if m.get("quick") else ""
    return (
        f"{m['nproc']} cores ({m['cpu']}), {m['mem_gib']} GiB · model {m['model']} · "
        f"llama-cpp-python {m['llama_cpp_python']} · llama.cpp threads {m.get('threads', '-')}{quick}"
    )


def _when(m: dict[str, Any]) -> str:
    return f"measured {m['date']} at git {m['git_rev']}, load average at start {m['loadavg_at_start'][0]}"


def render_summary(files: list[Path], charts: list[tuple[str, str]] | None = None) -> str:
    """The markdown summary of the scenario ``files``; ``charts`` = [(title, path relative to it)]."""
    docs = sorted((json.loads(f.read_text()) for f in files), key=lambda d: d["scenario"])
    out = ["# Benchmark results", ""]
    if docs:
        out += [f"Machine: {_machine_line(docs[0]['machine'])}", ""]
    if charts:
        out += ["Charts (`bench/plots.py`):", ""]
        out += [f"- [{title}]({rel})" for title, rel in charts]
        out.append("")
    for d in docs:
        out += [f"## {d['scenario']}. {d['title']}", ""]
        if _machine_line(d["machine"]) != _machine_line(docs[0]["machine"]):
            out += [f"_Machine: {_machine_line(d['machine'])}_", ""]
        if "results" in d:
            try:
                out.append(RENDER[d["scenario"]](d["results"]))
            except (KeyError, TypeError, ValueError) as exc:
                out.append(f"(cannot render: {type(exc).__name__}: {exc}; see {d['name']}.json)")
        took = f"took {d.get('elapsed_s', 0):.0f} s"
        if "bench_client_cpu_s" in d:
            took += f" (bench client CPU {d['bench_client_cpu_s']:.0f} s)"
        notes = [d.get("status", "ok"), _when(d["machine"]), took]
        notes += [str(d[k]) for k in ("error", "skipped") if d.get(k)]
        out.append("\n_" + "; ".join(notes) + "_")
        out.append("")
    return "\n".join(out)
