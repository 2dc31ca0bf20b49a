"""Simulated arithmetic: elementwise ops, sums, dots and GEMM with separate input, accumulator
and output formats, and the error-bound constants that go with them."""

from .bounds import gamma, input_cast_factor
from .elementwise import add, div, fma, mul, sqrt, sub
from .models import MODELS, AccumulationModel, get_model
from .hardware import HARDWARE_MODELS, TensorCoreModel
from .reductions import dot, matmul, sum

__all__ = ["add", "sub", "mul", "div", "fma", "sqrt", "sum", "dot", "matmul", "MODELS",
           "AccumulationModel", "get_model", "gamma", "input_cast_factor", "HARDWARE_MODELS",
           "TensorCoreModel"]
