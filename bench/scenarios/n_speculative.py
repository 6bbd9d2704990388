"""Scenario N — one caller alone: prompt-lookup speculative decoding on vs off.

Two servers side by side (``--speculative`` and ``--no-speculative``), used in
turn, one request at a time, so both see the same machine moment by moment:

* extraction: fields of a given record as JSON (the answer copies spans);
* edit: a paragraph repeated with a few words replaced;
* story: open-ended writing (little to copy).

Each request is greedy with a fixed ``max_tokens`` (``ignore_eos`` off: outputs
end where the model ends them; tok/s counts what was generated). Then 16
concurrent streams on both servers (speculation switches itself off under
load): the throughput must not drop. Server-side counters of drafted/accepted
tokens come from the speculating server's log-free metric (GetMetrics
``generated_tokens_total`` over engine steps).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from inference.v1 import inference_pb2 as pb

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import Stream, channel, closed_loop, get_metrics, next_id, summarize
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import ratio

RECORDS = [
    ("Maria Lopez", "maria.lopez@northwind.example", "+44 20 7946 0831", "Bristol", "Senior analyst"),
    ("Kenji Watanabe", "k.watanabe@contoso.example", "+81 3 5550 1423", "Osaka", "Plant manager"),
    ("Amara Okafor", "amara.okafor@fabrikam.example", "+234 1 555 0192", "Lagos", "Head of sales"),
    ("Lukas Becker", "lukas.becker@adatum.example", "+49 30 5550 7788", "Leipzig", "Data engineer"),
]
PARAGRAPH = (
    "The committee met on Tuesday to review the quarterly budget. After a long discussion the members "
    "agreed to move the library renovation to the spring, to hire two more part-time staff for the "
    "reading room, and to ask the council for a larger grant next year. The chair thanked the "
    "volunteers who ran the book fair and noted that visitor numbers had risen for the third month."
)
STORIES = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a short story about a robot learning to paint.",
    "Write a short story about two rivals stuck in a lift.",
    "Write a short story about a village where it never stops snowing.",
]
MAX_TOKENS = 128


def _workloads() -> dict[str, list[list[pb.ChatMessage]]]:
    def user(text: str) -> list[pb.ChatMessage]:
        return [pb.ChatMessage(role="user", content=text)]

    extraction = [
        user(
            f"Record: name {n}; email {e}; phone {p}; city {c}; title {t}.\n"
            "Return the record as a JSON object with the keys name, email, phone, city and title, "
            "copying every value exactly."
        )
        for n, e, p, c, t in RECORDS
    ]
    swaps = [("Tuesday", "Thursday"), ("spring", "autumn"), ("two", "three"), ("third", "fourth")]
    edit = [
        user(f"Repeat this paragraph word for word, but replace '{a}' with '{b}':\n\n{PARAGRAPH}")
        for a, b in swaps
    ]
    return {"extraction": extraction, "edit": edit, "story": [user(s) for s in STORIES]}


async def _one(target: str, messages: list[pb.ChatMessage]) -> tuple[int, float]:
    """Tokens generated and seconds from send to done, one request alone."""
    sp = pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    req = pb.GenerateRequest(request_id=next_id(), messages=messages, sampling=sp)
    async with channel(target) as ch:
        stream = Stream(ch)
        try:
            t0 = time.perf_counter()
            res = await stream.send(req)
            return (res.tokens if res.ok else 0), time.perf_counter() - t0
        finally:
            await stream.close()


def _alone(targets: dict[str, str], rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, prompts in _workloads().items():
        tot = {mode: [0, 0.0] for mode in targets}
        for _ in range(rounds):
            for messages in prompts:
                for mode, target in targets.items():  # alternate: same moment, both servers
                    toks, secs = asyncio.run(_one(target, messages))
                    tot[mode][0] += toks
                    tot[mode][1] += secs
        row = {m: {"tokens": t, "seconds": round(s, 2), "tok_s": t / s} for m, (t, s) in tot.items()}
        row["speedup"] = ratio(row["on"]["tok_s"], row["off"]["tok_s"])
        out[name] = row
        say(
            f"    {name:>10}: on {row['on']['tok_s']:.1f} tok/s, off {row['off']['tok_s']:.1f} tok/s, x{row['speedup']:.2f}"
        )
    return out


async def _loaded(target: str, prompts: list[list[str]]) -> dict[str, Any]:
    async with channel(target) as ch:
        t0 = time.perf_counter()
        results = await closed_loop(ch, prompts, 64)
        row = summarize(results, time.perf_counter() - t0)
        row["generated_total"] = (await get_metrics(ch)).generated_tokens_total
    return row


def _under_load(targets: dict[str, str], maker: PromptMaker, per_client: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, target in targets.items():
        prompts = [maker.unique(per_client, 30, 60) for _ in range(16)]
        out[mode] = asyncio.run(_loaded(target, prompts))
    out["ratio_on_off"] = ratio(out["on"]["tok_s"], out["off"]["tok_s"])
    say(f"    16 streams: on {out['on']['tok_s']:.1f} tok/s, off {out['off']['tok_s']:.1f} tok/s")
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    rounds, per_client = (1, 1) if cfg.quick else (3, 3)
    threads = cfg.server_threads()
    with (
        GrpcServer("spec-on", cfg.model, "--speculative", threads=threads) as on,
        GrpcServer("spec-off", cfg.model, "--no-speculative", threads=threads) as off,
    ):
        targets = {"on": on.target, "off": off.target}
        for t in targets.values():  # warm both
            asyncio.run(_one(t, [pb.ChatMessage(role="user", content="Hello")]))
        say("  one request at a time")
        alone = _alone(targets, rounds)
        say("  16 streams")
        loaded = _under_load(targets, PromptMaker(cfg.model, seed=99), per_client)
    return {"alone": alone, "loaded": loaded, "max_tokens": MAX_TOKENS}


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario N."""
    lines = [
        "One request at a time, greedy, speculation on vs off (two servers used in turn):",
        "",
        "| workload | on tok/s | off tok/s | speedup |",
        "|---|---|---|---|",
    ]
    for name, row in r["alone"].items():
        lines.append(
            f"| {name} | {row['on']['tok_s']:.1f} | {row['off']['tok_s']:.1f} | {row['speedup']:.2f}x |"
        )
    ld = r["loaded"]
    lines += [
        "",
        f"16 streams: on {ld['on']['tok_s']:.1f} tok/s, off {ld['off']['tok_s']:.1f} tok/s "
        f"(ratio {ld['ratio_on_off']:.2f}; speculation is off while more than --spec-max-running run).",
        "",
        "Targets: extraction >= 1.6x, story within 3%, no loss at 16 streams.",
    ]
    return "\n".join(lines)
