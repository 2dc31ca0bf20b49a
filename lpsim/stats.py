"""Counters of what rounding did: overflows, underflows, subnormal results, inexact results.

GPU launches add their counters into a device accumulator per stats object and device (made
by lpsim_cuda on first use) instead of copying them back per call; reading a field folds the
accumulators into the fields, after waiting for the streams that wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: counter names in the order the kernels return them
COUNTERS = ("inexact", "overflow", "underflow", "subnormal", "nan", "inf")
#: the fields of a RoundingStats
FIELDS = ("elements",) + COUNTERS
#: the slots of a device accumulator: the kernels' counters, then elements
SLOTS = COUNTERS + ("elements",)


@dataclass
class RoundingStats:
    """Accumulates over every call it is passed to (``quantize(..., stats=s)``).

    elements: values rounded; inexact: results that differ from the input; overflow: finite
    inputs whose rounded magnitude exceeds max_finite; underflow: nonzero finite inputs rounded
    to zero; subnormal: nonzero results below min_normal; nan / inf: NaN and inf inputs.

    GPU calls leave their counts on the device: reading a field (or ``==``, ``repr``,
    ``as_dict``, ``+=``) first waits for those launches and adds them in.  Once captured in
    a CUDA graph, whose replays add unseen, every read waits for the whole device.
    """

    elements: int = 0
    inexact: int = 0
    overflow: int = 0
    underflow: int = 0
    subnormal: int = 0
    nan: int = 0
    inf: int = 0
    # device id -> accumulator with ``dirty`` (it may hold unread counts) and ``drain()``
    # (the counts in SLOTS order, zeroing them); lpsim_cuda.counters.DeviceCounters
    _devices: dict = field(default_factory=dict, repr=False, compare=False)

    def __getattribute__(self, name):
        if name in FIELDS and any(d.dirty for d in object.__getattribute__(self, "_devices")
                                  .values()):
            object.__getattribute__(self, "sync")()
        return object.__getattribute__(self, name)

    def device_counters(self, device, make=None):
        """The accumulator GPU launches on ``device`` add into; ``make()`` creates a missing
        one (without ``make``, a missing one is None)."""
        if device not in self._devices and make is not None:
            self._devices[device] = make()
        return self._devices.get(device)

    def sync(self) -> None:
        """Wait for the GPU launches that counted into this object and add their counts in."""
        for accumulator in self._devices.values():
            if accumulator.dirty:
                for name, value in zip(SLOTS, accumulator.drain()):
                    setattr(self, name, object.__getattribute__(self, name) + int(value))

    def add(self, elements: int, counts) -> None:
        """Add one call's element count and its counters (in COUNTERS order)."""
        for name, value in zip(FIELDS, (elements, *counts)):
            # host fields only: counts still on a device are added when read
            setattr(self, name, object.__getattribute__(self, name) + int(value))

    def __iadd__(self, other: "RoundingStats") -> "RoundingStats":
        self.add(other.elements, [getattr(other, name) for name in COUNTERS])
        return self

    def reset(self) -> None:
        for accumulator in self._devices.values():
            if accumulator.dirty:
                accumulator.drain()       # zero the device side too (after its launches)
        for name in FIELDS:
            setattr(self, name, 0)

    def as_dict(self) -> dict:
        self.sync()
        return {name: object.__getattribute__(self, name) for name in FIELDS}

    def __getstate__(self):
        # pickles and copies carry the totals, not the device buffers
        self.sync()
        return {**self.__dict__, "_devices": {}}
