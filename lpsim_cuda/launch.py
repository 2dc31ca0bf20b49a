"""Where a launch goes: its device, its stream, and the size of its grid.

Why: a launch must order with the caller's work (torch's current stream, a CuPy array's
stream) and size its grid to the device; both rest on facts worth looking up once (the SM
count, numba's wrapper of a foreign stream), so they are cached here.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import numpy as np
from numba import config, cuda

from lpsim._extras import is_torch

SIMULATOR = bool(config.ENABLE_CUDASIM)
#: threads per block; the simulator runs each thread as a Python thread, so it gets fewer
THREADS = 32 if SIMULATOR else 128
#: resident blocks per SM the grid aims at: enough loads in flight to cover memory latency
BLOCKS_PER_SM = 8
#: the simulator's grid: each block costs tens of milliseconds there; two blocks still run
#: the cross-block atomics and the grid-stride loop
SIMULATOR_BLOCKS = 2
#: a cap on the grid in blocks (None: from the device); tests lower it to run the
#: grid-stride loop many times over
GRID_LIMIT: int | None = None
#: every lane of a warp takes part in a shuffle (the kernels' blocks are whole warps)
FULL_MASK = 0xFFFFFFFF


def check_numpy(load=None) -> None:
    """Refuse, at import and with the remedy, a numpy that numba-cuda cannot compile with.

    numba-cuda up to at least 0.30.4 registers ``np.row_stack`` when it builds its typing
    context, so under numpy 2.5 (which removed it) every kernel launch fails with an
    AttributeError from deep inside numba-cuda (seen on an H100, 2026-11-23).  ``load``
    imports that registry (a test passes a stand-in); the check costs nothing on a numpy
    that still has ``row_stack`` and is skipped under the simulator, which never loads it.
    """
    import numpy as np
    if SIMULATOR or hasattr(np, "row_stack"):
        return
    try:
        if load is None:
            import numba.cuda.np.arrayobj  # noqa: F401  (where numba-cuda registers it)
        else:
            load()
    except AttributeError as error:
        import numba_cuda
        raise ImportError(
            f"lpsim_cuda: numba-cuda {numba_cuda.__version__} cannot compile kernels with "
            f"numpy {np.__version__} ({error}); install numpy<2.5 or a numba-cuda release "
            "that supports this numpy") from None


#: (shape, dtype, device) -> a device array that stands in for an argument a kernel ignores
_PLACEHOLDERS: dict = {}


def placeholder(shape: tuple, dtype):
    """A cached device array of ``shape`` for a kernel argument that is not used (no state,
    no counters): allocated once per device, never written by the kernels that take it."""
    key = (tuple(shape), np.dtype(dtype), current_device())
    if key not in _PLACEHOLDERS:
        _PLACEHOLDERS[key] = cuda.device_array(shape, dtype)
    return _PLACEHOLDERS[key]


def overlaps_apart(x_ptr: int, x_bytes: int, out_ptr: int, out_bytes: int, n: int) -> bool:
    """Whether ``out`` (n elements of ``out_bytes`` at ``out_ptr``) shares memory with ``x``
    (n of ``x_bytes``) without being ``x`` itself: the same start and width is an in-place
    call, which every kernel supports; any other overlap races between threads."""
    if out_ptr == x_ptr and out_bytes == x_bytes:
        return False
    return x_ptr < out_ptr + out_bytes * n and out_ptr < x_ptr + x_bytes * n


def address(array) -> int:
    """The device address of a numba device array's data (the simulator's: its host data).
    Read from the pointer that numba's ``__cuda_array_interface__`` reads it from, without
    the dictionary that builds (its contiguity test, shape and dtype: microseconds where a
    route asks each call, as for a counted call's accumulator)."""
    if SIMULATOR:                   # a FakeCUDAArray wraps a numpy array
        return array._ary.ctypes.data
    pointer = getattr(array, "device_ctypes_pointer", None)
    if pointer is None:             # another CUDA-array-interface object
        return array.__cuda_array_interface__["data"][0]
    return pointer.value or 0       # None for an array of no memory, as the interface's 0


def grid_size(nblocks: int, device: int, per_sm: int = BLOCKS_PER_SM) -> int:
    """Blocks for ``nblocks`` Philox blocks (one per thread and pass of the grid-stride loop).

    At most ``per_sm`` blocks an SM: the number a kernel's registers let reside at once (its
    launch bounds), so the grid is one wave.  A larger grid runs a second wave of the blocks
    that did not fit, each making all its passes with the SMs part empty: a kernel limited
    by its latency then takes two waves' time (the optimizer's 8 x 132 blocks, 5 resident
    per SM, ran as 660 + 396 blocks)."""
    cap = GRID_LIMIT or (SIMULATOR_BLOCKS if SIMULATOR else per_sm * _device_sms(device))
    return max(1, min(cap, -(-nblocks // THREADS)))


def configured(kernel, blocks: int, stream=0):
    """``kernel[blocks, THREADS, stream]``, made once per (kernel, grid, stream) on a GPU.

    A small grid is sized to its work, so numba's low-occupancy warning, the only one that
    configuring a launch gives, is noise and is silenced.  The simulator's ``kernel[...]``
    reconfigures one shared object, so there it is made on every call."""
    if SIMULATOR:
        return kernel[blocks, THREADS, stream]
    return _configured(kernel, blocks, stream)


@functools.lru_cache(maxsize=512)
def _configured(kernel, blocks: int, stream):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kernel[blocks, THREADS, stream]


@functools.cache
def _device_sms(device: int) -> int:
    # the caller runs on ``device`` (device_of), so the current device is the one asked about
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def device_of(x):
    """A context that makes x's device current when it is a torch tensor on another one."""
    if is_torch(x) and x.is_cuda:
        import torch
        if x.device.index != torch.cuda.current_device():
            return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def current_device() -> int:
    """The id of numba's current device (0 under the simulator)."""
    return 0 if SIMULATOR else cuda.get_current_device().id


def torch_stream(device):
    """torch's current stream on ``device``, as a stream numba launches on."""
    return external_stream(torch_stream_handle(device))


def torch_stream_handle(device) -> int:
    """The handle of torch's current stream on ``device`` (a torch.device or an index):
    torch's raw query where the build has it (the one torch's compiled code calls), since
    the public stream object costs microseconds a call (benchmarks/results/profile-gpu.txt).
    The raw query takes only an integer index."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        index = device if isinstance(device, int) else device.index
        return raw(torch.cuda.current_device() if index is None else index)
    return torch.cuda.current_stream(device).cuda_stream


def external_stream(handle):
    """numba's stream for a foreign stream handle (a CUDA array interface's "stream" value).

    None, 0 and 1 (the legacy default stream) give numba's default stream 0; wrappers of
    other handles are cached, so a launch does not build one each time.
    """
    if handle is None or handle in (0, 1):
        return 0
    return _wrap_stream(int(handle))


@functools.lru_cache(maxsize=64)
def _wrap_stream(handle: int):
    return cuda.external_stream(handle)


def capturing(x) -> bool:
    """Whether a launch for ``x`` is being captured into a CUDA graph (torch.cuda.graph)."""
    if is_torch(x):
        import torch
        return torch.cuda.is_current_stream_capturing()
    return False
