"""Fair share between tenants: the Virtual Token Counter (VTC).

From Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024):
every tenant has a counter of the service it received, ``input_weight`` per
prompt token and ``output_weight`` per generated token, divided by the tenant's
weight. Among waiting requests (within a priority tier: ``PriorityPolicy`` keeps
its tiers, aging and preemption), the tenant with the smallest counter goes
first, FCFS within a tenant. A tenant that enters the queue while it had
nothing waiting is lifted to the smallest counter of the tenants still waiting
(or to the counter of the last one to leave, if none is), less ``credit``: idle
or light use banks at most ``credit`` of advantage.

NOTE: the paper lifts to the minimum itself (``credit`` 0). Then a tenant whose
few closed-loop streams are all running is lifted on each new request, ties go
to the older waiting requests, and it gets less than its share (simulated: 2
streams against 16, 4 running slots, 256-token outputs: 40% instead of 50%).
A small credit (default: about two 256-token requests) keeps its place; the
service difference bound grows by ``credit``.

NOTE: aging still applies: a batch request that waited longer than
``--aging-s`` is ordered with interactive work, ahead of every batch request.
A tenant whose backlog is deeper than that escapes its tier's fair share (and
its aged requests may preempt batch work); raise ``--aging-s`` where tenants
share a batch tier under sustained overload.

Charging "as tokens are computed": ``order`` is called by the scheduler once per
step, on the engine thread; it first charges each tenant for the progress its
sequences made since the previous call (prompt tokens when a sequence is first
scheduled, minus prefix-cache hits; generated tokens as they appear). So the
engine needs no extra hook, and counters lag by at most one step.

NOTE: no preemption for fairness. The paper's bound (the service difference of
two backlogged tenants stays within 2·max(w_in·L_in, w_out·M), L_in the longest
prompt, M the most tokens a running batch holds) holds for its non-preemptive
VTC; preempting running work would only cost recomputation.

Within one step several requests may be admitted; ``order`` interleaves tenants
by simulating the charge of each admitted prompt, as the paper's dispatch does.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from service.request.sequence import SeqStatus, Sequence

GroupKey = Callable[[Sequence], Any]


class FairShare:
    """Virtual Token Counters per tenant (engine thread only, except read-only ``snapshot``)."""

    def __init__(
        self,
        weight: Callable[[str], float] = lambda _tenant: 1.0,
        input_weight: float = 1.0,
        output_weight: float = 2.0,
        credit: float = 1024.0,
    ) -> None:
        self.weight = weight
        self.credit = credit
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.counters: dict[str, float] = {}
        self._tracked: dict[int, tuple[Sequence, float]] = {}  # uid -> (sequence, cost charged)
        self._backlogged: set[str] = set()
        self._last_left = 0.0

    def cost(self, seq: Sequence) -> float:
        """Service ``seq`` has received so far (before the tenant's weight)."""
        computed_prompt = seq.num_prompt_tokens - seq.num_cached if seq.first_scheduled is not None else 0
        return self.input_weight * computed_prompt + self.output_weight * max(seq.num_generated, 0)

    def _charge(self, tenant: str, amount: float) -> None:
        self.counters[tenant] = self.counters.get(tenant, 0.0) + amount / max(self.weight(tenant), 1e-9)

    def update(self, waiting: list[Sequence]) -> None:
        """Charge the progress made since the last call; lift tenants that (re-)enter the queue."""
        for uid, (seq, charged) in list(self._tracked.items()):
            cost = self.cost(seq)
            if cost != charged:
                self._charge(seq.tenant, cost - charged)
                self._tracked[uid] = (seq, cost)
            if seq.status is SeqStatus.FINISHED:
                del self._tracked[uid]
        now = {s.tenant for s in waiting}
        staying = now & self._backlogged
        for tenant in sorted(self._backlogged - now):
            self._last_left = self.counters.get(tenant, 0.0)
        floor = min((self.counters.get(t, 0.0) for t in staying), default=self._last_left)
        for tenant in now - self._backlogged:
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor - self.credit)
        for seq in waiting:
            if seq.uid not in self._tracked:
                self._tracked[seq.uid] = (seq, self.cost(seq))
        self._backlogged = now

    def order(self, waiting: list[Sequence], group: GroupKey) -> list[Sequence]:
        """``waiting`` in service order: groups by ``group(seq)`` ascending, VTC order inside each."""
        self.update(waiting)
        groups: dict[Any, dict[str, list[Sequence]]] = {}
        for seq in sorted(waiting, key=lambda s: s.queue_key):
            groups.setdefault(group(seq), {}).setdefault(seq.tenant, []).append(seq)
        out: list[Sequence] = []
        for key in sorted(groups):
            out.extend(self._interleave(groups[key]))
        return out

    def _interleave(self, by_tenant: dict[str, list[Sequence]]) -> list[Sequence]:
        """Least-served tenant first, charging each pick's prompt as if it were admitted."""
        heap = [(self.counters.get(t, 0.0), seqs[0].queue_key, t, 0) for t, seqs in by_tenant.items()]
        heapq.heapify(heap)
        out = []
        while heap:
            counter, _key, tenant, i = heapq.heappop(heap)
            seqs = by_tenant[tenant]
            seq = seqs[i]
            out.append(seq)
            if i + 1 < len(seqs):
                counter += self.input_weight * seq.num_uncomputed / max(self.weight(tenant), 1e-9)
                heapq.heappush(heap, (counter, seqs[i + 1].queue_key, tenant, i + 1))
        return out

    def snapshot(self) -> dict[str, float]:
        """Counters per tenant (a copy; safe from any thread)."""
        return dict(self.counters)
