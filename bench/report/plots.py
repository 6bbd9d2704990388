"""PNG charts of the benchmark results: ``render_all(results_dir)`` -> ``<results>/plots/*.png``.

One chart per scenario file present (A throughput, B KV memory, C+D prefix cache,
E mixed priority, F structured output, G tracing, H fair share), drawn with matplotlib's Agg
backend from the JSON the scenarios wrote. Every chart has a title, axis
labels with units and a footer naming the machine, the model and the git
revision the figures were measured at. Charts whose data is missing are left
out (a skipped or failed scenario); charts from older result files that lack
the raw samples draw what the file holds and say so in the legend.

Used by ``python -m bench.run`` (also with ``--summary-only``); needs the
bench environment (``make bench-env``: matplotlib is a bench-only dependency).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # NOTE: set before pyplot is imported; no display on servers or CI

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from bench.report import charts, fairness_chart

DPI = 110


@dataclass(frozen=True)
class Chart:
    """One chart: its file name, title and the scenario files it is drawn from."""

    file: str
    title: str
    sources: tuple[str, ...]  # scenario result names (bench/results/<name>.json)
    draw: Callable[[Figure, dict[str, dict[str, Any]]], None]


CHARTS = [
    Chart(
        "throughput.png",
        "A. Generated tokens/s vs concurrent streams",
        ("throughput",),
        charts.throughput,
    ),
    Chart(
        "kv_memory.png",
        "B. KV blocks: pool size and blocks in use, 8 requests",
        ("kv_memory",),
        charts.kv_memory,
    ),
    Chart(
        "prefix_cache.png",
        "C/D. Prefix cache: hit rate and TTFT per scenario",
        ("prefix_reuse", "many_prefixes"),
        charts.prefix_cache,
    ),
    Chart(
        "priority_ttft.png",
        "E. TTFT distribution per tier under mixed load",
        ("priority",),
        charts.priority_ttft,
    ),
    Chart(
        "structured_output.png",
        "F. GenerateJSON vs unconstrained generation",
        ("structured_output",),
        charts.structured_output,
    ),
    Chart("tracing.png", "G. Tracing overhead: tok/s with tracing off and on", ("tracing",), charts.tracing),
    Chart(
        "fairness.png",
        "H. Fair share between tenants, and the cost of TLS and token auth",
        ("fairness",),
        fairness_chart.fairness,
    ),
]


def _load(results: Path, name: str) -> dict[str, Any] | None:
    """The scenario file's document if it ran to completion, else None."""
    path = results / f"{name}.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return doc if doc.get("status", "ok") == "ok" and "results" in doc else None


def footer(docs: list[dict[str, Any]]) -> str:
    """Machine, model, threads and git revision of the figures, with the dates they were measured."""
    runs: dict[str, list[str]] = {}
    for d in docs:
        m = d["machine"]
        quick = " · QUICK (tiny loads)" if m.get("quick") else ""
        line = (
            f"{m['nproc']} cores ({m['cpu']}), {m['mem_gib']} GiB · model {m['model']} · "
            f"llama.cpp threads {m.get('threads', '-')} · git {m['git_rev']}{quick}"
        )
        runs.setdefault(line, []).append(m["date"])
    return "\n".join(f"{line} · measured {', '.join(dates)}" for line, dates in runs.items())


def render_chart(chart: Chart, docs: list[dict[str, Any]], out: Path) -> Path:
    """Draw ``chart`` from ``docs`` (the documents of ``chart.sources``) into ``out``."""
    fig = plt.figure(figsize=(10, 5.6), dpi=DPI)
    try:
        chart.draw(fig, {d["name"]: d["results"] for d in docs})
        fig.suptitle(chart.title, fontsize=13, fontweight="bold")
        text = footer(docs)
        fig.text(0.01, 0.01, text, fontsize=7.5, color="#555555", va="bottom")
        bottom = 0.045 + 0.02 * text.count("\n")
        fig.tight_layout(rect=(0, bottom, 1, 0.97))
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    finally:
        plt.close(fig)
    return out


def render_all(results: Path) -> list[tuple[str, Path]]:
    """Render every chart whose sources are present into ``results/plots``; [(title, path)].

    A chart needs at least one of its source files with status ok; a chart
    whose drawing fails on a malformed file is reported and skipped.
    """
    done: list[tuple[str, Path]] = []
    for chart in CHARTS:
        docs = [d for d in (_load(results, n) for n in chart.sources) if d is not None]
        if not docs:
            continue
        try:
            done.append((chart.title, render_chart(chart, docs, results / "plots" / chart.file)))
        except (KeyError, TypeError, ValueError) as exc:
            print(f"  chart {chart.file} not drawn: {type(exc).__name__}: {exc}", flush=True)
    return done
