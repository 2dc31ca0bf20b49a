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
_ZEROS = np.zeros(len(SLOTS), np.int64)
#: device -> the buffer a launch without stats gets (its kernel never writes it)
_SCRATCH: dict = {}
#: device buffers baked into captured CUDA graphs: a replay must never write freed memory,
#: so they live as long as the process (one small buffer per captured stats object)
_CAPTURED: list = []


class DeviceCounters:
    """A stats object's counters on one device, and the streams that wrote them since the
    last read (one stream, or 'several': then a read waits for the whole device)."""

    def __init__(self, device: int):
        self.device = device
        self.array = cuda.to_device(_ZEROS)
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
            counts = self.array.copy_to_host(stream=stream)
            self.array.copy_to_device(_ZEROS, stream=stream)
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
    def add_warp_counts(counts, first, c0, c1, c2, c3, c4, c5):
        """Add one thread's six counters into ``counts`` (slots first .. first + 5; a zero
        counter's slot is not touched)."""
        for f, v in enumerate((c0, c1, c2, c3, c4, c5)):
            if v:
                cuda.atomic.add(counts, first + f, v)
else:
    @cuda.jit(device=True)
    def add_warp_counts(counts, first, c0, c1, c2, c3, c4, c5):
        """Sum six counters over the warp by shuffles and add them into ``counts`` (slots
        first .. first + 5; a zero sum's slot is not touched) from its first lane: one
        atomic per warp and counter, no shared memory.  Every lane of the warp must call
        it."""
        width = 16
        while width > 0:
            c0 += cuda.shfl_down_sync(FULL_MASK, c0, width)
            c1 += cuda.shfl_down_sync(FULL_MASK, c1, width)
            c2 += cuda.shfl_down_sync(FULL_MASK, c2, width)
            c3 += cuda.shfl_down_sync(FULL_MASK, c3, width)
            c4 += cuda.shfl_down_sync(FULL_MASK, c4, width)
            c5 += cuda.shfl_down_sync(FULL_MASK, c5, width)
            width >>= 1
        if cuda.laneid == 0:
            for f, v in enumerate((c0, c1, c2, c3, c4, c5)):
                if v:
                    cuda.atomic.add(counts, first + f, v)
