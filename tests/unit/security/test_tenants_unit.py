"""Tenants without a model: the tenants file, quotas, and the Virtual Token Counter fair share."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from service.priority import PriorityPolicy
from service.request.sequence import FinishReason, Priority, SamplingParams, SeqStatus, Sequence
from service.scheduler.fair_share import FairShare
from service.security.quotas import QuotaExceeded, TenantQuotas
from service.security.tenants import Tenant, TenantFile, TenantFileError, parse_table


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def seq(tenant: str, prompt: int = 8, max_tokens: int = 16, arrival: float = 0.0) -> Sequence:
    s = Sequence(
        request_id=f"{tenant}-{arrival}", token_ids=[1] * prompt, params=SamplingParams(max_tokens=max_tokens)
    )
    s.tenant, s.arrival, s.queue_key = tenant, arrival, (1, arrival)
    return s


# -- tenants file ----------------------------------------------------------------------------------
def test_tokens_match_by_digest_only() -> None:
    table = parse_table(json.dumps({"tenants": {"a": {"token_sha256": [sha("t1"), sha("t2")]}, "b": {}}}))
    assert table.by_token("t1").name == "a" and table.by_token("t2").name == "a"  # type: ignore[union-attr]
    assert table.by_token("t3") is None and table.by_token("") is None
    assert table.tenants["b"].roles == {"user"}


@pytest.mark.parametrize(
    "doc",
    [
        "{",
        '{"tenants": []}',
        '{"tenants": {"a": {"token_sha256": "abc"}}}',
        '{"tenants": {"a": {"roles": ["root"]}}}',
        '{"tenants": {"a": {"weight": 0}}}',
        '{"tenants": {"a": {"max_concurrent": "many"}}}',
    ],
)
def test_bad_tenants_files_are_refused(doc: str) -> None:
    with pytest.raises(TenantFileError):
        parse_table(doc)


def test_toml_tenants_file(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(f'[tenants.a]\ntoken_sha256 = ["{sha("x")}"]\nweight = 2.0\n')
    assert TenantFile(path).table.tenants["a"].weight == 2.0


# -- quotas ----------------------------------------------------------------------------------------
def test_max_queued_counts_requests_not_started() -> None:
    quotas, tenant = TenantQuotas(), Tenant("a", max_queued=2)
    first, second, third = seq("a", arrival=1), seq("a", arrival=2), seq("a", arrival=3)
    quotas.reserve(first, tenant)
    quotas.reserve(second, tenant)
    with pytest.raises(QuotaExceeded) as info:
        quotas.reserve(third, tenant)
    assert info.value.quota == "max_queued" and info.value.retry_after_ms >= 100
    first.first_scheduled = 1.0  # started: no longer queued
    quotas.reserve(third, tenant)
    assert quotas.snapshot()["a"] | {} == quotas.snapshot()["a"]
    assert quotas.snapshot()["a"]["rejected"] == 1 and quotas.snapshot()["a"]["in_flight"] == 3


def test_tokens_per_minute_reserved_then_settled() -> None:
    now = [0.0]
    quotas, tenant = TenantQuotas(clock=lambda: now[0]), Tenant("a", tokens_per_minute=100)
    a = seq("a", prompt=10, max_tokens=40)  # reserves 50
    quotas.reserve(a, tenant)
    quotas.reserve(seq("a", prompt=10, max_tokens=30), tenant)  # 90 reserved
    with pytest.raises(QuotaExceeded):
        quotas.reserve(seq("a", prompt=10, max_tokens=20), tenant)
    a.token_ids += [2] * 5  # a generated 5 tokens and finished: settles to 15
    quotas.settle(_finished(a))
    quotas.reserve(seq("a", prompt=10, max_tokens=20), tenant)  # 15 + 40 + 30 = 85
    with pytest.raises(QuotaExceeded) as info:
        quotas.reserve(seq("a", prompt=10, max_tokens=10), tenant)
    assert info.value.quota == "tokens_per_minute"
    now[0] = 61.0  # the settled 15 left the window; 70 still reserved
    quotas.reserve(seq("a", prompt=10, max_tokens=10), tenant)


def test_refused_submission_releases_the_reservation() -> None:
    quotas, tenant = TenantQuotas(), Tenant("a", max_concurrent=1)

    refused = seq("a")
    quotas.reserve(refused, tenant)  # then the engine refuses it (queue full): the lifecycle settles it refused
    quotas.settle(refused, refused=True)
    quotas.reserve(seq("a"), tenant)
    assert quotas.snapshot()["a"]["in_flight"] == 1 and quotas.snapshot()["a"]["requests"] == 1


def _finished(s: Sequence) -> Sequence:
    s.status, s.finish_reason, s.finish_time = SeqStatus.FINISHED, FinishReason.LENGTH, 1.0
    return s


# -- Virtual Token Counter ---------------------------------------------------------------------------
class Sim:
    """A toy engine: ``slots`` running sequences, one token each per step; random request lengths."""

    def __init__(self, fair: FairShare, slots: int, prompt: int, output: int) -> None:
        self.policy = PriorityPolicy(fair=fair)
        self.slots, self.prompt, self.output = slots, prompt, output
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.served: dict[str, float] = {}
        self.clock = 0.0
        self.rng = random.Random(7)

    def send(self, tenant: str, n: int) -> None:
        for _ in range(n):
            self.clock += 1e-6
            prompt, output = self.rng.randint(1, self.prompt), self.rng.randint(1, self.output)
            self.waiting.append(seq(tenant, prompt, output, arrival=self.clock))

    def step(self) -> list[Sequence]:
        for s in self.policy.order(self.waiting, 0.0)[: self.slots - len(self.running)]:
            self.waiting.remove(s)
            self.running.append(s)
            s.status, s.first_scheduled = SeqStatus.RUNNING, self.clock
            self._serve(s.tenant, s.num_prompt_tokens * 1.0)
        finished = []
        for s in list(self.running):
            s.token_ids.append(7)
            self._serve(s.tenant, 2.0)
            if s.num_generated >= s.params.max_tokens:
                s.status = SeqStatus.FINISHED
                self.running.remove(s)
                finished.append(s)
        return finished

    def _serve(self, tenant: str, amount: float) -> None:
        self.served[tenant] = self.served.get(tenant, 0.0) + amount


def _bound(fair: FairShare, slots: int, prompt: int, output: int) -> float:
    """The paper's bound on the service difference of two backlogged tenants: 2·max(w_in·L_in, w_out·M).

    L_in: the longest prompt; M: the most tokens a running batch holds (here slots x request length).
    """
    return 2 * max(fair.input_weight * prompt, fair.output_weight * slots * (prompt + output))


def _refill(sim: Sim, backlog: dict[str, int]) -> None:
    """Closed loop: each tenant keeps ``backlog[t]`` requests waiting (so both stay backlogged)."""
    for tenant, n in backlog.items():
        sim.send(tenant, n - sum(1 for s in sim.waiting if s.tenant == tenant))


def test_vtc_two_tenants_ten_times_the_load_stay_within_the_bound() -> None:
    fair = FairShare()
    sim = Sim(fair, slots=4, prompt=16, output=24)
    diffs = []
    for step in range(3000):
        _refill(sim, {"heavy": 40, "light": 4})  # 10x the light tenant's load
        sim.step()
        if step >= 100:
            diffs.append(sim.served["heavy"] - sim.served["light"])
    # Service difference over any interval [t1, t2] = D(t2) - D(t1).
    assert max(diffs) - min(diffs) <= _bound(fair, 4, 16, 24) + fair.credit, (max(diffs), min(diffs))
    share = sim.served["light"] / (sim.served["light"] + sim.served["heavy"])
    assert 0.45 <= share <= 0.55, share
    fcfs = Sim(FairShare(), slots=4, prompt=16, output=24)
    fcfs.policy.fair = None  # FCFS within the tier: the heavy tenant takes ~10/11 of the service
    for _ in range(1000):
        _refill(fcfs, {"heavy": 40, "light": 4})
        fcfs.step()
    assert fcfs.served["light"] / (fcfs.served["light"] + fcfs.served["heavy"]) < 0.2


def test_vtc_weights_are_respected() -> None:
    weights = {"gold": 3.0, "basic": 1.0}
    fair = FairShare(lambda t: weights[t])
    sim = Sim(fair, slots=4, prompt=8, output=16)
    for _ in range(3000):
        _refill(sim, {"gold": 4, "basic": 4})
        sim.step()
    share = sim.served["gold"] / (sim.served["gold"] + sim.served["basic"])
    assert 0.70 <= share <= 0.80, share  # 3:1 weights -> 75%


def test_vtc_returning_tenant_cannot_bank_credit() -> None:
    fair = FairShare(credit=100.0)
    sim = Sim(fair, slots=2, prompt=8, output=8)
    for _ in range(300):
        _refill(sim, {"busy": 8})
        sim.step()
    assert fair.counters.get("idle", 0.0) == 0.0
    lead = 0.0
    served_before: dict[str, float] = {}
    for step in range(1000):
        _refill(sim, {"busy": 8, "idle": 8})  # returns after the busy tenant received a lot of service
        sim.step()
        lead = max(lead, fair.counters["busy"] - fair.counters["idle"])
        if step == 499:
            served_before = dict(sim.served)
    assert lead <= fair.credit + _bound(fair, 2, 8, 8), lead  # not the busy tenant's whole past
    gained = {t: sim.served[t] - served_before[t] for t in ("busy", "idle")}
    share = gained["idle"] / (gained["busy"] + gained["idle"])
    assert 0.4 <= share <= 0.6, share  # then an even split


def test_vtc_closed_loop_light_tenant_gets_its_share() -> None:
    """2 closed-loop streams against 16 (the benchmark's shape): the light tenant gets about half."""
    shares = {}
    for credit in (FairShare().credit, 0.0):  # the default, and the paper's lift to the minimum itself
        sim = Sim(FairShare(credit=credit), slots=4, prompt=40, output=256)
        for _ in range(6000):
            for tenant, streams in (("a", 16), ("b", 2)):
                mine = sum(1 for s in sim.waiting + sim.running if s.tenant == tenant)
                sim.send(tenant, streams - mine)
            sim.step()
        shares[credit] = sim.served["b"] / (sim.served["a"] + sim.served["b"])
    assert 0.47 <= shares[FairShare().credit] <= 0.53, shares
    assert shares[0.0] < shares[FairShare().credit], shares


def test_one_tenant_order_is_fcfs_with_preempted_first() -> None:
    fair = FairShare()
    policy = PriorityPolicy(fair=fair)
    xs = [seq("a", arrival=float(i)) for i in range(5)]
    for x in xs:
        x.priority = Priority.BATCH
    xs[3].queue_key = (0, -1.0)  # preempted: leads its tier
    xs[4].priority = Priority.INTERACTIVE
    assert policy.order(xs, 0.0) == [xs[4], xs[3], xs[0], xs[1], xs[2]]
    assert PriorityPolicy().order(xs, 0.0) == policy.order(xs, 0.0)


# -- observability ------------------------------------------------------------------------------------
def test_tenant_metrics_are_bounded_by_the_file(tmp_path: Path) -> None:
    from inference.v1 import inference_pb2 as pb

    from service.observability.metrics_view import tenant_metrics
    from service.observability.otel_metrics import _per_tenant
    from service.security.tenancy import Tenancy

    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": {"a": {"token_sha256": [sha("x")], "weight": 2}}}))
    tenancy = Tenancy(TenantFile(path))
    known, unknown = seq("a"), seq("not-in-the-file")
    tenancy.reserve(known)
    tenancy.reserve(unknown)  # (the interceptor never lets such a name through)
    rows = tenant_metrics(tenancy)
    assert [(r.tenant, r.weight, r.requests_total, r.in_flight) for r in rows] == [("a", 2.0, 1, 1)]
    observed = _per_tenant(lambda t: t.requests_total)(pb.GetMetricsResponse(tenants=rows))
    assert observed == [(1, {"inference.tenant": "a"})]


def test_tenant_on_request_span_attributes_never_the_token() -> None:
    from service.observability.telemetry import _request_attributes

    s = seq("team-a")
    attrs = _request_attributes(s, "model.gguf")
    assert attrs["inference.tenant"] == "team-a"
    assert not any("token" in k and "tokens" not in k for k in attrs)
