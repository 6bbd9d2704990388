"""The drawings behind ``bench.report.plots``: one function per chart, ``draw(fig, {name: results})``.

Each reads the ``results`` part of the scenario files named in its ``Chart``
(a missing optional source is simply left out) and draws axes with units.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

Data = dict[str, dict[str, Any]]
ON, OFF = "prefix cache on", "prefix cache off"
SYSTEMS = [  # (result key, label, colour, marker) of scenario A
    ("batcher", "this server (continuous batching)", "tab:blue", "o"),
    ("sequential", "this server, --max-running 1", "tab:gray", "s"),
    ("raw", "raw llama.cpp decode loop (no server)", "tab:green", "^"),
    ("llama_cpp_server", "llama_cpp.server (llama-cpp-python)", "tab:red", "D"),
]


def _levels(sys_result: dict[str, Any]) -> tuple[list[int], list[float]]:
    pts = [(int(c), x["tok_s"]) for c, x in sys_result.get("levels", {}).items() if x.get("tok_s")]
    pts.sort()
    return [c for c, _ in pts], [v for _, v in pts]


def throughput(fig: Figure, data: Data) -> None:
    """Tok/s per concurrency level for every system; batcher/other ratios written at each level."""
    r = data["throughput"]
    ax = fig.add_subplot(1, 1, 1)
    curves: dict[str, dict[int, float]] = {}
    for key, label, colour, marker in SYSTEMS:
        xs, ys = _levels(r.get(key, {}))
        if xs:
            ax.plot(xs, ys, marker=marker, color=colour, label=label, linewidth=2)
            curves[key] = dict(zip(xs, ys, strict=True))
    ours = curves.get("batcher", {})
    for c, v in ours.items():
        notes = [
            f"{v / curves[k][c]:.2f}x {short}"
            for k, short in (("sequential", "seq"), ("llama_cpp_server", "peer"))
            if c in curves.get(k, {})
        ]
        if notes:
            box = {"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": "tab:blue", "alpha": 0.9}
            ax.annotate(
                "\n".join(notes),
                (c, v),
                textcoords="offset points",
                xytext=(0, -14),
                ha="center",
                va="top",
                fontsize=8,
                color="tab:blue",
                bbox=box,
            )
    ax.set_xscale("log", base=2)
    levels = sorted({c for cur in curves.values() for c in cur})
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_ylim(0, max((v for cur in curves.values() for v in cur.values()), default=1) * 1.25)
    ax.set_xlabel("concurrent streams C (closed loop; raw loop: batch size B = C)")
    ax.set_ylabel("generated tokens per second (tok/s)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(
        f"{r['prompt_tokens']}-token prompts, {r['max_tokens']} tokens each (ignore_eos). Boxes: this server's tok/s / --max-running 1 (seq) and / llama_cpp.server (peer)",
        fontsize=9,
    )


def _cdf(run: dict[str, Any], tier: str) -> tuple[list[float], list[float], str]:
    """TTFT samples of ``tier`` in ``run``, sorted, with cumulative fractions, and a legend note.

    Requests that never got a first token count in the denominator (the curve
    stops below 1). Older files without samples give (p50, p99) only.
    """
    samples = run.get(f"{tier}_ttft_samples_ms")
    if samples:
        unfinished = int(run.get(f"{tier}_ttft_unfinished") or 0)
        n = len(samples) + unfinished
        note = f", n={n}" + (f", {unfinished} without a token by the window's end" if unfinished else "")
        xs = sorted(samples)
        return xs, [(i + 1) / n for i in range(len(xs))], note
    s = run.get(f"{tier}_ttft") or {}
    if s.get("p50_ms") is None:
        return [], [], ""
    return [s["p50_ms"], s["p99_ms"]], [0.5, 0.99], " (p50, p99 only: no samples saved)"


def _curve(ax: Axes, xs: list[float], ys: list[float], note: str, label: str, **style: Any) -> None:
    if "p50, p99 only" in note:
        ax.plot(xs, ys, marker="o", label=label + note, **style)
    else:
        ax.step(xs, ys, where="post", label=label + note, **style)


def _tier_curves(ax: Axes, r: dict[str, Any], label: str) -> None:
    tiers = (("interactive", "tab:blue"), ("batch", "tab:orange"))
    for policy, ls in (("priority", "-"), ("fcfs", "--")):
        run = r.get(policy, {}).get(label)
        for tier, colour in tiers if run is not None else ():
            xs, ys, note = _cdf(run, tier)
            if xs:
                _curve(ax, xs, ys, note, f"{tier}, {policy}", color=colour, linestyle=ls, linewidth=1.8)
    idle = r.get("priority", {}).get("idle")
    if idle is not None:
        xs, ys, note = _cdf(idle, "interactive")
        if xs:
            _curve(ax, xs, ys, note, "interactive, idle server", color="black", linestyle=":", linewidth=1.5)


def priority_ttft(fig: Figure, data: Data) -> None:
    """One panel per batch-stream count: TTFT CDFs of the interactive and batch tiers, priority vs fcfs."""
    r = data["priority"]
    labels = [f"loaded_{n}" for n in r["load"]["batch_streams"]]
    axes = fig.subplots(1, len(labels), sharey=True, squeeze=False)[0]
    for ax, label in zip(axes, labels, strict=True):
        _tier_curves(ax, r, label)
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
        ax.set_xlabel("time to first token, client-side (ms, log scale)")
        ax.set_title(
            f"{label.split('_')[1]} batch streams + interactive every {r['load']['interval_s'] * 1000:.0f} ms",
            fontsize=10,
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.axhline(0.99, color="gray", linewidth=0.8, alpha=0.6)
    axes[0].set_ylabel("fraction of requests with TTFT <= x")
    axes[0].set_ylim(0, 1.02)
    axes[-1].legend(loc="lower right", fontsize=7.5)


def _blocks_timeline(ax: Axes, low: Axes, x: dict[str, Any], label: str, colour: str) -> None:
    """Blocks in use (and the pool size) on ``ax``, running requests on ``low``."""
    tl = x["blocks_timeline"]
    ax.plot(tl["t_s"], tl["used"], color=colour, linewidth=2, label=f"{label}: blocks in use")
    pool = f"{label}: pool, --ctx {x['ctx']} ({x['blocks_total']} blocks)"
    ax.axhline(x["blocks_total"], color=colour, linestyle="--", linewidth=1.2, label=pool)
    low.step(tl["t_s"], tl["running"], where="post", color=colour, linewidth=1.5, label=label)


def _blocks_peaks(ax: Axes, r: dict[str, Any]) -> None:
    """Older result files hold only the peak: pool size and peak use as bars."""
    servers = [("ours", "shared pool"), ("naive", "naive 8 x 4096")]
    groups = [f"{label}\n(--ctx {r[k]['ctx']})" for k, label in servers]
    series: dict[str, list[float | None]] = {
        "blocks in the pool": [r[k]["blocks_total"] for k, _ in servers],
        "peak blocks in use": [r[k]["peak_blocks_used"] for k, _ in servers],
    }
    _bars(ax, groups, series, "{:.0f}")
    ax.set_xlabel("server (this result file has no timeline: rerun scenario B for blocks over time)")


def kv_memory(fig: Figure, data: Data) -> None:
    """Blocks in use over the run on our pool and on the naive-size pool, with both pool sizes."""
    r = data["kv_memory"]
    if all(r[k].get("blocks_timeline", {}).get("t_s") for k in ("ours", "naive")):
        ax, low = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
        _blocks_timeline(ax, low, r["ours"], "shared pool", "tab:blue")
        _blocks_timeline(ax, low, r["naive"], "naive 8 x 4096", "tab:red")
        ax.set_yscale("symlog", linthresh=10)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.92), ncol=2, fontsize=8)  # between the pools
        low.set_xlabel("time since the first request (s)")
        low.set_ylabel("running requests")
        low.grid(True, alpha=0.3)
        low.legend(loc="upper right", fontsize=8)
    else:
        ax = fig.add_subplot(1, 1, 1)
        _blocks_peaks(ax, r)
        ax.set_yscale("log")
        ax.legend(loc="upper left", fontsize=9)
    _plain_log_ticks(ax.yaxis)
    ax.set_ylabel(f"KV blocks ({r['ours']['block_size']} tokens each; log scale)")
    ax.grid(True, which="both", alpha=0.3)
    mib = r["ours"]["bytes_per_block"] / 2**20
    ax.set_title(
        f"{r['clients']} concurrent requests, one block = {mib:.2f} MiB; "
        f"KV buffer {r['pct_less_kv_buffer']:.1f}% smaller than the naive layout",
        fontsize=9,
    )


def _plain_log_ticks(axis: Any) -> None:
    """Log-axis ticks at 1, 2, 5 x 10^k written as plain numbers (thousands as "10k": short labels
    do not run into each other at the top of a decade)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _bars(ax: Axes, groups: list[str], series: dict[str, list[float | None]], fmt: str) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (name, vals) in enumerate(series.items()):
        xs = np.arange(len(groups)) + (i - (len(series) - 1) / 2) * width
        heights = [v or 0.0 for v in vals]
        bars = ax.bar(xs, heights, width, label=name)
        ax.bar_label(bars, [fmt.format(v) if v is not None else "n/a" for v in vals], fontsize=8)
    ax.set_xticks(np.arange(len(groups)), groups, fontsize=9)


def _prefix_rows(
    data: Data,
) -> tuple[list[str], dict[str, list[float | None]], dict[str, list[float | None]]]:
    """Groups (scenarios present) and, per cache setting, hit rate (%) and TTFT p50 (ms) per group."""
    groups: list[str] = []
    rate: dict[str, list[float | None]] = {ON: [], OFF: []}
    ttft: dict[str, list[float | None]] = {ON: [], OFF: []}
    if "prefix_reuse" in data:
        groups.append("C. one ~1,100-token prefix,\nsent again (warm request)")
        for key, label in (("prefix_cache", ON), ("no_prefix_cache", OFF)):
            x = data["prefix_reuse"][key]
            prompt = sum(p["prompt_tokens"] for p in x["pairs"])
            cached = sum(p["warm_cached_tokens"] for p in x["pairs"])
            rate[label].append(100.0 * cached / prompt if prompt else None)
            ttft[label].append(x["warm_ttft_p50_ms"])
    if "many_prefixes" in data:
        groups.append("D. 32 system prompts\nround-robin, 8 clients")
        for key, label in (("prefix_cache", ON), ("no_prefix_cache", OFF)):
            x = data["many_prefixes"][key]
            hit = x.get("prefix_hit_rate")
            rate[label].append(None if hit is None else 100.0 * hit)
            ttft[label].append(x["ttft"]["p50_ms"])
    return groups, rate, ttft


def prefix_cache(fig: Figure, data: Data) -> None:
    """Prefix hit rate (left) and TTFT p50 (right) per scenario, with and without the prefix cache."""
    groups, rate, ttft = _prefix_rows(data)
    left, right = fig.subplots(1, 2)
    _bars(left, groups, rate, "{:.1f}%")
    left.set_ylabel("prompt tokens served from the prefix cache (%)")
    left.set_ylim(0, 125)
    left.set_title("prefix hit rate", fontsize=10)
    _bars(right, groups, ttft, "{:.0f} ms")
    right.set_yscale("log")
    _plain_log_ticks(right.yaxis)
    right.set_ylabel("TTFT p50, client-side (ms, log scale)")
    right.set_title("time to first token", fontsize=10)
    for ax in (left, right):
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right" if ax is left else "upper left")


def structured_output(fig: Figure, data: Data) -> None:
    """Tok/s of GenerateJSON and of unconstrained generation of the same lengths, per client count."""
    r = data["structured_output"]
    ax = fig.add_subplot(1, 1, 1)
    levels = list(r["levels"])
    series: dict[str, list[float | None]] = {
        "GenerateJSON (grammar-constrained)": [r["levels"][c]["json_tok_s"] for c in levels],
        "unconstrained Generate, same lengths": [r["levels"][c]["plain_tok_s"] for c in levels],
    }
    _bars(
        ax,
        [f"{c} client(s)\noverhead {r['levels'][c]['overhead_pct']:+.0f}%" for c in levels],
        series,
        "{:.0f}",
    )
    ax.set_ylabel("generated tokens per second (tok/s)")
    ax.set_xlabel("concurrent clients (overhead < 0: constrained is faster, forced tokens skip sampling)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")


def tracing(fig: Figure, data: Data) -> None:
    """Tok/s of each alternating trial with tracing off and on (OTLP export), with their medians."""
    r = data["tracing"]
    ax = fig.add_subplot(1, 1, 1)
    trials = r.get("trials_tok_s", {})
    for i, (key, label, colour) in enumerate(
        (("off", "tracing off", "tab:gray"), ("on", "tracing on (OTLP export)", "tab:purple"))
    ):
        vals = trials.get(key, [])
        ax.scatter([i] * len(vals), vals, color=colour, s=40, label=f"{label}: trials")
        if vals:
            ax.hlines(float(np.median(vals)), i - 0.25, i + 0.25, color=colour, linewidth=2.5)
    ax.set_xticks([0, 1], ["off", "on"])
    ax.set_xlim(-0.8, 1.8)
    ax.set_ylabel("generated tokens per second (tok/s)")
    ax.set_xlabel("tracing (bar: median of the trials; the axis does not start at 0)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9)
    ax.set_title(
        f"overhead {r.get('overhead_pct', float('nan')):+.1f}% (target <= {r.get('target_overhead_pct', 1)}%)",
        fontsize=10,
    )
