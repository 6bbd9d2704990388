"""Routing by KV-cache events across 3 replicas, against round robin, ``prefix_affinity`` and one big cache.

``python -m bench.studies.prefix_routing [--rounds 2] [--systems 24] [--system-tokens 400] [--passes 2]``
(run it under ``flock /tmp/bench.lock``). Issue #38's targets: routed by the events, the 3 replicas
serve from cache >= 90% of the prompt tokens one replica with three times the cache serves, at
>= 2x round robin's requests/s.

Workload: ``--systems`` distinct system prompts of ``--system-tokens`` tokens (seeded random words,
the benchmark model's tokens) and short user turns (12 random words), chat messages, 16 output
tokens (greedy, ``ignore_eos``), from ``--clients`` closed-loop clients (threads). A fill pass (each
system prompt once, unmeasured), then ``--passes`` measured passes, each a seeded shuffle of the
system prompts (a fixed order would let round robin meet the same replica for a prompt each pass).

Caches: each replica keeps ``--pool-tokens`` idle tokens in its KV pool and a ``--host-mib`` host
tier; the system prompts exceed one replica's cache and fit in three. Arms, fresh servers each
(cold caches), alternating, ``--rounds`` times, ``uptime`` recorded before each:

* ``events``: 3 replicas with KV-cache events on; ``bench.harness.prefix_router.PrefixRouter``
  renders each chat on a replica's ``/v1/chat/completions/render``, hashes its blocks and sends it
  (gRPC) to the replica holding the longest prefix (ties: fewest in flight);
* ``round_robin``: the same 3 replicas behind the Python client's round_robin;
* ``prefix_affinity``: the Python client's ``prefix_affinity`` (the ring keyed by system message);
* ``single``: ONE replica with three times the pool and the host tier.

Every replica runs ``--threads 1``; the 3 replicas share this machine's 2 cores, so requests/s
compares the 3-replica arms under the same constraint. Per arm: prompt tokens served from cache /
prompt tokens (the servers' ``usage.cached_tokens``, measured passes), requests/s over the measured
passes, TTFT percentiles, requests per replica. Writes ``bench/results/prefix_routing.json``.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from inference_client import Delta, Done, InferenceClient

from bench.harness.config import DEFAULT_MODEL, say
from bench.harness.prefix_router import Endpoint, PrefixRouter
from bench.harness.procs import GrpcServer, free_port
from bench.harness.prompts import PromptMaker
from bench.harness.results import load_now, machine_info, write_result
from bench.harness.stats import latency_summary, ratio

ARMS = ("events", "round_robin", "prefix_affinity", "single")
REPLICAS = 3
MAX_TOKENS = 16
Chat = list[dict[str, str]]


def workload(model: str, systems: int, tokens: int, passes: int, seed: int) -> tuple[list[Chat], list[Chat]]:
    """(fill pass, measured passes): chats of a system prompt and a short user turn."""
    maker = PromptMaker(model, seed=seed)
    prompts = [maker.text(tokens) for _ in range(systems)]
    rng = random.Random(seed)

    def chat(k: int) -> Chat:
        return [{"role": "system", "content": prompts[k]}, {"role": "user", "content": maker.words(12)}]

    measured = [chat(k) for _ in range(passes) for k in rng.sample(range(systems), systems)]
    return [chat(k) for k in range(systems)], measured


def _generate(client: InferenceClient, messages: Chat) -> tuple[Done, float | None]:
    t0, first, done = time.perf_counter(), None, None
    for event in client.generate(messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True):
        if first is None and isinstance(event, Delta) and event.token_ids:
            first = 1000 * (time.perf_counter() - t0)
        if isinstance(event, Done):
            done = event
    assert done is not None, "a generation ended without Done"
    return done, first


def closed_loop(send: Callable[[Chat], tuple[Done, float | None]], chats: list[Chat], clients: int) -> dict[str, Any]:
    """``clients`` threads, client i sending every ``clients``-th chat in turn; usage and TTFTs."""
    rows: list[tuple[int, int, float | None]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def run(mine: list[Chat]) -> None:
        for messages in mine:
            try:
                done, ttft = send(messages)
                with lock:
                    rows.append((done.usage.prompt_tokens, done.usage.cached_tokens, ttft))
            except Exception as exc:  # counted and reported
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(chats[i::clients],)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    prompt, cached = sum(r[0] for r in rows), sum(r[1] for r in rows)
    return {
        "requests": len(rows), "failed": len(errors), "errors": sorted(set(errors))[:5], "wall_s": wall,
        "requests_per_s": len(rows) / wall, "prompt_tokens": prompt, "cached_tokens": cached,
        "cached_fraction": cached / prompt if prompt else None,
        "ttft": latency_summary([r[2] for r in rows if r[2] is not None]),
    }


def _flags(args: argparse.Namespace, scale: int) -> list[str]:
    ctx = 8 * (args.system_tokens + 64) + scale * args.pool_tokens + 512  # the running requests and the idle cap
    return ["--ctx", str(ctx), "--max-running", "8", "--prefix-cache-tokens", str(scale * args.pool_tokens),
            "--prefix-host-cache-mib", str(scale * args.host_mib)]


def _requests(monitors: list[InferenceClient]) -> list[int]:
    return [int(m.metrics(timeout=30).requests_total) for m in monitors]


def run_arm(arm: str, args: argparse.Namespace, fill: list[Chat], measured: list[Chat]) -> dict[str, Any]:
    """Fresh servers for ``arm``, the fill pass, then the measured passes."""
    n, scale = (1, REPLICAS) if arm == "single" else (REPLICAS, 1)
    with ExitStack() as stack:
        events = [(free_port(), free_port(), free_port()) for _ in range(n)] if arm == "events" else []
        servers = []
        for i in range(n):
            extra = []
            if events:
                http, pub, replay = events[i]
                extra = ["--http-port", str(http), "--kv-events-endpoint", f"tcp://*:{pub}",
                         "--kv-events-replay-endpoint", f"tcp://*:{replay}"]
            server = GrpcServer(f"routing-{arm}-{i}", args.model, *_flags(args, scale), *extra, threads=1)
            servers.append(stack.enter_context(server))
        monitors = [stack.enter_context(InferenceClient(s.target)) for s in servers]
        send = _sender(arm, stack, servers, events)
        closed_loop(send, fill, args.clients)
        before = _requests(monitors)
        out = closed_loop(send, measured, args.clients)
        out["requests_per_replica"] = [b - a for a, b in zip(before, _requests(monitors), strict=True)]
    return out


def _sender(arm: str, stack: ExitStack, servers: list[GrpcServer],
            events: list[tuple[int, int, int]]) -> Callable[[Chat], tuple[Done, float | None]]:
    """How ``arm`` sends one chat."""
    if arm == "events":
        router = stack.enter_context(PrefixRouter([
            Endpoint(f"r{i}", f"http://127.0.0.1:{h}", f"tcp://127.0.0.1:{p}", f"tcp://127.0.0.1:{r}")
            for i, (h, p, r) in enumerate(events)]))
        clients = [stack.enter_context(InferenceClient(s.target, timeout=600)) for s in servers]

        def routed(messages: Chat) -> tuple[Done, float | None]:
            ids = router.render_chat(messages)  # NOTE: part of the arm's cost: timed with the request
            with router.route(ids) as decision:
                return _generate(clients[decision.replica], messages)

        return routed
    target = servers[0].target if arm == "single" else "ipv4:" + ",".join(s.target for s in servers)
    balancing = {"single": "auto", "round_robin": "round_robin", "prefix_affinity": "prefix_affinity"}[arm]
    client = stack.enter_context(InferenceClient(target, timeout=600, balancing=balancing))
    return lambda messages: _generate(client, messages)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm: pooled cached fraction, mean requests/s; the targets against single and round_robin."""
    out: dict[str, Any] = {}
    for arm, rs in runs.items():
        prompt, cached = sum(r["prompt_tokens"] for r in rs), sum(r["cached_tokens"] for r in rs)
        out[arm] = {
            "cached_fraction": cached / prompt if prompt else None,
            "cached_fraction_per_round": [r["cached_fraction"] for r in rs],
            "requests_per_s": sum(r["requests_per_s"] for r in rs) / len(rs),
            "requests_per_s_per_round": [r["requests_per_s"] for r in rs],
            "failed": sum(r["failed"] for r in rs),
        }
    ev, single, rr = out.get("events"), out.get("single"), out.get("round_robin")
    if ev and single and rr:
        cache_ratio = ratio(ev["cached_fraction"], single["cached_fraction"])
        rps_ratio = ratio(ev["requests_per_s"], rr["requests_per_s"])
        out["targets"] = {
            "events_cached_vs_single": cache_ratio, "cached_met": (cache_ratio or 0) >= 0.9,
            "events_rps_vs_round_robin": rps_ratio, "rps_met": (rps_ratio or 0) >= 2.0,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="the benchmark model")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--systems", type=int, default=24)
    ap.add_argument("--system-tokens", type=int, default=400)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--pool-tokens", type=int, default=1024, help="each replica's --prefix-cache-tokens")
    ap.add_argument("--host-mib", type=int, default=80, help="each replica's --prefix-host-cache-mib")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--seed", type=int, default=3838)
    args = ap.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    assert set(arms) <= set(ARMS), f"arms are {ARMS}"
    fill, measured = workload(args.model, args.systems, args.system_tokens, args.passes, args.seed)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for rnd in range(args.rounds):
        for arm in arms if rnd % 2 == 0 else arms[::-1]:  # NOTE: alternating order: drifting load hits every arm
            load = load_now()
            r = run_arm(arm, args, fill, measured)
            r.update(round=rnd + 1, load_before=load)
            runs[arm].append(r)
            say(f"round {rnd + 1} {arm} (load {load['load1']:.2f}): cached {100 * (r['cached_fraction'] or 0):.1f}%, "
                f"{r['requests_per_s']:.3f} req/s, per replica {r['requests_per_replica']}, {r['failed']} failed")
    summary = summarize(runs)
    say(f"summary: {summary}")
    params = {k: v for k, v in vars(args).items() if k != "model"}
    write_result("prefix_routing", {"machine": machine_info(args.model, False), "params": params,
                                    "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
