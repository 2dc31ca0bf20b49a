"""Stand-ins of numba device arrays, for checking a route's flat launch arguments against
numba's own flattening (``_Kernel._prepare_args``) without a GPU.

Imported by the scripts that tests run in a process without the CUDA simulator
(test_optim_cuda.py, test_cuda_block_groups.py, test_cuda_hadamard.py): a route builds the
flat list cuda.core or the driver gets, and numba's launch would build the same list for the
same arguments; on a GPU each route checks this once against the real launch.
"""

import types

import numba
import numba.cuda.dispatcher as dispatcher
import numpy as np
from numba.core import types as T


class Device:
    """What numba's flattening and lpsim_cuda.launch.address read of a C-contiguous device
    array of ``shape`` and ``dtype`` at ``ptr``."""

    def __init__(self, shape, dtype, ptr):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.shape, self.dtype, self.ptr = shape, np.dtype(dtype), ptr
        self.size, self.ndim = int(np.prod(shape)), len(shape)
        strides = [self.dtype.itemsize * int(np.prod(shape[k + 1:])) for k in range(len(shape))]
        self._layout = types.SimpleNamespace(strides_in_bytes=tuple(strides))
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": self.shape,
                                         "typestr": self.dtype.str, "version": 2}
        self._numba_type_ = T.Array(numba.from_dtype(self.dtype), self.ndim, "C")


class _Kernel:
    extensions = []
    _prepare_args = dispatcher._Kernel._prepare_args


def flatten(kinds, args) -> list:
    """numba's flat launch arguments for ``args`` of numba types ``kinds`` (stand-ins for
    its device arrays, which it then passes as they are)."""
    saved = dispatcher.wrap_arg
    dispatcher.wrap_arg = lambda value: types.SimpleNamespace(
        to_device=lambda retr, stream: value)
    try:
        flat = []
        for kind, value in zip(kinds, args):
            _Kernel()._prepare_args(kind, value, 0, [], flat)
        return flat
    finally:
        dispatcher.wrap_arg = saved


def typeof(args) -> tuple:
    """numba's types of ``args``, as its dispatcher types a launch's."""
    return tuple(numba.typeof(a) for a in args)
