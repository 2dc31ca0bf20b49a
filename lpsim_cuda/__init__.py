"""lpsim_cuda: lpsim's rounding core as numba.cuda kernels (runs under NUMBA_ENABLE_CUDASIM too)."""

from lpsim._extras import require

require("numba_cuda", extra="cuda", feature="lpsim_cuda")

from .launch import check_numpy  # noqa: E402

check_numpy()

from . import philox  # noqa: E402,F401  (the kernels' Philox: a CUDA-target overload)

from .quantize import quantize, warmup  # noqa: E402

__all__ = ["quantize", "warmup"]
