"""Scenario K's semantic half: labelled question pairs through the semantic index, no server.

Every pair of each labelled set (paraphrases that should hit, near-misses that must not) goes
through ``SemanticIndex.nearest`` with the stored question as the only entry, at the server's
default threshold: hit rate on paraphrases, false-hit rate on near-misses, 95% intervals (Wilson;
Clopper-Pearson too when SciPy is installed), per kind and over a threshold sweep. The sets and
what each may claim are described in ``k_response_cache``'s docstring.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.harness.config import BenchConfig, say
from bench.harness.stats import clopper_pearson, wilson
from service.config import ServerConfig

DATA = Path(__file__).resolve().parents[1] / "data"
PAIRS = DATA / "semantic_pairs.jsonl"
SETS = {  # name -> file; see k_response_cache's docstring for what each one may claim
    "tuning": PAIRS,
    "heldout": DATA / "semantic_heldout.jsonl",
    "heldout2": DATA / "semantic_heldout2.jsonl",
    "heldout3": DATA / "semantic_heldout3.jsonl",  # the blind one: evaluated once, guard unchanged after
}
POOLED = ("heldout", "heldout2", "heldout3")
SWEEP = (0.85, 0.88, 0.9, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97)


def _rate(k: int, n: int) -> dict[str, Any]:
    return {
        "k": k,
        "n": n,
        "rate": k / n if n else None,
        "wilson95": wilson(k, n),
        "clopper_pearson95": clopper_pearson(k, n),
    }


def _evaluate(rows: list[dict[str, Any]], vectors: dict[str, Any], index: Any, guard: bool) -> dict[str, Any]:
    """Hit rates of ``rows`` through ``index`` (one stored question at a time), or by similarity alone."""
    hits: dict[str, list[int]] = {}
    for r in rows:
        if guard:
            index.add("s", r["a"], vectors[r["a"]], "k")
            hit = index.nearest("s", r["b"], vectors[r["b"]]) == "k"
        else:
            hit = float(vectors[r["a"]] @ vectors[r["b"]]) >= index.threshold
        hits.setdefault(r["kind"], []).append(int(hit))
    para = hits.pop("paraphrase")
    near = [h for kind in hits.values() for h in kind]
    return {
        "hit": _rate(sum(para), len(para)),
        "false_hit": _rate(sum(near), len(near)),
        "false_hit_by_kind": {k: _rate(sum(v), len(v)) for k, v in sorted(hits.items())},
    }


def _semantic_set(model: Any, path: Path, threshold: float) -> dict[str, Any]:
    from service.response_cache.semantic import SemanticIndex

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vectors = dict(zip(texts, model.embed_many(texts), strict=True))
    out: dict[str, Any] = {"file": path.name, "pairs": len(rows)}
    out["default"] = _evaluate(rows, vectors, SemanticIndex(model, threshold), guard=True)
    out["similarity_only"] = _evaluate(rows, vectors, SemanticIndex(model, threshold), guard=False)
    out["sweep"] = {str(th): _evaluate(rows, vectors, SemanticIndex(model, th), guard=True) for th in SWEEP}
    d = out["default"]
    say(
        f"  {path.name} @ {threshold}: hit {d['hit']['k']}/{d['hit']['n']} = {d['hit']['rate']:.1%} of "
        f"paraphrases, false hits {_upper(d['false_hit'])}; similarity alone: false "
        f"{out['similarity_only']['false_hit']['rate']:.2%}"
    )
    return out


def _upper(r: dict[str, Any]) -> str:
    cp = r["clopper_pearson95"]
    return f"{r['k']}/{r['n']} = {r['rate']:.2%} (95% upper: Wilson {r['wilson95'][1]:.2%}" + (
        f", Clopper-Pearson {cp[1]:.2%})" if cp else ")"
    )


def _pooled(sets: dict[str, Any], names: tuple[str, ...], threshold: str | None = None) -> dict[str, Any]:
    """Summed counts of ``names`` (default threshold, or one of the sweep's)."""

    def part(name: str) -> dict[str, Any]:
        return sets[name]["default"] if threshold is None else sets[name]["sweep"][threshold]

    out = {}
    for what in ("hit", "false_hit"):
        out[what] = _rate(sum(part(n)[what]["k"] for n in names), sum(part(n)[what]["n"] for n in names))
    return out


def run_semantic(cfg: BenchConfig) -> dict[str, Any]:
    """Every set of SETS and the pooled held-out figure (see k_response_cache's docstring)."""
    from service.response_cache.semantic import MiniLM, SemanticUnavailable

    try:
        model = MiniLM()
    except SemanticUnavailable as exc:
        return {"skipped": str(exc)}
    texts = [json.loads(line)["b"] for line in PAIRS.read_text().splitlines()[:50]]
    t0 = time.perf_counter()
    for t in texts:  # per-message latency, one at a time as the server embeds
        model.embed(t)
    threshold = ServerConfig().semantic_cache_threshold
    out: dict[str, Any] = {
        "threshold": threshold,
        "embed_ms_per_message": (time.perf_counter() - t0) * 1e3 / len(texts),
    }
    for name, path in SETS.items():
        out[name] = _semantic_set(model, path, threshold)
    sets = {n: out[n] for n in SETS}
    out["pooled_heldout"] = _pooled(sets, POOLED) | {
        "sets": list(POOLED),
        "sweep": {th: _pooled(sets, POOLED, th) for th in out["tuning"]["sweep"]},
    }
    p = out["pooled_heldout"]
    say(
        f"  pooled held-out ({' + '.join(POOLED)}): hit {p['hit']['rate']:.1%}, false hits {_upper(p['false_hit'])}"
    )
    return out


# -- summary.md ------------------------------------------------------------------------------------
def _set_row(name: str, x: dict[str, Any]) -> str:
    d = x.get("default", x)
    fh, hit = d["false_hit"], d["hit"]
    cp = fh["clopper_pearson95"]
    label = f"{name} ({x['file']})" if "file" in x else f"pooled held-out ({' + '.join(x['sets'])})"
    alone = x["similarity_only"]["false_hit"] if "similarity_only" in x else None
    alone_s = f"{alone['k']}/{alone['n']}" if alone else "-"
    cp_s = f"{cp[0]:.2%}-{cp[1]:.2%}" if cp else "-"
    return (
        f"| {label} | {x.get('pairs', hit['n'] + fh['n'])} | {hit['k']}/{hit['n']} = {hit['rate']:.1%} "
        f"| {fh['k']}/{fh['n']} = {fh['rate']:.2%} | {fh['wilson95'][0]:.2%}-{fh['wilson95'][1]:.2%} "
        f"| {cp_s} | {alone_s} |"
    )


def _sweep_lines(s: dict[str, Any], cols: list[str]) -> list[str]:
    out = [
        "",
        "| threshold | " + " | ".join(f"{n}: hit rate | false hits | Wilson upper" for n in cols) + " |",
        "|---|" + "---|---|---|" * len(cols),
    ]
    for th in s["tuning"]["sweep"]:
        cells = []
        for name in cols:
            v = s[name]["sweep"][th]
            fh = v["false_hit"]
            cells.append(f"{v['hit']['rate']:.1%} | {fh['k']}/{fh['n']} | {fh['wilson95'][1]:.1%}")
        out.append(f"| {th} | " + " | ".join(cells) + " |")
    return out


def render_semantic(s: dict[str, Any]) -> list[str]:
    """The semantic half's lines of K's summary.md section: per set, then the threshold sweep."""
    out = [
        f"\nSemantic, threshold {s['threshold']}, {s['embed_ms_per_message']:.1f} ms per embedding. False hits "
        "with 95% upper bounds (Wilson / Clopper-Pearson); target: upper bound <= 1%.",
        "",
        "| set | pairs | paraphrase hits | near-miss false hits | Wilson 95% | Clopper-Pearson 95% "
        "| similarity alone: false hits |",
        "|---|---|---|---|---|---|---|",
    ]
    names = [n for n in SETS if n in s]
    out += [_set_row(name, s[name]) for name in [*names, "pooled_heldout"] if s.get(name) is not None]
    cols = [*names, "pooled_heldout"] if "pooled_heldout" in s else names
    return out + _sweep_lines(s, cols)
