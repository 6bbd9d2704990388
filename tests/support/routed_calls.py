"""The prefix router's side of tests/model/scale/test_prefix_routing.py, run on the client host.

``routed_chats`` runs in a ``ClientHost`` worker (tests/support/client_host.py: a process inside the
client namespace, which reaches the replicas): it starts a ``PrefixRouter`` (bench/harness/prefix_router.py)
subscribed to every replica's events, sends each chat (one at a time, in order) to the replica the
router picks, and, at quiescence, compares the router's index with each replica's own
(``tests.support.indexed_replica``). Plain data in and out.
"""

from __future__ import annotations

import time
from typing import Any

import httpx2

from bench.harness.prefix_router import Endpoint, PrefixRouter
from tests.support.indexed_replica import own_index

MEDIUM = {"pool": "cpu", "host": "cpu_host"}  # the replica's tiers as the events name them


def _send(router: PrefixRouter, http: httpx2.Client, model: str, messages: list[dict[str, str]],
          max_tokens: int) -> dict[str, Any]:
    ids = router.render_chat(messages)
    with router.route(ids) as decision:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        reply = http.post(f"{router.endpoints[decision.replica].http}/v1/chat/completions", json=body)
    usage = reply.json().get("usage", {}) if reply.status_code == 200 else {}
    return {"status": reply.status_code, "error": reply.text if reply.status_code != 200 else "",
            "replica": decision.replica, "blocks": decision.blocks,
            "scores": list(decision.scores), "token_ids": ids, "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens")}


def _agreement(router: PrefixRouter, i: int, path: str, timeout: float) -> dict[str, Any]:
    """Replica ``i``'s own index and the router's, once equal (or as they are after ``timeout`` s)."""
    own = own_index(path)
    want = {MEDIUM[tier]: frozenset(own[tier]) for tier in MEDIUM}
    deadline = time.monotonic() + timeout
    while True:
        held = router.held(i)
        seen = {medium: held.get(medium, frozenset()) for medium in want}
        if seen == want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return {"own": {m: sorted(v) for m, v in want.items()}, "router": {m: sorted(v) for m, v in seen.items()},
            "gaps": router.subs[i].gaps, "violations": own["violations"]}


def routed_chats(endpoints: list[Endpoint], model: str, chats: list[list[dict[str, str]]], sockets: list[str],
                 max_tokens: int, timeout: float) -> dict[str, Any]:
    """Each chat through the router, in order; then every replica's index, own and rebuilt from events."""
    with PrefixRouter(endpoints) as router, httpx2.Client(timeout=timeout) as http:
        requests = [_send(router, http, model, messages, max_tokens) for messages in chats]
        indexes = [_agreement(router, i, path, timeout) for i, path in enumerate(sockets)]
    return {"requests": requests, "indexes": indexes}
