"""lpsim for torch users: tensor rounding that autograd sees, autograd quantizers, a qtorch
drop-in (:mod:`lpsim.torch.qtorch_compat`), per-tensor precision assignment
(:mod:`lpsim.torch.precision`) and simulated FP8/MXFP8/NVFP4 training recipes
(:mod:`lpsim.torch.recipes`, :mod:`lpsim.torch.simulate`, with the GEMMs of
:mod:`lpsim.torch.gemms` and the attention projections of :mod:`lpsim.torch.attention`).
Importing it needs torch; ``import lpsim`` does not."""

from .._extras import require

require("torch", extra="torch", feature="lpsim.torch")

from .precision import (Candidates, DynamicLossScaler, PrecisionAssignment, PrecisionModel,
                        assign)
from .quantizer import Quantizer, Rounding, quantizer
from .tensors import quantize
from .recipes import PRESETS, Gemm, Operand, Recipe, recipe
from .simulate import (Report, SimulatedLinear, SimulatedMultiheadAttention, report,
                       simulate)
from .resume import load_simulation_state, simulation_state

__all__ = ["quantize", "quantizer", "Quantizer", "Rounding", "PrecisionModel",
           "PrecisionAssignment", "Candidates", "DynamicLossScaler", "assign", "simulate",
           "SimulatedLinear", "SimulatedMultiheadAttention", "report", "Report", "Recipe",
           "Gemm", "Operand", "recipe", "PRESETS", "simulation_state", "load_simulation_state"]
