"""Scenario F, part "finish" (F's own half): JSON documents that end, on real-world schemas it has never seen.

A fixed random sample of ``SAMPLE`` JSON Schemas from JSONSchemaBench's dev
split (``$JSONSCHEMABENCH`` or ``../shared/jsonschemabench/dev.jsonl``; seed
``SEED``, ids recorded in the result; only schemas whose compact text is at
most ``MAX_SCHEMA_CHARS`` characters are drawn, so the prompt fits), served by
the default model with ``max_tokens`` = ``MAX_TOKENS`` and the default
sampling (temperature 0.8, seed = the schema's index). Three arms, the same
prompt (one user message asking for an example document, rendered with the
model's chat template) and the same seed in each:

* ``today``: ``json_repeat_penalty`` 0, ``json_finish`` CUT_OFF (the behaviour
  before issue 30);
* ``repeat``: the default repetition control (``json_repeat_penalty`` 0.8);
* ``repeat_finish``: repetition control and ``json_finish`` CLOSE_WITHIN_BUDGET.

Each outcome is one of: valid (ended naturally, FINISH_REASON_STOP),
closed_early (FINISH_REASON_CLOSED), cut_off (OUT_OF_RANGE), rejected (the
schema is refused: INVALID_ARGUMENT / RESOURCE_EXHAUSTED before generation),
failed_validation (the server's final validation refused the document it had
generated, INTERNAL: only approximated schemas), invalid (a *returned* document
that fails ``jsonschema`` here), failed (any other status). The arms of one
schema run back to back in a rotating order on ``CLIENTS`` concurrent clients,
so every arm sees the same load; the load average is recorded every
``LOAD_EVERY`` schemas.

Per-token cost is measured apart, on requests of one shape (the sample's
documents differ in length by arm, and cut-off requests report no timing): a
story in a JSON string that cannot end before ``COST_MIN_LENGTH`` characters,
on a Generate stream with ``max_tokens`` ``COST_TOKENS`` (ignore_eos): every
token is free text the repetition control looks at, and budget-aware
completion watches the end of every request (a request may also end once its
string is long enough). Rounds of ``CLIENTS`` requests of one arm alternate the
arms (A B C C B A ...), the load average is recorded before each round, and
the cost is the server's time per output token after the first, ``(total_ms -
ttft_ms) / (completion_tokens - 1)``, mean per arm.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import jsonschema
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from bench.harness.config import ROOT, BenchConfig, say
from bench.harness.procs import GrpcServer
from bench.harness.tables import Row, fmt, table

SEED = 30
SAMPLE = 120
MAX_TOKENS = 768
MAX_SCHEMA_CHARS = 3000
CLIENTS = 4
LOAD_EVERY = 10
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"  # the service's default model
ARMS: dict[str, dict[str, Any]] = {
    "today": {"json_repeat_penalty": 0.0, "json_finish": pb.JSON_FINISH_CUT_OFF},
    "repeat": {"json_repeat_penalty": 0.8, "json_finish": pb.JSON_FINISH_CUT_OFF},
    "repeat_finish": {"json_repeat_penalty": 0.8, "json_finish": pb.JSON_FINISH_CLOSE_WITHIN_BUDGET},
}
OUTCOMES = ("valid", "closed_early", "cut_off", "rejected", "failed_validation", "invalid", "failed")
ERRORS = {"OUT_OF_RANGE": "cut_off", "INVALID_ARGUMENT": "rejected", "RESOURCE_EXHAUSTED": "rejected"}
VALIDATION = "INTERNAL: generated document failed validation"
COST_TOKENS = 160
COST_MIN_LENGTH = 300
COST_ROUNDS = 6  # per arm
COST_SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": COST_MIN_LENGTH}},
    "required": ["story"],
}
PROMPT = "Write one realistic example JSON document for this JSON Schema. Reply with the JSON only.\n\nSchema: {}"


def dataset_path() -> Path:
    env = os.environ.get("JSONSCHEMABENCH")
    return Path(env) if env else ROOT.parent / "shared" / "jsonschemabench" / "dev.jsonl"


def sample_schemas(path: Path, n: int = SAMPLE, seed: int = SEED) -> list[dict[str, Any]]:
    """The seeded sample: ``n`` rows (id, schema) among those whose compact schema is short enough."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    eligible = sorted(
        (r for r in rows if len(json.dumps(r["schema"], separators=(",", ":"))) <= MAX_SCHEMA_CHARS),
        key=lambda r: r["id"],
    )
    return random.Random(seed).sample(eligible, n)


def _outcome(row: dict[str, Any], arm: str, index: int, stub: pb_grpc.InferenceServiceStub) -> dict[str, Any]:
    schema = json.dumps(row["schema"], separators=(",", ":"))
    req = pb.GenerateJSONRequest(
        messages=[pb.ChatMessage(role="user", content=PROMPT.format(schema))],
        json_schema=schema,
        sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, seed=index, **ARMS[arm]),
    )
    out: dict[str, Any] = {"id": row["id"], "arm": arm}
    try:
        resp = stub.GenerateJSON(req, timeout=1800)
    except grpc.RpcError as exc:
        out["error"] = f"{exc.code().name}: {(exc.details() or '')[:200]}"
        out["outcome"] = _kind(out)
        return out
    closed = resp.finish_reason == pb.FINISH_REASON_CLOSED
    out["outcome"] = "closed_early" if closed else "valid"
    if (problem := _problem(row["schema"], resp.json)) is not None:
        out["outcome"], out["error"] = "invalid", problem
    u, t = resp.usage, resp.timing
    out["completion_tokens"] = u.completion_tokens
    if u.completion_tokens > 1:
        out["tpot_ms"] = (t.total_ms - t.ttft_ms) / (u.completion_tokens - 1)
    return out


def _problem(schema: dict[str, Any], text: str) -> str | None:
    """What a client's own check finds wrong with a returned document (None: valid, or not checkable here).

    NOTE: a schema this plain jsonschema check cannot evaluate (an unresolvable
    ``$ref``, say) is left to the server's own final validation.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}"[:200]
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        err = next(iter(cls(schema).iter_errors(doc)), None)
    except Exception:  # see the NOTE
        return None
    return None if err is None else err.message[:200]


def _kind(r: dict[str, Any]) -> str:
    """The outcome of a request that ended with an error status (see the module docstring)."""
    error = r.get("error", "")
    if error.startswith(VALIDATION):
        return "failed_validation"
    return ERRORS.get(error.split(":", 1)[0], "failed")


def _summary(results: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Outcome counts per arm; an error's outcome is re-derived from its recorded status and message."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        rows = [r for r in results if r["arm"] == arm]
        kinds = [r["outcome"] if r["outcome"] in ("valid", "closed_early") or "completion_tokens" in r else _kind(r)
                 for r in rows]
        counts = {k: kinds.count(k) for k in OUTCOMES}
        out[arm] = {
            **counts,
            "shares": {k: counts[k] / n for k in OUTCOMES},
            "completion_tokens": sum(r.get("completion_tokens", 0) for r in rows),
        }
    return out


def _cost_one(stub: pb_grpc.InferenceServiceStub, arm: str, seed: int) -> dict[str, Any]:
    req = pb.GenerateRequest(
        request_id=f"{arm}-{seed}",
        messages=[pb.ChatMessage(role="user", content="Tell me a long story about a lighthouse keeper.")],
        sampling=pb.SamplingParams(max_tokens=COST_TOKENS, seed=seed, ignore_eos=True, **ARMS[arm]),
        response_format=pb.ResponseFormat(json_schema=json.dumps(COST_SCHEMA)),
    )
    events = list(stub.Generate(iter([req]), timeout=1800))
    last = events[-1]
    if not last.HasField("done"):
        return {"arm": arm, "error": f"{last.error.status}: {last.error.message[:200]}"}
    d = last.done
    tpot = (d.timing.total_ms - d.timing.ttft_ms) / max(d.usage.completion_tokens - 1, 1)
    reason = pb.FinishReason.Name(d.finish_reason)
    return {"arm": arm, "tokens": d.usage.completion_tokens, "tpot_ms": tpot, "finish": reason}


def _cost(stub: pb_grpc.InferenceServiceStub, rounds: int) -> dict[str, Any]:
    """Per-token cost of each arm on fixed-shape requests (see the module docstring)."""
    names = list(ARMS)
    order = [names[i % 3] if (i // 3) % 2 == 0 else names[2 - i % 3] for i in range(3 * rounds)]
    runs: list[dict[str, Any]] = []
    for i, arm in enumerate(order):
        load = os.getloadavg()
        with ThreadPoolExecutor(CLIENTS) as pool:
            seeds = [1000 * i + k for k in range(CLIENTS)]
            done = list(pool.map(_cost_one, [stub] * CLIENTS, [arm] * CLIENTS, seeds))
        runs += [{**r, "round": i, "loadavg": load} for r in done]
    out: dict[str, Any] = {"order": order, "runs": runs}
    for arm in names:
        tpot = [r["tpot_ms"] for r in runs if r["arm"] == arm and "tpot_ms" in r]
        out[arm] = {"requests": len(tpot), "tpot_ms_mean": sum(tpot) / len(tpot) if tpot else None}
    base = out["today"]["tpot_ms_mean"]
    for arm in names:
        mean = out[arm]["tpot_ms_mean"]
        out[arm]["overhead_pct"] = None if not base or mean is None else (mean / base - 1) * 100
    return out


def _drive(stub: pb_grpc.InferenceServiceStub, rows: list[dict[str, Any]], t0: float) -> tuple[list, list]:
    """Every schema in every arm (rotating order), CLIENTS schemas at a time: (results, load samples)."""
    loads: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    names = list(ARMS)

    def one_schema(i: int) -> None:
        if i % LOAD_EVERY == 0:
            with lock:
                loads.append({"schema": i, "t_s": round(time.time() - t0, 1), "loadavg": os.getloadavg()})
        for k in range(len(names)):
            res = _outcome(rows[i], names[(i + k) % len(names)], i, stub)
            with lock:
                results.append(res)
        if i % LOAD_EVERY == LOAD_EVERY - 1:
            say(f"  {i + 1}/{len(rows)} schemas, {time.time() - t0:.0f} s")

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(one_schema, range(len(rows))))
    return results, loads


def run(cfg: BenchConfig) -> dict[str, Any]:
    """The three arms over the seeded sample, then the per-token cost, on one server."""
    path = dataset_path()
    if not path.is_file():
        return {"skipped": f"{path} missing (JSONSchemaBench dev split)"}
    rows = sample_schemas(path, 6 if cfg.quick else SAMPLE)
    t0 = time.time()
    with GrpcServer("F-finish", MODEL, threads=cfg.threads) as srv, grpc.insecure_channel(srv.target) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        results, loads = _drive(stub, rows, t0)
        say("  per-token cost: fixed-shape requests, rounds alternating the arms")
        cost = _cost(stub, 1 if cfg.quick else COST_ROUNDS)
        m = stub.GetMetrics(pb.GetMetricsRequest()).grammar
    summary = _summary(results, len(rows))
    for arm, s in summary.items():
        c = cost[arm]
        say(
            f"  {arm}: valid {s['valid']}, closed early {s['closed_early']}, cut off {s['cut_off']}, "
            f"rejected {s['rejected']}, failed validation {s['failed_validation']}, invalid {s['invalid']}, "
            f"failed {s['failed']}; "
            f"{c['tpot_ms_mean'] or 0:.2f} ms/token ({c['overhead_pct'] or 0:+.1f}%)"
        )
    return {
        "seed": SEED,
        "sample": len(rows),
        "max_tokens": MAX_TOKENS,
        "max_schema_chars": MAX_SCHEMA_CHARS,
        "model": MODEL.name,
        "clients": CLIENTS,
        "arms": {k: {**v, "json_finish": pb.JsonFinish.Name(v["json_finish"])} for k, v in ARMS.items()},
        "schema_ids": [r["id"] for r in rows],
        "summary": summary,
        "cost": cost,
        "server_documents": {"natural": m.documents_natural, "closed": m.documents_closed, "cut_off": m.documents_cut_off},
        "loadavg": loads,
        "wall_s": time.time() - t0,
        "requests": sorted(results, key=lambda r: (r["id"], r["arm"])),
    }


# -- summary.md ------------------------------------------------------------------------------------
HEAD = [
    "arm",
    "valid (natural end)",
    "closed early",
    "cut off",
    "rejected",
    "failed validation",
    "invalid returned",
    "failed",
    "tokens returned",
    "ms/token",
    "vs today",
]
LABELS = {
    "today": "today (no repetition control, cut off)",
    "repeat": "repetition control (json_repeat_penalty 0.8)",
    "repeat_finish": "repetition control + budget-aware completion",
}


def _row(arm: str, s: dict[str, Any], c: dict[str, Any], n: int) -> Row:
    share = [f"{s[k]} ({100 * s[k] / n:.1f}%)" for k in OUTCOMES]
    over = c.get("overhead_pct")
    cost = [fmt(c.get("tpot_ms_mean"), 2), "-" if over is None else f"{over:+.1f}%"]
    return [LABELS[arm], *share, str(s["completion_tokens"]), *cost]


def render(r: dict[str, Any]) -> str:
    """The summary.md lines of part "finish"."""
    if "summary" not in r:
        return f"Part finish: {r.get('skipped', 'not run')}"
    n = r["sample"]
    return "\n".join(
        [
            f"Part finish: {n} JSONSchemaBench dev schemas (seed {r['seed']}, ids in the result file), "
            f"{r['model']}, max_tokens {r['max_tokens']}, {r['clients']} clients, default sampling; the three arms "
            "of a schema run back to back in a rotating order. ms/token: server time per output token after "
            f"the first on fixed-shape requests ({COST_TOKENS} tokens of free text in a JSON string, rounds "
            "alternating the arms), mean per arm.",
            "",
            table(HEAD, [_row(arm, s, r["cost"][arm], n) for arm, s in _summary(r["requests"], n).items()]),
            "",
            "ms/token of the cost rounds, round means per arm (their spread is the run-to-run noise): "
            + "; ".join(f"{arm} {_spread(r['cost'], arm)}" for arm in ARMS),
        ]
    )


def _spread(cost: dict[str, Any], arm: str) -> str:
    means = []
    for rnd in sorted({x["round"] for x in cost["runs"] if x["arm"] == arm}):
        tpot = [x["tpot_ms"] for x in cost["runs"] if x["round"] == rnd and "tpot_ms" in x]
        means.append(sum(tpot) / len(tpot))
    return f"{min(means):.1f}-{max(means):.1f}" if means else "-"
