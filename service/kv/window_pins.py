"""The pin lane: a second holder of every registered block's cells, for models with a sliding window.

llama.cpp keeps a sliding-window model's window layers in a second cache, where ``find_slot`` gives a
new token any cell that one sequence alone holds outside that sequence's window (``swa_full`` sizes
that cache, it does not change the rule). A cached block held by one lane would lose cells there, and
a prefix copied from it would lack them. ``WindowPins`` gives each registered block's cells to one
more sequence id, the pin lane, so none of them is ever held by one sequence alone.
"""

from __future__ import annotations

from collections.abc import Callable

from service.kv.blocks import Block, KVOp


class WindowPins:
    """Which registered blocks start where, and the cell operations that pin and unpin them."""

    def __init__(self, pin_lane: int, block_size: int) -> None:
        self.pin_lane = pin_lane
        self.block_size = block_size
        self._at_start: dict[int, set[int]] = {}  # block start -> ids of the registered blocks there

    def pin(self, block: Block, lane: int) -> KVOp:
        """``block`` was just registered from ``lane``'s cells: the operation giving them to the pin lane."""
        self._at_start.setdefault(block.start, set()).add(block.id)
        return KVOp("cp", self.pin_lane, block.start, block.start + self.block_size, lane)

    def unpin(self, block: Block, holder_of: Callable[[int], int]) -> list[KVOp]:
        """``block`` leaves the index: the operations that let its cells go from the pin lane.

        NOTE: llama.cpp removes a sequence's cells by position only, so the pin lane's cells of every
        registered block at this start go, and those blocks are given back from one of their holders
        (``holder_of``: block id -> a lane holding its cells).
        """
        same = self._at_start.get(block.start, set())
        same.discard(block.id)
        if not same:
            self._at_start.pop(block.start, None)
        p0, p1 = block.start, block.start + self.block_size
        return [KVOp("rm", self.pin_lane, p0, p1), *(KVOp("cp", self.pin_lane, p0, p1, holder_of(b)) for b in sorted(same))]
