"""Fair share between tenants on the real scheduler and engine (the simulation is in
tests/unit/security/test_tenants_unit.py): two tenants, one sending ten times the other's load."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.request.sequence import Sequence
from tests.support.helpers import req, wait_for
from tests.support.server import RunningServer, assert_kv_clean, start_server, wait_idle

pytestmark = pytest.mark.model

TOKENS = {"heavy": "tok-heavy-0123", "light": "tok-light-4567"}
SLOTS, OUTPUT = 2, 16


@pytest.fixture(scope="module")
def tenants_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    path: Path = tmp_path_factory.mktemp("fair") / "tenants.json"
    doc = {"tenants": {t: {"token_sha256": hashlib.sha256(k.encode()).hexdigest()} for t, k in TOKENS.items()}}
    path.write_text(json.dumps(doc))
    srv = start_server(auth_tokens=str(path), max_running=SLOTS, prefix_cache=False)
    yield srv
    srv.close()


class ServiceLog:
    """Step hook: each tenant's service so far (VTC's measure: prompt tokens computed + 2 x generated),
    counted from the sequences themselves, and its difference at every step both tenants had work
    waiting (backlogged)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.seen: dict[int, Sequence] = {}
        self.diffs: list[float] = []
        self.max_prompt = 0
        self._chained = engine.step_hook

    def __call__(self, engine: Any) -> None:
        if self._chained is not None:
            self._chained(engine)
        sched = engine.scheduler
        for s in sched.running:
            self.seen.setdefault(s.uid, s)
            self.max_prompt = max(self.max_prompt, s.num_prompt_tokens)
        waiting = {s.tenant for s in sched.waiting}
        if {"heavy", "light"} <= waiting:
            served = {"heavy": 0.0, "light": 0.0}
            for s in self.seen.values():
                served[s.tenant] += (s.num_prompt_tokens - s.num_cached) + 2.0 * max(s.num_generated, 0)
            self.diffs.append(served["heavy"] - served["light"])

    def __enter__(self) -> ServiceLog:
        self.engine.step_hook = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.step_hook = self._chained


def test_a_tenant_with_ten_times_the_load_gets_no_more_service_than_the_vtc_bound(
    tenants_server: RunningServer,
) -> None:
    fair = tenants_server.engine.scheduler.policy.fair
    assert fair is not None, "fair share is on with a tenants file"
    counts = {"heavy": 40, "light": 4}  # ten times the light tenant's load, all queued at once
    light_done = threading.Event()
    finished: dict[str, int] = {}

    def run(tenant: str, ch: grpc.Channel) -> None:
        """One stream with all the tenant's requests; the heavy one is cancelled once light is served."""
        msgs = [
            req(f"{tenant}{i}", f"Item {i} of the {tenant} list, described:", OUTPUT, ignore_eos=True)
            for i in range(counts[tenant])
        ]
        call = pb_grpc.InferenceServiceStub(ch).Generate(
            iter(msgs), metadata=(("authorization", f"Bearer {TOKENS[tenant]}"),), timeout=600
        )
        dones = 0
        try:
            for ev in call:
                dones += ev.WhichOneof("event") == "done"
                if light_done.is_set():
                    call.cancel()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.CANCELLED, exc
        finished[tenant] = dones

    with ServiceLog(tenants_server.engine) as log, grpc.insecure_channel(tenants_server.target) as ch:
        heavy = threading.Thread(target=run, args=("heavy", ch))
        heavy.start()
        # The heavy tenant's requests queue first (FCFS would then serve all 40 before the light ones).
        sched = tenants_server.engine.scheduler
        assert wait_for(lambda: sum(s.tenant == "heavy" for s in list(sched.waiting)) >= 30), "heavy not queued"
        run("light", ch)
        light_done.set()
        heavy.join(600)
    wait_idle(tenants_server, timeout=600)
    assert finished["light"] == counts["light"] and finished["heavy"] < counts["heavy"]
    assert len(log.diffs) > 20, "both tenants should have been backlogged for a while"
    # The paper's bound on the service difference of two backlogged tenants over any interval:
    # 2 x max(w_in x L_in, w_out x M), M the most tokens a running batch holds.
    bound = 2 * max(fair.input_weight * log.max_prompt, fair.output_weight * SLOTS * (log.max_prompt + OUTPUT))
    spread = max(log.diffs) - min(log.diffs)
    assert spread <= bound, (spread, bound, log.diffs[:: max(1, len(log.diffs) // 20)])
    assert_kv_clean(tenants_server)
