"""What a param group of lpsim.optim may hold: its lpsim options and torch.optim's flags.

Why here: param groups are plain dicts that a user, a scheduler or a loaded state dict may
change, so the optimizer checks them at construction, in add_param_group and at every step;
each check names the value and what is accepted.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import numpy as np
import torch

from lpsim.formats import parse_format
from lpsim.philox import split_key

from .setup import STATE_ROUNDINGS
from .step import UPDATES

IMPLEMENTATIONS = ("fused", "reference")


def check_number(name, value, low=0.0, high=None, open_high=False):
    """A real hyperparameter (Python or numpy scalar, or a 1-element real tensor as torch.optim
    takes for lr; not a bool) in range."""
    if torch.is_tensor(value):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            raise (ValueError if value.numel() != 1 else TypeError)(
                f"{name}={value!r} must be a real number or a 1-element real tensor")
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} must be a real number")
    try:
        nan = math.isnan(value)
    except OverflowError:               # an integer past float64's range
        raise ValueError(f"{name}={value!r} is out of range; accepted: a number float64 "
                         "holds") from None
    if nan:
        raise TypeError(f"{name}={value!r} must be a real number")
    if value < low or (high is not None and (value >= high if open_high else value > high)):
        bound = f"< {high}" if open_high else f"<= {high}"
        raise ValueError(f"{name}={value!r} is out of range; accepted: {low} <= {name}"
                         + (f" {bound}" if high is not None else ""))


#: the largest float32, the precision a step's hyperparameters are computed in
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: the magnitudes that round to a finite float32 are those below 2**128 less half an ulp of
#: FLOAT32_MAX (that tie rounds to the even 2**128: inf)
FLOAT32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103


def check_float32(name, value) -> None:
    """A ValueError unless a hyperparameter (checked by :func:`check_number`) or a product
    of them is finite in float32, the step's precision (lr = 1e39 became inf there, and its
    cast's overflow warning raised mid-step under warnings-as-errors).  Two comparisons, as
    each step checks its groups (a float32 cast under np.errstate took 2.5 µs a value)."""
    x = float(value.item() if torch.is_tensor(value) else value)
    if not -FLOAT32_OVERFLOW < x < FLOAT32_OVERFLOW:
        raise ValueError(f"{name}={value!r} overflows float32, the precision of the step; "
                         f"accepted: {name} <= {FLOAT32_MAX:.8g}")


@contextlib.contextmanager
def naming_group(index: int):
    """A param group's refused hyperparameter, its error prefixed with the group's index."""
    try:
        yield
    except (TypeError, ValueError) as error:
        raise type(error)(f"param group {index}: {error}") from None


#: torch.optim's flags lpsim takes (at these values; ``maximize`` either way): a config
#: written for torch.optim keeps them, and its state dict's groups carry them
TORCH_FLAGS = {"maximize": (False, True), "amsgrad": (False,), "capturable": (False,),
               "differentiable": (False,), "fused": (None, False, True),
               "decoupled_weight_decay": (True,)}
_WHY = {"amsgrad": "lpsim's AdamW keeps no running maximum of the second moment",
        "capturable": "lpsim's steps keep their step counts on the host (no CUDA graphs)",
        "differentiable": "lpsim's kernels do not record autograd through the step",
        "decoupled_weight_decay": "lpsim's AdamW decays the weight decoupled (torch.optim."
                                  "AdamW), not as torch.optim.Adam's L2 term in the gradient"}


def check_flags(group: dict) -> None:
    """A TypeError for a torch.optim flag of the wrong type, a ValueError for one set to what
    lpsim cannot do, naming it (flags absent from a group keep torch's defaults)."""
    for name, accepted in TORCH_FLAGS.items():
        if name not in group:
            continue
        value = group[name]
        if not (isinstance(value, bool) or (value is None and None in accepted)):
            raise TypeError(f"{name}={value!r} is not a bool; accepted: "
                            + ", ".join(map(repr, accepted)))
        if value not in accepted:
            raise ValueError(f"{name}={value!r}: {_WHY[name]}; accepted: "
                             + ", ".join(map(repr, accepted)))
    if group.get("fused") and group["implementation"] == "reference":
        raise ValueError("fused=True with implementation='reference'; accepted: fused=None or "
                         "False with the reference, or implementation='fused'")


#: the options of a param group lpsim reads at every step
OPTIONS = ("update_rounding", "weight_format", "state_format", "state_rounding", "sr_bits",
           "seed", "implementation", "foreach")


def check_options(group: dict) -> None:
    """A clear error for an lpsim option of a param group that is not accepted: at
    construction, in add_param_group and at every step (param_groups are plain dicts a user
    or a loaded state dict may change)."""
    missing = [name for name in OPTIONS if name not in group]
    if missing:
        raise ValueError(f"a param group has no {missing[0]!r}; lpsim's options ("
                         f"{', '.join(OPTIONS)}) must be in every group")
    update_rounding, state_rounding, implementation, foreach, sr_bits = (
        group["update_rounding"], group["state_rounding"], group["implementation"],
        group["foreach"], group["sr_bits"])
    if update_rounding not in UPDATES:
        raise ValueError(f"unknown update_rounding {update_rounding!r}; accepted: "
                         f"{', '.join(UPDATES)}")
    if state_rounding not in STATE_ROUNDINGS:
        raise ValueError(f"unknown state_rounding {state_rounding!r}; accepted: "
                         f"{', '.join(STATE_ROUNDINGS)}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {implementation!r}; accepted: "
                         f"{', '.join(IMPLEMENTATIONS)}")
    for name in ("weight_format", "state_format"):
        if group[name] is not None:
            parse_format(group[name])          # a clear error now, not in a kernel
    if not (foreach is None or isinstance(foreach, bool)):
        raise TypeError(f"foreach={foreach!r} is not a bool; accepted: None (True), True or "
                        "False")
    if sr_bits is not None:
        if isinstance(sr_bits, bool) or not isinstance(sr_bits, (int, np.integer)):
            raise TypeError(f"sr_bits={sr_bits!r} is not an integer; accepted: 1..32 or None")
        if not 1 <= sr_bits <= 32:
            raise ValueError(f"sr_bits={sr_bits!r} is out of range; accepted: 1..32 or None")
    split_key(group["seed"], "seed")
    check_flags(group)
