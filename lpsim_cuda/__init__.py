"""lpsim_cuda: lpsim's rounding core as numba.cuda kernels (runs under NUMBA_ENABLE_CUDASIM too)."""

from lpsim._extras import require

require("numba_cuda", extra="cuda", feature="lpsim_cuda")

from .quantize import quantize, warmup

__all__ = ["quantize", "warmup"]
