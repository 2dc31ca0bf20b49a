"""The fused optimizer step on the GPU: one launch per parameter, the CPU kernel's scalar core.

Each thread steps quads of four consecutive global elements in a grid-stride loop with
:func:`lpsim.optim.step.step_quad`, the function the CPU kernel runs: bf16/fp16 weights and
states are read and written as their 16-bit codes, the float32 work stays in registers, and
the random bits are Philox words made in registers from (seed, step, parameter, element).

numba.cuda contracts ``a*b + c`` into an FMA (NVVM's default), which rounds once where the
CPU rounds twice; so on a real GPU the step's products (:func:`lpsim.optim.step.fmul`) are
rebound to ``fmul_rn`` (:func:`rebind`), one source compiled with another primitive.  The
simulator runs the Python source as it is.
"""

from __future__ import annotations

import types

import numpy as np
from numba import cuda
from numba.extending import register_jitable

from lpsim.optim import step as core
from lpsim.optim.step import NCOUNTS

from . import arrays, launch
from .launch import THREADS

#: the functions of lpsim.optim.step that call fmul, directly or through one another
_USERS = ("adamw_moments", "adamw_update", "adamw_direction", "sgd_gradient", "sgd_buffer",
          "sgd_update", "sgd_direction", "step_element", "step_quad")


def rebind(module, overrides: dict, names=_USERS) -> dict:
    """Copies of ``module``'s functions ``names`` whose globals see ``overrides`` (and each
    other's copies), each registered as jitable: the same source with other primitives."""
    space = dict(vars(module))
    space.update(overrides)
    copies = {}
    for name in names:
        fn = getattr(module, name)
        copies[name] = register_jitable(types.FunctionType(fn.__code__, space, fn.__name__,
                                                           fn.__defaults__, fn.__closure__))
    space.update(copies)
    return copies


if launch.SIMULATOR:
    _step_quad = core.step_quad
else:                                                      # pragma: no cover (GPU only)
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _fmul_rn(a, b):
        return libdevice.fmul_rn(a, b)

    _step_quad = rebind(core, {"fmul": _fmul_rn})["step_quad"]


@register_jitable
def _step_all(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, sp16, counts):
    """Every quad of one parameter in a grid-stride loop; the counters added into
    ``counts`` with one atomic per counter and thread."""
    n = wb.size
    first = offset // 4
    nquads = (offset + n + 3) // 4 - first
    local = cuda.local.array(NCOUNTS, np.int64)
    for f in range(NCOUNTS):
        local[f] = 0
    j = cuda.grid(1)
    while j < nquads:
        _step_quad(first + j, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, pw, pc,
                   ps, sp16, local)
        j += cuda.gridsize(1)
    for f in range(NCOUNTS):
        if local[f]:
            cuda.atomic.add(counts, f, local[f])


def _make_kernel(kinds, ints, pw, pc, ps, sp16):
    """The step kernel of one configuration: storage kinds, the integer options (algorithm,
    update, modes, sr bits, nesterov, first step) and the formats' parameters are
    compile-time constants, so each branch on them folds away and the decision keeps only
    the registers its own case needs (AdamW bf16 SR: 162 -> 90 per thread).  The
    hyperparameters, keys and offset stay arguments: they change from step to step."""
    KINDS, INTS, PW, PC, PS, SP16 = kinds, ints, pw, pc, ps, sp16

    def kernel(wb, gb, mb, vb, cb, rb, hp, keys, offset, counts):
        _step_all(wb, gb, mb, vb, cb, rb, KINDS, hp, INTS, keys, offset, PW, PC, PS, SP16,
                  counts)

    return cuda.jit(kernel)


#: configuration -> its kernel (profile_cuda.py and kernel_budget.py read what was made)
KERNELS: dict = {}


def optim_kernel(kinds: tuple, ints: tuple, pw, pc, ps, sp16):
    """The step kernel of a configuration (:func:`_make_kernel`), made once."""
    key = (kinds, ints, pw, pc, ps, sp16)
    found = KERNELS.get(key)
    if found is None:
        found = KERNELS[key] = _make_kernel(kinds, ints, pw, pc, ps, sp16)
    return found


def step_arrays(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, setup, counts,
                stream=0):
    """Launch the step over flat integer device arrays of one parameter's bits (in place);
    the NCOUNTS counters are added into the device array ``counts``."""
    n = wb.size
    if n == 0:
        return
    nquads = (offset + n + 3) // 4 - offset // 4
    grid = launch.grid_size(nquads, launch.current_device())
    kinds, ints, sp16 = tuple(kinds), tuple(ints), tuple(setup.sp16)
    kernel = optim_kernel(kinds, ints, setup.pw, setup.pc, setup.ps, sp16)
    kernel[grid, THREADS, stream](wb, gb, mb, vb, cb, rb, hp, keys, offset, counts)


def step(param, grad, m, v, c, r, kargs, setup, counts):                # pragma: no cover
    """Step torch CUDA tensors (contiguous) on torch's current stream; counters go to the
    device array ``counts`` (NCOUNTS int64), read by the optimizer when asked."""
    with launch.device_of(param):
        stream = launch.torch_stream(param.device)
        sdtype = np.int16 if setup.state_dtype.itemsize == 2 else np.int32
        views = [arrays._torch_bits(t) if t is not None else launch.placeholder((1,), dt)
                 for t, dt in ((param, None), (grad, None), (m, sdtype), (v, sdtype),
                               (c, sdtype), (r, np.int16))]
        step_arrays(*views, *kargs, setup, counts, stream)
