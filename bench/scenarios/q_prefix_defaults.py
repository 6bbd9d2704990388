"""Scenario Q — many system prompts at default flags, against llama.cpp's ``llama-server`` (issue #28 item 5).

Two measurements, both with this server at its **default flags** (plus ``--threads`` as every
scenario and ``--http-port 0``; the response cache stays at its default too: every request here is
unique, so it never replays):

* **T1, many system prompts.** Scenario D's workload: 32 distinct ~500-token system prompts used
  round-robin by 8 closed-loop clients, each request = one system prompt + ``"\\nUser: "`` + 12
  unique words, 16 greedy tokens (``ignore_eos``). One fill pass over the 32 prompts, then two
  measured passes (64 requests). Arm ``ours``: this server over gRPC ``Generate``; arm
  ``llama_server``: llama.cpp's ``llama-server`` (``make llama-tools``; ``LLAMA_SERVER`` overrides
  the path) with ``-np 32 -kvu -c 32768`` (one slot per system prompt, one unified KV cache that
  holds all of them; ``cache_prompt`` at its default, true) over streamed ``/v1/completions``.
  Reported: requests/s over the measured passes, TTFT p50/p99, and this server's prefix hit rate
  (GetMetrics kv counters, delta over the measured passes; llama-server's ``cache_n`` where it
  reports it). Target: ours >= 2x llama-server's requests/s.
* **T2, a request that shares no prefix.** Right after ``ours``' T1 load, on the same server (its
  cache holding whatever the defaults kept of the 32 prompts), ``BENCH_Q_PROBES`` (3) probes one
  at a time: a unique 500-token prompt, 64 greedy tokens. Arm ``empty``: each of the same probes on
  a freshly started server (one fresh server per probe, so its cache is empty; a 4-token warm-up
  request first, too short to leave a cached block). Reported: TTFT and decode tok/s
  (tokens after the first / time after the first token) of each probe, medians. Target: loaded
  within 5% of empty (TTFT <= 1.05x, decode tok/s >= 0.95x).

Every arm starts its own server, arms run in the order ours, empty, llama_server in every round
(``BENCH_Q_ROUNDS``, default 2), all on the same prompts, and ``uptime`` is recorded before each arm.
``BENCH_Q_SOURCE=DIR`` runs this server from another checkout's code (its gRPC stubs generated:
``make stubs``); ``BENCH_Q_NP`` and ``BENCH_Q_PEER_CTX`` change llama-server's ``-np`` and ``-c``, and
``BENCH_Q_PEER_FLAGS`` adds flags to it (e.g. ``--swa-full``: at its defaults llama-server
reuses ~3% of these prompts on Gemma 3; see bench/results/NOTES.md).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from bench.harness.config import ROOT, BenchConfig, say
from bench.harness.grpc_load import ReqResult, channel, closed_loop, get_metrics, summarize
from bench.harness.procs import GrpcServer, LlamaServer, llama_server_binary
from bench.harness.prompts import PromptMaker
from bench.harness.results import load_now
from bench.harness.stats import latency_summary, ratio
from bench.harness.tables import dig, fmt, table, verdict

CLIENTS = 8
MAX_TOKENS = 16  # as scenario D
PROBE_MAX_TOKENS = 64
PEER_CTX = 32768  # 32 x ~520 tokens (prompts + outputs) fit with room to spare
RATIO_TARGET = 2.0
WITHIN = 0.05
SWITCH_LINE = "compute threads now"  # service/threads/adaptive.py's log line on a thread-count switch


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _round_robin(systems: list[str], maker: PromptMaker, passes: int) -> list[list[str]]:
    """Requests k = 0, 1, ... use system prompt k % len(systems); client i takes every CLIENTS-th request."""
    total = len(systems) * passes
    reqs = [systems[k % len(systems)] + "\nUser: " + maker.words(12) for k in range(total)]
    return [reqs[i::CLIENTS] for i in range(CLIENTS)]


def _kv(m: Any) -> dict[str, Any]:
    """All of GetMetrics' kv fields (whatever the server's proto has), uint64 strings as ints."""
    d = MessageToDict(m.kv, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return {k: int(v) if isinstance(v, str) and v.isdigit() else v for k, v in d.items()}


def _cache_stats(results: list[ReqResult]) -> dict[str, Any]:
    """Prompt and cached tokens as the answers reported them (usage / llama-server's ``cache_n``)."""
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    return {"prompt_tokens": prompt, "cached_tokens": cached, "cached_share": cached / prompt if prompt else None}


def _switches(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count(SWITCH_LINE)
    except OSError:
        return 0


def _probe_row(r: ReqResult, kv_before: dict[str, Any]) -> dict[str, Any]:
    e2e_s = r.end - r.start
    ttft_s = (r.ttft_ms or 0.0) / 1000.0
    decode_s = e2e_s - ttft_s
    return {
        "ok": r.ok,
        "error": r.error,
        "ttft_ms": r.ttft_ms,
        "server_ttft_ms": r.server_ttft_ms,
        "e2e_ms": e2e_s * 1000.0,
        "tokens": r.tokens,
        "decode_tok_s": (r.tokens - 1) / decode_s if r.ok and r.tokens > 1 and decode_s > 0 else None,
        "e2e_tok_s": r.tokens / e2e_s if r.ok and e2e_s > 0 else None,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "kv_blocks_cached_before": kv_before.get("blocks_cached"),
        "kv_holder_seq_ids_before": kv_before.get("holder_seq_ids"),
    }


async def _probe(ch: Any, prompt: str, max_tokens: int) -> dict[str, Any]:
    kv_before = _kv(await get_metrics(ch))
    (r,) = await closed_loop(ch, [[prompt]], max_tokens)
    return _probe_row(r, kv_before)


async def _ours(target: str, fill: list[list[str]], measured: list[list[str]], probes: list[str],
                probe_tokens: int) -> dict[str, Any]:
    """T1 on a fresh server (fill pass, measured passes), then T2's probes on the loaded server."""
    async with channel(target) as ch:
        t0 = time.perf_counter()
        first = summarize(await closed_loop(ch, fill, MAX_TOKENS), time.perf_counter() - t0)
        kv0 = _kv(await get_metrics(ch))
        t0 = time.perf_counter()
        results = await closed_loop(ch, measured, MAX_TOKENS)
        row = summarize(results, time.perf_counter() - t0)
        kv1 = _kv(await get_metrics(ch))
        load = load_now()
        loaded = [await _probe(ch, p, probe_tokens) for p in probes]
        kv2 = _kv(await get_metrics(ch))
    hits = int(kv1["prefix_hit_tokens"]) - int(kv0["prefix_hit_tokens"])
    prompts = int(kv1["prompt_tokens"]) - int(kv0["prompt_tokens"])
    row.update(
        first_pass=first,
        prefix_hit_tokens=hits,
        prompt_tokens=prompts,
        prefix_hit_rate=hits / prompts if prompts else None,
        client_cache=_cache_stats(results),
        server_ttft=latency_summary([r.server_ttft_ms for r in results if r.ok]),
        kv_after_fill=kv0,
        kv_after_measured=kv1,
        kv_after_probes=kv2,
    )
    return {"t1": row, "t2_loaded": loaded, "load_before_probes": load}


async def _empty_probe(target: str, prompt: str, probe_tokens: int) -> dict[str, Any]:
    async with channel(target) as ch:
        await closed_loop(ch, [["Hello"]], 4)  # warm-up: ~6 tokens, less than one cached block
        return await _probe(ch, prompt, probe_tokens)


async def _peer(base_url: str, fill: list[list[str]], measured: list[list[str]]) -> dict[str, Any]:
    from bench.harness import sse_load  # NOTE: httpx is a bench-env dependency

    t0 = time.perf_counter()
    first = summarize(await sse_load.closed_loop(base_url, "peer", fill, MAX_TOKENS), time.perf_counter() - t0)
    t0 = time.perf_counter()
    results = await sse_load.closed_loop(base_url, "peer", measured, MAX_TOKENS)
    row = summarize(results, time.perf_counter() - t0)
    row.update(first_pass=first, client_cache=_cache_stats(results))
    return row


def _flags(argv: list[str], drop: tuple[str, ...]) -> str:
    """The command line's flags without the ones that only place it (model path, host, port)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in drop:
            skip = True
        else:
            out.append(a)
    return " ".join(out)


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=False).stdout.strip()


def _git_rev(path: Path) -> str:
    """HEAD of the checkout that serves, the last commit that changed its service/, and whether it is dirty."""
    rev = _git(path, "rev-parse", "--short", "HEAD") or "unknown"
    last = _git(path, "log", "-1", "--format=%h", "--", "service")
    dirty = " +uncommitted service/ changes" if _git(path, "status", "--porcelain", "--", "service") else ""
    return f"{rev} (service/ last changed in {last or 'unknown'}){dirty}"


def run(cfg: BenchConfig) -> dict[str, Any]:
    peer_bin = llama_server_binary()  # skip early when the peer is not built
    source = Path(os.environ.get("BENCH_Q_SOURCE", ROOT)).resolve()
    maker = PromptMaker(cfg.model, seed=4343)
    if cfg.quick:
        n_sys, length, passes, rounds, n_probes, probe_len, probe_tokens = 8, 150, 1, 1, 1, 150, 16
    else:
        n_sys, length, passes = 32, 500, 2
        rounds, n_probes = _env_int("BENCH_Q_ROUNDS", 2), _env_int("BENCH_Q_PROBES", 3)
        probe_len, probe_tokens = 500, PROBE_MAX_TOKENS
    np_, peer_ctx = _env_int("BENCH_Q_NP", n_sys), _env_int("BENCH_Q_PEER_CTX", PEER_CTX)
    peer_extra = shlex.split(os.environ.get("BENCH_Q_PEER_FLAGS", ""))
    systems = [maker.text(length) for _ in range(n_sys)]
    fill = _round_robin(systems, maker, 1)
    measured = _round_robin(systems, maker, passes)
    probes_by_round = [[maker.text(probe_len) for _ in range(n_probes)] for _ in range(rounds)]
    out: dict[str, Any] = {
        "system_prompts": n_sys,
        "system_prompt_tokens": length,
        "clients": CLIENTS,
        "measured_requests": n_sys * passes,
        "max_tokens": MAX_TOKENS,
        "probe_prompt_tokens": probe_len,
        "probe_max_tokens": probe_tokens,
        "probes_per_round": n_probes,
        "rounds": rounds,
        "service_source": str(source),
        "service_git_rev": _git_rev(source),
        "runs": {"ours": [], "empty": [], "llama_server": []},
    }
    for r in range(rounds):
        say(f"  round {r}: arms ours (T1 + T2 loaded), empty (T2), llama_server (T1)")
        load = load_now()
        with GrpcServer(f"Q-ours-r{r}", cfg.model, threads=cfg.threads, source=source,
                        response_cache_off=False) as srv:
            out["ours_argv"] = srv.argv
            out["ours_flags"] = _flags(srv.argv[3:], drop=("--model", "--host", "--port"))
            row = asyncio.run(_ours(srv.target, fill, measured, probes_by_round[r], probe_tokens))
        row.update(round=r, **load, thread_switches=_switches(srv.log_path))
        out["runs"]["ours"].append(row)
        t1 = row["t1"]
        say(f"    ours: {t1['req_s']:.3f} req/s, TTFT p50 {t1['ttft']['p50_ms']:.0f} ms p99 "
            f"{t1['ttft']['p99_ms']:.0f} ms, hit rate {(t1['prefix_hit_rate'] or 0) * 100:.1f}%, "
            f"{t1['failed']} failed (load1 {load['load1']:.2f}); probes TTFT "
            + ", ".join(f"{fmt(p['ttft_ms'], 0)} ms / {fmt(p['decode_tok_s'])} tok/s" for p in row["t2_loaded"]))
        load = load_now()
        empty = []
        for i, prompt in enumerate(probes_by_round[r]):
            with GrpcServer(f"Q-empty-r{r}-p{i}", cfg.model, threads=cfg.threads, source=source,
                            response_cache_off=False) as srv:
                probe = asyncio.run(_empty_probe(srv.target, prompt, probe_tokens))
            probe["thread_switches"] = _switches(srv.log_path)
            empty.append(probe)
        out["runs"]["empty"].append({"round": r, **load, "t2_empty": empty})
        say(f"    empty (load1 {load['load1']:.2f}): probes TTFT "
            + ", ".join(f"{fmt(p['ttft_ms'], 0)} ms / {fmt(p['decode_tok_s'])} tok/s" for p in empty))
        load = load_now()
        with LlamaServer(f"Q-llama-server-r{r}", peer_bin, cfg.model, parallel=np_, ctx=peer_ctx,
                         threads=cfg.server_threads(), extra=peer_extra) as peer:
            out["llama_server_argv"] = peer.argv
            out["llama_server_flags"] = _flags(peer.argv[1:], drop=("-m", "--host", "--port"))
            prow = asyncio.run(_peer(peer.base_url, fill, measured))
        prow.update(round=r, **load)
        out["runs"]["llama_server"].append(prow)
        say(f"    llama_server: {prow['req_s']:.3f} req/s, TTFT p50 {prow['ttft']['p50_ms']:.0f} ms p99 "
            f"{prow['ttft']['p99_ms']:.0f} ms, cached share {fmt(prow['client_cache']['cached_share'], 3)}, "
            f"{prow['failed']} failed (load1 {load['load1']:.2f})")
    out.update(_summary(out["runs"]))
    s = out["summary"]
    say(f"  T1 req/s ours / llama-server (medians of rounds): {fmt(s['t1_req_s_ratio'], 2)}; "
        f"T2 loaded / empty: TTFT {fmt(s['t2_ttft_ratio'], 3)}, decode tok/s {fmt(s['t2_decode_ratio'], 3)}")
    return out


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ours = [x["t1"] for x in runs["ours"]]
    peer = runs["llama_server"]
    loaded = [p for x in runs["ours"] for p in x["t2_loaded"] if p["ok"]]
    empty = [p for x in runs["empty"] for p in x["t2_empty"] if p["ok"]]
    s: dict[str, Any] = {
        "ours_req_s": [x["req_s"] for x in ours],
        "llama_server_req_s": [x["req_s"] for x in peer],
        "ours_req_s_median": _median([x["req_s"] for x in ours]),
        "llama_server_req_s_median": _median([x["req_s"] for x in peer]),
        "t1_req_s_ratio_by_round": [ratio(a["req_s"], b["req_s"]) for a, b in zip(ours, peer, strict=True)],
        "ours_ttft_p50_ms": _median([dig(x, "ttft", "p50_ms") for x in ours]),
        "ours_ttft_p99_ms": _median([dig(x, "ttft", "p99_ms") for x in ours]),
        "llama_server_ttft_p50_ms": _median([dig(x, "ttft", "p50_ms") for x in peer]),
        "llama_server_ttft_p99_ms": _median([dig(x, "ttft", "p99_ms") for x in peer]),
        "ours_prefix_hit_rate": _median([x["prefix_hit_rate"] for x in ours]),
        "llama_server_cached_share": _median([dig(x, "client_cache", "cached_share") for x in peer]),
        "t2_loaded_ttft_ms": _median([p["ttft_ms"] for p in loaded]),
        "t2_empty_ttft_ms": _median([p["ttft_ms"] for p in empty]),
        "t2_loaded_decode_tok_s": _median([p["decode_tok_s"] for p in loaded]),
        "t2_empty_decode_tok_s": _median([p["decode_tok_s"] for p in empty]),
        "t2_loaded_e2e_ms": _median([p["e2e_ms"] for p in loaded]),
        "t2_empty_e2e_ms": _median([p["e2e_ms"] for p in empty]),
        "t2_probes": [len(loaded), len(empty)],
    }
    s["t1_req_s_ratio"] = ratio(s["ours_req_s_median"], s["llama_server_req_s_median"])
    s["t2_ttft_ratio"] = ratio(s["t2_loaded_ttft_ms"], s["t2_empty_ttft_ms"])
    s["t2_decode_ratio"] = ratio(s["t2_loaded_decode_tok_s"], s["t2_empty_decode_tok_s"])
    s["t2_e2e_ratio"] = ratio(s["t2_loaded_e2e_ms"], s["t2_empty_e2e_ms"])
    return {"summary": s}


# -- summary.md ------------------------------------------------------------------------------------
def _rates(xs: list[float | None], digits: int = 3) -> str:
    return " / ".join(fmt(x, digits) for x in xs)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario Q."""
    s = r["summary"]
    runs = r["runs"]
    loads = {arm: " / ".join(f"{x['load1']:.2f}" for x in runs[arm]) for arm in runs}
    t1_rows = [
        ["this server (defaults)", _rates(s["ours_req_s"]), fmt(s["ours_req_s_median"], 3),
         f"{fmt(s['ours_ttft_p50_ms'], 0)} / {fmt(s['ours_ttft_p99_ms'], 0)}",
         f"{_pct(s['ours_prefix_hit_rate'])} (GetMetrics)", loads["ours"]],
        ["llama-server", _rates(s["llama_server_req_s"]), fmt(s["llama_server_req_s_median"], 3),
         f"{fmt(s['llama_server_ttft_p50_ms'], 0)} / {fmt(s['llama_server_ttft_p99_ms'], 0)}",
         f"{_pct(s['llama_server_cached_share'])} (its usage.cached_tokens)", loads["llama_server"]],
    ]
    t1_head = ["T1 arm", "req/s by round", "req/s median", "TTFT p50 / p99 ms (median of rounds)",
               "prompt tokens from cache", "load1 before each arm"]
    t2_rows = [
        ["after the T1 load", fmt(s["t2_loaded_ttft_ms"], 0), fmt(s["t2_loaded_decode_tok_s"]),
         fmt(s["t2_loaded_e2e_ms"], 0),
         " / ".join(str(p["kv_blocks_cached_before"]) for x in runs["ours"] for p in x["t2_loaded"]),
         str(s["t2_probes"][0])],
        ["fresh server, empty cache", fmt(s["t2_empty_ttft_ms"], 0), fmt(s["t2_empty_decode_tok_s"]),
         fmt(s["t2_empty_e2e_ms"], 0),
         " / ".join(str(p["kv_blocks_cached_before"]) for x in runs["empty"] for p in x["t2_empty"]),
         str(s["t2_probes"][1])],
    ]
    t2_head = ["T2 probe on", "TTFT ms (median)", "decode tok/s (median)", "e2e ms (median)",
               "KV blocks cached before each probe", "probes"]
    ttft, dec = s["t2_ttft_ratio"], s["t2_decode_ratio"]
    return "\n".join([
        f"Default flags. T1: {r['system_prompts']} distinct ~{r['system_prompt_tokens']}-token system prompts "
        f"round-robin, {r['clients']} closed-loop clients, {r['max_tokens']} greedy tokens; a fill pass, then "
        f"{r['measured_requests']} measured requests; {r['rounds']} rounds, arms alternating (ours, empty, "
        f"llama-server), each on a fresh server. T2: {r['probes_per_round']} probe(s) per round, a unique "
        f"{r['probe_prompt_tokens']}-token prompt and {r['probe_max_tokens']} greedy tokens, one at a time. "
        f"Service code: {r['service_source']} at {r['service_git_rev']}.",
        "",
        table(t1_head, t1_rows),
        "",
        f"- T1 requests/s, this server / llama-server (medians of rounds): **{fmt(s['t1_req_s_ratio'], 2)}x** "
        f"(by round {_rates(s['t1_req_s_ratio_by_round'], 2)}; target >= {RATIO_TARGET:.0f}x: "
        f"{verdict(s['t1_req_s_ratio'], RATIO_TARGET)})",
        "",
        table(t2_head, t2_rows),
        "",
        f"- T2 loaded / empty: TTFT **{fmt(ttft, 3)}** (target <= {1 + WITHIN:.2f}: "
        f"{verdict(ttft, 1 + WITHIN, higher_is_better=False)}), decode tok/s **{fmt(dec, 3)}** (target >= "
        f"{1 - WITHIN:.2f}: {verdict(dec, 1 - WITHIN)}), end to end {fmt(s['t2_e2e_ratio'], 3)}",
        f"- This server: `{r.get('ours_flags', '')}`; llama-server: `{r.get('llama_server_flags', '')}`",
    ])
