"""The multi-tensor CPU step: one compiled call steps every tensor of a set (numba).

Why: a model has tens to thousands of small tensors, and a Python call per tensor costs more
than stepping it; torch's ``_foreach`` and fused optimizers make one call per group.  A set is
the tensors of one param group that share dtypes, Setup and step count (so one tuple of
hyperparameters).  Its *table* has one int64 row per tensor: the data addresses of weight,
gradient and states (0: absent), the element count, the global offset, the three Philox
streams (:mod:`lpsim.optim.keys`) and the tensor's first work unit.  The kernel makes each
row into arrays in compiled code (``numba.carray`` of an address cast to a typed pointer) and
runs the per-tensor kernels' own code on it (:func:`lpsim.optim.cpu.run_chunks`, or
:func:`~lpsim.optim.cpu.run_quads` for float16 storage), so both routes give the same bits.

Work units are the chunks of :data:`lpsim.optim.cpu.CHUNK` global indices of every tensor,
numbered across the table; large sets are dealt out to numba's thread count by unit ranges.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from lpsim.cpu import params_of
from lpsim.pool import deal, ranges

from .cpu import CHUNK, _entry, run_chunks, run_quads, scratch
from .step import NCOUNTS, STORE_F16

#: the table's columns: addresses of weight, gradient, states (m, v, Kahan, remainder), then
#: element count, global offset, the streams of weight / first / second moment, first unit
W, G, M, V, C, R, N, OFFSET, SW, SM, SV, START = range(12)
COLUMNS = 12
#: where the step's values start in ``consts`` (after pw, pc, ps: 20 each, sp16: 11, kinds: 3)
DYNAMIC = 74
#: elements per worker below which a set is stepped in the calling thread alone
GRAIN = 1 << 15


@intrinsic
def _pointer(typingctx, address, proto):
    """The int64 ``address`` as a pointer to ``proto``'s element type."""
    ptr = types.CPointer(proto.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))
    return ptr(types.int64, proto), codegen


@njit(nogil=True, cache=True, error_model="numpy")
def _optim_step_multi(table, pw_, pg_, pm_, pv_, pc_, pr_, consts, hp, u0, u1):
    """Step work units u0 .. u1-1 of the tensors in ``table`` (columns above); the arrays
    ``pw_`` .. ``pr_`` give the element types (and stand in for absent states); ``consts``:
    the int64 arguments of the per-tensor kernel in one array (filled by :class:`Table`),
    cheaper to pass than their tuples.  Returns the NCOUNTS counters."""
    pw, pc, ps = params_of(consts[0:20]), params_of(consts[20:40]), params_of(consts[40:60])
    v = consts[60:]
    sp16 = (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10])
    kinds = (v[11], v[12], v[13])
    ints = (v[14], v[15], v[16], v[17], v[18], v[19], v[20], v[21])
    seed_lo, seed_hi, shift = v[22], v[23], v[24]
    counts = np.zeros(NCOUNTS, np.int64)
    fast = kinds[0] != STORE_F16 and kinds[1] != STORE_F16 and kinds[2] != STORE_F16
    longest = 1
    for i in range(table.shape[0]):
        longest = max(longest, min(table[i, N], CHUNK))
    work = scratch(longest)
    for i in range(table.shape[0]):
        first, n, offset = table[i, START], table[i, N], table[i, OFFSET]
        last = first + (offset % CHUNK + n + CHUNK - 1) // CHUNK
        c0, c1 = max(u0, first) - first, min(u1, last) - first
        if c1 <= c0:
            continue
        wb = carray(_pointer(table[i, W], pw_), n)
        gb = carray(_pointer(table[i, G], pg_), n)
        mb = pm_ if table[i, M] == 0 else carray(_pointer(table[i, M], pm_), n)
        vb = pv_ if table[i, V] == 0 else carray(_pointer(table[i, V], pv_), n)
        cb = pc_ if table[i, C] == 0 else carray(_pointer(table[i, C], pc_), n)
        rb = pr_ if table[i, R] == 0 else carray(_pointer(table[i, R], pr_), n)
        keys = (seed_lo, seed_hi, table[i, SW] + shift, table[i, SM] + shift,
                table[i, SV] + shift)
        if fast:
            run_chunks(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, c0,
                       c1, work, counts)
        else:       # chunk ch holds the quads of global indices (offset // CHUNK + ch) * CHUNK ..
            base = (offset // CHUNK) * (CHUNK // 4)
            q0 = max(base + c0 * (CHUNK // 4), offset // 4)
            q1 = min(base + c1 * (CHUNK // 4), (offset + n + 3) // 4)
            run_quads(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, sp16,
                      q0, q1, counts)
    return counts


def units(n: int, offset: int) -> int:
    """Work units (chunks of CHUNK global indices) of a tensor of n elements at ``offset``."""
    return (offset % CHUNK + n + CHUNK - 1) // CHUNK


class Table:
    """A set's table, built once and reused while its tensors keep their storage: a step
    refreshes only the gradient addresses (and passes its step count and hyperparameters)."""

    def __init__(self, rows, setup, workers):
        """rows: (weight, gradient, m, v, kahan, remainder addresses, n, offset, stream of
        weight / first / second moment at step 0) per tensor."""
        self.table = np.zeros((len(rows), COLUMNS), np.int64)
        self.table[:, :START] = rows
        self.consts = np.zeros(DYNAMIC + 11, np.int64)
        self.consts[:DYNAMIC] = (*setup.pw, *setup.pc, *setup.ps, *setup.sp16, *setup.kinds)
        self.kernel = None
        per = [units(int(n), int(o)) for n, o in self.table[:, [N, OFFSET]]]
        self.table[:, START] = np.cumsum([0] + per[:-1])
        self.total = int(sum(per))
        self.elements = int(self.table[:, N].sum())
        wkind, gkind, skind = setup.kinds
        self.protos = tuple(np.zeros(1, np.int32 if kind == 0 else np.int16)
                            for kind in (wkind, gkind, skind, skind, skind, 1))
        self.workers = max(1, min(workers, self.elements // GRAIN, self.total))
        self.bounds = self._split(per, ranges(self.workers))

    def _split(self, per, workers):
        """Unit boundaries of ``workers`` contiguous ranges of about equal element counts."""
        if workers <= 1:
            return [0, self.total]
        sizes = np.concatenate([np.diff(np.clip(np.arange(k + 1) * CHUNK - o % CHUNK, 0, n))
                                for k, n, o in zip(per, self.table[:, N], self.table[:, OFFSET])])
        cum = np.cumsum(sizes)
        cuts = np.searchsorted(cum, np.arange(1, workers) * (cum[-1] / workers)) + 1
        return sorted({0, self.total, *(int(c) for c in cuts if 0 < c < self.total)})

    def refresh(self, grads) -> None:
        """Set the gradients' addresses."""
        self.table[:, G] = [g.data_ptr() for g in grads]

    def step(self, hp, ints, seed, step: int) -> np.ndarray:
        """Run the kernel over the set at step count ``step`` (hyperparameters ``hp``, the
        per-tensor kernel's ``ints``, ``seed`` = (lo, hi)); returns the NCOUNTS counters
        (tensors written in place)."""
        self.consts[DYNAMIC:] = (*ints, *seed, step << 24)
        args = (self.table, *self.protos, self.consts, hp)
        kernel = self.kernel
        if kernel is None:
            kernel = self.kernel = _entry(_optim_step_multi, args + (0, self.total))
        return sum(deal(lambda a, b: kernel(*args, a, b), self.bounds, self.workers))
