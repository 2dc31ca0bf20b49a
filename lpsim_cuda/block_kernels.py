"""Block-scaled fake quantization of float32 arrays, a block per group of lanes.

Why: the general block kernel (:mod:`lpsim_cuda.blocks`) gives each element a thread and
each block a shared-memory tree reduction with a barrier per level, holds the largest
magnitude in float64 and takes the format as runtime data: 0.013-0.025 of an H100's copy
bandwidth for MXFP8 and NVFP4 (benchmarks/results/gpu-h100-2026-11-26.md).  Here, for float32
data blocked along its contiguous last axis:

* a block of B elements belongs to B / 4 consecutive lanes of a warp (8 for MX's 32, 4 for
  NVFP4's 16); each lane reads its four elements with one 16-byte load, so a warp reads
  whole blocks, contiguous; a block of 256 .. 1024 (2-D scaling's 16 x 16 or 32 x 32
  tiles) belongs to a whole warp, each lane holding 2 .. 8 quads a warp's width apart;
* the block's largest finite magnitude (as float32 bits) and whether it holds a NaN or inf
  are reduced across those lanes by warp shuffles: no shared memory, no barrier;
* every lane takes the block's scale from :func:`lpsim.blocks.block_scale` and rounds its
  four elements with :func:`lpsim.blocks.element_fast` (:func:`lpsim.blocks.element_exact`
  where it declines), the CPU kernels' own decisions, with its Philox block's four words;
  element and scale formats, mode and sr_bits are compile-time constants.

The CUDA simulator has no warp shuffles: there the lanes' partials meet in shared memory
between two barriers (the same values).  Other layouts, float64, and tails the block does not
divide take the general kernel.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from lpsim.blocks.decisions import (BlockParams, _element_params, block_params,
                                    block_recip, block_scale, element_exact, element_fast,
                                    element_nearest32_conditions, element_params32,
                                    nearest_words_exact, words_exact)
from lpsim.blocks.word_scales import pow2_exponent, pow2_float32, pow2_words, scale_words
from lpsim.blocks.words import element_nearest32
from lpsim.philox import block_words
from lpsim.rounding import (NEAREST, STOCHASTIC, kernel_params, nearest32_words,
                            sr_word_applies)
from lpsim.storage import code_bits
from lpsim.word32 import as_int64, bits_float32, like, word

from . import launch, vector
from .block_counting import (add_counts9, element32, element32_sr, overflowed_element,
                             tally_flags, tally_nonfinite, tally_quad)
from .launch import FULL_MASK, SIMULATOR
from .tensor_amax import INF32, finite32

@cuda.jit(device=True)
def _int32(w):
    """The 32-bit word (or integer) ``w`` as an int32 (a shuffle's operand)."""
    return np.int32(as_int64(w))


#: the most quads a lane holds: blocks of 4 .. 128 elements are 1 .. 32 lanes of one quad,
#: blocks of 256 .. 1024 (a 16 x 16 or 32 x 32 tile of 2-D scaling) 32 lanes of 2 .. 8 quads
MAX_QUADS = 8


def layout_of(block: int) -> tuple[int, int]:
    """(lanes per block, quads per lane) of a block of 4, 8, ..., 1024 elements (a power of
    two), else (0, 0).  A lane's quads lie a warp's width apart, so each pass over them
    reads whole rows of memory."""
    if block < 4 or block & (block - 1):
        return 0, 0
    lanes = min(block // 4, 32)
    quads = block // (4 * lanes)
    return (lanes, quads) if quads <= MAX_QUADS else (0, 0)


def lanes_of(block: int) -> int:
    """Lanes per block (four elements each a pass), or 0 where these kernels do not take
    a block of that length (:func:`layout_of`)."""
    return layout_of(block)[0]


if SIMULATOR:
    @cuda.jit(device=True)
    def _block_reduce(xb, first, block, amax_bits, nonfinite, lanes, half):
        """The lanes' partials (largest finite magnitude bits, any NaN or inf) combined over
        the ``lanes`` lanes of a block through shared memory (:func:`_block_any`; the
        simulator has no shuffles): the same partials the device's shuffles combine."""
        return _block_any(amax_bits, lanes), _block_any(nonfinite, lanes)

    @cuda.jit(device=True)
    def _block_max(xb, first, block, m, lanes, half):
        """The lanes' largest magnitude bits ``m`` combined over a block's lanes."""
        return _block_any(m, lanes)
else:
    @cuda.jit(device=True)
    def _block_max(xb, first, block, m, lanes, half):
        """The lanes' largest magnitude bits ``m`` (words) combined over the ``lanes`` lanes
        of a block by butterfly shuffles."""
        width = lanes >> 1
        while width > 0:
            m = max(m, cuda.shfl_xor_sync(FULL_MASK, _int32(m), width))
            width >>= 1
        return m

    @cuda.jit(device=True)
    def _block_reduce(xb, first, block, amax_bits, nonfinite, lanes, half):
        """The lanes' partial (largest finite magnitude bits, any NaN or inf: 32-bit words)
        combined over the ``lanes`` lanes of a block by butterfly shuffles (every lane gets
        the result)."""
        width = lanes >> 1
        while width > 0:
            amax_bits = max(amax_bits, cuda.shfl_xor_sync(FULL_MASK, _int32(amax_bits), width))
            nonfinite = max(nonfinite, cuda.shfl_xor_sync(FULL_MASK, _int32(nonfinite), width))
            width >>= 1
        return amax_bits, nonfinite


if SIMULATOR:
    @cuda.jit(device=True)
    def _block_any(v, lanes):
        """The largest ``v`` over the ``lanes`` lanes of a block (consecutive threads):
        through shared memory, between two barriers (the simulator has no shuffles)."""
        seen = cuda.shared.array(launch.THREADS, np.int64)
        t = cuda.threadIdx.x
        seen[t] = v
        cuda.syncthreads()
        first = t // lanes * lanes
        m = np.int64(0)
        for i in range(first, first + lanes):
            m = max(m, seen[i])
        cuda.syncthreads()
        return m
else:
    @cuda.jit(device=True)
    def _block_any(v, lanes):
        """The largest ``v`` over the ``lanes`` lanes of a block by butterfly shuffles."""
        m = _int32(v)
        width = lanes >> 1
        while width > 0:
            m = max(m, cuda.shfl_xor_sync(FULL_MASK, m, width))
            width >>= 1
        return np.int64(m)


@cuda.jit(device=True)
def _value(b):
    """The float32 whose bits are the int32 ``b``."""
    return np.int32(b).view(np.float32)


@cuda.jit(device=True)
def _lane_partial(b):
    """(finite magnitude bits or 0, 1 if NaN or inf) of one float32 element's bits ``b``
    (int32), as 32-bit words."""
    a = word(b) & 0x7FFFFFFF
    return finite32(b), like(a, a >= INF32)


@cuda.jit(device=True)
def _quad_max(b0, b1, b2, b3):
    """The largest magnitude bits (NaN and inf included) of four float32 elements' bits."""
    return max(max(word(b0) & 0x7FFFFFFF, word(b1) & 0x7FFFFFFF),
               max(word(b2) & 0x7FFFFFFF, word(b3) & 0x7FFFFFFF))


@cuda.jit(device=True)
def _quad_partial(b0, b1, b2, b3):
    """:func:`_lane_partial` of four elements combined."""
    a0, f0 = _lane_partial(b0)
    a1, f1 = _lane_partial(b1)
    a2, f2 = _lane_partial(b2)
    a3, f3 = _lane_partial(b3)
    return max(max(a0, a1), max(a2, a3)), max(max(f0, f1), max(f2, f3))


def _make(p, sp, mode: int, k: int, lanes: int, p32=None, near: bool = False,
          device_pts: bool = False, fixed=None, half: int = 0, count: bool = False,
          quads: int = 1, ahead: bool = False):
    """The kernel of one (element Params, scale Params, mode, k, lanes per block, quads per
    lane: :func:`layout_of`).  Where a lane holds several quads, it reads them for the
    block's amax, then reads each again (from the cache) to round it.

    ``fixed``: the format's BlockParams (any per-tensor scale), compiled in as constants
    but for the per-tensor scale and its reciprocal, the arguments ``pts`` and ``pts_inv``
    (or ``ts``): the branches a format never takes (other scale rules, float64 reciprocals
    and scales) are then not in its kernel at all.

    ``device_pts``: the per-tensor scale and its reciprocal are read from the device array
    ``ts`` (:func:`device_tensor_scale`) instead, so a call that finds NVFP4's
    scale on the device never waits for the host.
    With ``p32`` (the element's float32 Params, where :func:`lpsim.blocks.words_exact`
    holds) the elements of a block without NaN or inf take the CPU word kernel's float32
    steps: :func:`lpsim.blocks.words.element_nearest32` to nearest where ``near``
    (:func:`lpsim.blocks.nearest_words_exact`), else
    :func:`lpsim.blocks.element_fast32` with :func:`lpsim.blocks.element_exact` for what it
    declines; float32 products and 32-bit integers where the general step works in float64.

    ``count``: the kernel adds the call's :data:`lpsim.blocks.BLOCK_COUNTERS` into
    ``counts`` as the CPU counts them (:mod:`lpsim.blocks.word_counts`): each element's
    rounding flags from the step that rounds it (:func:`lpsim.blocks.element_nearest32_flags`
    to nearest, unless the block's largest quotient is inf), a block's clipped scale from
    the CPU's clip bounds (``counts[9:11]``, :func:`lpsim.blocks.word_counts.clip_bounds`;
    :func:`lpsim.blocks.block_scale` where they are zero: a tensor scale found on the
    device, or the general step), flushed where its largest finite magnitude is nonzero
    and no element rounds to a nonzero value (its lanes' results combined as the amax is),
    NaN blocks; summed per thread, then per warp, one atomic per warp and counter."""
    P, SP, MODE, K, LANES, HALF, COUNT, QUADS = p, sp, mode, k, lanes, half, count, quads
    MINN = bits_float32(word(p32.minnorm)) if p32 is not None else np.float32(0)
    WORDS, P32 = p32 is not None, p32
    NEAR = WORDS and near and mode == NEAREST
    CW, LW = nearest32_words(p32.m, p32.emin) if WORDS else (0, 0)
    stochastic = mode >= STOCHASTIC
    block = 4 * lanes * quads
    DEVICE_PTS = device_pts
    (BLOCK, RULE, POW2, EMAX_E, M_E, MAX_E, SMIN_EXP, SMAX_EXP, SMIN, SMAX, NONFINITE_NAN,
     _, _, F32, NEAR32, SNEAR32) = fixed
    NAN_BLOCKS = NONFINITE_NAN != 0
    # power-of-two scales from the exponent field of a float32 normal amax
    POW2_WORDS = bool(pow2_words(np.int64(1 << 23), fixed))
    # the next pass's quad is loaded before this one is rounded (two 16-byte loads in flight
    # a lane, 2 instructions an element) where ``ahead`` (:func:`kernel` says where)
    PREFETCH = ahead and POW2_WORDS and mode == NEAREST and not count and quads == 1
    # the float32 element step: a counted nearest kernel takes it only for a block whose
    # largest quotient overflows float32 (block_counting.overflowed_element, cold), others
    # for every element (looked up here, so that a stub set before the kernel is made is used)
    STEP32 = overflowed_element if NEAR and COUNT else element32
    if WORDS and sr_word_applies(p32, mode, k):
        STEP32 = element32_sr       # its flags unread where nothing counts: compiled away

    def blocks(xb, out, n, pts, pts_inv, seed_lo, seed_hi, stream, block0, ts, counts):
        """Fake-quantize the n float32 values whose bits are ``xb`` (with HALF, bfloat16 or
        float16 codes, widened exactly) in blocks of 4 * LANES * QUADS consecutive elements
        into ``out``."""
        tensor, tensor_inv = (ts[0], ts[1]) if DEVICE_PTS else (pts, pts_inv)
        bp = BlockParams(BLOCK, RULE, POW2, EMAX_E, M_E, MAX_E, SMIN_EXP, SMAX_EXP, SMIN, SMAX,
                         NONFINITE_NAN, tensor, tensor_inv, F32, NEAR32, SNEAR32)
        t = cuda.grid(1)
        per_pass = cuda.gridsize(1) // LANES * LANES   # groups of whole blocks a pass covers
        quads = n // block * LANES                     # the lanes of the whole blocks
        base = 0
        # with COUNT: the thread's counters, 32-bit words (a thread rounds far fewer than
        # 2**32 elements: a grid-stride loop over one wave), made int64 at the end
        wz = word(np.int32(0))
        c = (wz, wz, wz, wz, wz, wz, wz, wz, wz)
        # the clip bounds are float32 magnitude bits (below 2**32)
        clip_lo, clip_hi = (word(counts[9]), word(counts[10])) if COUNT else (wz, wz)
        n0 = n1 = n2 = n3 = np.int32(0)              # PREFETCH: the next pass's quad
        if PREFETCH and t < quads:
            n0, n1, n2, n3 = vector.load4(xb, t)
        while base < quads:                            # the same trip count on every lane
            j = base + t                               # this lane of a block
            live = j < quads
            g = j // LANES                             # its block
            q0 = j + g * (LANES * (QUADS - 1))         # its first quad (the next LANES on)
            b0 = b1 = b2 = b3 = np.int32(0)
            if PREFETCH:
                if live:
                    b0, b1, b2, b3 = n0, n1, n2, n3
                if j + per_pass < quads:
                    n0, n1, n2, n3 = vector.load4(xb, j + per_pass)
            elif live:
                b0, b1, b2, b3 = vector.load4(xb, q0)
            if live and HALF:
                b0, b1 = code_bits(b0, HALF), code_bits(b1, HALF)
                b2, b3 = code_bits(b2, HALF), code_bits(b3, HALF)
            # the lane's largest magnitude bits (NaN and inf included), and its largest
            # finite ones and whether it holds a NaN or inf
            m = _quad_max(b0, b1, b2, b3)
            fa, ff = _quad_partial(b0, b1, b2, b3)
            # its other quads (while loops: numba's range loops cost these kernels registers
            # and instructions even where QUADS is 1)
            r = 1
            while r < QUADS:
                if live:
                    b0, b1, b2, b3 = _load(xb, q0 + r * LANES)
                    m = max(m, _quad_max(b0, b1, b2, b3))
                    fr, nr = _quad_partial(b0, b1, b2, b3)
                    fa, ff = max(fa, fr), max(ff, nr)
                r += 1
            if NAN_BLOCKS:
                # a NaN or inf makes its whole block NaN, so the largest magnitude bits,
                # NaN and inf included, tell both: one reduction, two steps an element
                amax_bits = _block_max(xb, g * block, block, m, LANES, HALF)
                nonfinite = like(amax_bits, amax_bits >= INF32)
            else:
                amax_bits, nonfinite = _block_reduce(xb, g * block, block, fa, ff, LANES,
                                                     HALF)
            nz = clipped = nan_block = wz              # with COUNT: this lane's block
            r = 0
            while r < QUADS:
                jq = q0 + r * LANES                    # the quad rounded now
                if QUADS > 1 and live:                 # read again (from the cache)
                    b0, b1, b2, b3 = _load(xb, jq)
                if live:
                    a = as_int64(amax_bits)
                    w0 = w1 = w2 = w3 = np.int64(0)
                    if stochastic:
                        w0, w1, w2, w3 = block_words(block0 + jq, stream, seed_lo, seed_hi)
                    if bp.nonfinite_nan != 0 and nonfinite != 0:
                        v0 = v1 = v2 = v3 = np.float32(np.nan)
                        if COUNT:
                            c = tally_nonfinite(tally_nonfinite(tally_nonfinite(
                                tally_nonfinite(c, b0), b1), b2), b3)
                            nan_block = wz + 1
                    elif WORDS and nonfinite == 0 and (not POW2_WORDS or pow2_words(a, bp)):
                        # the word kernel's scale: integer steps from the amax bits, the float32
                        # reciprocal by exponent bits or one float32 division (a power-of-two
                        # scale of an amax that is not a float32 normal, an all-zero block say,
                        # takes the general step below)
                        if POW2_WORDS:
                            ex = pow2_exponent(word(amax_bits), bp)
                            s32, rc = pow2_float32(ex), pow2_float32(-ex)
                            s = np.float64(s32)
                        else:
                            s = scale_words(word(amax_bits), bp, SP)
                            s32 = np.float32(s)
                            rc = np.float32(block_recip(s, bp)) if bp.pow2 else \
                                np.float32(bp.pts_inv) / s32
                        # counted: an inf largest quotient (a tiny given tensor scale) is
                        # element_exact's to flag, as the CPU's counted kernel does
                        if NEAR and COUNT and bits_float32(amax_bits) * rc < np.inf:
                            pts, maxe = np.float32(bp.pts), np.float32(bp.max_e)
                            v0, f0, z0 = _near_counted(_value(b0), rc, s32, pts, maxe, bp)
                            v1, f1, z1 = _near_counted(_value(b1), rc, s32, pts, maxe, bp)
                            v2, f2, z2 = _near_counted(_value(b2), rc, s32, pts, maxe, bp)
                            v3, f3, z3 = _near_counted(_value(b3), rc, s32, pts, maxe, bp)
                            c = tally_quad(c, f0, f1, f2, f3)
                            nz += z0 + z1 + z2 + z3
                        elif NEAR and not COUNT:
                            pts, maxe = np.float32(bp.pts), np.float32(bp.max_e)
                            v0 = element_nearest32(_value(b0), rc, s32, pts, maxe, CW, LW)
                            v1 = element_nearest32(_value(b1), rc, s32, pts, maxe, CW, LW)
                            v2 = element_nearest32(_value(b2), rc, s32, pts, maxe, CW, LW)
                            v3 = element_nearest32(_value(b3), rc, s32, pts, maxe, CW, LW)
                        else:                   # (STEP32: see above)
                            v0, f0, z0, c = STEP32(_value(b0), rc, s32, s, w0, bp, MODE, K,
                                                   P32, P, c)
                            v1, f1, z1, c = STEP32(_value(b1), rc, s32, s, w1, bp, MODE, K,
                                                   P32, P, c)
                            v2, f2, z2, c = STEP32(_value(b2), rc, s32, s, w2, bp, MODE, K,
                                                   P32, P, c)
                            v3, f3, z3, c = STEP32(_value(b3), rc, s32, s, w3, bp, MODE, K,
                                                   P32, P, c)
                            if COUNT:
                                c = tally_quad(c, f0, f1, f2, f3)
                                nz += z0 + z1 + z2 + z3
                        if COUNT:
                            am = word(amax_bits)
                            if clip_hi != 0:        # lpsim.blocks.word_counts.clip_bounds'
                                clipped = like(am, am != 0 and (am < clip_lo or am >= clip_hi))
                            else:                   # a scale found on the device: no bounds
                                clipped = like(am, block_scale(np.float64(bits_float32(am)),
                                                               bp, SP)[1])
                    else:
                        amax = np.float64(bits_float32(amax_bits))
                        s, clip = block_scale(amax, bp, SP)
                        recip = block_recip(s, bp)
                        v0, g0, z0 = _element(_value(b0), recip, s, w0, bp)
                        v1, g1, z1 = _element(_value(b1), recip, s, w1, bp)
                        v2, g2, z2 = _element(_value(b2), recip, s, w2, bp)
                        v3, g3, z3 = _element(_value(b3), recip, s, w3, bp)
                        if COUNT:
                            c = tally_flags(tally_flags(tally_flags(tally_flags(c, g0), g1), g2),
                                            g3)
                            nz += like(nz, z0 + z1 + z2 + z3)
                            clipped = like(nz, clip)
                    vector.store4(out, jq, v0, v1, v2, v3)
                r += 1
            if COUNT:
                # the block's counters, by its first lane: its lanes' nonzero results
                # combined over the block (every lane takes part, as in the amax reduction)
                anynz = _block_any(nz, LANES)
                # a block's first lane (blocks start at multiples of LANES, the block size)
                if live and (cuda.threadIdx.x & (LANES - 1)) == 0:
                    flushed = like(nz, nan_block == 0 and (amax_bits & 0x7FFFFFFF) != 0
                                   and (amax_bits & 0x7FFFFFFF) < INF32 and anynz == 0)
                    c = (c[0], c[1], c[2], c[3], c[4], c[5], c[6] + clipped,
                         c[7] + flushed, c[8] + nan_block)
            base += per_pass
        if COUNT:
            add_counts9(counts, c)

    @cuda.jit(device=True)
    def _load(xb, q):
        """Quad q of ``xb`` as float32 bits (16-bit codes widened exactly)."""
        b0, b1, b2, b3 = vector.load4(xb, q)
        if HALF:
            return (code_bits(b0, HALF), code_bits(b1, HALF), code_bits(b2, HALF),
                    code_bits(b3, HALF))
        return b0, b1, b2, b3

    @cuda.jit(device=True)
    def _near_counted(xv, rc, s32, pts, maxe, bp):
        """(value, (inexact, overflow, underflow, subnormal), 1 where q is nonzero) of a
        finite element to nearest (:func:`element_nearest32_conditions`), 32-bit words."""
        v, i, o, u, b, q = element_nearest32_conditions(xv, rc, s32, pts, maxe, MINN, CW, LW,
                                                        bp.pow2)
        return v, (i, o, u, b), like(i, q != 0)

    @cuda.jit(device=True)
    def _element(xv, recip, s, r, bp):
        """(value, flags, 1 where q is nonzero): the general step (the uncounted kernel
        reads the value alone; the rest is left out of it)."""
        q, v, ok, flags = element_fast(xv, recip, s, MODE, r, K, P, bp)
        if not ok:
            q, v, flags = element_exact(xv, recip, s, MODE, r, K, P, bp)
        # the float32 store's rounding, here
        return np.float32(v), np.int64(flags), np.int64(q != 0)

    step = cuda.jit(device=True)(blocks)
    if DEVICE_PTS or COUNT:
        def kernel(xb, out, n, pts, pts_inv, seed_lo, seed_hi, stream, block0, ts, counts):
            step(xb, out, n, pts, pts_inv, seed_lo, seed_hi, stream, block0, ts, counts)
    else:
        # neither a scale on the device nor counters: two arrays (14 launch arguments) fewer;
        # the stand-ins are never read, so they take no memory
        def kernel(xb, out, n, pts, pts_inv, seed_lo, seed_hi, stream, block0):
            step(xb, out, n, pts, pts_inv, seed_lo, seed_hi, stream, block0,
                 cuda.local.array(2, np.float64), cuda.local.array(1, np.int64))
    return cuda.jit(kernel)


#: (element format, scale format, mode, k, (lanes, quads), float32 steps, nearest steps, scale on
#: the device, BlockParams at a per-tensor scale of 1, source kind, counting) -> its kernel
KERNELS: dict = {}


def kernel(bfmt, mode: int, k: int, word_bits: int, device_pts: bool = False, half: int = 0,
           count: bool = False):
    """The kernel of a parsed block format (element and scale formats compiled in)."""
    lanes, quads = layout_of(bfmt.block)
    # the next pass's quad loaded ahead where an H200 measured it faster (MXFP8 from float32:
    # 0.694 -> 0.731 of a copy), not where it measured slower (MXFP4 0.710 -> 0.619, MXFP8 of
    # bfloat16 codes 0.318 -> 0.196; torchao's same rows unchanged), nor where unmeasured
    ahead = half == 0 and bfmt.element.bits == 8
    words = words_exact(bfmt)
    near = words and nearest_words_exact(bfmt.saturating_element)
    fixed = block_params(bfmt)
    key = (bfmt.saturating_element, bfmt.scale, mode, k, word_bits, (lanes, quads), words,
           near, device_pts, fixed, half, count)
    found = KERNELS.get(key)
    if found is None:
        p = _element_params(bfmt.saturating_element, word_bits)
        found = KERNELS[key] = _make(p, kernel_params(bfmt.scale, np.float64), mode, k, lanes,
                                     element_params32(bfmt) if words else None, near,
                                     device_pts, fixed, half, count, quads, ahead)
    return found


def eligible(bfmt, length: int, n: int, x_ptr: int, out_ptr: int, mode: int,
             offset: int, in_bytes: int = 4) -> bool:
    """Whether a call blocked along its contiguous last axis can take these kernels: a
    block of 4 .. 1024 elements (a power of two: :func:`layout_of`) that divides the axis, arrays
    aligned to four elements' access (x of ``in_bytes`` a value: float32, or 16-bit codes),
    out x itself (float32) or apart from it, and (stochastic) Philox blocks that start at a
    lane's first element."""
    if (not lanes_of(bfmt.block) or length % bfmt.block or x_ptr % (4 * in_bytes)
            or out_ptr % 16):
        return False
    if launch.overlaps_apart(x_ptr, in_bytes, out_ptr, 4, n):
        return False
    return mode < STOCHASTIC or offset % 4 == 0

