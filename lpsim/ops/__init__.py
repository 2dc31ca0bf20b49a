"""Simulated arithmetic: elementwise ops, sums, dots and GEMM with separate input, accumulator
and output formats, and the error-bound constants that go with them.

Repeated calls are cheap: the first array call of an elementwise request (op, fmt,
rounding, dtype, sr_bits), and the first 2-D ``matmul`` or 1-D ``dot`` of a model, dtypes
and shapes on one thread, go the general way and leave a plan that later calls run from
(numpy float32/float64 operands, no ``stats``/``out`` for products, no ``in_fmt``/``out``
for elementwise ops); elementwise calls on scalars (Python floats, numpy scalars) to a
deterministic mode with nothing else asked run one compiled call once their (op, fmt,
rounding, container) was seen; the results are the same bits either way."""

from .bounds import gamma, input_cast_factor
from .elementwise import add, div, fma, mul, sqrt, sub
from .models import MODELS, AccumulationModel, get_model
from .hardware import HARDWARE_MODELS, TensorCoreModel
from .instruction_models import INSTRUCTION_MODELS, InstructionModel, scaled_matmul
from .reductions import dot, matmul, sum
from .mma import mma, wgmma_matmul

__all__ = ["add", "sub", "mul", "div", "fma", "sqrt", "sum", "dot", "matmul", "MODELS",
           "AccumulationModel", "get_model", "gamma", "input_cast_factor", "HARDWARE_MODELS",
           "TensorCoreModel", "InstructionModel", "INSTRUCTION_MODELS", "scaled_matmul", "mma",
           "wgmma_matmul"]
