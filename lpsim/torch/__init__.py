"""lpsim for torch users: tensor rounding that autograd sees, autograd quantizers, a qtorch
drop-in (:mod:`lpsim.torch.qtorch_compat`) and per-tensor precision assignment
(:mod:`lpsim.torch.precision`).  Importing it needs torch; ``import lpsim`` does not."""

from .._extras import require

require("torch", extra="torch", feature="lpsim.torch")

from .precision import (Candidates, DynamicLossScaler, PrecisionAssignment, PrecisionModel,
                        assign)
from .quantizer import Quantizer, Rounding, quantizer
from .tensors import quantize

__all__ = ["quantize", "quantizer", "Quantizer", "Rounding", "PrecisionModel",
           "PrecisionAssignment", "Candidates", "DynamicLossScaler", "assign"]
