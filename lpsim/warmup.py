"""``lpsim.warmup``: compile (or load from numba's on-disk cache) the CPU kernels ahead of use.

A kernel compiles once per machine, in seconds, and later processes load it from the cache
in a fraction of a second; either happens on its first call.  Call ``warmup`` before timing
code, before a hypothesis test with a deadline, or once after installing (``lpsim warmup``).

What it prepares, each by one small call of the public function that a program makes first
(:func:`jobs` lists them by name):

* ``lpsim.quantize`` to element formats: the kernel of each of ``modes`` for each of
  ``containers``, and float32 nearest's kernels without stats;
* ``blocks``: ``lpsim.quantize`` to block formats (mxfp4, mxfp8, nvfp4 and every
  ``lpsim.blocks.block``: they share their kernels), each of ``modes``: float32 data without
  stats and with stats (the word kernels), float32 element values
  (``lpsim.blocks.quantize_blocks``, the general kernel) and float64 data; and nvfp4's
  per-tensor scale;
* ``ops``: lpsim.ops' elementwise operations, scalar, dot, both GEMMs and the tensor-core
  model of ``matmul``;
* ``optim`` (default: when torch is installed): a step of ``lpsim.optim.AdamW`` and
  ``lpsim.optim.SGD`` with bfloat16 and float32 parameters, multi-tensor and per-tensor.

Not prepared: the kernels of ``lpsim.casgd``, lpsim.storage's packing kernel and
``lpsim_cuda`` (``lpsim_cuda.warmup``); each compiles on its first call.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

from .rounding import MODES

CONTAINERS = ("float32", "float64")


def warmup(modes=None, containers=CONTAINERS, *, ops: bool = True, blocks: bool = True,
           optim=None, progress=None) -> int:
    """Compile or load the CPU kernels of ``modes`` (default: all) for ``containers`` (element
    and, with ``blocks``, block formats), with ``ops`` those of lpsim.ops, and with ``optim``
    (default: when torch is installed) lpsim.optim's AdamW and SGD steps; returns how many
    calls it made (:func:`jobs` lists them; the module docstring says what each covers).

    progress: show a progress bar (default: when stderr is a terminal).
    """
    from tqdm import tqdm

    from . import cpu
    todo = jobs(modes, containers, ops=ops, blocks=blocks, optim=optim)
    show = sys.stderr.isatty() if progress is None else progress
    notice, cpu.NOTICE_AFTER = cpu.NOTICE_AFTER, None if show else cpu.NOTICE_AFTER
    try:
        for _, job in tqdm(todo, desc="lpsim kernels", disable=not show, file=sys.stderr):
            job()
    finally:
        cpu.NOTICE_AFTER = notice
    return len(todo)


def jobs(modes=None, containers=CONTAINERS, *, ops: bool = True, blocks: bool = True,
         optim=None) -> list:
    """The (name, call) pairs :func:`warmup` runs, in order; bad arguments are refused here,
    before anything compiles.  optim=None: the optimizer steps when torch is installed."""
    from . import cpu
    modes = list(MODES) if modes is None else _names(modes, "modes")
    unknown = [m for m in modes if not isinstance(m, str) or m not in MODES]
    if unknown:
        raise ValueError(f"warmup: unknown rounding modes {unknown}; accepted: "
                         f"{', '.join(MODES)}")
    dtypes, bad = [], []
    for c in _names(containers, "containers"):
        try:    # np.dtype(None) is float64: None is refused, not taken for it
            d = None if c is None else np.dtype(c)
        except (TypeError, ValueError):
            d = None
        if d in (np.float32, np.float64):
            dtypes.append(d)
        else:
            bad.append(c)
    if bad:
        raise ValueError(f"warmup: containers {bad} are not accepted; accepted: float32, "
                         "float64")
    for name, flag in (("ops", ops), ("blocks", blocks)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"warmup: {name}={flag!r} must be True or False")
    if optim is None:
        optim = importlib.util.find_spec("torch") is not None
    elif not isinstance(optim, (bool, np.bool_)):
        raise TypeError(f"warmup: optim={optim!r} must be True, False or None (None: when "
                        "torch is installed)")
    todo = [(f"quantize {m} {d}", lambda m=m, d=d: cpu.entry(MODES[m], d))
            for m in modes for d in dtypes]
    if "nearest" in modes and np.dtype(np.float32) in dtypes:
        todo.append(("quantize nearest float32 without stats", cpu.nearest32_entry))
        todo.append(("quantize nearest float32 small calls", cpu.nearest32_all_entry))
    if blocks:
        todo += _block_jobs(modes, dtypes)
    if ops:
        todo += _ops_jobs()
    if optim:
        todo += _optim_jobs()
    return todo


def _names(value, what):
    """``value`` as a list: one name (a string, or a dtype for containers) is a list of one,
    so that a string is not taken letter by letter."""
    if isinstance(value, (str, np.dtype, type)):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"warmup: {what}={value!r} is a {type(value).__name__}; accepted: a "
                        "name or a list of names") from None


def _block_jobs(modes, dtypes):
    """lpsim.quantize to mxfp4 (every block format takes the same kernels): per mode, float32
    without stats and with stats (its word kernels), float32 element values (the general
    kernel), float64; nvfp4's per-tensor amax once."""
    from .blocks.counters import BlockStats
    from .blocks.fake_quantize import quantize_blocks
    from .quantize import quantize
    todo = []
    for m in modes:
        for d in dtypes:
            x = np.linspace(-3.0, 3.0, 64).astype(d)
            if d == np.float32:
                todo.append((f"quantize mxfp4 {m} float32",
                             lambda x=x, m=m: quantize(x, "mxfp4", m, seed=0)))
                todo.append((f"quantize_blocks mxfp4 {m} float32 elements",
                             lambda x=x, m=m: quantize_blocks(x, "mxfp4", m, seed=0)))
            todo.append((f"quantize mxfp4 {m} {d} with stats",
                         lambda x=x, m=m: quantize(x, "mxfp4", m, seed=0, stats=BlockStats())))
    for d in dtypes:
        x = np.linspace(-3.0, 3.0, 64).astype(d)
        todo.append((f"quantize nvfp4 nearest {d}", lambda x=x: quantize(x, "nvfp4")))
    return todo


def _ops_jobs():
    """One small call of each lpsim.ops kernel (the six elementwise operations, scalar,
    chain, the GEMM of deterministic blocked products, the general one and the tensor-core
    model)."""
    from . import ops
    x = np.float32([1.0, 2.0])
    square = np.ones((2, 2), np.float32)
    todo = [(f"ops.{op.__name__}", lambda op=op: op(x, x, "bf16"))
            for op in (ops.add, ops.sub, ops.mul, ops.div)]
    return todo + [
        ("ops.sqrt", lambda: ops.sqrt(x, "bf16")),
        ("ops.fma", lambda: ops.fma(x, x, x, "bf16")),
        ("ops.add of scalars", lambda: ops.add(1.0, 2.0, "bf16")),
        ("ops.dot sequential", lambda: ops.dot(x, x, acc_fmt="bf16", order="sequential")),
        ("ops.matmul", lambda: ops.matmul(square, square, acc_fmt="bf16")),
        ("ops.matmul stochastic", lambda: ops.matmul(square, square, acc_fmt="bf16",
                                                     acc_rounding="stochastic", seed=0)),
        ("ops.matmul hopper-fp8", lambda: ops.matmul(square, square, model="hopper-fp8"))]


def _optim_jobs():
    """A step of AdamW and SGD (momentum) with stochastic update rounding: bfloat16 and
    float32 parameters on the multi-tensor route, bfloat16 one tensor at a time."""
    def step(cls, dtype, foreach, kw):
        import torch

        from . import optim
        p = torch.nn.Parameter(torch.ones(8, dtype=getattr(torch, dtype)))
        p.grad = torch.full_like(p, 0.5)
        getattr(optim, cls)([p], lr=1e-3, update_rounding="stochastic", seed=0,
                            foreach=foreach, **kw).step()

    return [(f"optim.{cls} {dtype}{'' if foreach else ' per tensor'}",
             lambda cls=cls, dtype=dtype, foreach=foreach, kw=kw: step(cls, dtype, foreach, kw))
            for cls, kw in (("AdamW", {}), ("SGD", {"momentum": 0.9}))
            for dtype, foreach in (("bfloat16", True), ("float32", True), ("bfloat16", False))]
