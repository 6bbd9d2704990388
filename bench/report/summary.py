"""Writes ``summary.md`` from the scenario JSON files in the results folder.

Each scenario file is ``{"scenario", "name", "title", "machine", "elapsed_s", "results"}``
(or ``error``/``skipped`` instead of ``results``). The summary is rebuilt from
every file present, so ``--only`` runs refresh their rows and keep the others.
Each scenario's section is its module's ``render`` (``bench/scenarios/``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.harness.config import results_dir, say
from bench.scenarios.catalog import BY_KEY


def _machine_line(m: dict[str, Any]) -> str:
    quick = " · QUICK (tiny loads, not for publishing)" if m.get("quick") else ""
    return (
        f"{m['nproc']} cores ({m['cpu']}), {m['mem_gib']} GiB · model {m['model']} · "
        f"llama-cpp-python {m['llama_cpp_python']} · llama.cpp threads {m.get('threads', '-')}{quick}"
    )


def _when(m: dict[str, Any]) -> str:
    return f"measured {m['date']} at git {m['git_rev']}, load average at start {m['loadavg_at_start'][0]}"


def _section(d: dict[str, Any], first_machine: dict[str, Any]) -> list[str]:
    """One scenario's heading, its rendered results and the run's notes."""
    out = [f"## {d['scenario']}. {d['title']}", ""]
    if _machine_line(d["machine"]) != _machine_line(first_machine):
        out += [f"_Machine: {_machine_line(d['machine'])}_", ""]
    if "results" in d:
        try:
            out.append(BY_KEY[d["scenario"]].render(d["results"]))
        except (KeyError, TypeError, ValueError) as exc:
            out.append(f"(cannot render: {type(exc).__name__}: {exc}; see {d['name']}.json)")
    took = f"took {d.get('elapsed_s', 0):.0f} s"
    if "bench_client_cpu_s" in d:
        took += f" (bench client CPU {d['bench_client_cpu_s']:.0f} s)"
    notes = [d.get("status", "ok"), _when(d["machine"]), took]
    notes += [str(d[k]) for k in ("error", "skipped") if d.get(k)]
    out.append("\n_" + "; ".join(notes) + "_")
    out.append("")
    return out


def render_summary(files: list[Path], charts: list[tuple[str, str]] | None = None) -> str:
    """The markdown summary of the scenario ``files``; ``charts`` = [(title, path relative to it)]."""
    docs = sorted((json.loads(f.read_text()) for f in files), key=lambda d: d["scenario"])
    out = ["# Benchmark results", ""]
    if docs:
        out += [f"Machine: {_machine_line(docs[0]['machine'])}", ""]
    if charts:
        out += ["Charts (`bench/report/plots.py`):", ""]
        out += [f"- [{title}]({rel})" for title, rel in charts]
        out.append("")
    for d in docs:
        out += _section(d, docs[0]["machine"])
    return "\n".join(out)


def render_charts() -> list[tuple[str, Path]]:
    """PNG charts of the results (bench/report/plots.py); none, said loudly, without matplotlib."""
    try:
        from bench.report import plots
    except ModuleNotFoundError as exc:
        if exc.name != "matplotlib":
            raise
        say("CHARTS SKIPPED: matplotlib is not installed (run `make bench-env`)")
        return []
    charts = plots.render_all(results_dir())
    say(f"charts: {', '.join(str(p) for _, p in charts) or 'none (no results)'}")
    return charts


def write_summary() -> Path:
    """Rebuild ``<results>/summary.md`` and the charts from every scenario file in the results folder."""
    files = sorted(
        p for p in results_dir().glob("*.json") if json.loads(p.read_text()).get("scenario") in BY_KEY
    )
    path = results_dir() / "summary.md"
    charts = [(title, str(png.relative_to(results_dir()))) for title, png in render_charts()]
    path.write_text(render_summary(files, charts))
    return path
