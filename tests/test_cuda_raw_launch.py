"""lpsim_cuda.raw_launch: a route's flat launch arguments packed as the driver reads kernel
parameters, and the route's launch through cuLaunchKernel or, where the driver refuses,
cuda.core's launch.  No GPU: the driver's entry point is replaced by one that reads back the
parameters it is given, as the driver copies them.  On a GPU every route test launches this
way (test_cuda_specialised.py, test_cuda_block_groups.py, test_optim_cuda.py).
"""

import ctypes
import struct

import numpy as np
import pytest

from lpsim_cuda import raw_launch, specialised
from lpsim_cuda.launch import THREADS

driver = pytest.importorskip("cuda.bindings.driver")

#: a flat argument list of every kind numba passes: an array's seven ints, int64, float32
#: (a value that rounds), float64 (subnormal), an int64 near the top, a negative stream
FLAT = [0, 0, 1024, 4, 0x7F1234567000, 1024, 4, ctypes.c_int64(-5), ctypes.c_float(0.1),
        ctypes.c_double(1e-310), ctypes.c_int64(2 ** 62 + 3), ctypes.c_int32(-7),
        ctypes.c_uint64(2 ** 64 - 1)]


def read_back(address: int, count: int) -> list:
    """The 8 bytes at each of the ``count`` addresses in the array at ``address``: what the
    driver copies for each parameter (it reads each parameter's own size from there)."""
    pointers = (ctypes.c_void_p * count).from_address(address)
    return [ctypes.string_at(p, 8) for p in pointers]


def as_bytes(v) -> bytes:
    if type(v) is int:
        return struct.pack("<q", v)
    return bytes(v).ljust(8, b"\0")         # a ctypes scalar's own bytes, padded to its slot


def test_a_block_holds_each_argument_as_the_driver_reads_it():
    """Each slot holds its argument's bytes (a float32's four, then zeros), the pointer array
    points at the slots in order, and a second pack overwrites every slot."""
    block = raw_launch.ParamBlock(FLAT)
    block.pack(FLAT)
    assert read_back(block.address, len(FLAT)) == [as_bytes(v) for v in FLAT]
    assert block.unpacked()[8] == np.float32(0.1)
    other = [v + 1 if type(v) is int else type(v)(v.value - 1) for v in FLAT]
    block.pack(other)
    assert read_back(block.address, len(FLAT)) == [as_bytes(v) for v in other]


def test_a_block_refuses_a_kind_it_cannot_pack():
    with pytest.raises(TypeError, match="float"):
        raw_launch.ParamBlock([0, 1.5])


class Stream:
    handle = 0x5000


class Function:
    handle = 0x7000


def route(monkeypatch):
    """A Route without a compiled kernel (no GPU): its launch, with cuda.core's launch
    recorded."""
    r = specialised.Route.__new__(specialised.Route)
    r.function, r._block, r._configs = Function(), None, {}
    r.core = []
    r._core_launch = lambda stream, config, function, *flat: r.core.append(flat)
    r.config = lambda blocks: ("config", blocks)
    monkeypatch.setattr(raw_launch, "STATE", {"on": True, "why": None})
    return r


def test_a_route_launches_through_the_driver_with_its_packed_arguments(monkeypatch):
    """cuLaunchKernel gets the kernel's handle as a CUfunction, the grid, THREADS, the
    stream's handle and the block's parameter array, whose slots hold this call's values;
    cuda.core's launch is not called."""
    calls = []

    def fake(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        calls.append((int(f), gx, gy, gz, bx, by, bz, shared, stream, extra,
                      read_back(params, len(FLAT))))
        return (driver.CUresult.CUDA_SUCCESS,)
    monkeypatch.setattr(driver, "cuLaunchKernel", fake)
    r = route(monkeypatch)
    for blocks in (3, 5):
        r.launch(Stream(), blocks, FLAT)
    assert [c[:10] for c in calls] == [(0x7000, b, 1, 1, THREADS, 1, 1, 0, 0x5000, 0)
                                       for b in (3, 5)]
    assert calls[1][10] == [as_bytes(v) for v in FLAT] and r.core == []


@pytest.mark.parametrize("refusal", ["error", "raise"])
def test_a_refused_raw_launch_falls_back_to_cuda_core(monkeypatch, refusal):
    """A driver call that returns an error or raises (another cuda-bindings) launched
    nothing: the route launches through cuda.core, and later calls go there directly."""
    calls = []

    def fake(*args):
        calls.append(args)
        if refusal == "raise":
            raise TypeError("not a CUfunction")
        return (driver.CUresult.CUDA_ERROR_INVALID_HANDLE,)
    monkeypatch.setattr(driver, "cuLaunchKernel", fake)
    r = route(monkeypatch)
    r.launch(Stream(), 3, FLAT)
    r.launch(Stream(), 3, FLAT)
    assert len(calls) == 1 and r.core == [tuple(FLAT)] * 2
    assert not raw_launch.STATE["on"] and raw_launch.STATE["why"]


def test_arguments_it_cannot_pack_go_to_cuda_core(monkeypatch):
    monkeypatch.setattr(driver, "cuLaunchKernel", lambda *args: pytest.fail("raw launch"))
    r = route(monkeypatch)
    r.launch(Stream(), 2, [0, 1.5])
    assert r.core == [(0, 1.5)] and r._block is False


def test_an_arrays_address_is_its_interfaces_data_pointer(monkeypatch):
    """lpsim_cuda.launch.address reads a device array's pointer where numba's
    __cuda_array_interface__ reads it (without building the interface), 0 for an array of no
    memory as the interface gives; another interface object's own data pointer (stand-ins:
    the real arrays need a GPU, whose route checks compare these addresses with numba's)."""
    from lpsim_cuda import launch
    monkeypatch.setattr(launch, "SIMULATOR", False)

    class Array:
        def __init__(self, value):
            self.device_ctypes_pointer = ctypes.c_void_p(value)

        @property
        def __cuda_array_interface__(self):
            value = self.device_ctypes_pointer.value
            return {"data": (value if value is not None else 0, False)}

    class Interface:
        __cuda_array_interface__ = {"data": (0x7F0000004000, False)}

    for array in (Array(0x7F0000001000), Array(None), Interface()):
        assert launch.address(array) == array.__cuda_array_interface__["data"][0]
