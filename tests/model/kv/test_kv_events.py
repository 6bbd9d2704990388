"""KV-cache events from a real server, read by real pyzmq subscribers.

The server keeps 4 idle blocks in its KV pool (``--prefix-cache-tokens 64``), so requests sharing a
system prompt register blocks, evict them and spill their chains to the host tier. A subscriber
decodes vLLM's format independently (``bench.harness.kv_events``) and rebuilds the index; at
quiescence it must equal the replica's own (``KVBlockManager.indexed``), and the tokens of its
chains must be the ids the render endpoint reports. Subscribers that join late or stall change
nothing the replica answers.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import httpx2
import pytest
import zmq

from bench.harness.kv_events import Removed, Stored, Subscriber
from tests.support.helpers import MarginRecorder, assert_same_greedy, req, run_stream
from tests.support.server import RunningServer, free_port, start_server, wait_idle

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct.Q4_1"
BLOCK = 16
U64 = 1 << 64
SYSTEM = (
    "You are a meticulous assistant for a shipping company. Answer questions about parcels, tracking "
    "numbers, delivery windows, customs forms and refunds. Always be polite, concise and precise. "
) * 2
QUESTIONS = ["Where is my parcel?", "How do I fill in a customs form?", "Can I change the delivery window?"]


@dataclass
class Replica:
    srv: RunningServer
    pub: str  # the PUB endpoint, for subscribers
    replay: str  # the ROUTER endpoint

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.srv.server.http_port}"


def events_server(**overrides: object) -> Replica:
    port, replay = free_port(), free_port()
    srv = start_server(
        http_port=free_port(),
        kv_events_endpoint=f"tcp://*:{port}",
        kv_events_replay_endpoint=f"tcp://*:{replay}",
        adaptive_threads=False,  # NOTE: one thread count, so two servers compute alike
        **overrides,
    )
    return Replica(srv, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}")


def chat(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def replica_index(srv: RunningServer) -> tuple[frozenset[int], frozenset[int]]:
    """The replica's own index (pool, host tier) as the wire's unsigned hashes; the engine is idle."""
    wait_idle(srv)
    pool, host = srv.engine.kv.indexed()
    return frozenset(h % U64 for h in pool), frozenset(h % U64 for h in host)


def agree(sub: Subscriber, srv: RunningServer) -> None:
    pool, host = replica_index(srv)
    sub.wait_for(
        lambda: sub.index.get("cpu") == pool and sub.index.get("cpu_host") == host,
        what=f"the subscriber's index to equal the replica's ({len(pool)} pool, {len(host)} host blocks)",
    )


@dataclass
class Workload:
    replica: Replica
    sub: Subscriber
    renders: list[list[int]]  # the token ids of each request, from the render endpoint


@pytest.fixture(scope="module")
def workload() -> Iterator[Workload]:
    replica = events_server(prefix_cache_tokens=4 * BLOCK)
    sub = Subscriber(replica.pub, topic=b"kv@", replay=replica.replay)
    renders = []
    try:
        with httpx2.Client(base_url=replica.http, timeout=120) as http:
            for question in QUESTIONS:
                body = {"model": MODEL, "messages": chat(SYSTEM, question), "max_tokens": 8, "temperature": 0}
                assert http.post("/v1/chat/completions", json=body).status_code == 200
                rendered = http.post("/v1/chat/completions/render", json={"messages": chat(SYSTEM, question)})
                renders.append(rendered.json()["token_ids"])
        agree(sub, replica.srv)
        yield Workload(replica, sub, renders)
    finally:
        sub.close()
        replica.srv.close()


def test_stored_blocks_chain_by_parent_hash_and_their_tokens_are_the_rendered_prompts(workload: Workload) -> None:
    stored: set[int] = set()
    events = workload.sub.events()
    for event in events:
        if isinstance(event, Stored):
            assert event.parent is None or event.parent in stored, "a block's parent was stored before it"
            assert event.block_size == BLOCK and event.medium in ("cpu", "cpu_host")
            stored.update(event.hashes)
    index = workload.sub.index
    for ids in workload.renders:
        whole = len(ids) // BLOCK * BLOCK
        chains = [h for h in index.tokens if len(index.tokens[h]) and index.chain_tokens(h) == ids[:whole]]
        assert chains, f"no stored chain holds the prompt's {whole // BLOCK} whole blocks"
    first = workload.renders[0]
    shared = next(k for k in range(len(first)) if any(len(r) <= k or r[k] != first[k] for r in workload.renders))
    assert shared >= 4 * BLOCK  # the system prompt's blocks, stored once and reused
    assert sum(1 for e in events if isinstance(e, Stored) and e.parent is None and e.medium == "cpu") == 1


def test_evicted_pool_blocks_are_removed_and_their_chains_stored_in_the_host_tier(workload: Workload) -> None:
    events = workload.sub.events()
    assert any(isinstance(e, Removed) and e.medium == "cpu" for e in events)
    assert any(isinstance(e, Stored) and e.medium == "cpu_host" for e in events)
    pool, host = replica_index(workload.replica.srv)
    assert len(pool) <= 4  # the idle cap: at quiescence every registered block is idle
    assert workload.sub.index.get("cpu") == pool and workload.sub.index.get("cpu_host") == host


def test_messages_carry_the_llm_d_topic_and_the_counters_are_on_metrics(workload: Workload) -> None:
    srv = workload.replica.srv
    host = os.environ.get("POD_IP") or socket.gethostname()
    topics = {topic for topic, _, _ in workload.sub.messages}
    assert topics == {f"kv@{host}:{srv.config.http_port}@{MODEL}".encode()}
    assert [seq for _, seq, _ in workload.sub.messages] == list(range(len(workload.sub.messages)))
    metrics = httpx2.get(f"{workload.replica.http}/metrics", timeout=60).text
    published = srv.server.kv_events.published
    assert f"inference_kv_events_published_total {float(published)}" in metrics
    assert "inference_kv_events_dropped_total 0.0" in metrics


def test_a_late_subscriber_catches_up_by_replay_and_agrees_with_the_replica(workload: Workload) -> None:
    replica = workload.replica
    late = Subscriber(replica.pub, replay=replica.replay)
    try:
        with httpx2.Client(base_url=replica.http, timeout=120) as http:
            body = {"model": MODEL, "messages": chat(SYSTEM, "Is Saturday delivery possible?"), "max_tokens": 8}
            assert http.post("/v1/chat/completions", json=body).status_code == 200
        agree(late, replica.srv)
        agree(workload.sub, replica.srv)
        assert late.replays >= 1 and late.gaps == 0
        assert late.messages[0][1] == 0  # from the first batch on, AllBlocksCleared
    finally:
        late.close()


def greedy_answers(replica: Replica, rec: MarginRecorder | None, during: object = None) -> dict[str, list[int]]:
    """The requests, one after another (``during``: called after the first), and their tokens."""
    out: dict[str, list[int]] = {}
    replica.srv.engine.logits_hook = rec
    try:
        with grpc.insecure_channel(replica.srv.target) as ch:
            for n, question in enumerate(QUESTIONS):
                rid = f"q{n}"
                out[rid] = list(run_stream(ch, [req(rid, SYSTEM + question, 24, ignore_eos=True)])[rid].token_ids)
                if n == 0 and callable(during):
                    during()
    finally:
        replica.srv.engine.logits_hook = None
    return out


def test_a_stalled_or_late_subscriber_changes_nothing_the_replica_answers() -> None:
    rec = MarginRecorder()
    quiet = events_server(kv_events_hwm=1)
    try:
        reference = greedy_answers(quiet, rec)  # nobody subscribed
    finally:
        quiet.srv.close()
    busy = events_server(kv_events_hwm=1)
    ctx = zmq.Context()
    late: list[Subscriber] = []
    try:
        stalled = ctx.socket(zmq.SUB)  # connected, subscribed, never reads
        stalled.setsockopt(zmq.RCVHWM, 1)
        stalled.setsockopt(zmq.SUBSCRIBE, b"")
        stalled.connect(busy.pub)
        answers = greedy_answers(busy, None, lambda: late.append(Subscriber(busy.pub, replay=busy.replay)))
        for rid, tokens in reference.items():
            assert_same_greedy(tokens, answers[rid], rec.rows[rid])
        publisher = busy.srv.server.kv_events
        assert publisher.dropped == 0 and publisher.published > len(QUESTIONS)
        agree(late[0], busy.srv)
    finally:
        for sub in late:
            sub.close()
        ctx.destroy(linger=0)
        busy.srv.close()
