"""Scale-out on loopback: 3 server processes behind the client's own load balancing.

* ``round_robin`` (gRPC's policy from the service config) spreads requests over
  every replica (GetMetrics of each); a replica SIGTERMed mid-run loses no
  request (it drains, health NOT_SERVING takes it out of rotation, new streams
  go to the others); restarted on the same port, it gets traffic again within
  ``max_connection_age + 5 s``. While a replica drains (NOT_SERVING but still up),
  gRPC's client-side health checking keeps every new request off it.
* ``prefix_affinity``: requests sharing a prefix land on one replica, and under
  concurrency no placement exceeds the ring's load bound.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from inference_client import NO_RETRY, InferenceClient, InferenceError

from tests.support.helpers import wait_for
from tests.support.server import ROOT, server_argv
from tests.support.waiting import scaled

pytestmark = pytest.mark.model

MAX_CONNECTION_AGE_S = 2.0
PREFIX = "You are a terse assistant for a hardware shop. Answer in one short sentence. " * 4


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all held open while picking, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class Replica:
    """One ``python -m service`` process on a fixed loopback port (restartable on it)."""

    def __init__(self, port: int, log_dir: Path) -> None:
        self.port = port
        self.log = log_dir / f"replica-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = server_argv("--threads", "1", "--max-connection-age-s", str(MAX_CONNECTION_AGE_S), port=self.port)
        # NOTE: a drain's grace outlasts any test step on a busy machine; drains end when their last
        # request does (the tests close or finish theirs), so a long grace costs no time.
        argv += ["--max-connection-age-grace-s", "30", "--grace-seconds", "120"]
        argv += ["--response-cache-bytes", "0"]  # NOTE: the routing tests count requests each replica runs
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=dict(os.environ)
            )

    def wait_serving(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        with InferenceClient(self.address) as client:
            while time.monotonic() < deadline:
                assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
                try:
                    if client.health(timeout=1.0) == "SERVING":
                        return
                except InferenceError:
                    pass
                time.sleep(0.2)
        raise AssertionError(f"replica {self.port} not SERVING after {timeout} s")

    def requests_total(self) -> int:
        with InferenceClient(self.address, timeout=10) as client:
            return int(client.metrics().requests_total)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    log_dir = tmp_path_factory.mktemp("replicas")
    group = [Replica(port, log_dir) for port in _free_ports(3)]
    try:
        for r in group:
            r.start()
        for r in group:
            r.wait_serving()
        yield group
    finally:
        for r in group:
            r.terminate()
        for r in group:
            try:
                r.wait(30)
            except subprocess.TimeoutExpired:
                r.kill()


def _target(group: list[Replica]) -> str:
    return "ipv4:" + ",".join(r.address for r in group)


def _ask(client: InferenceClient, prompt: str, max_tokens: int = 4) -> str:
    return client.generate(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True).text()


def _load(
    client: InferenceClient, n_threads: int, per_thread: int, errors: list[BaseException], answered: list[str]
) -> list:
    def worker(i: int) -> None:
        for j in range(per_thread):
            try:
                answered.append(_ask(client, f"Request {i}-{j}: tell me about the sea.", max_tokens=8))
            except BaseException as exc:  # recorded: the assertion is that there are none
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    return threads


def test_round_robin_spreads_drains_and_takes_a_restarted_replica_back(replicas: list[Replica]) -> None:
    client = InferenceClient(_target(replicas), timeout=600)
    try:
        before = [r.requests_total() for r in replicas]
        for i in range(12):
            _ask(client, f"Hello number {i}")
        spread = [r.requests_total() - b for r, b in zip(replicas, before, strict=True)]
        assert sum(spread) == 12 and min(spread) >= 2, spread  # every replica took its share

        # SIGTERM one replica while 4 threads keep sending: nothing is lost.
        errors: list[BaseException] = []
        answered: list[str] = []
        threads = _load(client, n_threads=4, per_thread=6, errors=errors, answered=answered)
        assert wait_for(lambda: len(answered) >= 4, timeout=600), errors  # the load runs: 20 requests to go
        victim = replicas[0]
        victim.terminate()
        for t in threads:
            t.join(180)
        assert not errors, errors
        assert victim.wait(60) == 0

        # Restart on the same port: traffic comes back within max_connection_age + 5 s (the client's
        # longest reconnect backoff), give or take how slowly the busy machine runs the requests between.
        victim.start()
        victim.wait_serving()
        served_at = time.monotonic()
        while victim.requests_total() == 0:
            assert time.monotonic() - served_at < MAX_CONNECTION_AGE_S + scaled(5.0), (
                "restarted replica got no traffic"
            )
            _ask(client, "Are you back?", max_tokens=2)
    finally:
        client.close()


def test_prefix_affinity_keeps_a_prefix_on_one_replica_within_the_bound(replicas: list[Replica]) -> None:
    client = InferenceClient(
        _target(replicas), timeout=600, balancing="prefix_affinity", affinity_epsilon=0.5
    )
    try:
        assert client.pool is not None
        before = [r.requests_total() for r in replicas]
        for i in range(6):  # one at a time: the prefix's replica always has room
            _ask(client, PREFIX + f"Question {i}: do you sell screws?")
        after = [r.requests_total() - b for r, b in zip(replicas, before, strict=True)]
        assert sorted(after) == [0, 0, 6], after

        # 6 concurrent streams on one prefix: the bound spills some to other replicas.
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                _ask(client, PREFIX + f"Concurrent question {i}.", max_tokens=16)
            except BaseException as exc:  # recorded: the assertion is that there are none
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert client.pool.over_bound == 0
        home = max(client.pool.placements, key=lambda b: client.pool.placements[b])
        assert client.pool.placements[home] >= 6 + 3  # the 6 sequential ones, and most concurrent ones
        assert sum(client.pool.in_flight.values()) == 0  # every finished stream released its count
    finally:
        client.close()


def test_round_robin_skips_a_draining_replica_by_its_health(replicas: list[Replica]) -> None:
    """While a replica drains (NOT_SERVING, still up, finishing a long request), health-checked
    round_robin sends it nothing: no retries needed (NO_RETRY), none lost."""
    victim = replicas[1]
    with InferenceClient(victim.address, timeout=600) as direct:
        # NOTE: long enough to keep the victim draining until it is closed below
        long = direct.generate("Write a long story.", max_tokens=4000, temperature=0.0, ignore_eos=True)
        next(iter(long))  # running on the victim
        client = InferenceClient(_target(replicas), timeout=600, retry=NO_RETRY)
        try:
            for i in range(3):
                _ask(client, f"Warm {i}", max_tokens=2)
            before = victim.requests_total()
            victim.terminate()
            deadline = time.monotonic() + 60
            while direct.health(timeout=2) != "NOT_SERVING":
                assert time.monotonic() < deadline, "the draining replica never reported NOT_SERVING"
                time.sleep(0.05)
            for i in range(12):
                _ask(client, f"During the drain {i}", max_tokens=2)
            assert victim.proc is not None and victim.proc.poll() is None  # still draining
            assert victim.requests_total() == before
        finally:
            long.close()
            client.close()
    assert victim.wait(60) == 0
    victim.start()
    victim.wait_serving()
