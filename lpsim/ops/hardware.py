"""Tensor-core accumulation models: aligned, truncated chunk sums and FP32 promotion.

A matrix unit does not run an ideal FMA chain.  The model here (the one reported for Hopper
FP8 tensor cores: about 14 significant bits kept; DeepSeek-V3, Sec. 3.3.2, promotes to FP32
CUDA-core sums every 128 products) computes each output c_ij as follows, with the products
p_k = a_ik b_kj exact (inputs rounded to ``in_fmt``, which may be a block format: then a is
block-quantized along K (its last axis) and b along K (its first), and each p_k carries both
blocks' scales exactly, as block-scaled MMA applies them):

1. K is cut into promotion intervals of ``promote`` products (None: one interval), each into
   chunks of ``chunk`` products.
2. Per chunk, the terms are the interval's partial sum t_0 and the chunk's products; with
   E = max floor(log2 |t|) over the nonzero terms, every term is truncated toward zero to a
   multiple of 2**(E - align_bits + 1) (``align_bits`` bits from the top of the largest),
   the truncated terms are added exactly, and the sum is rounded to ``partial_fmt``
   toward zero: the new partial sum.
3. At the end of each interval the partial sum is added to the FP32 accumulator, rounded to
   nearest (``acc_fmt``; without promotion the partial sum is the accumulator).
4. The output is the accumulator rounded to ``out_fmt`` with ``out_rounding`` by
   :func:`lpsim.quantize` (random words: counter o, C order over the output, of
   ``(seed, stream + 2)``; the inputs use streams ``stream`` and ``stream + 1``; each
   modulo 2**64).

NaN and inf follow IEEE 754, as an FP32 accumulator does: a chunk with a NaN or infinite
term (a product, or the partial sum) sums to the IEEE sum of those terms alone (finite
terms cannot change it), so the output is NaN where a product is NaN (a NaN input, or
inf * 0) or where +inf and -inf meet, ±inf where infinite terms of one sign enter, and a
NaN or inf partial sum or accumulator stays.  An input that ``in_fmt`` cannot hold as inf
becomes what its rounding gives: e4m3fn has no inf, so inf inputs of the Hopper models are
NaN, as on the hardware; a block with a NaN or inf element has a NaN scale (MX, NVFP4).
Finite inputs give the steps above bit for bit.

Rounding counters (``stats``): every rounding, as in :func:`lpsim.ops.matmul`: the inputs'
to in_fmt, each chunk's partial sum, each promotion and the output.  The alignment's
truncation of terms is the model's, not a rounding to a format, and is not counted.

:func:`reference_matmul` repeats these steps with Fractions (:mod:`lpsim.reference`).

The named Hopper models are approximations of the hardware, not bit-exact: against
``torch._scaled_mm`` recorded on an H100 (``tests/data/tensor-cores-h100.npz``, 17 input
families, K = 16 .. 4096), ``hopper-fp8`` reproduces 77.5% of the outputs with
``use_fast_accum=True`` (57-100% per family) and ``hopper-fp8-promote128`` 62.3% with the
default (equal up to K = 128, 3-54% beyond); every output lies within 6 units of the model's
kept bit per chunk.  No chunk, bit count or promotion interval fits better: the hardware's
rule inside a chunk differs.  The instruction models (:mod:`lpsim.ops.instruction_models`,
named in INSTRUCTION_MODELS: ``hopper-wgmma-e4m3`` and ``hopper-wgmma-e4m3-promote128``)
follow that rule and reproduce every recorded output.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from numba import njit, prange

from ..formats import Format, parse_format
from ..rounding import NEAREST, TOWARD_ZERO, mode_code, kernel_params, round_bits, tally
from ..exact import f2i, i2f, sum_to_odd
from .instruction_models import INSTRUCTION_MODELS, InstructionModel, instruction_matmul
from .operands import stream_after


@dataclass(frozen=True)
class TensorCoreModel:
    """Inputs, chunk alignment, promotion interval and formats of a tensor-core GEMM; NaN and
    inf as IEEE 754 (the module's docstring)."""

    in_fmt: object = None               # Format, block format (lpsim.blocks) or None
    chunk: int = 32                     # products aligned together
    align_bits: int = 14                # bits kept from the top of the largest term
    promote: int | None = None          # products per promotion to acc_fmt (None: never)
    partial_fmt: Format = parse_format("fp32")
    acc_fmt: Format = parse_format("fp32")
    out_fmt: Format = parse_format("fp32")
    out_rounding: str = "nearest"
    description: str = ""

    def __post_init__(self):
        from ..blocks.formats import as_block_format
        if self.in_fmt is not None:
            block = as_block_format(self.in_fmt)
            object.__setattr__(self, "in_fmt", block if block is not None
                               else parse_format(self.in_fmt))
        for name in ("partial_fmt", "acc_fmt", "out_fmt"):
            object.__setattr__(self, name, parse_format(getattr(self, name)))
        for name, low in (("chunk", 1), ("align_bits", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < low:
                raise ValueError(f"{name}={value!r} is not accepted; accepted: an integer "
                                 f">= {low}")
        # a chunk's chunk + 1 aligned terms (each below 2**align_bits units of its last
        # place) are summed exactly in float64 only while their sum stays below 2**53
        top = min(50, 53 - int(self.chunk).bit_length())
        if self.align_bits > top:
            raise ValueError(f"align_bits={self.align_bits} is not accepted with chunk="
                             f"{self.chunk}; accepted: 1..{top} (a chunk's aligned terms are "
                             "summed exactly in float64: align_bits + bits of chunk <= 53)")
        if self.promote is not None and (isinstance(self.promote, bool) or not isinstance(
                self.promote, (int, np.integer)) or self.promote < 1
                or self.promote % self.chunk):
            raise ValueError(f"promote={self.promote!r} is not accepted; accepted: None or a "
                             f"positive multiple of chunk={self.chunk}")
        mode_code(self.out_rounding)

    def with_(self, **changes) -> "TensorCoreModel":
        return replace(self, **changes)


HARDWARE_MODELS: dict[str, TensorCoreModel] = {
    "hopper-fp8": TensorCoreModel(
        "e4m3fn", 32, 14, None,
        description="FP8 E4M3 inputs, products aligned to the largest term and truncated to "
                    "14 bits per 32-product chunk, no promotion (approximates H100 FP8 "
                    "tensor cores with fast accumulation: 77% of outputs bit-exact; "
                    "hopper-wgmma-e4m3 is exact)"),
    "hopper-fp8-promote128": TensorCoreModel(
        "e4m3fn", 32, 14, 128,
        description="hopper-fp8 with the partial sum promoted to an FP32 accumulator every "
                    "128 products (DeepSeek-V3's FP8 GEMM; approximates torch._scaled_mm's "
                    "default on an H100: 62% of outputs bit-exact; "
                    "hopper-wgmma-e4m3-promote128 is exact)"),
    "mxfp8-fp32": TensorCoreModel(
        "mxfp8_e4m3", 32, 25, None,
        description="MXFP8 (E4M3, E8M0 scale per 32) inputs, chunks of 32 aligned to 25 "
                    "bits: an FP32-wide block-scaled MMA"),
    "nvfp4-fp32": TensorCoreModel(
        "nvfp4", 16, 25, None,
        description="NVFP4 inputs (E2M1, E4M3 scale per 16, FP32 tensor scale), chunks of "
                    "16 aligned to 25 bits; the inputs are the block values rounded to float32 "
                    "(e2m1 x scale x tensor scale needs up to 30 bits), as lpsim.quantize "
                    "gives them"),
}



def hardware_model(model) -> TensorCoreModel | InstructionModel | None:
    """The tensor-core model (TensorCoreModel or InstructionModel) that ``model`` names or
    is; None for anything else."""
    if isinstance(model, (TensorCoreModel, InstructionModel)):
        return model
    if isinstance(model, str):
        return HARDWARE_MODELS.get(model) or INSTRUCTION_MODELS.get(model)
    return None


def block_inputs(a, b, bfmt, rounding="nearest", *, seed=None, stream=0, stats=None):
    """a and b block-quantized along K (a's last axis; b's second to last, as numpy.matmul
    takes a batched b, or its only one): the exact values q * s."""
    from ..blocks.fake_quantize import quantize as quantize_blocks
    a = quantize_blocks(a, bfmt, rounding, axis=-1, seed=seed, stream=stream, stats=stats)
    b = quantize_blocks(b, bfmt, rounding, axis=0 if np.ndim(b) == 1 else -2, seed=seed,
                        stream=stream_after(stream, 1), stats=stats)
    return np.ascontiguousarray(a), np.ascontiguousarray(b)


@njit(cache=True)
def _trunc_to(t, q):
    """t truncated toward zero to a multiple of 2**q (exact in float64: |t| < 2**(q+51))."""
    # ldexp of t itself: 2**-q alone leaves float64's range once q < -1023 (tiny chunks)
    return math.ldexp(float(math.trunc(math.ldexp(t, -q))), q)


@njit(cache=True)
def _exponent(t):
    m, e = math.frexp(abs(t))
    return e - 1


@njit(cache=True)
def _chunk_sum(terms, n, align_bits):
    """Step 2's exact sum of terms[:n] aligned and truncated; the IEEE sum of the NaN and inf
    terms alone when there are any (no finite term changes it)."""
    top = -100000
    special = 0.0
    specials = False
    for t in range(n):
        if not math.isfinite(terms[t]):
            special += terms[t]
            specials = True
        elif terms[t] != 0.0:
            top = max(top, _exponent(terms[t]))
    if specials:
        return special
    s = 0.0
    if top > -100000:
        q = top - align_bits + 1
        for t in range(n):
            s += _trunc_to(terms[t], q)
    return s


@njit(parallel=True, cache=True)
def _tc_gemm(a, b, out, counts, chunk, align_bits, promote, pp, ap):
    """out[i, j]: the accumulator of c_ij (steps 1-3); counts[i*N + j]: the six rounding
    counters of its partial-sum and accumulator roundings, then their number."""
    M, K = a.shape
    N = b.shape[1]
    for ij in prange(M * N):
        i, j = ij // N, ij % N
        acc = 0.0
        partial = 0.0
        c = (0, 0, 0, 0, 0, 0)
        rounded = 0
        terms = np.empty(min(chunk, K) + 1)
        for k0 in range(0, K, chunk):
            n = min(chunk, K - k0)
            terms[0] = partial
            for t in range(n):
                terms[t + 1] = np.float64(a[i, k0 + t]) * np.float64(b[k0 + t, j])
            s = _chunk_sum(terms, n + 1, align_bits)
            bits, flags = round_bits(f2i(s), TOWARD_ZERO, 0, 64, pp)
            c = tally(c, flags)
            rounded += 1
            partial = i2f(bits)
            if promote > 0 and ((k0 + n) % promote == 0 or k0 + n == K):
                bits, flags = round_bits(sum_to_odd(acc, partial), NEAREST, 0, 64, ap)
                c = tally(c, flags)
                rounded += 1
                acc = i2f(bits)
                partial = 0.0
        if promote == 0:
            acc = partial
        out[i, j] = acc
        for t in range(6):
            counts[ij, t] = c[t]
        counts[ij, 6] = rounded


def tc_matmul(a, b, model, *, rounding="nearest", seed=None, stream=0, stats=None):
    """a @ b (2-D, or 1-D as numpy.matmul) under a TensorCoreModel (inputs rounded to the
    model's in_fmt with ``rounding``); the container is numpy's result type of a and b,
    float64 when out_fmt does not fit float32, as :func:`lpsim.ops.matmul`'s.  stats: a
    RoundingStats counting every rounding (the module's docstring)."""
    from ..blocks.formats import BlockFormat
    from ..quantize import quantize
    from .operands import fits_float32, matrix_operands
    model = hardware_model(model)
    a, b, dtype, shaped = matrix_operands(a, b, model.out_fmt, "a tensor-core model")
    if isinstance(model.in_fmt, BlockFormat):
        a, b = block_inputs(a, b, model.in_fmt, rounding, seed=seed, stream=stream,
                            stats=stats)
    elif model.in_fmt is not None:
        a = quantize(a, model.in_fmt, rounding, seed=seed, stream=stream, stats=stats)
        b = quantize(b, model.in_fmt, rounding, seed=seed, stream=stream_after(stream, 1),
                     stats=stats)
    for name, x in (("a", a), ("b", b)):
        if not fits_float32(x):
            raise ValueError(
                f"a tensor-core model multiplies in float64, exactly for operands float32 "
                f"holds, and {name} (after in_fmt={model.in_fmt}) holds values it does not; "
                "accepted: an in_fmt that fits float32, or such data")
    acc = np.empty((a.shape[0], b.shape[1]))
    counts = np.zeros((acc.size, 7), np.int64)
    f64 = np.float64
    _tc_gemm(np.ascontiguousarray(a, f64), np.ascontiguousarray(b, f64), acc, counts,
             model.chunk, model.align_bits, model.promote or 0,
             kernel_params(model.partial_fmt, f64), kernel_params(model.acc_fmt, f64))
    if stats is not None:
        total = counts.sum(axis=0)
        stats.add(total[6], total[:6])
    out = quantize(acc, model.out_fmt, model.out_rounding, seed=seed,
                   stream=stream_after(stream, 2), stats=stats).astype(dtype, copy=False)
    return shaped(out)


def reference_matmul(a, b, model):
    """The steps of this module's docstring with Fractions, on inputs already rounded to the
    model's in_fmt (exact values, e.g. :func:`block_inputs`' results); float64 array.  NaN
    and inf terms stay floats and are added as floats (IEEE 754), the rest are Fractions."""
    from .. import reference as ref
    from ..quantize import quantize
    model = hardware_model(model)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    M, K = a.shape
    N = b.shape[1]
    out = np.empty((M, N))

    def rounded(x, fmt, mode):
        if isinstance(x, float):        # NaN or inf: the format's policy decides
            y = float(quantize(np.array(x), fmt, mode))
            return y if not math.isfinite(y) else Fraction(y)
        r = ref.round_exact(x, fmt, mode)
        return Fraction(0) if r.value == 0 else r.value

    def product(x, y):
        x, y = float(x), float(y)
        return Fraction(x) * Fraction(y) if math.isfinite(x) and math.isfinite(y) else x * y

    for i in range(M):
        for j in range(N):
            acc, partial = Fraction(0), Fraction(0)
            for k0 in range(0, K, model.chunk):
                ks = range(k0, min(k0 + model.chunk, K))
                terms = [partial] + [product(a[i, k], b[k, j]) for k in ks]
                specials = [t for t in terms if isinstance(t, float)]
                nonzero = [abs(t) for t in terms if t]
                total = Fraction(0)
                if specials:
                    total = sum(specials, 0.0)
                elif nonzero:
                    q = max(ref._floor_log2(t) for t in nonzero) - model.align_bits + 1
                    unit = ref._pow2(q)
                    total = sum((math.trunc(t / unit) * unit for t in terms), Fraction(0))
                partial = rounded(total, model.partial_fmt, "toward_zero")
                end = ks.stop
                if model.promote and (end % model.promote == 0 or end == K):
                    both = acc + partial if isinstance(acc, Fraction) and \
                        isinstance(partial, Fraction) else float(acc) + float(partial)
                    acc = rounded(both, model.acc_fmt, "nearest")
                    partial = Fraction(0)
            if not model.promote:
                acc = partial
            out[i, j] = float(rounded(acc, model.out_fmt, model.out_rounding))
    return out


def _passes_through(model, in_fmt) -> bool:
    """True when :func:`dispatch` has nothing to do for (model, in_fmt): cached per pair, as
    parsing a block-format string costs more than a small product."""
    try:
        return _passes_through_cached(model, in_fmt)
    except TypeError:       # unhashable: dispatch looks at it
        return False


@functools.lru_cache(maxsize=256)
def _passes_through_cached(model, in_fmt) -> bool:
    from ..blocks.formats import as_block_format
    return hardware_model(model) is None and as_block_format(in_fmt) is None


#: matmul's keywords that a tensor-core model takes (its own accumulator fixes the others)
TC_KEYWORDS = ("in_fmt", "out_fmt", "out_rounding")


def dispatch(a, b, model, in_fmt, seed, stream, stats=None, **keywords):
    """lpsim.ops.matmul's hook: (result, a, b, model, in_fmt).

    A tensor-core model computes the result here, with in_fmt, out_fmt and out_rounding
    replacing its own; ``keywords`` (matmul's acc_fmt, out_fmt, acc_rounding, out_rounding,
    fused, order) other than these must be None, as the model's chunked accumulator fixes
    them: a ValueError names the first one given.  A block in_fmt block-quantizes a and b
    along K and hands them back with in_fmt None and the model's input rounding removed (the
    block values are the inputs); anything else passes through with result None.  stats
    counts the roundings done here.
    """
    if _passes_through(model, in_fmt):
        return None, a, b, model, in_fmt
    from ..blocks.formats import as_block_format
    from .models import get_model
    hw = hardware_model(model)
    if isinstance(hw, InstructionModel):
        label = repr(model) if isinstance(model, str) else "an InstructionModel"
        for name, value in dict(keywords, in_fmt=in_fmt).items():
            if value is not None and name not in ("out_fmt", "out_rounding"):
                raise ValueError(
                    f"matmul: {name}={value!r} is not accepted with the instruction model "
                    f"{label}: its instruction fixes the input types and the accumulation; "
                    "accepted with it: out_fmt, out_rounding, seed, stream, stats, out")
        changes = {k: keywords[k] for k in ("out_fmt", "out_rounding")
                   if keywords.get(k) is not None}
        hw = hw.with_(**changes) if changes else hw
        return instruction_matmul(a, b, hw, seed=seed, stream=stream, stats=stats), a, b, \
            model, in_fmt
    if hw is not None:
        for name, value in keywords.items():
            if value is not None and name not in TC_KEYWORDS:
                label = repr(model) if isinstance(model, str) else "a TensorCoreModel"
                raise ValueError(
                    f"matmul: {name}={value!r} is not accepted with the tensor-core model "
                    f"{label}, whose chunked accumulator fixes acc_fmt, acc_rounding, fused "
                    f"and order; accepted with it: {', '.join(TC_KEYWORDS)}, seed, stream, "
                    "stats, out (or a TensorCoreModel with other fields)")
        changes = dict(in_fmt=in_fmt, out_fmt=keywords.get("out_fmt"),
                       out_rounding=keywords.get("out_rounding"))
        changes = {k: v for k, v in changes.items() if v is not None}
        if changes:
            hw = hw.with_(**changes)
        return tc_matmul(a, b, hw, seed=seed, stream=stream, stats=stats), a, b, model, \
            in_fmt
    bfmt = as_block_format(in_fmt)
    if bfmt is None:
        return None, a, b, model, in_fmt
    from .operands import as_array
    a, b = block_inputs(as_array(a, "a", "matmul"), as_array(b, "b", "matmul"), bfmt,
                        seed=seed, stream=stream, stats=stats)
    if model is not None:
        model = replace(get_model(model), in_fmt=None)
    return None, a, b, model, None


__all__ = ["TensorCoreModel", "InstructionModel", "HARDWARE_MODELS", "hardware_model",
           "tc_matmul",
           "reference_matmul", "block_inputs"]
