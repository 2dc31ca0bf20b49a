"""Counters of what rounding did: overflows, underflows, subnormal results, inexact results."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

#: counter names in the order the kernels return them
COUNTERS = ("inexact", "overflow", "underflow", "subnormal", "nan", "inf")


@dataclass
class RoundingStats:
    """Accumulates over every call it is passed to (``quantize(..., stats=s)``).

    elements: values rounded; inexact: results that differ from the input; overflow: finite
    inputs whose rounded magnitude exceeds max_finite; underflow: nonzero finite inputs rounded
    to zero; subnormal: nonzero results below min_normal; nan / inf: NaN and inf inputs.
    """

    elements: int = 0
    inexact: int = 0
    overflow: int = 0
    underflow: int = 0
    subnormal: int = 0
    nan: int = 0
    inf: int = 0
    _pending: list = field(default_factory=list, repr=False, compare=False)

    def __getattribute__(self, name):
        # counters of GPU launches stay on the device until someone reads them
        if name in COUNTERS and object.__getattribute__(self, "_pending"):
            object.__getattribute__(self, "_settle")()
        return object.__getattribute__(self, name)

    def add_pending(self, elements: int, device_counts) -> None:
        """Record a GPU launch's counters (a device array) without synchronising."""
        self.elements += int(elements)
        self._pending.append(device_counts)

    def _settle(self) -> None:
        pending, self._pending = self._pending, []
        for device_counts in pending:
            self.add(0, device_counts.copy_to_host())

    def add(self, elements: int, counts) -> None:
        """Add one call's element count and its counters (in COUNTERS order)."""
        self.elements += int(elements)
        for name, value in zip(COUNTERS, counts):
            setattr(self, name, getattr(self, name) + int(value))

    def __iadd__(self, other: "RoundingStats") -> "RoundingStats":
        for f in fields(self)[:len(COUNTERS) + 1]:
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def reset(self) -> None:
        self._pending = []
        for f in fields(self)[:len(COUNTERS) + 1]:
            setattr(self, f.name, 0)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in ("elements",) + COUNTERS}
