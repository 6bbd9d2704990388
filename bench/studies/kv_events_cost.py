"""What publishing KV-cache events costs the engine (issue #38 item 1): step time with and without.

``python -m bench.studies.kv_events_cost [--rounds 2] [--streams 8] [--requests 2]``: one in-process
server per mode, started in turn, each running the same workload through the real lifecycle
(``Intake.collect``): ``--streams`` concurrent streams of ``--requests`` greedy requests that share a
system prompt, 48 new tokens each, with a small idle prefix cache (``--prefix-cache-tokens 64``) so
blocks are registered, evicted and spilled every few steps. Modes, in rotation for ``--rounds``:

* ``off``: no ``--kv-events-endpoint``;
* ``on``: events published, nobody subscribed;
* ``subscribed``: events published to a subscriber in another process that decodes every message.

Per mode: engine steps (wall time, mean and median), the engine thread's own event work per step
(its CPU time in ``KVBlockManager.commit``, ``free`` and ``flush_events``, the only places that
record or hand over events; measured in every mode, so ``off`` is their cost without events), and
batches published (and received by the subscriber), and the publisher thread's CPU time (encoding
and sending) per engine step: it runs beside the engine thread, on the other core.
Writes ``bench/results/kv_events_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from inference.v1 import inference_pb2 as pb

import service.kv_events.publisher as publisher_module
from bench.harness.config import ROOT, say
from bench.harness.results import machine_info, write_result
from service.api.ask import Ask
from service.config import DEFAULT_MODEL, ServerConfig
from service.server import InferenceServer

_ENCODE = publisher_module.encode
SYSTEM = (
    "You are a meticulous assistant for a shipping company. Answer questions about parcels, tracking "
    "numbers, delivery windows, customs forms and refunds. Always be polite, concise and precise. "
) * 3
# A subscriber in its own process: decodes every batch; the server's last batch (AllBlocksCleared) ends it.
SUBSCRIBER = """
import sys, msgpack, zmq
sock = zmq.Context().socket(zmq.SUB); sock.connect(sys.argv[1]); sock.setsockopt(zmq.SUBSCRIBE, b"")
n = 0
while sock.poll(600_000):
    n += 1
    if msgpack.unpackb(sock.recv_multipart()[2])[1] == [["AllBlocksCleared"]] and n > 1:
        break
print(n)
"""


def _timed(record: list[float], fn: Callable[..., Any], clock: Callable[[], float]) -> Callable[..., Any]:
    def wrapper(*args: Any) -> Any:
        t0 = clock()
        try:
            return fn(*args)
        finally:
            record.append(clock() - t0)

    return wrapper


async def _workload(server: InferenceServer, streams: int, requests: int) -> None:
    async def stream(s: int) -> None:
        for r in range(requests):
            sampling = pb.SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
            prompt = f"{SYSTEM}Customer {s}-{r} asks about parcel {1000 * s + r}. Reply:"
            await server.intake.collect(Ask(f"s{s}r{r}", prompt=prompt, sampling=sampling))

    await asyncio.gather(*(stream(s) for s in range(streams)))


async def _one(mode: str, model: str, port: int, streams: int, requests: int) -> dict[str, Any]:
    endpoint = f"tcp://*:{port}" if mode != "off" else ""
    config = ServerConfig(
        model=model, host="127.0.0.1", port=0, http_port=0, threads=2, adaptive_threads=False,
        max_running=streams, batch_db=":memory:", response_cache_bytes=0, prefix_cache_tokens=64,
        kv_events_endpoint=endpoint,
    )
    server = InferenceServer(config)
    await server.start()
    engine = server.engine
    assert engine is not None
    steps: list[float] = []
    kv_work: list[float] = []
    published_work: list[float] = []
    if server.kv_events is not None:  # the publisher thread's CPU per batch: encoding and sending
        publisher = server.kv_events
        publisher._send = _timed(published_work, publisher._send, time.thread_time)  # type: ignore[method-assign]
        publisher_module.encode = _timed(published_work, _ENCODE, time.thread_time)
    engine.step = _timed(steps, engine.step, time.perf_counter)  # type: ignore[method-assign]
    for name in ("commit", "free", "flush_events"):
        # NOTE: the engine thread's CPU time: on a loaded machine, wall time would count preemptions
        setattr(engine.kv, name, _timed(kv_work, getattr(engine.kv, name), time.thread_time))
    sub = None
    if mode == "subscribed":
        sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, f"tcp://127.0.0.1:{port}"],
                               stdout=subprocess.PIPE, text=True)
        await asyncio.sleep(1.0)  # NOTE: the subscription reaches the PUB socket before the work starts
    t0 = time.perf_counter()
    await _workload(server, streams, requests)
    wall = time.perf_counter() - t0
    published = server.kv_events.published if server.kv_events is not None else 0
    dropped = server.kv_events.dropped if server.kv_events is not None else 0
    await server.stop()
    received = int(sub.communicate(timeout=60)[0]) if sub is not None else 0
    return {
        "mode": mode, "steps": len(steps), "wall_s": wall,
        "step_mean_ms": 1000 * statistics.fmean(steps), "step_median_ms": 1000 * statistics.median(steps),
        "kv_work_per_step_us": 1e6 * sum(kv_work) / len(steps), "published": published, "dropped": dropped,
        "received": received, "publisher_cpu_per_step_us": 1e6 * sum(published_work) / len(steps),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--port", type=int, default=5599)
    ap.add_argument("--model", default=str(ROOT / DEFAULT_MODEL), help="the server's default model: short steps")
    args = ap.parse_args(argv)
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for mode in ("off", "on", "subscribed"):
            run = asyncio.run(_one(mode, args.model, args.port, args.streams, args.requests))
            say(f"round {r + 1} {mode}: {run}")
            runs.append(run)
    summary = {}
    for mode in ("off", "on", "subscribed"):
        mine = [x for x in runs if x["mode"] == mode]
        summary[mode] = {k: statistics.median(x[k] for x in mine) for k in mine[0] if k != "mode"}
    off = summary["off"]
    for mode in ("on", "subscribed"):
        s = summary[mode]
        s["step_mean_vs_off"] = s["step_mean_ms"] / off["step_mean_ms"] - 1
        s["kv_work_extra_share_of_step"] = (s["kv_work_per_step_us"] - off["kv_work_per_step_us"]) / (
            1000 * s["step_mean_ms"]
        )
    say(f"summary: {summary}")
    write_result("kv_events_cost", {"machine": machine_info(args.model, False), "runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
