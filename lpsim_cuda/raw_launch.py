"""A cached route's launch arguments packed once per call into a buffer the driver reads.

Why: cuda.core's ``launch`` converts each flat launch argument on every call (numba passes
an array as seven), about 0.45 µs each on an H200 (20 more arguments raised a call's host
time from 14.7 to 23.9 µs, ``benchmarks/results/ab-gpu.txt``): 19 arguments are more than
half of a specialised quantize call, 90 those of the optimizer's set kernel.  A route's
arguments keep their kinds from call to call, so :class:`ParamBlock` holds them as the
driver reads kernel parameters (slot i: argument i in 8 bytes, a float32 in its first 4),
with the array of the slots' addresses (``cuLaunchKernel``'s ``kernelParams``); a call packs
its values with one ``struct.pack_into`` and launches through ``cuda.bindings``.

Where the driver call is not there or refuses (another cuda-bindings, a handle it does not
take), nothing has been launched: :func:`launch` says so (False) and the caller launches
through cuda.core, as it did before; the first refusal turns the raw path off for the
process (:data:`STATE`).  A block is packed and launched under its lock: the driver copies
the parameters when the launch is enqueued, so the next call may overwrite them.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading

#: how a flat argument of each ctypes kind is packed into its 8-byte slot (little-endian)
_CODES = {ctypes.c_float: "f4x", ctypes.c_double: "d", ctypes.c_int64: "q",
          ctypes.c_uint64: "Q", ctypes.c_int32: "i4x", ctypes.c_uint32: "I4x"}
#: whether raw launches are on; why not, once one was refused
STATE = {"on": True, "why": None}


class ParamBlock:
    """The parameters of one route's launches: ``flat`` (numba's flat argument list: Python
    ints, which numba passes as intptr values, and ctypes scalars) fixes each slot's kind;
    :meth:`pack` writes a call's values."""

    def __init__(self, flat):
        codes = []
        for value in flat:
            kind = type(value)
            if kind is int:
                codes.append("q")
            elif kind in _CODES:
                codes.append(_CODES[kind])
            else:
                accepted = ", ".join(sorted(c.__name__ for c in _CODES))
                raise TypeError(f"a flat launch argument of type {kind.__name__} "
                                f"({value!r}); accepted: int, {accepted}")
        self.format = "<" + "".join(codes)
        self.size = len(codes)
        #: the slots whose values come as ctypes scalars (the rest are ints): only these are
        #: unboxed at each pack
        self.boxed = [i for i, value in enumerate(flat) if type(value) is not int]
        self.slots = (ctypes.c_uint64 * max(self.size, 1))()
        base = ctypes.addressof(self.slots)
        self.pointers = (ctypes.c_void_p * max(self.size, 1))(
            *(base + 8 * i for i in range(self.size)))
        #: cuLaunchKernel's kernelParams: the address of the slots' addresses
        self.address = ctypes.addressof(self.pointers)
        self.lock = threading.Lock()
        #: the driver's handle of the kernel, made at the first launch (one route, one kernel)
        self.handle = None

    def pack(self, flat) -> None:
        """Write ``flat`` (the kinds the block was made with) into the slots."""
        values = list(flat)
        for i in self.boxed:
            values[i] = values[i].value
        struct.pack_into(self.format, self.slots, 0, *values)

    def unpacked(self) -> list:
        """The slots' values as :meth:`pack` wrote them (ints and floats; for tests)."""
        return list(struct.unpack_from(self.format, self.slots, 0))


@functools.cache
def _driver():
    """cuda.bindings' driver module, imported at the first launch (not on every one)."""
    from cuda.bindings import driver
    return driver


def launch(block: ParamBlock, function, blocks: int, threads: int, stream, flat) -> bool:
    """Launch ``function`` (cuda.core's kernel) on ``blocks`` x ``threads`` on ``stream``
    (cuda.core's) with ``flat`` packed into ``block``: True, or False where the raw path is
    off or the driver refused the call before launching anything."""
    if not STATE["on"]:
        return False
    try:
        driver = _driver()
        if block.handle is None:
            block.handle = driver.CUfunction(int(function.handle))
        with block.lock:
            block.pack(flat)
            error = driver.cuLaunchKernel(block.handle, blocks, 1, 1, threads, 1, 1, 0,
                                          int(stream.handle), block.address, 0)[0]
    except Exception as failure:        # noqa: BLE001 (a cuda-bindings without this API)
        STATE.update(on=False, why=repr(failure))
        return False
    if error != driver.CUresult.CUDA_SUCCESS:
        STATE.update(on=False, why=f"cuLaunchKernel: {error!r}")
        return False
    return True


__all__ = ["ParamBlock", "launch", "STATE"]
