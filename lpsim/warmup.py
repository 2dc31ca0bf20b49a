"""``lpsim.warmup``: compile (or load from numba's on-disk cache) the kernels ahead of use.

A kernel compiles once per machine, in seconds, and later processes load it from the cache
in a fraction of a second; either happens on its first call.  Call ``warmup`` before timing
code, before a hypothesis test with a deadline, or once after installing (``lpsim warmup``).
"""

from __future__ import annotations

import sys

import numpy as np

from .rounding import MODES

CONTAINERS = ("float32", "float64")


def warmup(modes=None, containers=CONTAINERS, *, ops: bool = True, progress=None) -> int:
    """Compile or load the CPU kernels of ``modes`` (default: all) for ``containers``, and
    with ``ops`` those of lpsim.ops; returns how many kernels are ready.

    progress: show a progress bar (default: when stderr is a terminal).
    """
    from tqdm import tqdm

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
    jobs = [(lambda m=m, d=d: cpu.entry(MODES[m], d)) for m in modes for d in dtypes]
    if "nearest" in modes and np.dtype(np.float32) in dtypes:
        jobs.append(cpu.nearest32_entry)       # lpsim.quantize's float32 nearest, no stats
        jobs.append(cpu.nearest32_all_entry)   # ... and its small calls
    if ops:
        jobs += _ops_jobs()
    show = sys.stderr.isatty() if progress is None else progress
    notice, cpu.NOTICE_AFTER = cpu.NOTICE_AFTER, None if show else cpu.NOTICE_AFTER
    try:
        for job in tqdm(jobs, desc="lpsim kernels", disable=not show, file=sys.stderr):
            job()
    finally:
        cpu.NOTICE_AFTER = notice
    return len(jobs)


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


def _ops_jobs():
    """One small call of each lpsim.ops kernel (the six elementwise operations, scalar,
    chain, the GEMM of deterministic blocked products and the general one)."""
    from . import ops
    x = np.float32([1.0, 2.0])
    square = np.ones((2, 2), np.float32)
    elementwise = [lambda op=op: op(x, x, "bf16") for op in (ops.add, ops.sub, ops.mul, ops.div)]
    elementwise += [lambda: ops.sqrt(x, "bf16"), lambda: ops.fma(x, x, x, "bf16")]
    return elementwise + [
        lambda: ops.add(1.0, 2.0, "bf16"),
        lambda: ops.dot(x, x, acc_fmt="bf16", order="sequential"),
        lambda: ops.matmul(square, square, acc_fmt="bf16"),
        lambda: ops.matmul(square, square, acc_fmt="bf16", acc_rounding="stochastic",
                           seed=0)]
