"""Where an optimizer's random bits come from: (seed, step, parameter, slot, element).

The bits that round element ``i`` of parameter ``p`` at step ``t`` are lpsim's Philox words
(:mod:`lpsim.philox`) with key ``seed`` and

* stream ``(t << 24) | (p << 2) | slot``: ``t`` the parameter's step count (1, 2, ...),
  ``p`` its position among the optimizer's parameters (param groups in order, < 2**22),
  ``slot`` 0 for the weight update, 1 for the first moment (SGD: momentum buffer), 2 for
  the second moment;
* counter: ``i``, the element's index in the *unsharded* parameter (C order), which is
  ``offset`` of :func:`lpsim.quantize`.

Every rounding draws a 32-bit word, four elements to a Philox block (lane ``i % 4`` of
block ``i // 4``): the states' (float32 containers) and the weight update's, which is
rounded from the float64 value ``w - u``.  32 bits decide stochastic rounding to within
2**-32 of a quantum (the round-up probability is ceil(frac 2**32) / 2**32); a float64
container's 62 bits would take two Philox blocks per four weights instead of one, and the
generator is most of a CPU step's cost.

So no key is used twice in a run, every data-parallel rank draws the same bits without
communicating (SR paper Algorithm 1 line 9, "shared randomness"), and a shard of a parameter
(FSDP2, DTensor) rounds each element exactly as the whole parameter would.
"""

from __future__ import annotations

WEIGHT, FIRST_MOMENT, SECOND_MOMENT = 0, 1, 2
MAX_PARAMS = 1 << 22
MAX_STEPS = 1 << 40


def stream(step: int, index: int, slot: int) -> int:
    """The Philox stream of (step, parameter position, slot)."""
    if not 0 <= index < MAX_PARAMS:
        raise ValueError(f"parameter position {index} is out of range; lpsim.optim keys at most "
                         f"{MAX_PARAMS} parameters")
    if not 0 <= step < MAX_STEPS:
        raise ValueError(f"step {step} is out of range; accepted: 0 <= step < 2**40")
    return (int(step) << 24) | (int(index) << 2) | int(slot)


def global_offset(param) -> int:
    """Global index of the first local element of ``param`` in its unsharded tensor.

    0 for ordinary tensors.  A DTensor (FSDP2 ``fully_shard``, tensor parallel) whose local
    shard is one contiguous run of the global tensor (sharded on dim 0, or replicated) gets
    the start of that run; other layouts raise, since their elements are not one run.
    """
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:                                      # pragma: no cover
        return 0
    if not isinstance(param, DTensor):
        return 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape, start = compute_local_shape_and_global_offset(param.shape, param.device_mesh,
                                                         param.placements)
    stride, offset = 1, 0
    for size, first in zip(reversed(param.shape), reversed(start)):
        offset += first * stride
        stride *= size
    if any(size != whole for size, whole in zip(shape[1:], param.shape[1:])):
        raise ValueError(f"a DTensor parameter with placements {param.placements} and local "
                         f"shape {tuple(shape)} of {tuple(param.shape)} is not one contiguous "
                         "run of the global tensor; lpsim.optim keys DTensors sharded on dim 0 "
                         "or replicated")
    return int(offset)
