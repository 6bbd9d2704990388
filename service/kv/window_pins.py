"""The pin lane: a second holder of every full block's cells, for models with a sliding window.

llama.cpp keeps a sliding-window model's window layers in a second cache, where ``find_slot`` gives a
new token any cell that one sequence alone holds outside that sequence's window (``swa_full`` sizes
that cache, it does not change the rule), and ``apply_ubatch`` then purges that sequence from every
cell before it, shared ones too. A cached block held by one lane would lose cells there, and a prefix
copied from it would lack them. So each full block's cells are given to one more sequence id, the
pin lane: the manager pins a block as it registers it (a block computed twice takes the registered
copy's cells instead, ``KVBlockManager._adopt``) and the blocks a host-tier load fills as they land;
then only the partial last block of a running sequence is ever held by one sequence, and it is never
outside that sequence's window.
"""

from __future__ import annotations

from collections.abc import Callable

from service.kv.blocks import Block, KVOp


class WindowPins:
    """Which pinned blocks start where, and the cell operations that pin and unpin them.

    The manager pins every block of the index (as it registers it) and the blocks a host-tier load
    fills (as their cells land); a pinned block is unpinned when its cells go from the pool.
    """

    def __init__(self, pin_lane: int, block_size: int) -> None:
        self.pin_lane = pin_lane
        self.block_size = block_size
        self._at_start: dict[int, set[int]] = {}  # block start -> ids of the pinned blocks there

    def pin(self, block: Block, lane: int) -> KVOp | None:
        """``lane``'s cells of ``block`` are to be the pin lane's too: the operation (None: they are)."""
        if block.pinned:
            return None
        self.track(block)
        return KVOp("cp", self.pin_lane, block.start, block.start + self.block_size, lane)

    def track(self, block: Block) -> None:
        """``block``'s cells are being given to the pin lane by an operation already queued (a load)."""
        block.pinned = True
        self._at_start.setdefault(block.start, set()).add(block.id)

    def unpin(self, block: Block, holder_of: Callable[[int], int]) -> list[KVOp]:
        """``block``'s cells go: the operations that take them from the pin lane (none if not pinned).

        NOTE: llama.cpp removes a sequence's cells by position only, so the pin lane's cells of every
        pinned block at this start go, and those blocks are given back from one of their holders
        (``holder_of``: block id -> a lane holding its cells).
        """
        if not block.pinned:
            return []
        block.pinned = False
        same = self._at_start.get(block.start, set())
        same.discard(block.id)
        if not same:
            self._at_start.pop(block.start, None)
        p0, p1 = block.start, block.start + self.block_size
        return [KVOp("rm", self.pin_lane, p0, p1), *(KVOp("cp", self.pin_lane, p0, p1, holder_of(b)) for b in sorted(same))]
