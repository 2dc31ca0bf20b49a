"""lpsim_cuda: lpsim's rounding core as numba.cuda kernels (runs under NUMBA_ENABLE_CUDASIM too)."""

from .quantize import quantize, warmup

__all__ = ["quantize", "warmup"]
