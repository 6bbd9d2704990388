"""Model-free simulation of llama.cpp's KV cells and of engine steps, for unit tests.

``ShadowKV`` applies the KV manager's cell operations with llama.cpp's
semantics (a cell has one position and a set of lanes; ``cp`` adds a lane to
cells, ``rm`` removes it, a cell with no lane is free) and checks that the pool
never overflows and that every running sequence sees exactly its own tokens.
``drive`` runs schedule -> (fake) forward -> update until all work is done,
with a deterministic "model": the next token is a hash of the whole context, so
a recomputed (preempted) sequence must produce exactly the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.kv.blocks import KVOp
from service.kv.integrity import check_integrity
from service.paged_kv import KVBlockManager
from service.request.sequence import FinishReason, Sequence
from service.scheduler.plan import Plan
from service.scheduler.scheduler import Scheduler


@dataclass
class ShadowKV:
    capacity: int
    cells: dict[int, tuple[int, int, set[int]]] = field(default_factory=dict)  # id -> (pos, token, lanes)
    _next: int = 0

    saved: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # key -> (pos, token), host tier

    def apply(self, ops: tuple[KVOp, ...] | list[KVOp]) -> None:
        for op in ops:
            if op.kind in ("save", "load", "drop"):
                self._host_op(op)
                continue
            for cid, (pos, _tok, lanes) in list(self.cells.items()):
                if op.p0 <= pos < op.p1:
                    if op.kind == "rm":
                        lanes.discard(op.lane)
                    elif op.src in lanes:
                        lanes.add(op.lane)
                if not lanes:
                    del self.cells[cid]

    def _host_op(self, op: KVOp) -> None:
        """The runner's save / load / drop: copies of a lane's cells to and from host memory."""
        if op.kind == "save":
            got = sorted((p, t) for p, t, ls in self.cells.values() if op.lane in ls and op.p0 <= p < op.p1)
            assert [p for p, _t in got] == list(range(op.p0, op.p1)), f"lane {op.lane} lacks cells to save"
            self.saved[op.key] = got
        elif op.kind == "drop":
            del self.saved[op.key]
        else:  # load: the saved cells, or (bytes gone) the tokens computed again; same cells either way
            assert all(op.lane not in ls for _p, _t, ls in self.cells.values()), "load into a lane with cells"
            cells = self.saved.get(op.key) or list(enumerate(op.tokens))
            for pos, token in cells[op.p0 : op.p1]:
                self.write(op.lane, pos, token)

    def write(self, lane: int, pos: int, token: int) -> None:
        assert all(not (p == pos and lane in ls) for p, _t, ls in self.cells.values()), (
            f"lane {lane} already has a cell at {pos}"
        )
        assert len(self.cells) < self.capacity, "llama.cpp would have run out of KV cells"
        self.cells[self._next] = (pos, token, {lane})
        self._next += 1

    def lane_tokens(self, lane: int) -> list[int]:
        got = sorted((p, t) for p, t, ls in self.cells.values() if lane in ls)
        return [t for _p, t in got]


@dataclass
class SlidingShadowKV(ShadowKV):
    """Both caches of a model with sliding-window layers (Gemma 3): the full cache as ``ShadowKV``,
    and ``swa``, the window layers' cache, where a new cell may take any cell that one lane alone
    holds outside that lane's last ``window`` positions (llama.cpp's ``find_slot``, ``swa_full`` or
    not, judged on the cells as they were before the batch). Here such a cell is always taken, the
    oldest first: the harshest choice llama.cpp may make; the lane that held it then leaves all its
    cells up to that position, shared ones too, as llama.cpp purges. Each ``apply`` starts a batch,
    as the engine applies its cell operations before each decode.

    ``write`` also makes llama.cpp's batch check (a lane's new cell follows its last one in ``swa``,
    whose positions are the ones llama.cpp checks), and ``assert_window`` that a lane holds the cells
    its next token attends to in the window layers.
    """

    window: int = 4
    pin_lane: int = -1  # the KV manager's, for the pins a load makes
    swa: ShadowKV = field(init=False)
    _before: dict[int, int] = field(init=False, default_factory=dict)  # lane -> last swa position, batch start
    _fresh: set[int] = field(init=False, default_factory=set)  # swa cells written in this batch

    def __post_init__(self) -> None:
        self.swa = ShadowKV(self.capacity)

    def apply(self, ops: tuple[KVOp, ...] | list[KVOp]) -> None:
        for op in ops:
            if op.kind in ("save", "load", "drop"):
                self._host(op)
            else:
                ShadowKV.apply(self, [op])
                self.swa.apply([op])
        self._snapshot()

    def _host(self, op: KVOp) -> None:
        """The runner's save / load / drop for such a model: every cell saved (in window-long pieces),
        and a load's whole blocks given to the pin lane as they land."""
        if op.kind == "save":
            got = [p for p, _t, ls in self.swa.cells.values() if op.lane in ls and op.p0 <= p < op.p1]
            assert sorted(got) == list(range(op.p0, op.p1)), f"lane {op.lane} lacks window cells to save"
        self._snapshot()
        self._host_op(op)  # writes a load's cells through ``write``
        if op.kind == "load" and op.pinned:
            for cells in (self.cells, self.swa.cells):
                for p, _t, ls in cells.values():
                    if op.lane in ls and p < op.pinned:
                        ls.add(self.pin_lane)

    def _snapshot(self) -> None:
        self._before, self._fresh = {}, set()
        for p, _t, ls in self.swa.cells.values():
            for ln in ls:
                self._before[ln] = max(self._before.get(ln, -1), p)

    def write(self, lane: int, pos: int, token: int) -> None:
        last = max((p for p, _t, ls in self.swa.cells.values() if lane in ls), default=None)
        assert last is None or last == pos - 1, f"llama_decode -1: lane {lane} writes {pos} after its cell {last}"
        super().write(lane, pos, token)
        taken = next((cid for cid, (p, _t, ls) in self.swa.cells.items() if self._reclaimable(cid, p, ls)), None)
        if taken is not None:
            self._purge(*self.swa.cells.pop(taken))
        self._fresh.add(self.swa._next)
        self.swa.write(lane, pos, token)

    def _purge(self, pos: int, _token: int, lanes: set[int]) -> None:
        """llama.cpp's purge after taking a lane's cell: the lane leaves every cell up to that position,
        shared ones too (``apply_ubatch`` keeps each sequence's positions contiguous)."""
        (lane,) = lanes
        for cid, (p, _t, ls) in list(self.swa.cells.items()):
            if p <= pos and lane in ls:
                ls.discard(lane)
                if not ls:
                    del self.swa.cells[cid]

    def _reclaimable(self, cid: int, pos: int, lanes: set[int]) -> bool:
        if len(lanes) != 1 or cid in self._fresh:
            return False
        return self._before.get(next(iter(lanes)), -1) + 1 - pos >= self.window

    def assert_window(self, lane: int, tokens: list[int]) -> None:
        n = len(tokens)
        held = {p: t for p, t, ls in self.swa.cells.values() if lane in ls}
        want = {p: tokens[p] for p in range(max(0, n + 1 - self.window), n)}  # what position n attends to
        assert {p: held.get(p) for p in want} == want and max(held, default=-1) == n - 1, (
            f"lane {lane} lacks window cells: holds {sorted(held)[-self.window:]}, needs {sorted(want)}"
        )


def next_token(context: list[int], vocab: int = 50) -> int:
    return hash(tuple(context)) % vocab


def append_token(seq: Sequence, token: int) -> FinishReason | None:
    seq.token_ids.append(token)
    return FinishReason.LENGTH if seq.num_generated >= seq.params.max_tokens else None


def fake_forward(sched: Scheduler, shadow: ShadowKV, plan: Plan) -> dict[int, int]:
    """Write each scheduled token's cell; check each lane holds exactly its context."""
    shadow.apply(plan.kv_ops)
    sampled = {}
    for item in plan.items:
        seq = item.seq
        for pos in range(seq.num_computed, seq.num_computed + item.num_tokens):
            shadow.write(seq.lane, pos, seq.token_ids[pos])  # type: ignore[arg-type]
        upto = seq.num_computed + item.num_tokens
        assert shadow.lane_tokens(seq.lane) == seq.token_ids[:upto], f"{seq.request_id} sees wrong KV"  # type: ignore[arg-type]
        if isinstance(shadow, SlidingShadowKV):
            shadow.assert_window(seq.lane, seq.token_ids[:upto])  # type: ignore[arg-type]
        if item.sample:
            sampled[seq.uid] = next_token(seq.token_ids)
    return sampled


def drive(sched: Scheduler, shadow: ShadowKV, max_steps: int = 10_000) -> int:
    """Run steps until idle, checking integrity after each; returns the number of steps."""
    steps = 0
    while sched.has_work():
        plan = sched.schedule()
        sampled = fake_forward(sched, shadow, plan)
        sched.update(plan, sampled)
        check_integrity(sched.kv, sched.running)
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    shadow.apply(sched.kv.take_ops())
    return steps


def kv_manager(num_blocks: int = 32, block_size: int = 4, lanes: int = 8) -> KVBlockManager:
    return KVBlockManager(num_blocks, block_size, lanes)
