"""Named accumulation models: which formats a matrix unit reads, accumulates and writes.

The FMAC model (Zhang et al., "Revisiting BFloat16 training", Sec. 2): a <- a + x*y with
low-precision inputs x, y and a wider accumulator a, rounded to the output format at the end.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields, replace

import numpy as np

from ..formats import Format, parse_format
from ..rounding import mode_code

ORDERS = ("sequential", "pairwise", "('blocked', k)")


#: the largest block width k: the kernels take it as an int64
MAX_BLOCK = 2 ** 63 - 1


def check_order(order):
    """The order as "sequential", "pairwise", ("blocked", k) with k a Python int, or None.

    None: any order (BLAS allowed).  k may be any integer type (numpy integers too), not a
    bool or a float, up to MAX_BLOCK.  lpsim.ops calls it before its caches, which key on
    values (("blocked", 3.0) == ("blocked", 3), True == 1).
    """
    if order is None:
        return None
    if isinstance(order, str) and order in ("sequential", "pairwise"):
        return order
    if isinstance(order, tuple) and len(order) == 2 and isinstance(order[0], str) and \
            order[0] == "blocked":
        k = order[1]
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not \
                1 <= k <= MAX_BLOCK:
            raise ValueError(f"order={order!r}: the block width k={k!r} is not accepted; "
                             "accepted: an integer >= 1 and <= 2**63 - 1 (the kernels' int64; "
                             "int or numpy integer, not bool)")
        return ("blocked", int(k))
    raise ValueError(f"unknown order {order!r}; accepted: None (any order), "
                     f"{', '.join(ORDERS)}")


@dataclass(frozen=True)
class AccumulationModel:
    """Input, accumulator and output formats of a matrix unit, fused or not, and its order.

    in_fmt None: operands are used as given.  order None: any order (BLAS where it is
    exactly the accumulator), see :func:`lpsim.ops.matmul`.
    """

    in_fmt: Format | None
    acc_fmt: Format
    out_fmt: Format
    fused: bool = True
    order: object = None
    acc_rounding: str = "nearest"
    out_rounding: str = "nearest"
    description: str = ""

    def __post_init__(self):
        for name in ("in_fmt", "acc_fmt", "out_fmt"):
            value = getattr(self, name)
            if value is not None or name != "in_fmt":
                object.__setattr__(self, name, parse_format(value))
        object.__setattr__(self, "order", check_order(self.order))
        if not isinstance(self.fused, (bool, np.bool_)):    # "False" would be true
            raise TypeError(f"fused={self.fused!r} is not accepted; accepted: True or False "
                            "(a bool)")
        object.__setattr__(self, "fused", bool(self.fused))
        mode_code(self.acc_rounding)
        mode_code(self.out_rounding)

    def __hash__(self) -> int:
        # cached: a model keys the per-call caches of lpsim.ops (not pickled: its strings'
        # hashes differ between processes)
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def with_(self, **changes) -> "AccumulationModel":
        """A copy with the given fields replaced; None values keep the model's."""
        names = {f.name for f in fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise TypeError(f"unknown model fields {sorted(unknown)}; accepted: {sorted(names)}")
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


MODELS: dict[str, AccumulationModel] = {
    "bf16-fp32": AccumulationModel("bf16", "fp32", "fp32",
                                   description="bf16 inputs, fp32 FMA accumulator and output "
                                               "(tensor-core BF16 GEMM; CA-SGD Recipe C)"),
    "fp16-fp32": AccumulationModel("fp16", "fp32", "fp32",
                                   description="fp16 inputs, fp32 accumulator and output"),
    "fp16-fp16": AccumulationModel("fp16", "fp16", "fp16",
                                   description="fp16 inputs, fp16 accumulator (HMMA with "
                                               "half accumulation; CA-SGD Recipe F)"),
    "tf32": AccumulationModel("tf32", "fp32", "fp32",
                              description="fp32 inputs rounded to tf32, fp32 accumulator"),
    "fp32": AccumulationModel("fp32", "fp32", "fp32",
                              description="fp32 inputs, fp32 FMA accumulator and output"),
}


def get_model(model) -> AccumulationModel:
    """A model by name (a key of MODELS) or the model itself."""
    if isinstance(model, AccumulationModel):
        return model
    try:
        return MODELS[model]
    except (KeyError, TypeError):
        raise ValueError(f"unknown accumulation model {model!r}; accepted: "
                         f"{', '.join(MODELS)} or an AccumulationModel (and in "
                         "lpsim.ops.matmul the names of lpsim.ops.HARDWARE_MODELS and "
                         "lpsim.ops.INSTRUCTION_MODELS)") from None
