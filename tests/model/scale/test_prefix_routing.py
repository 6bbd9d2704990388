"""Routing by KV-cache events across 3 replicas on hosts of their own (issue #38 item 4).

Three servers (the default model, 1 thread), each in its own network namespace
(tests/support/netns.py) with its KV-cache events on (``tcp://*:5557``, replay on 5558) and a small
prefix cache: ``--prefix-cache-tokens 256`` idle tokens in the KV pool plus a 12 MiB host tier
(12 MiB / 23,040 bytes per token of SmolLM2-135M's f16 KV = 546 tokens), 802 tokens in all. Six
system prompts of ~180 tokens (~1,120 with their chat template and questions) exceed that, and fit in three.

A ``PrefixRouter`` (bench/harness/prefix_router.py: a decoder written from vLLM's wire format, not the
server's code) runs on a client host: it subscribes to the three replicas' events, renders each chat
through a replica's ``/v1/chat/completions/render``, computes the request's block hash chain and
sends the request to the replica holding its longest prefix. Three rounds over the six system
prompts, one request at a time (so each choice is deterministic), 4 output tokens each.

Proved: the first round spreads the system prompts two per replica; every later request reaches
the replica holding its system prompt (the router's index says so, and the server's
``usage.prompt_tokens_details.cached_tokens`` shows it served from cache); at quiescence the index
rebuilt from each replica's events equals that replica's own (``KVBlockManager.indexed``, reached
through ``tests.support.indexed_replica``), both tiers, and together the replicas hold all six
system prompts while none holds all of them.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.harness.prefix_router import Endpoint, chain_hashes
from tests.support.client_host import ClientHost
from tests.support.netns import Network
from tests.support.routed_calls import routed_chats
from tests.support.server import DEFAULT_MODEL, ROOT

pytestmark = pytest.mark.model

BLOCK = 16
MODEL = "SmolLM2-135M-Instruct.Q4_1"
POOL_TOKENS, HOST_MIB, KV_BYTES_PER_TOKEN = 256, 12, 23_040
CAPACITY = POOL_TOKENS + HOST_MIB * 2**20 // KV_BYTES_PER_TOKEN  # one replica's cache, in tokens
SHOPS = ["Bakery", "Bicycle", "Florist", "Hardware", "Bookshop", "Pharmacy"]
QUESTIONS = ["When do you open?", "Do you deliver?", "Can I pay by card?"]
WORDS = ["order", "parcel", "receipt", "refund", "opening", "hours", "delivery", "address", "invoice", "discount",
         "voucher", "stock", "shelf", "aisle", "counter", "basket", "price", "label", "queue", "weekend"]
ROUNDS, MAX_TOKENS = len(QUESTIONS), 4
FLAGS = ["--threads", "1", "--ctx", "2048", "--max-running", "4", "--response-cache-bytes", "0",
         "--port", "50051", "--http-port", "8000", "--kv-events-endpoint", "tcp://*:5557",
         "--kv-events-replay-endpoint", "tcp://*:5558", "--prefix-cache-tokens", str(POOL_TOKENS),
         "--prefix-host-cache-mib", str(HOST_MIB)]


def system_prompt(k: int) -> str:
    rng = random.Random(k)
    return f"{SHOPS[k]} assistant. Answer customers briefly. Notes: " + " ".join(rng.choice(WORDS) for _ in range(150))


def chat(k: int, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system_prompt(k)}, {"role": "user", "content": question}]


@dataclass
class Cluster:
    endpoints: list[Endpoint]
    sockets: list[str]
    cli: ClientHost


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("routing")
    net = Network(["cli", "r0", "r1", "r2"])
    procs: list[subprocess.Popen[bytes]] = []
    cli = None
    try:
        nodes = [net[f"r{i}"] for i in range(3)]
        sockets = [str(folder / f"{n.name}.sock") for n in nodes]
        for node, sock in zip(nodes, sockets, strict=True):
            argv = [sys.executable, "-m", "tests.support.indexed_replica", sock, "--model", str(DEFAULT_MODEL),
                    "--host", node.address, *FLAGS]
            with (folder / f"{node.name}.log").open("ab") as log:
                # NOTE: POD_IP names the replica in its events' topic, as the downward API would
                procs.append(node.popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        env={**os.environ, "POD_IP": node.address}))
        for proc, sock, node in zip(procs, sockets, nodes, strict=True):
            _wait_listening(proc, Path(sock), folder / f"{node.name}.log")
        endpoints = [Endpoint(n.name, f"http://{n.address}:8000", f"tcp://{n.address}:5557",
                              f"tcp://{n.address}:5558") for n in nodes]
        cli = ClientHost(net["cli"], workers=1)
        yield Cluster(endpoints, sockets, cli)
    finally:
        if cli is not None:
            cli.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        net.close()


def _wait_listening(proc: subprocess.Popen[bytes], sock: Path, log: Path, timeout: float = 600.0) -> None:
    """Until the launcher's socket exists (it binds it once its server serves); fails if the process ends."""
    deadline = time.monotonic() + timeout
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"replica not serving (exit {proc.returncode}):\n"
                                 f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def routed(cluster: Cluster) -> dict[str, Any]:
    chats = [chat(k, QUESTIONS[r]) for r in range(ROUNDS) for k in range(len(SHOPS))]
    return cluster.cli.call(routed_chats, cluster.endpoints, MODEL, chats, cluster.sockets, MAX_TOKENS, 600.0,
                            timeout=900)


def shared_blocks(results: list[dict[str, Any]]) -> dict[int, tuple[int, ...]]:
    """Per system prompt, the chain hashes of the whole blocks all its requests share."""
    out: dict[int, tuple[int, ...]] = {}
    for k in range(len(SHOPS)):
        renders = [r["token_ids"] for r in results[k :: len(SHOPS)]]
        common = next(i for i in range(min(map(len, renders))) if len({ids[i] for ids in renders}) > 1)
        out[k] = tuple(chain_hashes(renders[0][: common // BLOCK * BLOCK + 1], BLOCK))
    return out


def test_the_system_prompts_exceed_one_replicas_cache_and_fit_in_three(routed: dict[str, Any]) -> None:
    first = routed["requests"][: len(SHOPS)]
    total = sum(r["prompt_tokens"] for r in first)
    assert CAPACITY < total <= 3 * CAPACITY, (CAPACITY, total)
    held = [set(ix["own"]["cpu"]) | set(ix["own"]["cpu_host"]) for ix in routed["indexes"]]
    systems = shared_blocks(routed["requests"])
    holders = {k: [i for i, h in enumerate(held) if set(chain) <= h] for k, chain in systems.items()}
    assert all(len(v) == 1 for v in holders.values()), holders  # each system prompt cached on one replica
    assert sorted(sum(1 for v in holders.values() if v == [i]) for i in range(3)) == [2, 2, 2], holders


def test_first_requests_spread_two_system_prompts_per_replica(routed: dict[str, Any]) -> None:
    first = routed["requests"][: len(SHOPS)]
    assert [(r["status"], r["error"]) for r in first] == [(200, "")] * len(SHOPS)
    assert [r["blocks"] for r in first] == [0] * len(SHOPS)  # nothing cached anywhere yet
    assert sorted(sum(1 for r in first if r["replica"] == i) for i in range(3)) == [2, 2, 2]


def test_every_later_request_reaches_the_replica_holding_its_system_prompt(routed: dict[str, Any]) -> None:
    results, systems = routed["requests"], shared_blocks(routed["requests"])
    home = {k: results[k]["replica"] for k in range(len(SHOPS))}
    for n, r in enumerate(results[len(SHOPS) :], start=len(SHOPS)):
        k, want = n % len(SHOPS), len(systems[n % len(SHOPS)])
        assert (r["status"], r["error"]) == (200, "")
        assert r["replica"] == home[k], f"request {n} (system {k}) went to r{r['replica']}, its prefix is on r{home[k]}"
        assert r["blocks"] >= want and sorted(r["scores"]) == [0, 0, r["blocks"]], r["scores"]
        # NOTE: the server copies a spilled chain back only when it reaches 2 blocks past the pool's
        # own hit (service/paged_kv.py, HOST_GAIN_BLOCKS): up to one block may be computed again.
        assert r["cached_tokens"] >= (want - 1) * BLOCK, (n, r["cached_tokens"], want)


def test_the_index_rebuilt_from_events_equals_each_replicas_own_at_quiescence(routed: dict[str, Any]) -> None:
    for i, ix in enumerate(routed["indexes"]):
        assert ix["violations"] == [], ix["violations"]
        assert ix["gaps"] == 0
        assert ix["own"]["cpu"], f"r{i} holds nothing in its pool"
        assert ix["router"] == ix["own"], f"r{i}: the router's index differs from the replica's own"
