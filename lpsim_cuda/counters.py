"""The device side of RoundingStats: one accumulator per stats object and device.

Why: a counts buffer per call costs an allocation and a host copy per launch and cannot be
captured in a CUDA graph.  The kernels add into the accumulator with atomics; it is copied
back only when the stats are read, on the stream that wrote it, so the read is not stale.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from lpsim.stats import SLOTS

from .launch import FULL_MASK, SIMULATOR

#: slot of the accumulator the kernel adds the element count to
ELEMENTS = SLOTS.index("elements")
#: device -> the buffer a launch without stats gets (its kernel never writes it)
_SCRATCH: dict = {}
#: device buffers baked into captured CUDA graphs: a replay must never write freed memory,
#: so they live as long as the process (one small buffer per captured stats object)
_CAPTURED: list = []


class DeviceCounters:
    """A stats object's counters on one device, and the streams that wrote them since the
    last read (one stream, or 'several': then a read waits for the whole device).

    ``names``: what the counter slots count (the element kernels' SLOTS, or a block kernel's
    BLOCK_COUNTERS); ``tail``: constants the kernel reads after them (a block format's clip
    bounds), which a read neither returns nor zeroes."""

    def __init__(self, device: int, names: tuple = SLOTS, tail: tuple = ()):
        self.device = device
        self.names = names
        self.array = cuda.to_device(np.array([0] * len(names) + list(tail), np.int64))
        self.stream = None        # the stream launched on since the last read
        self.mixed = False        # launched on more than one stream since the last read
        self.captured = False     # in a CUDA graph: replays add to it unseen, so always read

    @property
    def dirty(self) -> bool:
        return self.stream is not None or self.captured

    def launched(self, stream, captured: bool) -> None:
        """Note a launch on ``stream`` that adds into this accumulator."""
        if self.stream is None:
            self.stream = stream
        elif stream != self.stream:           # numba streams compare by identity
            self.mixed = True
        if captured and not self.captured:
            self.captured = True
            _CAPTURED.append(self.array)

    def drain(self) -> np.ndarray:
        """The counts added since the last drain (SLOTS order), zeroing them on the device."""
        with cuda.gpus[self.device]:
            if self.mixed or self.captured or self.stream is None:
                cuda.synchronize()            # several or unknown streams: wait for them all
                stream = 0
            else:
                stream = self.stream
            head = len(self.names)
            counts = self.array.copy_to_host(stream=stream)[:head]
            self.array[:head].copy_to_device(np.zeros(head, np.int64), stream=stream)
            if stream:
                stream.synchronize()
        self.stream, self.mixed = None, False
        return counts


def launch_counts(stats, device: int, stream, capturing):
    """(buffer, count) for a launch: ``stats``' accumulator on ``device``, or, for
    ``stats=None``, a cached scratch buffer and count=False (the kernel skips its reduction).

    ``capturing()`` says whether the launch is being captured into a CUDA graph, where
    nothing may be allocated: the buffers must exist by then (:func:`lpsim_cuda.warmup`).
    """
    if stats is None:
        scratch = _SCRATCH.get(device)
        if scratch is None:
            _refuse_during_capture(capturing, "lpsim_cuda.warmup()")
            scratch = _SCRATCH[device] = cuda.device_array(len(SLOTS), np.int64)
        return scratch, False
    accumulator = stats.device_counters(device)
    if accumulator is None:
        _refuse_during_capture(capturing, "lpsim_cuda.warmup(stats=stats)")
        accumulator = stats.device_counters(device, lambda: DeviceCounters(device))
    accumulator.launched(stream, capturing())
    return accumulator.array, True


#: block accumulators a stats object keeps per device before the oldest are read and
#: dropped (one per format's clip bounds: an NVFP4 call given a new tensor scale makes one)
MAX_BLOCK_ACCUMULATORS = 8


def launch_block_counts(stats, device: int, stream, capturing, names: tuple, bounds: tuple):
    """The device array a counting block kernel adds its counters (``names``:
    lpsim.blocks.BLOCK_COUNTERS) into, then reads its clip ``bounds`` (lo, hi) from:
    ``stats``' accumulator on ``device`` for those bounds, made on first use and read only
    when ``stats`` is (no copy back, no allocation a call)."""
    key = ("blocks", device, *(int(b) for b in bounds))
    accumulator = stats.device_counters(key)
    if accumulator is None:
        _refuse_during_capture(capturing, "lpsim.quantize once with these stats and this format")
        held = [k for k, a in stats._devices.items()
                if isinstance(k, tuple) and k[:2] == ("blocks", device) and not a.captured]
        if len(held) >= MAX_BLOCK_ACCUMULATORS:
            stats.sync()                               # their counts are in the fields now
            for k in held:
                del stats._devices[k]
        accumulator = stats.device_counters(
            key, lambda: DeviceCounters(device, names, tuple(bounds)))
    accumulator.launched(stream, capturing())
    return accumulator.array


def _refuse_during_capture(capturing, remedy: str) -> None:
    if capturing():
        raise RuntimeError("lpsim_cuda.quantize would allocate its counters buffer inside a "
                           f"CUDA graph capture, which cannot allocate; call {remedy} before "
                           "capturing")


def prepare(stats, device: int) -> None:
    """Allocate the scratch buffer of ``device`` and, given ``stats``, its accumulator there."""
    launch_counts(None, device, 0, lambda: False)
    if stats is not None:
        stats.device_counters(device, lambda: DeviceCounters(device))


if SIMULATOR:               # the simulator has no warp shuffles: each thread adds its own
    @cuda.jit(device=True)
    def add_warp_count(counts, slot, v):
        """Add one thread's counter ``v`` into ``counts[slot]`` (not touched where it is 0)."""
        if v:
            cuda.atomic.add(counts, slot, v)
else:
    @cuda.jit(device=True)
    def add_warp_count(counts, slot, v):
        """Sum the counter ``v`` over the warp by shuffles and add it into ``counts[slot]``
        from the first lane (not touched where the sum is 0): one atomic a warp, no shared
        memory, where one a thread put as many atomics on one address as the grid has
        threads.  Every lane of the warp must call it."""
        width = 16
        while width > 0:
            v += cuda.shfl_down_sync(FULL_MASK, v, width)
            width >>= 1
        if cuda.laneid == 0 and v:
            cuda.atomic.add(counts, slot, v)


@cuda.jit(device=True)
def add_warp_counts(counts, first, c0, c1, c2, c3, c4, c5):
    """:func:`add_warp_count` of six counters, into slots first .. first + 5."""
    add_warp_count(counts, first, c0)
    add_warp_count(counts, first + 1, c1)
    add_warp_count(counts, first + 2, c2)
    add_warp_count(counts, first + 3, c3)
    add_warp_count(counts, first + 4, c4)
    add_warp_count(counts, first + 5, c5)
