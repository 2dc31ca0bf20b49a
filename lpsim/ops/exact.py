"""The exact float64 building blocks, where ``lpsim.ops.exact`` users import them.

They live in :mod:`lpsim.exact`, in the core layer, because lpsim.blocks and lpsim.casgd's
shared kernels use them too and sit below lpsim.ops (docs/architecture.rst).
"""

from ..exact import (FINEST, MAX_M, NEG_ZERO, check_exact, f2i, fma, i2f,  # noqa: F401
                     product_to_odd, quotient_to_odd, sqrt_to_odd, step_sum_to_odd, sum_to_odd,
                     to_odd, zero_sum_bits)

__all__ = ["FINEST", "MAX_M", "NEG_ZERO", "check_exact", "f2i", "fma", "i2f", "product_to_odd",
           "quotient_to_odd", "sqrt_to_odd", "step_sum_to_odd", "sum_to_odd", "to_odd",
           "zero_sum_bits"]
