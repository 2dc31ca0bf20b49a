"""Counters of what rounding did: overflows, underflows, subnormal results, inexact results.

GPU launches add their counters into a device accumulator per stats object and device (made
by lpsim_cuda on first use) instead of copying them back per call; reading a field folds the
accumulators into the fields, after waiting for the streams that wrote them.
"""

from __future__ import annotations

import numpy as np

#: counter names in the order the kernels return them
COUNTERS = ("inexact", "overflow", "underflow", "subnormal", "nan", "inf")
#: the fields of a RoundingStats, in the order of its host counter vector
FIELDS = ("elements",) + COUNTERS
#: the slots of a device accumulator: the kernels' counters, then elements
SLOTS = COUNTERS + ("elements",)


def check_count(name: str, value) -> int:
    """A counter's value: an integer (Python or numpy, not a bool) from 0 to 2**63 - 1."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} is not accepted; accepted: an integer count")
    if not 0 <= value <= 2 ** 63 - 1:
        raise ValueError(f"{name}={value!r} is out of range; accepted: 0 <= {name} <= "
                         "2**63 - 1")
    return int(value)


def counter_field(index: int, name: str, store: str = "counts"):
    """The property of counter ``name``, slot ``index`` of the object's ``store`` array: a
    read first adds in what GPU launches left on the device; a write is checked."""
    def get(self) -> int:
        if self._devices:
            self.sync()
        return int(getattr(self, store)[index])

    def set_(self, value) -> None:
        getattr(self, store)[index] = check_count(name, value)

    return property(get, set_, doc=f"{name} (see the class docstring)")


class RoundingStats:
    """Accumulates over every call it is passed to (``quantize(..., stats=s)``).

    elements: values rounded; inexact: results that differ from the input; overflow: finite
    inputs whose rounded magnitude exceeds max_finite; underflow: nonzero finite inputs rounded
    to zero; subnormal: nonzero results below min_normal; nan / inf: NaN and inf inputs.

    The CPU kernels add straight into ``counts`` (int64, FIELDS order), so leaving stats on
    costs nothing measurable.  GPU calls leave their counts on the device: reading a field
    (or ``==``, ``repr``, ``as_dict``, ``+``) first waits for those launches and adds them
    in.  Once captured in a CUDA graph, whose replays add unseen, every read waits for the
    whole device.  One object is not meant to be updated from several threads at once.
    """

    __slots__ = ("counts", "_devices")

    def __init__(self, elements: int = 0, inexact: int = 0, overflow: int = 0,
                 underflow: int = 0, subnormal: int = 0, nan: int = 0, inf: int = 0):
        given = (elements, inexact, overflow, underflow, subnormal, nan, inf)
        self.counts = np.array([check_count(name, v) for name, v in zip(FIELDS, given)], np.int64)
        # device id -> accumulator with ``dirty`` (it may hold unread counts) and ``drain()``
        # (the counts in SLOTS order, zeroing them); lpsim_cuda.counters.DeviceCounters
        self._devices = {}

    elements = counter_field(0, "elements")
    inexact = counter_field(1, "inexact")
    overflow = counter_field(2, "overflow")
    underflow = counter_field(3, "underflow")
    subnormal = counter_field(4, "subnormal")
    nan = counter_field(5, "nan")
    inf = counter_field(6, "inf")

    def device_counters(self, device, make=None):
        """The accumulator GPU launches on ``device`` add into; ``make()`` creates a missing
        one (without ``make``, a missing one is None)."""
        if device not in self._devices and make is not None:
            self._devices[device] = make()
        return self._devices.get(device)

    def sync(self) -> None:
        """Wait for the GPU launches that counted into this object and add their counts in
        (an accumulator's ``names`` say what its slots count: SLOTS unless it says)."""
        for accumulator in self._devices.values():
            if accumulator.dirty:
                for name, value in zip(getattr(accumulator, "names", SLOTS),
                                       accumulator.drain()):
                    self._fold(name, int(value))

    def _fold(self, name: str, value: int) -> None:
        """Add a device counter named ``name`` (a field's name; others are not counted
        here: a block format's block counters, which lpsim.blocks.BlockStats keeps)."""
        if name in FIELDS:
            self.counts[FIELDS.index(name)] += value

    def add(self, elements: int, counts) -> None:
        """Add one call's element count and its counters (in COUNTERS order)."""
        # host fields only: counts still on a device are added when read
        self.counts[0] += int(elements)
        if type(counts) is np.ndarray and counts.dtype == np.int64:     # a kernel's sums
            self.counts[1:] += counts
        else:
            self.counts[1:] += np.asarray([int(c) for c in counts], np.int64)

    def as_dict(self) -> dict:
        self.sync()
        return dict(zip(FIELDS, (int(c) for c in self.counts)))

    def __iadd__(self, other: "RoundingStats") -> "RoundingStats":
        if not isinstance(other, RoundingStats):
            return NotImplemented
        other.sync()
        self.sync()
        room = np.iinfo(np.int64).max - self.counts
        if np.any(other.counts > room):     # int64 would wrap to a negative count
            i = int(np.argmax(other.counts > room))
            raise OverflowError(f"adding RoundingStats: {FIELDS[i]} would pass 2**63 - 1 "
                                f"({int(self.counts[i])} + {int(other.counts[i])}); nothing "
                                "was added")
        self.counts += other.counts
        return self

    def __add__(self, other: "RoundingStats") -> "RoundingStats":
        if not isinstance(other, RoundingStats):
            return NotImplemented
        total = RoundingStats()
        total += self
        total += other
        return total

    def __eq__(self, other) -> bool:
        if not isinstance(other, RoundingStats):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    __hash__ = None     # mutable

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value}" for name, value in self.as_dict().items())
        return f"RoundingStats({fields})"

    def reset(self) -> None:
        for accumulator in self._devices.values():
            if accumulator.dirty:
                accumulator.drain()       # zero the device side too (after its launches)
        self.counts[:] = 0

    def __getstate__(self):
        # pickles and copies carry the totals, not the device buffers
        return self.as_dict()

    def __setstate__(self, state) -> None:
        self.__init__(**state)

    def __copy__(self) -> "RoundingStats":
        return RoundingStats(**self.as_dict())

    def __deepcopy__(self, memo) -> "RoundingStats":
        return self.__copy__()


def check_stats(stats, accepted: str = "an lpsim.RoundingStats or None", where: str = ""):
    """``stats``, or a TypeError naming it (after ``where``, e.g. "matmul: ") unless it is a
    RoundingStats (or None): the one check of every entry point that takes stats."""
    if stats is not None and not isinstance(stats, RoundingStats):
        raise TypeError(f"{where}stats={stats!r} is a {type(stats).__name__}; accepted: "
                        f"{accepted}")
    return stats


def staged(stats):
    """A fresh, empty stats object of ``stats``' own kind (a RoundingStats, a BlockStats)
    for a call to count into, added into ``stats`` by :func:`commit` once the call has
    succeeded: a call refused after it counted (a bad ``out``, seed or offset found late)
    changes nothing.  None and other kinds (the call's check names them) pass through, as
    does a subclass that needs arguments to be made."""
    if not isinstance(stats, RoundingStats):
        return stats
    try:
        return type(stats)()
    except TypeError:
        return stats


def commit(stats, scratch) -> None:
    """Add what a call counted into ``scratch`` (:func:`staged`'s) into ``stats``."""
    if scratch is not stats:
        stats += scratch
