"""What the block kernels count: the per-block counter columns (:data:`BLOCK_COUNTERS`),
:class:`BlockStats` (an lpsim.RoundingStats with block counters) and :func:`add_counts`.

Every block writes its own row of counters, on the CPU and in ``lpsim_cuda.blocks``, so
threads and GPU groups never add into one another's; a call's rows are summed into the
caller's stats once, by :func:`add_counts`.
"""

from __future__ import annotations

import numpy as np

from ..stats import RoundingStats, check_count, counter_field

#: per-block counter columns of the kernels
BLOCK_COUNTERS = ("inexact", "overflow", "underflow", "subnormal", "nan", "inf",
                  "clipped_scale", "flushed", "nan_block")


#: what a block format's ``stats`` may be
STATS_ACCEPTED = "an lpsim.RoundingStats, an lpsim.blocks.BlockStats or None"


#: the block fields a device counter of BLOCK_COUNTERS adds to
_FOLDED = {"clipped_scale": "clipped_scales", "flushed": "flushed_blocks",
           "nan_block": "nan_blocks"}


class BlockStats(RoundingStats):
    """RoundingStats of the elements plus per-call block counters.

    overflow counts saturated elements (x / s beyond the element format's largest value);
    blocks: blocks quantized; clipped_scales: scales clamped to the scale format's range;
    flushed_blocks: blocks with a nonzero element whose elements all became zero;
    nan_blocks: blocks given a NaN scale (a NaN or inf element, ``nonfinite="nan"``).
    GPU calls leave their counts on the device until a field is read, as RoundingStats'.
    """

    __slots__ = ("_block",)
    BLOCK_FIELDS = ("blocks", "clipped_scales", "flushed_blocks", "nan_blocks")

    blocks = counter_field(0, "blocks", "_block")
    clipped_scales = counter_field(1, "clipped_scales", "_block")
    flushed_blocks = counter_field(2, "flushed_blocks", "_block")
    nan_blocks = counter_field(3, "nan_blocks", "_block")

    def __init__(self, **counts):
        block = [check_count(name, counts.pop(name, 0)) for name in self.BLOCK_FIELDS]
        super().__init__(**counts)
        self._block = np.array(block, np.int64)

    def add_blocks(self, blocks: int, counts) -> None:
        """Add one call's block count and its clipped, flushed and NaN blocks (int64)."""
        self._block[0] += int(blocks)
        self._block[1:] += counts

    def _fold(self, name: str, value: int) -> None:
        if name in _FOLDED:
            self._block[self.BLOCK_FIELDS.index(_FOLDED[name])] += value
        else:
            super()._fold(name, value)

    def as_dict(self) -> dict:
        return {**super().as_dict(), **{name: getattr(self, name) for name in self.BLOCK_FIELDS}}

    def reset(self) -> None:
        super().reset()
        self._block[:] = 0

    def __iadd__(self, other: RoundingStats) -> "BlockStats":
        """The element counters of any RoundingStats, and a BlockStats' block counters."""
        if super().__iadd__(other) is NotImplemented:
            return NotImplemented
        if isinstance(other, BlockStats):
            for name in self.BLOCK_FIELDS:
                setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def __add__(self, other: RoundingStats) -> RoundingStats:
        """Two BlockStats sum to a BlockStats; with a plain RoundingStats, the element
        counters sum to a RoundingStats (the plain one has no block counters)."""
        if not isinstance(other, RoundingStats):
            return NotImplemented
        total = BlockStats() if isinstance(other, BlockStats) else RoundingStats()
        total += self
        total += other
        return total

    def __repr__(self) -> str:
        return "BlockStats(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ")"

    def __getstate__(self):
        return self.as_dict()

    def __setstate__(self, state):
        self.__init__(**state)

    def __copy__(self) -> "BlockStats":
        return BlockStats(**self.as_dict())

    def __deepcopy__(self, memo) -> "BlockStats":
        return self.__copy__()


def add_launched(stats, elements: int, blocks: int) -> None:
    """Add what a counting GPU launch's caller knows on the host (its elements and blocks) to
    ``stats``; the launch's counters stay on the device until a field is read."""
    if stats is None:
        return
    stats.counts[0] += int(elements)
    if isinstance(stats, BlockStats):
        stats._block[0] += int(blocks)


def add_counts(stats, counts, elements, blocks=None) -> None:
    """Add a call's counts to a RoundingStats (and the block fields of BlockStats): rows of
    :data:`BLOCK_COUNTERS` whose sum is the call's, ``counts.shape[:2]`` blocks (one row per
    block) unless ``blocks`` says how many (rows of sums)."""
    if stats is None:
        return
    totals = counts.reshape(-1, len(BLOCK_COUNTERS)).sum(axis=0)
    stats.add(elements, totals[:6])
    if isinstance(stats, BlockStats):
        stats.add_blocks(counts.shape[0] * counts.shape[1] if blocks is None else blocks,
                         totals[6:9])
