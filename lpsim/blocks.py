"""Block-scaled formats (OCP MX, NVFP4): elements of a small format sharing one scale per block.

A :class:`BlockFormat` is an element format, a block size along an axis, a scale format and a
scale rule.  For a block with largest magnitude ``amax`` the scale is ``s`` and each element
is ``s * round(x / s)``, rounded in the element format with saturation (OCP MX v1.0, Sec. 6.3).
Power-of-two scale formats (``e8m0fnu``: MX) take the exponent from ``amax``
(``emax`` is the element format's largest exponent, ``max`` its largest value):

=========  ================================================================  ================
rule       scale exponent                                                    as in
=========  ================================================================  ================
``floor``  floor(log2 amax) - emax                                           OCP MX, gfloat
``ceil``   ceil(log2 amax) - emax                                            torchao CEIL
``even``   floor(log2 amax') - emax, amax' = amax rounded to the element's    torchao EVEN
           mantissa bits, ties away
``rceil``  ceil(log2 d), d = amax / max rounded to float32                   cuBLAS, TE,
                                                                             torchao RCEIL
=========  ================================================================  ================

clamped to the scale format's exponents (a *clipped scale*).  An all-zero block takes the
smallest scale.  Scale formats with mantissa bits (NVFP4's ``e4m3fn``) take
``t = fp32(amax / max)`` (divided by the per-tensor scale ``fp32(tensor_amax / (scale max *
max))`` when ``tensor_scale``), clamped to the scale format's range and rounded to it: to
nearest (``even``), up (``ceil``, ``rceil``) or down (``floor``); the elements are then
``fp32(x * r)`` with the float32 reciprocal ``r = fp32(fp32(1/pts) / s)``, as torchao's NVFP4
and TransformerEngine compute them.  The per-tensor scale is a float32 (a given one is
rounded to float32) of at least :func:`min_tensor_scale` (about 2**-119 for NVFP4), so that
``r`` stays finite for the smallest block scale: a tensor whose largest magnitude is below
about 4e-33 is scaled as if it reached it.  The fake-quantized value is ``q * s``
(``* pts``) rounded once to the container.

A block holding a NaN or inf gets a NaN scale and decodes to NaN (``nonfinite="nan"``, OCP),
or takes its scale from its finite elements (``nonfinite="finite"``: NaN stays NaN, inf
saturates).  Element rounding is any lpsim mode with the random bits of
:func:`lpsim.quantize` (element ``i`` of the blocked layout, C order with the block axis last,
uses counter ``offset + i``), ``sr_bits`` included.  The scale decision
(:func:`block_scale`) and the element step (:func:`element_fast`: :func:`scaled_bits`, then
:func:`lpsim.rounding.round_fast_sub`; else :func:`element_exact` with
:func:`lpsim.rounding.round_bits`) are the shared scalar core of the CPU kernel here (a
vectorised pass per block, see "the CPU kernel" below) and of ``lpsim_cuda.blocks``.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
from numba import njit
from numba.extending import overload, register_jitable

from .formats import Format, parse_format
from .cpu import (CHUNK, _constant, as_bits, draw_words, entry_point, literal_jitable,
                  thread_pool, threads, word_buffer)
from .philox import LANES, block_words, lane_word
from .request import MAX_COUNTER, keys
from .rounding import (DOWN, INEXACT, MODES, NEAREST, OVERFLOW, STOCHASTIC, UP, Params,
                       fast_sub_ok,
                       kernel_params, nearest32, nearest32_exact, nearest32_words, round_bits,
                       round_fast_sub)
from .stats import RoundingStats, check_stats
from .word32 import as_int64, bits_float32, float32_bits, like, word

#: elements per extra thread, and the size below which a call runs in the calling thread: an
#: element costs ten or more times a plain rounding (lpsim.cpu's grain), so threads pay sooner
PARALLEL_GRAIN = 1 << 17
SERIAL_BELOW = 2 * PARALLEL_GRAIN

RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
NONFINITE = ("nan", "finite")
FLOOR, CEIL, EVEN, RCEIL = range(4)

#: per-block counter columns of the kernels
BLOCK_COUNTERS = ("inexact", "overflow", "underflow", "subnormal", "nan", "inf",
                  "clipped_scale", "flushed", "nan_block")


#: what a block format's ``stats`` may be
STATS_ACCEPTED = "an lpsim.RoundingStats, an lpsim.blocks.BlockStats or None"


class BlockStats(RoundingStats):
    """RoundingStats of the elements plus per-call block counters.

    overflow counts saturated elements (x / s beyond the element format's largest value);
    blocks: blocks quantized; clipped_scales: scales clamped to the scale format's range;
    flushed_blocks: blocks with a nonzero element whose elements all became zero;
    nan_blocks: blocks given a NaN scale (a NaN or inf element, ``nonfinite="nan"``).
    """

    __slots__ = BLOCK_FIELDS = ("blocks", "clipped_scales", "flushed_blocks", "nan_blocks")

    def __init__(self, **counts):
        block = {name: int(counts.pop(name, 0)) for name in self.BLOCK_FIELDS}
        super().__init__(**counts)
        for name, value in block.items():
            setattr(self, name, value)

    def as_dict(self) -> dict:
        return {**super().as_dict(), **{name: getattr(self, name) for name in self.BLOCK_FIELDS}}

    def reset(self) -> None:
        super().reset()
        for name in self.BLOCK_FIELDS:
            setattr(self, name, 0)

    def __repr__(self) -> str:
        return "BlockStats(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ")"

    def __getstate__(self):
        return self.as_dict()

    def __setstate__(self, state):
        self.__init__(**state)

    def __copy__(self) -> "BlockStats":
        return BlockStats(**self.as_dict())

    def __deepcopy__(self, memo) -> "BlockStats":
        return self.__copy__()


_MAG64 = np.int64(0x7FFFFFFFFFFFFFFF)
_SIGN64 = np.int64(-0x8000000000000000)
_NORMAL64 = np.int64(1) << 52                  # 2**-1022, float64's smallest normal
#: power-of-two scales: the smallest value of an element format (2**-956: an exact quotient
#: below float64's normals then rounds in every mode, sr_bits and word width as 2**-1022
#: does) and the range of the scale format's values (float64 normals, whose reciprocals
#: are float64 normals: block_recip, block_scale)
ELEMENT_EXP_MIN, SCALE_EXP_RANGE = -956, (-1022, 1022)


@dataclass(frozen=True)
class BlockFormat:
    """Element format, block size, scale format, scale rule, optional FP32 tensor scale."""

    element: Format
    block: int = 32
    scale: Format = field(default_factory=lambda: parse_format("e8m0fnu"))
    rule: str = "floor"
    tensor_scale: bool = False
    nonfinite: str = "nan"

    def __post_init__(self):
        object.__setattr__(self, "element", parse_format(self.element))
        object.__setattr__(self, "scale", parse_format(self.scale))
        if isinstance(self.block, bool) or not isinstance(self.block, (int, np.integer)) \
                or self.block < 1:
            raise ValueError(f"block={self.block!r} is not accepted; accepted: an integer >= 1")
        object.__setattr__(self, "block", int(self.block))
        if self.rule not in RULES:
            raise ValueError(f"rule={self.rule!r} is unknown; accepted: {', '.join(RULES)}")
        if self.nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite={self.nonfinite!r} is unknown; accepted: "
                             f"{', '.join(NONFINITE)}")
        if not isinstance(self.tensor_scale, (bool, np.bool_)):
            raise TypeError(f"tensor_scale={self.tensor_scale!r} must be True or False")
        if self.tensor_scale and self.pow2:
            raise ValueError(f"tensor_scale=True needs a scale format with mantissa bits (as "
                             f"NVFP4's e4m3fn), not {self.scale!r}")
        if self.tensor_scale and not 0 < float(np.float32(
                self.scale.max_finite * self.element.max_finite)) < np.inf:
            raise ValueError(f"tensor_scale=True needs scale max * element max a positive "
                             f"finite float32 (the per-tensor scale divides by it), not "
                             f"{self.scale.max_finite!r} * {self.element.max_finite!r}")
        if self.tensor_scale and not self.scale.fits(np.float32)[0]:
            raise ValueError(f"tensor_scale=True needs a scale format whose values are float32 "
                             f"values (the per-tensor scale and the reciprocals are FP32), not "
                             f"{self.scale!r}: {self.scale.fits(np.float32)[1]}")
        for fmt, what in ((self.element, "element"), (self.scale, "scale")):
            ok, reason = fmt.fits(np.float64)
            if not ok:
                raise ValueError(f"{what} format {fmt!r} is too wide: {reason}")
        if self.pow2:
            least = self.element.emin - (self.element.m if self.element.subnormals else 0)
            if least < ELEMENT_EXP_MIN:
                raise ValueError(
                    f"element format {self.element!r} reaches 2**{least}; under a "
                    f"power-of-two scale {self.scale!r} accepted: element formats whose "
                    f"smallest value is at least 2**{ELEMENT_EXP_MIN} (their quotients x / s "
                    "are rounded exactly)")
            low, high = SCALE_EXP_RANGE
            if not (low <= self.scale.emin and self.scale.emax <= high):
                raise ValueError(
                    f"scale format {self.scale!r} spans 2**{self.scale.emin} to "
                    f"2**{self.scale.emax}; accepted as a power-of-two scale: values from "
                    f"2**{low} to 2**{high} (float64 normals with normal reciprocals)")

    @property
    def pow2(self) -> bool:
        """Whether every scale is a power of two (scale format without mantissa bits)."""
        return self.scale.m == 0

    @functools.cached_property
    def saturating_element(self) -> Format:
        """The element format with saturation: MX and NVFP4 clamp elements to +-max."""
        return replace(self.element, saturate=True)

    @functools.cached_property
    def tensor_scale_divisor(self) -> np.float32:
        """fp32(scale max * element max): what the per-tensor scale divides amax by."""
        return np.float32(self.scale.max_finite * self.element.max_finite)

    @property
    def name(self) -> str | None:
        for key, value in PRESETS.items():
            if value == self:
                return key
        return None

    def __repr__(self) -> str:
        extra = "".join([", tensor_scale=True" if self.tensor_scale else "",
                         f", nonfinite={self.nonfinite!r}" if self.nonfinite != "nan" else ""])
        return (f"block({self.element!r}, {self.block}, {self.scale!r}, {self.rule!r}"
                f"{extra})")

    __str__ = __repr__


def block(element, block: int = 32, scale="e8m0fnu", rule: str = "floor", *,
          tensor_scale: bool = False, nonfinite: str = "nan") -> BlockFormat:
    """The block format with these parts (any element format, any scale format and rule)."""
    return BlockFormat(element, block, scale, rule, tensor_scale, nonfinite)


#: MXINT8's element: k/64 for |k| <= 127, one zero (OCP's two's complement INT8 with scale
#: 2**-6, symmetric: lpsim does not produce the -2.0 code)
INT8_MX = Format(1, 6, 1, specials="fnuz", saturate=True)

PRESETS: dict[str, BlockFormat] = {
    "mxfp8_e4m3": block("e4m3fn"),
    "mxfp8_e5m2": block("e5m2"),
    "mxfp6_e3m2": block("e3m2fn"),
    "mxfp6_e2m3": block("e2m3fn"),
    "mxfp4": block("e2m1fn"),
    "mxint8": block(INT8_MX),
    "nvfp4": block("e2m1fn", 16, "e4m3fn", "even", tensor_scale=True),
}
ALIASES = {"mxfp8": "mxfp8_e4m3", "mxfp6": "mxfp6_e3m2", "mxfp4_e2m1": "mxfp4"}

_BLOCK_CALL = re.compile(r"block\((.*)\)")


def as_block_format(spec) -> BlockFormat | None:
    """The BlockFormat that ``spec`` names (a preset, ``repr`` syntax), or None if ``spec``
    is not a block format (an element format or anything else)."""
    if isinstance(spec, BlockFormat):
        return spec
    if not isinstance(spec, str):
        return None
    key = spec.strip().lower()
    key = ALIASES.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    match = _BLOCK_CALL.fullmatch(key.replace(" ", ""))
    if not match:
        return None
    parts = re.split(r",(?![^()]*\))", match.group(1))       # commas outside fp(...)
    args, kwargs = [], {}
    for part in parts:
        if re.fullmatch(r"(tensor_scale|nonfinite)=.*", part):
            name, _, value = part.partition("=")
            value = value.strip("'\"")
            kwargs[name] = {"true": True, "false": False}.get(value, value)
        else:
            args.append(part.strip("'\""))
    if len(args) >= 2:
        if not re.fullmatch(r"\d+", args[1]):
            raise ValueError(f"block format {spec!r}: block size {args[1]!r} is not an integer")
        args[1] = int(args[1])
    return block(*args, **kwargs)


def parse_block_format(spec) -> BlockFormat:
    """A block format from a preset name ("mxfp4", "nvfp4") or ``repr`` syntax."""
    bfmt = as_block_format(spec)
    if bfmt is None:
        raise ValueError(f"unknown block format {spec!r}; accepted: a preset "
                         f"({', '.join(PRESETS)}) or 'block(element, size, scale, rule)'")
    return bfmt


# --- the shared scalar core ---------------------------------------------------------------

class BlockParams(NamedTuple):
    """What the block kernels need besides the element and scale Params; floats are float64."""

    block: int
    rule: int
    pow2: int
    emax_e: int      # element format's largest exponent
    m_e: int         # element mantissa bits
    max_e: float     # element format's largest value
    smin_exp: int    # power-of-two scales: exponent range
    smax_exp: int
    smin: float      # smallest and largest scale values
    smax: float
    nonfinite_nan: int
    pts: float       # per-tensor scale (1.0 without)
    pts_inv: float   # fp32(1 / pts)
    f32: int         # 1: float32 arrays take the element step on 32-bit words (element_fast32)
    near32: int      # 1: ... and nearest rounding its float32 add (element_nearest32)
    snear32: int     # 1: scales rounded to nearest by nearest32 (scale_words)


def f2i(v):
    """The int64 bit pattern of float64 ``v`` (compiled: a register bitcast; Python, as the
    CUDA simulator runs it: a numpy view)."""
    return np.float64(v).view(np.int64)


def i2f(b):
    """The float64 whose bit pattern is the int64 ``b``."""
    return np.int64(b).view(np.float64)


@overload(f2i)
def _f2i_compiled(v):
    from .exact import f2i as bitcast
    return lambda v: bitcast(np.float64(v))


@overload(i2f)
def _i2f_compiled(b):
    from .exact import i2f as bitcast
    return lambda b: bitcast(np.int64(b))


@register_jitable
def ilog2(v):
    """floor(log2 v) of a positive finite float64, and whether v is a power of two."""
    b = f2i(v)
    field_ = b >> 52
    frac = b & ((np.int64(1) << 52) - 1)
    if field_ == 0:                               # float64 subnormal
        top = 0
        while (frac >> (top + 1)) != 0:
            top += 1
        return top - 1074, frac == (np.int64(1) << top)
    return field_ - 1023, frac == 0


@register_jitable
def block_scale(amax, bp, sp):
    """(scale s, clipped) for a block of largest magnitude ``amax`` (finite, >= 0).

    The one scale decision of both kernels (the table in the module docstring).
    """
    if bp.pow2:
        if amax == 0:
            return bp.smin, 0
        if bp.rule == RCEIL:
            d = np.float64(np.float32(amax / bp.max_e))
            if d == 0:
                return bp.smin, 1
            ex, exact = ilog2(d)
            ex += 1 - np.int64(exact)
        else:
            a = amax
            if bp.rule == EVEN:                    # round to the element's mantissa bits
                a = i2f((f2i(amax) + (np.int64(1) << (51 - bp.m_e)))
                        & ~((np.int64(1) << 52) - 1))
            ex, exact = ilog2(a)
            if bp.rule == CEIL:
                ex += 1 - np.int64(exact)
            ex -= bp.emax_e
        if ex < bp.smin_exp:
            return bp.smin, 1
        if ex > bp.smax_exp:
            return bp.smax, 1
        return i2f((ex + 1023) << 52), 0
    t = np.float64(np.float32(amax / bp.max_e))
    if bp.pts != 1.0:
        t = np.float64(np.float32(t / bp.pts))
    if t < bp.smin:
        return bp.smin, np.int64(amax != 0)
    if t > bp.smax:
        return bp.smax, 1
    bits, _ = round_scale(f2i(t), _scale_mode(bp.rule), sp)
    return i2f(bits), 0


@register_jitable
def _scale_mode(rule):
    if rule == FLOOR:
        return DOWN
    if rule == EVEN:
        return NEAREST
    return UP


@register_jitable
def round_scale(bits, mode, sp):
    return round_bits(bits, mode, 0, 64, sp)


@register_jitable
def scale_recip(s, bp):
    """fp32 reciprocal that multiplies the elements under a non-power-of-two scale."""
    if bp.pts != 1.0:
        return np.float64(np.float32(bp.pts_inv / s))
    return np.float64(np.float32(1.0 / s))


@register_jitable
def scaled_bits(xv, s, recip, bp):
    """float64 bits of x / s: x * (1/s), exact for power-of-two scales; else fp32(x * recip)
    with recip the float32 reciprocal (torchao, TransformerEngine)."""
    if bp.pow2:
        b = f2i(np.float64(xv) * recip)        # recip = 1/s exactly: x / s, exact ...
        if (b & _MAG64) < _NORMAL64 and xv != 0:
            # ... but where it falls below float64's normals (float64 data under a large
            # scale), where it was rounded: 2**-1022 of its sign stands in, which every
            # element format a block format takes (smallest value >= 2**ELEMENT_EXP_MIN)
            # rounds and counts as it does the exact quotient
            b = (b & _SIGN64) | _NORMAL64
        return b
    return f2i(np.float64(np.float32(np.float64(xv) * recip)))


@register_jitable
def dequantize_element(q, s, bp):
    """q * s (* pts) in float64: exact for the small formats (one rounding to the container)."""
    if bp.pts != 1.0:
        return q * s * bp.pts
    return q * s


@register_jitable
def block_recip(s, bp):
    """The factor that scales a block's elements: 1/s (exact) for power-of-two scales, else
    the float32 reciprocal of :func:`scale_recip`."""
    if bp.pow2:
        # 2**-e from 2**e by its exponent field (exact, no division), for float64 normals
        # 2**e and 2**-e, as every power-of-two scale format lpsim accepts has; NaN stays NaN
        b = f2i(s)
        if s == s and (np.int64(1) << 52) < b < (np.int64(2046) << 52):
            return i2f((np.int64(2046) << 52) - b)
        return 1.0 / s
    return scale_recip(s, bp)


@register_jitable(forceinline=True)
def element_fast(xv, recip, s, mode, r, k, p, bp):
    """The straight-line element step: (q, q * s, ok, flags) of x in a block of scale ``s``.

    x / s (:func:`scaled_bits`) rounded by :func:`lpsim.rounding.round_fast_sub`; where ``ok``
    is 0 (NaN, inf, float64 subnormals) q is x / s unchanged and :func:`element_exact`
    decides.  No branch on the data, so a loop over it vectorises.
    """
    b, ok, flags = round_fast_sub(scaled_bits(xv, s, recip, bp), mode, r, k, p)
    q = i2f(b)
    return q, dequantize_element(q, s, bp), ok, flags


@register_jitable(forceinline=True)
def _exact_product(xv, yb):
    """0 where the float32 product x * recip (bits ``yb``) underflowed to 0 from x != 0 (a
    float32 subnormal product fails :func:`lpsim.rounding.fast_sub_ok` already), else 1."""
    return like(yb, ((yb & 0x7FFFFFFF) != 0) | ((float32_bits(xv) & 0x7FFFFFFF) == 0))


@register_jitable(forceinline=True)
def element_ok32(xv, recip, p):
    """:func:`element_fast32`'s ``ok`` alone (where the exact step must run instead)."""
    yb = float32_bits(xv * recip)
    return fast_sub_ok(yb, p) & _exact_product(xv, yb)


@register_jitable(forceinline=True)
def element_fast32(xv, r, recip, s, mode, k, p, bp):
    """:func:`element_fast` of a float32 element in float32 arithmetic on 32-bit words
    (:mod:`lpsim.word32`: eight AVX2 lanes), ``recip``, ``s`` and ``r`` float32 and a word,
    ``p`` the element's float32-container Params; where :func:`words_exact` holds, the same
    (q, q * s, ok, flags).

    x * recip is x / s exactly when the scale is a power of two and the product a float32
    normal (or x is 0: ``ok`` is 0 for a product that underflowed), and is the definition
    (fp32(x * r)) otherwise; q * s (* pts) is rounded once, as in float64.
    """
    yb = float32_bits(xv * recip)
    b, ok, flags = round_fast_sub(yb, mode, r, k, p)
    ok &= _exact_product(xv, yb)
    q = bits_float32(b)
    v = q * s * np.float32(bp.pts)              # times 1 (exact) without a tensor scale
    return q, v, ok, flags & -ok


@functools.lru_cache(maxsize=256)
def words_exact(bfmt: "BlockFormat") -> bool:
    """Whether :func:`element_fast32` gives the float64 step's results for every float32
    element of ``bfmt``: the element format fits a float32 container, every scale and (power
    of two) its reciprocal is a float32, and with a tensor scale q * s is an exact float32
    normal (so that q * s * pts is rounded once)."""
    el, sc = bfmt.saturating_element, bfmt.scale
    # element normals from float32's (round_fast_sub's 32-bit lanes hold only nonnegative
    # quantities: an element format reaching below them took wrong values)
    if not (el.fits(np.float32)[0] and sc.fits(np.float32)[0] and el.signed
            and el.emin >= -126):
        return False
    smin, smax = float(sc.min_subnormal), float(sc.max_finite)
    if bfmt.pow2 and not (2.0 ** -127 <= smin and smax <= 2.0 ** 127):
        return False
    # every reciprocal finite (the nearest step has no exact step for 0 * inf to fall back
    # on); a tensor scale keeps them finite by its least value (min_tensor_scale)
    if not bfmt.tensor_scale and not _reciprocal_finite(1.0, smin):
        return False
    if bfmt.tensor_scale:
        return (el.m + sc.m + 2 <= 24 and float(el.min_subnormal) * smin >= 2.0 ** -126
                and float(el.max_finite) * smax < 2.0 ** 128)
    return True


_INF64 = np.int64(0x7FF0000000000000)
_MAX64 = np.int64(0x7FEFFFFFFFFFFFFF)


@register_jitable
def element_exact(xv, recip, s, mode, r, k, p, bp):
    """(q, q * s, flags) of any element by :func:`lpsim.rounding.round_bits`.  A zero
    element is the zero of its sign whatever the reciprocal: a scale format reaching below
    float32's reciprocal range (bf16, fp(8,10); fp(11,0) in float64) gives its smallest
    scales an infinite one, and 0 * inf would be NaN."""
    yb = scaled_bits(xv, s, recip, bp)
    if xv == 0:
        yb = f2i(np.float64(xv))
    # a finite x whose exact quotient x / s (power-of-two scale) lies beyond float64 (float64
    # data, a narrow scale format): an overflow of every element format, as the largest
    # float64 of its sign rounds, flagged as one even where that is the format's largest
    big = bp.pow2 and (yb & _MAG64) == _INF64 and abs(np.float64(xv)) < np.inf
    if big:
        yb = (yb & _SIGN64) | _MAX64
    b, flags = round_bits(yb, mode, r, k, p)
    if big and b != p.nanb:
        flags |= OVERFLOW | INEXACT
    q = i2f(b)
    return q, dequantize_element(q, s, bp), flags


@register_jitable
def element_word(mode, g, lanes, stream, seed_lo, seed_hi):
    """The random word of element ``g`` (lpsim.philox's lanes; 0 for deterministic modes)."""
    if mode < STOCHASTIC:
        return np.int64(0)
    blk = g // lanes
    return lane_word(block_words(blk, stream, seed_lo, seed_hi), g - blk * lanes, lanes)


@register_jitable
def bits_value(a, M, EB):
    """The float64 value of the nonnegative container magnitude bits ``a`` (M mantissa bits,
    exponent bias EB; exact: float32 and float64 values are float64 values)."""
    a = np.int64(a)
    if M == 52:
        return i2f(a)
    field_ = a >> M
    frac = a & ((np.int64(1) << M) - 1)
    if field_ == 0:                             # float32 subnormal: frac * 2**(1 - EB - M)
        return np.float64(frac) * i2f((np.int64(1024 - EB - M)) << 52)
    return i2f(((field_ - EB + 1023) << 52) | (frac << (52 - M)))


# --- the CPU kernel ---------------------------------------------------------------------------
#
# Work is a range of blocks (row-major over rows and blocks per row, so a range of blocks is
# a contiguous range of elements), walked in chunks of about CHUNK elements: (a) per block,
# the largest magnitude as an integer max over the container bits (a vectorised reduction;
# the inf/NaN bit patterns are the largest) and the scale decision; (b) per block, the
# element step over its elements, a loop with no branch on the data that vectorises, its
# flags summed per block; the rare elements it leaves (NaN, inf, float64 subnormals) go to
# element_exact.  Stochastic modes draw the chunk's random words first, four a Philox call
# (lpsim.cpu.fill_words).  Threads take contiguous ranges of blocks.
#
# Without counters, a float32 array of a format where element_fast32 is exact (words_exact:
# MX and NVFP4 are) takes the word kernel (_words_kernel, its own entry point, so that such
# a call compiles nothing else): per block (_chunk_words) the largest magnitude, the scale
# in integer steps (scale_words), then the element loop on 32-bit words (eight AVX2 lanes),
# a loop of literal length for blocks of 32 and 16 elements, with unsigned offsets (no
# per-block array views, whose reference counting costs more than the block's elements).
# Nearest rounding there is one float32 add and subtract per element (nearest32).  One
# thread, 2**22 elements: MXFP8/MXFP4 nearest about 0.8 ns/element (2 ns before the add, 5-6
# for the per-block float64 loop), about as fast as a copy on two threads.

@register_jitable
def _nonfinite_block(xs, outs, qs, want_q, c):
    """A block holding NaN or inf under ``nonfinite="nan"``: NaN out, NaN and inf counted."""
    for i in range(xs.size):
        v = np.float64(xs[i])
        c[4] += np.int64(v != v)
        c[5] += np.int64(v == np.inf or v == -np.inf)
        outs[i] = np.nan
        if want_q:
            qs[i] = np.nan
    c[8] = 1


@register_jitable
def _finite_amax(xs):
    amax = 0.0
    for i in range(xs.size):
        v = abs(np.float64(xs[i]))
        if v != np.inf and v > amax:
            amax = v
    return amax


@register_jitable(inline="always")
def _block_elements(xs, outs, qs, rs, want_q, want_counts, s, recip, mode, k, p, bp):
    """The element step over one block (slices from 0, so no wraparound checks); returns
    (inexact, overflow, underflow, subnormal, nonzero, slow), the counters 0 unless want_q
    or want_counts.  ``mode`` must be a literal."""
    mode = _constant(mode)
    rmask = -1 if mode >= STOCHASTIC else 0     # deterministic modes read rs[0] only
    f0 = f1 = f2 = f3 = nonzero = slow = np.int64(0)
    if want_q:
        for i in range(xs.size):
            q, v, ok, flags = element_fast(xs[i], recip, s, mode, np.int64(rs[i & rmask]), k, p,
                                          bp)
            qs[i] = q
            outs[i] = v
            nonzero += np.int64(q != 0)
            slow += 1 - ok
            f0 += flags & 1
            f1 += (flags >> 1) & 1
            f2 += (flags >> 2) & 1
            f3 += (flags >> 3) & 1
    elif want_counts:
        for i in range(xs.size):
            q, v, ok, flags = element_fast(xs[i], recip, s, mode, np.int64(rs[i & rmask]), k, p,
                                          bp)
            outs[i] = v
            nonzero += np.int64(q != 0)
            slow += 1 - ok
            f0 += flags & 1
            f1 += (flags >> 1) & 1
            f2 += (flags >> 2) & 1
            f3 += (flags >> 3) & 1
    else:                                       # no counters: a third fewer operations
        for i in range(xs.size):
            q, v, ok, flags = element_fast(xs[i], recip, s, mode, np.int64(rs[i & rmask]), k, p,
                                          bp)
            outs[i] = v
            slow += 1 - ok
    return f0, f1, f2, f3, nonzero, slow


@register_jitable
def _block_slow(xs, outs, qs, rs, want_q, s, recip, mode, k, p, bp, c):
    """element_exact over the elements element_fast left; returns the change of nonzero."""
    dz = np.int64(0)
    rmask = -1 if mode >= STOCHASTIC else 0
    for i in range(xs.size):
        r = np.int64(rs[i & rmask])
        yb = scaled_bits(xs[i], s, recip, bp)      # element_fast leaves it as it is where
        q0 = i2f(yb)                               # fast_sub_ok is 0
        if not fast_sub_ok(yb, p):
            q, v, flags = element_exact(xs[i], recip, s, mode, r, k, p, bp)
            if want_q:
                qs[i] = q
            outs[i] = v
            dz += np.int64(q != 0) - np.int64(q0 != 0)
            for f in range(6):
                c[f] += (flags >> f) & 1
    return dz


@register_jitable(forceinline=True)
def element_nearest32(xv, rc, s, pts, maxe, cw, lw):
    """:func:`element_fast32`'s value q * s (* pts) for nearest rounding of a finite float32
    element, with ``rc`` the block's float32 reciprocal: q = min(:func:`nearest32` (x * rc),
    max) carrying x's sign.  x * rc underflowing to a float32 subnormal or to 0 is harmless
    here: such a quotient is below half the element's smallest subnormal and rounds to 0."""
    yb = float32_bits(xv * rc)
    q = min(nearest32(yb, cw, lw), maxe)
    return bits_float32(float32_bits(q * s * pts) | (float32_bits(xv) & 0x80000000))


@functools.lru_cache(maxsize=256)
def nearest_words_exact(fmt: Format) -> bool:
    """Whether :func:`element_nearest32` rounds x / s to ``fmt`` as round_bits does to
    nearest: :func:`lpsim.rounding.nearest32_exact`, and a smallest subnormal above 2**-125,
    so that a quotient that underflows to a float32 subnormal rounds to 0 either way."""
    return nearest32_exact(fmt) and fmt.emin - fmt.m >= -124 and fmt.emax <= 100


@register_jitable(forceinline=True)
def scale_words(am, bp, sp):
    """:func:`block_scale`'s scale (float64) of a block whose largest magnitude has the
    finite float32 bits ``am``, in integer steps where they apply: a power-of-two scale by
    floor, ceil or even of a float32 normal amax (the exponent field, its mantissa rounded
    first for even), and a scale with mantissa bits rounded to nearest (``even``: NVFP4's
    UE4M3) by :func:`nearest32`; else :func:`block_scale` itself."""
    a = as_int64(am)
    if bp.pow2 and bp.rule != RCEIL and a >= (np.int64(1) << 23) and bp.m_e <= 22:
        if bp.rule == EVEN:                     # round to the element's mantissa, ties away
            a = (a + (np.int64(1) << (22 - bp.m_e))) & (np.int64(255) << 23)
        ex = (a >> 23) - 127 - bp.emax_e
        if bp.rule == CEIL:
            ex += np.int64((a & ((np.int64(1) << 23) - 1)) != 0)
        ex = min(max(ex, bp.smin_exp), bp.smax_exp)
        return i2f((ex + 1023) << 52)
    if bp.snear32 and a != 0:
        # float32 divisions: the quotient of two float32 values rounded once to float32 is
        # block_scale's float64 quotient rounded to float32 (53 >= 2 * 24 + 2 bits)
        t = bits_float32(am) / np.float32(bp.max_e)
        if bp.pts != 1.0:
            t = t / np.float32(bp.pts)
        if t < bp.smin:
            return bp.smin
        if t > bp.smax:
            return bp.smax
        cw, lw = nearest32_words(sp.m, sp.emin)
        return np.float64(nearest32(float32_bits(t), cw, lw))
    s, _ = block_scale(bits_value(a, 23, 127), bp, sp)
    return s


@register_jitable(forceinline=True)
def _elements_nearest32(xf, outf, lo, size, rc, s, pts, maxe, cw, lw):
    """:func:`element_nearest32` over the ``size`` elements from ``lo`` (unsigned offsets:
    no negative-index checks; a literal size is a loop LLVM unrolls into vector steps)."""
    for i in range(size):
        j = lo + np.uint64(i)
        outf[j] = element_nearest32(xf[j], rc, s, pts, maxe, cw, lw)


@register_jitable(forceinline=True)
def _block_nearest32(xf, outf, lo, n, rc, s, pts, maxe, cw, lw):
    """:func:`_elements_nearest32` over a block of n elements from ``lo``: a loop of literal
    length for blocks of 32 and 16."""
    if n == 32:
        _elements_nearest32(xf, outf, lo, 32, rc, s, pts, maxe, cw, lw)
    elif n == 16:
        _elements_nearest32(xf, outf, lo, 16, rc, s, pts, maxe, cw, lw)
    else:
        _elements_nearest32(xf, outf, lo, n, rc, s, pts, maxe, cw, lw)


@register_jitable(forceinline=True)
def _elements_words(xf, outf, rs, lo, r0, size, rc, s, mode, k, p32, bp):
    """:func:`element_fast32` over the ``size`` elements from ``lo`` (random words from
    ``r0``); returns how many it left to the exact step."""
    rmask = np.uint64(0) if mode < STOCHASTIC else ~np.uint64(0)
    slow = word(np.int32(0))
    for i in range(size):
        j = lo + np.uint64(i)
        _, v, ok, _ = element_fast32(xf[j], word(rs[(r0 + np.uint64(i)) & rmask]), rc, s,
                                     mode, k, p32, bp)
        outf[j] = v
        slow += 1 - ok
    return slow


@register_jitable(forceinline=True)
def _block_amax32(xb, lo, size):
    """The largest magnitude bits of the ``size`` float32 words from ``lo``."""
    am = word(np.int32(0))
    for i in range(size):
        am = max(am, word(xb[lo + np.uint64(i)]) & 0x7FFFFFFF)
    return am


#: blocks of :func:`_chunk_words` whose scales are found before their elements are rounded:
#: one block's scale is a chain of dependent steps (largest magnitude, divisions, rounding,
#: reciprocal), and with the scales of a group found first the chains of different blocks
#: overlap one another and the element loops
SCALE_AHEAD = 16


@register_jitable
def scale_ahead_scratch():
    """The per-group arrays of :func:`_chunk_words`: first element and length of each block
    (a length below 0: a block with a NaN or inf), its float32 scale and reciprocal."""
    return (np.empty(SCALE_AHEAD, np.int64), np.empty(SCALE_AHEAD, np.int64),
            np.empty(SCALE_AHEAD, np.float32), np.empty(SCALE_AHEAD, np.float32))


@literal_jitable
def _group_elements(xf, outf, sf, rs, g0, g1, e_lo, mode, k, p, p32, sp, bp, ahead):
    """The element phase of :func:`_chunk_words` for blocks g0 .. g1-1 in every case (blocks
    with a NaN or inf, the general element step): a function of its own, so that the
    nearest-rounding loop of :func:`_chunk_words` compiles without this code around it."""
    mode = _constant(mode)
    near = mode == NEAREST and bp.near32
    rmask = -np.int64(mode >= STOCHASTIC)       # deterministic modes read rs[0] only
    maxe, pts = np.float32(bp.max_e), np.float32(bp.pts)
    cw, lw = nearest32_words(p32.m, p32.emin)
    los, ns, s32s, rcs = ahead
    for tb in range(g0, g1):                # the group's elements
        j = tb - g0
        lo_, n = los[j], ns[j]
        if n < 0:
            hi_ = lo_ - n
            if bp.nonfinite_nan:
                sf[tb] = np.nan
                for e in range(lo_, hi_):
                    outf[e] = np.nan
                continue
            s, _ = block_scale(_finite_amax(xf[lo_:hi_]), bp, sp)
            sf[tb] = s
            recip = block_recip(s, bp)
            for e in range(lo_, hi_):
                _, outf[e], _ = element_exact(xf[e], recip, s, mode,
                                              np.int64(rs[(e - e_lo) & rmask]), k, p, bp)
            continue
        lo, rc, s32 = np.uint64(lo_), rcs[j], s32s[j]
        if near:
            _block_nearest32(xf, outf, lo, n, rc, s32, pts, maxe, cw, lw)
            continue
        r0 = np.uint64(lo_ - e_lo)
        if n == 32:
            slow = _elements_words(xf, outf, rs, lo, r0, 32, rc, s32, mode, k, p32, bp)
        elif n == 16:
            slow = _elements_words(xf, outf, rs, lo, r0, 16, rc, s32, mode, k, p32, bp)
        else:
            slow = _elements_words(xf, outf, rs, lo, r0, n, rc, s32, mode, k, p32, bp)
        if slow != 0:
            s = sf[tb]
            recip = block_recip(s, bp)
            for e in range(lo_, lo_ + n):
                if element_ok32(xf[e], rc, p32) == 0:
                    r = rs[(e - e_lo) & rmask]
                    _, outf[e], _ = element_exact(xf[e], recip, s, mode, np.int64(r), k,
                                                  p, bp)


@register_jitable(forceinline=True)
def _blocks_nearest_steps(xf, outf, sf, xb, bam, tb, t_end, lo, size, steps, cinf, pts, maxe,
                          cw, lw):
    """Blocks tb .. t_end-1 of ``size`` elements each, end to end from element ``lo``, to
    nearest with their scales from :func:`_scale_steps`' table (largest magnitudes from
    ``bam`` where it is not empty), up to a block with a NaN or inf: returns its index
    (t_end if none) and leaves it to the caller.  One plain loop: with each block's steps
    (largest magnitude, table, elements) in one iteration the processor overlaps those of
    neighbouring blocks itself."""
    step_base, step_thr, svals, rvals, kshift = steps
    stored = bam.size != 0
    lo = np.uint64(lo)
    for b in range(tb, t_end):
        am = word(bam[b]) if stored else _block_amax32(xb, lo, size)
        if am >= cinf:
            return b
        a = as_int64(am)
        key = a >> kshift
        i = step_base[key] + np.int64(a >= step_thr[key])
        s32 = svals[i]
        sf[b] = s32
        _elements_nearest32(xf, outf, lo, size, rvals[i], s32, pts, maxe, cw, lw)
        lo += np.uint64(size)
    return t_end


@literal_jitable
def _chunk_words(xf, outf, sf, bam, rs, t, t_end, e_lo, mode, k, p, p32, sp, bp, length,
                 nblk, rct, ri0, rsh, steps, ahead):
    """Blocks t .. t_end-1 of the flat float32 arrays (element e_lo has random word rs[0])
    on 32-bit words, without counters.

    Per group of SCALE_AHEAD blocks, first each block's largest magnitude, scale
    (:func:`scale_words`) and reciprocal, then each block's element loop
    (:func:`element_nearest32` for nearest rounding where :func:`nearest_words_exact` holds,
    else :func:`element_fast32`, then :func:`element_exact` for what it left).  Blocks of
    32 and 16 elements run loops of that literal length: a loop of a run-time length this
    short spends more on its set-up than on its elements.  A block with a NaN or inf is
    NaN (``nonfinite="nan"``) or takes the exact step throughout.  ``rct``, ``ri0``,
    ``rsh``: the reciprocals of the scale's values (:func:`_reciprocals`); ``steps``: the
    scales as a table (:func:`_scale_steps`, used where it is not empty); ``ahead``:
    :func:`scale_ahead_scratch`; ``bam``: each block's largest magnitude bits
    (:func:`block_amaxes`), or empty (each block finds its own).  Nearest rounding with the
    table, of rows of whole blocks, runs :func:`_blocks_nearest_steps` instead.
    """
    near = _constant(mode) == NEAREST and bp.near32
    xb = as_bits(xf)
    size = bp.block
    cinf = word(np.int32(255 << 23))
    maxe, pts = np.float32(bp.max_e), np.float32(bp.pts)
    cw, lw = nearest32_words(p32.m, p32.emin)
    los, ns, s32s, rcs = ahead
    step_base, step_thr, svals, rvals, kshift = steps
    full = length == nblk * size                # every block of a row has size elements
    if near and full and step_base.size:
        tb = t
        while tb < t_end:
            lo = e_lo + (tb - t) * size
            if size == 16:
                bad = _blocks_nearest_steps(xf, outf, sf, xb, bam, tb, t_end, lo, 16, steps,
                                            cinf, pts, maxe, cw, lw)
            else:
                bad = _blocks_nearest_steps(xf, outf, sf, xb, bam, tb, t_end, lo, size, steps,
                                            cinf, pts, maxe, cw, lw)
            if bad == t_end:
                return
            los[0], ns[0] = e_lo + (bad - t) * size, -size          # a NaN or inf in it
            _group_elements(xf, outf, sf, rs, bad, bad + 1, e_lo, mode, k, p, p32, sp, bp,
                            ahead)
            tb = bad + 1
        return
    stored = bam.size != 0
    # the blocks' bounds by counting along the rows: _block_bounds' integer divisions per
    # block cost about as much as a 16-element block's rounding
    row_lo, col = (t // nblk) * length, t % nblk
    for g0 in range(t, t_end, SCALE_AHEAD):
        g1 = min(g0 + SCALE_AHEAD, t_end)
        nonfinite = 0
        # a group of whole blocks within one row: its bounds without the count's carried
        # dependency, which costs a sixth of a 16-element block
        simple = col + (g1 - g0) < nblk or (col + (g1 - g0) == nblk and full)
        if simple:
            base = row_lo + col * size
            for j in range(g1 - g0):
                los[j] = base + j * size
                ns[j] = size
            col += g1 - g0
            if col == nblk:
                col = 0
                row_lo += length
        else:
            for j in range(g1 - g0):
                lo_ = row_lo + col * size
                los[j] = lo_
                ns[j] = min(lo_ + size, row_lo + length) - lo_
                col += 1
                if col == nblk:
                    col = 0
                    row_lo += length
        for tb in range(g0, g1):                # the group's scales
            j = tb - g0
            lo_, n_ = los[j], ns[j]
            lo = np.uint64(lo_)
            if stored:
                am = word(bam[tb])
            elif n_ == 32:
                am = _block_amax32(xb, lo, 32)
            elif n_ == 16:
                am = _block_amax32(xb, lo, 16)
            else:
                am = _block_amax32(xb, lo, n_)
            if am >= cinf:                      # a NaN or inf in the block
                ns[j] = -n_
                nonfinite += 1
                continue
            if step_base.size:                  # the table of the scale's steps
                a = as_int64(am)
                key = a >> kshift
                i = step_base[key] + np.int64(a >= step_thr[key])
                s32 = svals[i]
                sf[tb] = s32
                s32s[j] = s32
                rcs[j] = rvals[i]
                continue
            s = scale_words(am, bp, sp)
            sf[tb] = s
            s32 = np.float32(s)
            s32s[j] = s32
            # block_recip: 2**-e by its exponent bits, or scale_recip in float32 arithmetic
            # (the float64 quotient of float32 values rounded to float32 is the same), from
            # the table of the scale's values where there is one
            if bp.pow2:
                rcs[j] = np.float32(block_recip(s, bp))
            else:
                i = (as_int64(float32_bits(s32)) >> rsh) - ri0
                rcs[j] = rct[i] if 0 <= i < rct.size else np.float32(bp.pts_inv) / s32
        if near and nonfinite == 0:             # the group's elements, to nearest
            for j in range(g1 - g0):
                _block_nearest32(xf, outf, np.uint64(los[j]), ns[j], rcs[j], s32s[j], pts,
                                 maxe, cw, lw)
            continue
        _group_elements(xf, outf, sf, rs, g0, g1, e_lo, mode, k, p, p32, sp, bp, ahead)


@register_jitable
def _block_bounds(tb, nblk, length, size):
    """(lo, hi): the elements of block ``tb`` (row-major, ``nblk`` blocks per row of
    ``length``; a row's last block may be short) in the flat array."""
    row_lo = (tb // nblk) * length
    lo = row_lo + (tb % nblk) * size
    return lo, min(lo + size, row_lo + length)


@register_jitable
def _chunk(t, t1, per_chunk, nblk, length, size):
    """(t_end, e_lo, e_hi): the chunk of blocks t .. t_end-1 (at most per_chunk, row-major)
    and its contiguous range of elements e_lo .. e_hi-1 of the flat array."""
    t_end = min(t + per_chunk, t1)
    e_lo = (t // nblk) * length + (t % nblk) * size
    last = t_end - 1
    e_hi = (last // nblk) * length + min((last % nblk + 1) * size, length)
    return t_end, e_lo, e_hi


@register_jitable
def _blocks_range(x, out, qout, sout, counts, t0, t1, mode, k, p, sp, bp, seed_lo, seed_hi,
                  stream, offset, want_q, want_counts, cm, ceb, chunk):
    """Blocks t0 .. t1-1 (row-major) of the 2-D ``x`` into out, qout, sout and counts."""
    stochastic = _constant(mode) >= STOCHASTIC
    rows, length = x.shape
    nblk = sout.shape[1]
    size = bp.block
    xf, outf = x.reshape(-1), out.reshape(-1)
    qf = qout.reshape(-1)
    sf = sout.reshape(-1)
    cf = counts.reshape(-1, counts.shape[2])
    xb = as_bits(xf)
    cmag = (np.int64(1) << 31) - 1 if cm == 23 else ~(np.int64(1) << 63)   # magnitude bits
    cinf = (2 * ceb + 1) << cm                           # and those of inf
    lanes = 4 if p.W == 32 else 2
    per_chunk = max(1, chunk // size)
    r = word_buffer(xb, per_chunk * size + 2 * lanes if stochastic else 1)
    t = t0
    while t < t1:
        t_end, e_lo, e_hi = _chunk(t, t1, per_chunk, nblk, length, size)
        rs = draw_words(mode, r, e_lo + offset, e_hi + offset, lanes, p.W, stream, seed_lo,
                        seed_hi)
        for tb in range(t, t_end):
            lo, hi = _block_bounds(tb, nblk, length, size)
            xs, outs, c = xf[lo:hi], outf[lo:hi], cf[tb]
            qs = qf[lo:hi] if want_q else qf
            rsb = rs[lo - e_lo:hi - e_lo] if stochastic else rs
            am = np.int64(0)                  # a word for float32 (lpsim.word32): 8 lanes
            xbs = xb[lo:hi]
            for i in range(xbs.size):
                am = max(am, word(xbs[i]) & cmag)
            if am >= cinf:
                if bp.nonfinite_nan:
                    _nonfinite_block(xs, outs, qs, want_q, c)
                    sf[tb] = np.nan
                    continue
                amax = _finite_amax(xs)
            else:
                amax = bits_value(as_int64(am), cm, ceb)
            s, clipped = block_scale(amax, bp, sp)
            recip = block_recip(s, bp)
            sf[tb] = s
            f0, f1, f2, f3, nonzero, slow = _block_elements(xs, outs, qs, rsb, want_q,
                                                            want_counts, s, recip, mode, k, p,
                                                            bp)
            c[0] = f0
            c[1] = f1
            c[2] = f2
            c[3] = f3
            c[6] = clipped
            if slow:
                nonzero += _block_slow(xs, outs, qs, rsb, want_q, s, recip, mode, k, p, bp, c)
            if want_q or want_counts:
                c[7] = np.int64(amax != 0 and nonzero == 0)
        t = t_end

@register_jitable
def _words_range(x, out, sout, bam, t0, t1, mode, k, p, p32, sp, bp, seed_lo, seed_hi,
                 stream, offset, chunk):
    """Blocks t0 .. t1-1 (row-major) of the 2-D float32 ``x`` into out and sout by
    :func:`_chunk_words`, a chunk of about ``chunk`` elements at a time for stochastic
    rounding (one draw of random words per chunk), the whole range at once otherwise."""
    stochastic = _constant(mode) >= STOCHASTIC
    length = x.shape[1]
    nblk = sout.shape[1]
    xf, outf, sf = x.reshape(-1), out.reshape(-1), sout.reshape(-1)
    per_chunk = max(1, chunk // bp.block) if stochastic else max(1, t1 - t0)
    r = np.empty(per_chunk * bp.block + 8 if stochastic else 1, np.uint32)
    rct, ri0, rsh = _reciprocals(bp, sp)
    steps = _scale_steps(bp, sp, rct, ri0, rsh, t1 - t0)
    ahead = scale_ahead_scratch()
    t = t0
    while t < t1:
        t_end, e_lo, e_hi = _chunk(t, t1, per_chunk, nblk, length, bp.block)
        rs = draw_words(mode, r, e_lo + offset, e_hi + offset, 4, 32, stream, seed_lo, seed_hi)
        _chunk_words(xf, outf, sf, bam, rs, t, t_end, e_lo, mode, k, p, p32, sp, bp, length,
                     nblk, rct, ri0, rsh, steps, ahead)
        t = t_end


@register_jitable
def _reciprocals(bp, sp):
    """(table, i0, shift): fp32(pts_inv / v) for every value v of a scale format with
    mantissa bits whose scales :func:`scale_words` rounds (``snear32``: float32 normals of
    at most m bits, so v's bits >> (23 - m) index them), entry i for the v whose index is
    i0 + i; one lookup per block where a division would stand in its dependency chain.
    An empty table (every lookup falls back to the division) for other scale formats or
    a table of more than 4096 entries."""
    shift = 23 - sp.m
    i0 = as_int64(float32_bits(np.float32(bp.smin))) >> shift
    size = (as_int64(float32_bits(np.float32(bp.smax))) >> shift) - i0 + 1
    if bp.pow2 or not bp.snear32 or size > 4096:
        return np.empty(0, np.float32), i0, shift
    table = np.empty(size, np.float32)
    for i in range(size):
        table[i] = np.float32(bp.pts_inv) / bits_float32(word((i0 + i) << shift))
    return table, i0, shift


#: blocks of a call (of a thread's range) from which the word kernel finds scales rounded
#: to nearest (``snear32``: NVFP4's UE4M3) in :func:`_scale_steps`' table instead of by two
#: divisions and a rounding per block: the table costs about 20 us, what 6000 blocks save
STEPS_FROM = 1 << 13


@register_jitable
def _scale_of(a, bp, sp):
    """:func:`scale_words`' scale (float32) of the largest magnitude bits ``a`` (int64)."""
    return np.float32(scale_words(word(a), bp, sp))


@register_jitable
def _next_step(a, s, bp, sp):
    """The least magnitude bits above ``a`` whose scale exceeds ``s`` (the scale of a), or -1
    if there is none below inf's bits: from a guess at the midpoint to the next value up,
    galloping to a bracket and halving it (the scale is non-decreasing in the bits)."""
    top = np.int64(255) << 23
    # the next value up if s is a normal of the scale format (else a value below it: the
    # search gallops on from there), and the bits a whose quotient meets the midpoint
    up = bits_float32(word(as_int64(float32_bits(s)) + (np.int64(1) << (23 - sp.m))))
    guess = (np.float64(s) + np.float64(up)) * 0.5 * bp.max_e * bp.pts
    g = as_int64(float32_bits(np.float32(min(guess, 3.0e38))))
    g = min(max(g, a + 1), top - 1)
    if _scale_of(g, bp, sp) > s:                        # bracket (lo, hi]: lo's scale is s
        hi, d = g, np.int64(1)
        lo = max(g - d, a)
        while lo > a and _scale_of(lo, bp, sp) > s:
            hi = lo
            d *= 2
            lo = max(hi - d, a)
    else:
        lo, d = g, np.int64(1)
        hi = min(g + d, top - 1)
        while _scale_of(hi, bp, sp) <= s:
            if hi == top - 1:                   # the largest finite bits: no step above a
                return np.int64(-1)
            lo = hi
            d *= 2
            hi = min(lo + d, top - 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _scale_of(mid, bp, sp) > s:
            hi = mid
        else:
            lo = mid
    return hi


@register_jitable
def _scale_steps(bp, sp, rct, ri0, rsh, blocks):
    """(base, thr, svals, rvals, kshift): :func:`scale_words`' scales rounded to nearest
    (``snear32``) as the step function of the largest magnitude bits ``a`` that they are,
    for a call of ``blocks`` blocks: with key = a >> kshift (a's exponent and its top m + 1
    mantissa bits, m the scale's), scale index i = base[key] + (a >= thr[key]), scale
    svals[i] and its reciprocal rvals[i] (as :func:`_chunk_words` takes them from ``rct``).
    Each step (the least a of a larger scale) is found by evaluating scale_words itself, so
    the table gives its scales exactly; a bucket of keys holding two steps, a call of fewer
    than STEPS_FROM blocks, or a scale without the table of its values ``rct`` (other kinds,
    or more than 4096 values) give empty tables (the divisions then run per block)."""
    kshift = np.int64(22 - sp.m)
    none = (np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32),
            np.empty(0, np.float32), kshift)
    if bp.pow2 or not bp.snear32 or rct.size == 0 or blocks < STEPS_FROM or sp.m > 8:
        return none
    cap = rct.size + 1                                  # at most one step per value
    steps = np.empty(cap, np.int64)
    svals = np.empty(cap, np.float32)
    s = _scale_of(np.int64(0), bp, sp)
    steps[0], svals[0], count = 0, s, 1
    a = np.int64(0)
    while True:
        a = _next_step(a, s, bp, sp)
        if a < 0:
            break
        if count == cap:
            return none
        s = _scale_of(a, bp, sp)
        steps[count], svals[count] = a, s
        count += 1
    nkeys = (np.int64(255) << 23) >> kshift
    base = np.empty(nkeys, np.int32)
    thr = np.empty(nkeys, np.int32)
    j = 0
    for key in range(nkeys):
        lo, hi = key << kshift, (key + 1) << kshift
        while j + 1 < count and steps[j + 1] <= lo:
            j += 1
        base[key] = j
        thr[key] = np.int32(255 << 23)                  # no step inside: never reached
        if j + 1 < count and steps[j + 1] < hi:
            if j + 2 < count and steps[j + 2] < hi:
                return none
            thr[key] = steps[j + 1]
    rvals = np.empty(count, np.float32)
    for i in range(count):
        v = svals[i]
        r = (as_int64(float32_bits(v)) >> rsh) - ri0
        rvals[i] = rct[r] if 0 <= r < rct.size else np.float32(bp.pts_inv) / v
    return base, thr, svals[:count], rvals, kshift


#: the word kernel's ``bam`` when no pass found the blocks' largest magnitudes
NO_AMAXES = np.empty(0, np.int32)


def _words_kernel(mode: int):
    """The float32 word kernel of rounding mode ``mode`` (no counters: lpsim.quantize without
    stats), named ``blocks_words_<mode>`` for numba's on-disk cache: a kernel of its own, so
    that a call that needs no counters compiles nothing else."""
    def kernel(x, out, sout, bam, t0, t1, k, p, p32, sp, bp, seed_lo, seed_hi, stream,
               offset, chunk):
        _words_range(x, out, sout, bam, t0, t1, mode, k, p, p32, sp, bp, seed_lo, seed_hi,
                     stream, offset, chunk)

    name = next(name for name, code in MODES.items() if code == mode)
    kernel.__name__ = kernel.__qualname__ = f"blocks_words_{name}"
    return kernel


def _blocks_kernel(mode: int):
    """The block kernel of rounding mode ``mode``, a constant of its body (the element loop's
    decision compiles to straight-line code), named ``blocks_<mode>``: numba's on-disk cache
    keys kernels by qualified name, so each mode has an entry of its own (as lpsim.cpu's)."""
    def kernel(x, out, qout, sout, counts, t0, t1, k, p, sp, bp, seed_lo, seed_hi, stream,
               offset, want_q, want_counts, cm, ceb, chunk):
        _blocks_range(x, out, qout, sout, counts, t0, t1, mode, k, p, sp, bp, seed_lo,
                      seed_hi, stream, offset, want_q, want_counts, cm, ceb, chunk)

    name = next(name for name, code in MODES.items() if code == mode)
    kernel.__name__ = kernel.__qualname__ = f"blocks_{name}"
    return kernel


#: the dispatcher of each mode, compiled on first use and cached on disk
KERNELS = {mode: njit(cache=True, nogil=True)(_blocks_kernel(mode)) for mode in MODES.values()}
WORD_KERNELS = {mode: njit(cache=True, nogil=True)(_words_kernel(mode))
                for mode in MODES.values()}


@functools.cache
def kernel_entry(mode: int, dtype: np.dtype):
    """The compiled entry point of ``mode``'s kernel for ``dtype`` arrays, without numba's
    dispatch (typing three NamedTuples costs more than quantizing a small array)."""
    from .request import plan
    dispatcher = KERNELS[mode]
    bfmt = PRESETS["mxfp4"]
    request = plan(bfmt.saturating_element, "nearest", dtype)
    x = np.zeros((1, 1), dtype)
    args = (x, x.copy(), np.zeros((1, 1)), np.zeros((1, 1)),
            np.zeros((1, 1, len(BLOCK_COUNTERS)), np.int64), 0, 1, 1,
            _element_params(bfmt.saturating_element, request.params.W),
            kernel_params(bfmt.scale, np.float64), block_params(bfmt), 0, 0, 0, 0, True, True,
            23, 127, CHUNK)
    return entry_point(dispatcher, args, f"the CPU block kernel {dispatcher.py_func.__name__} "
                       f"for {np.dtype(dtype)} arrays")


@functools.cache
def word_kernel_entry(mode: int):
    """The compiled entry point of ``mode``'s float32 word kernel (:func:`_words_kernel`)."""
    dispatcher = WORD_KERNELS[mode]
    bfmt = PRESETS["mxfp4"]
    x = np.zeros((1, 1), np.float32)
    args = (x, x.copy(), np.zeros((1, 1)), NO_AMAXES, 0, 1, 1,
            _element_params(bfmt.saturating_element, 32), element_params32(bfmt),
            kernel_params(bfmt.scale, np.float64), block_params(bfmt), 0, 0, 0, 0, CHUNK)
    return entry_point(dispatcher, args, f"the CPU block kernel {dispatcher.py_func.__name__} "
                       "for float32 arrays")


def takes_words(x2, bp, want_q, want_counts) -> bool:
    """Whether :func:`run_blocks` takes the float32 word kernel (which keeps no counters)."""
    return x2.dtype == np.float32 and bool(bp.f32) and not (want_q or want_counts)


def run_blocks(x2, out2, q2, s2, counts, request, p, p32, sp, bp, want_q,
               want_counts=True, bam=NO_AMAXES) -> None:
    """Quantize every block of the 2-D ``x2`` with the kernel of ``request.mode``.

    Fewer than SERIAL_BELOW elements run in the calling thread; larger arrays are
    split into one contiguous range of blocks per thread (at least PARALLEL_GRAIN elements
    each) on lpsim.cpu's thread pool, the calling thread taking the first.  Each block writes
    its own counters, so nothing is summed across threads.  Without counters, float32 arrays
    of a format that :func:`words_exact` admits take the word kernel (q2 and counts unused;
    ``bam``: the blocks' largest magnitudes where :func:`word_tensor_scale` found them).
    """
    seeds = (int(request.seed_lo), int(request.seed_hi), int(request.stream),
             int(request.offset))
    if takes_words(x2, bp, want_q, want_counts):
        kernel = word_kernel_entry(request.mode)
        head = (x2, out2, s2, bam)
        args = (int(request.k), p, p32, sp, bp, *seeds, int(CHUNK))
    else:
        kernel = kernel_entry(request.mode, x2.dtype)
        cm, ceb = (23, 127) if x2.dtype == np.float32 else (52, 1023)
        head = (x2, out2, q2, s2, counts)
        args = (int(request.k), p, sp, bp, *seeds, bool(want_q), bool(want_counts), cm, ceb,
                int(CHUNK))
    run_kernel(kernel, head, args, s2.size, x2.size)


def run_kernel(kernel, head, args, nblocks: int, n: int) -> None:
    """kernel(*head, t0, t1, *args) over blocks 0 .. nblocks-1 of n elements: in the calling
    thread below SERIAL_BELOW, else one contiguous range of blocks per thread."""
    workers = min(threads(), nblocks, n // PARALLEL_GRAIN) if n >= SERIAL_BELOW else 1
    if workers <= 1:
        kernel(*head, 0, nblocks, *args)
        return
    bounds = [nblocks * w // workers for w in range(workers + 1)]
    pool = thread_pool(workers - 1, os.getpid())
    futures = [pool.submit(kernel, *head, bounds[w], bounds[w + 1], *args)
               for w in range(1, workers)]
    kernel(*head, bounds[0], bounds[1], *args)
    for future in futures:
        future.result()


# --- host side ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def block_params(bfmt: BlockFormat, pts: float = 1.0) -> BlockParams:
    """The kernels' BlockParams for ``bfmt`` and a per-tensor scale ``pts`` (cached: a small
    call would otherwise spend much of its time here)."""
    el, sc = bfmt.saturating_element, bfmt.scale
    smin, smax = sc.min_subnormal, sc.max_finite
    return BlockParams(bfmt.block, RULES[bfmt.rule], int(bfmt.pow2), el.emax, el.m,
                       float(el.max_finite), int(np.log2(smin)) if bfmt.pow2 else 0,
                       sc.emax if bfmt.pow2 else 0, float(smin), float(smax),
                       int(bfmt.nonfinite == "nan"), float(pts),
                       float(np.float32(1.0 / np.float32(pts))), int(words_exact(bfmt)),
                       int(words_exact(bfmt) and nearest_words_exact(el)),
                       int(not bfmt.pow2 and bfmt.rule == "even" and nearest_words_exact(sc)))


@functools.lru_cache(maxsize=256)
def _element_params(element: Format, word_bits: int) -> Params:
    # the element rounds in a float64 register with the container's random words
    return kernel_params(element, np.float64)._replace(W=word_bits)


@functools.lru_cache(maxsize=256)
def element_params32(bfmt: BlockFormat) -> Params:
    """The element's float32-container Params (W = 32) for :func:`element_fast32`; those of
    e2m1fn (never read) where the format does not take that step."""
    return kernel_params(bfmt.saturating_element if words_exact(bfmt)
                         else PRESETS["mxfp4"].saturating_element, np.float32)


@register_jitable
def finite_bits(a, cmag, cinf):
    """The magnitude bits of container bits ``a`` if finite (below inf's bits ``cinf``), else
    0: what the per-tensor largest magnitude takes of each element, on the CPU and in
    lpsim_cuda."""
    a = a & cmag
    return a if a < cinf else a & 0


def container_bits(dtype) -> tuple:
    """(magnitude mask, inf's bits, M, EB) of a float32 or float64 container."""
    if np.dtype(dtype).itemsize == 8:
        return (1 << 63) - 1, 2047 << 52, 52, 1023
    return (1 << 31) - 1, 255 << 23, 23, 127


@njit(cache=True, nogil=True)
def finite_amax(x):
    """The largest finite magnitude of a flat float32/float64 array (0.0 if none): an integer
    max over the container bits below inf's, 32-bit words for float32 (one vectorised pass)."""
    xb = as_bits(x)
    wide = xb.itemsize == 8
    cmag = ~(np.int64(1) << 63) if wide else (np.int64(1) << 31) - 1
    cinf = (np.int64(2047) << 52) if wide else np.int64(255) << 23
    am = np.int64(0)
    for i in range(xb.size):            # a plain max first: one vector op per element
        am = max(am, word(xb[i]) & cmag)
    if am >= cinf:                      # an inf or NaN: the max below inf's bits
        am = am & 0
        for i in range(xb.size):
            am = max(am, finite_bits(word(xb[i]), cmag, cinf))
    return bits_value(as_int64(am), 52 if wide else 23, 1023 if wide else 127)


#: elements per thread of :func:`tensor_amax`'s pass: one integer max per element, about a
#: copy's cost, so a thread pays only on a range many times its start-up
AMAX_GRAIN = 1 << 20


@functools.cache
def _amax_entry(dtype: np.dtype):
    """:func:`finite_amax`'s compiled entry point for flat C-contiguous ``dtype`` arrays
    (numba's dispatch types the argument on every call: microseconds a small call)."""
    return entry_point(finite_amax, (np.zeros(1, dtype),), "lpsim.blocks' per-tensor amax")


def tensor_amax(flat: np.ndarray) -> float:
    """:func:`finite_amax` of a flat array, over lpsim's threads from 2 * AMAX_GRAIN elements
    (one contiguous range each, the calling thread taking the first): NVFP4's per-tensor
    pass reads the whole tensor once more before the blocks are rounded."""
    if not isinstance(flat, np.ndarray) or flat.dtype not in (np.float32, np.float64) \
            or flat.ndim != 1:
        raise TypeError(f"tensor_amax takes a flat float32/float64 numpy array, not "
                        f"{getattr(flat, 'dtype', type(flat).__name__)} of shape "
                        f"{getattr(flat, 'shape', None)}")
    amax = _amax_entry(flat.dtype) if flat.flags.c_contiguous else finite_amax
    return _threaded_max(flat.size, flat.size, lambda lo, hi: amax(flat[lo:hi]))


def _threaded_max(units: int, elements: int, run) -> float:
    """The largest float(run(lo, hi)) over contiguous ranges of ``units`` (blocks or
    elements; ``elements`` in all): one range per thread of lpsim's pool from 2 * AMAX_GRAIN
    elements, the calling thread taking the first."""
    workers = min(threads(), elements // AMAX_GRAIN)
    if workers <= 1:
        return float(run(0, units))
    bounds = [units * w // workers for w in range(workers + 1)]
    pool = thread_pool(workers - 1, os.getpid())
    futures = [pool.submit(run, bounds[w], bounds[w + 1]) for w in range(1, workers)]
    first = float(run(0, bounds[1]))
    return max([first] + [float(future.result()) for future in futures])


@register_jitable(forceinline=True)
def _amaxes_of(xb, bam, b0, b1, size, cinf):
    """:func:`block_amaxes` for blocks of ``size`` elements (a literal 16 or 32: loops LLVM
    unrolls into vector steps)."""
    top = word(np.int32(0))
    for b in range(b0, b1):
        lo = np.uint64(b * size)
        am = _block_amax32(xb, lo, size)
        bam[b] = as_int64(am)
        if am >= cinf:                          # a NaN or inf: the block's finite largest
            am = am & 0
            for i in range(size):
                am = max(am, finite_bits(word(xb[lo + np.uint64(i)]), 0x7FFFFFFF, cinf))
        top = max(top, am)
    return top


@njit(cache=True, nogil=True)
def block_amaxes(x, size, bam, b0, b1):
    """Blocks b0 .. b1-1 of the flat float32 ``x``, ``size`` elements each end to end: each
    block's largest magnitude bits into ``bam`` (int32; NaN's or inf's where the block holds
    one), and the largest finite magnitude of their elements returned (0.0 if none).  NVFP4's
    per-tensor pass, which reads every element anyway, finds the blocks' largest magnitudes
    at about the same cost, and the word kernel then reads one word per block instead."""
    xb = as_bits(x)
    cinf = word(np.int32(255 << 23))
    if size == 16:
        top = _amaxes_of(xb, bam, b0, b1, 16, cinf)
    elif size == 32:
        top = _amaxes_of(xb, bam, b0, b1, 32, cinf)
    else:
        top = _amaxes_of(xb, bam, b0, b1, size, cinf)
    return bits_value(as_int64(top), 23, 127)


@functools.cache
def _amaxes_entry():
    x, bam = np.zeros(1, np.float32), np.zeros(1, np.int32)
    return entry_point(block_amaxes, (x, 1, bam, 0, 1), "lpsim.blocks' per-block amax")


def tensor_amaxes(x2: np.ndarray, size: int) -> tuple:
    """(largest finite magnitude, int32 largest magnitude bits of each block) of the 2-D
    C-contiguous float32 ``x2`` whose rows are whole blocks of ``size`` elements: one pass,
    over lpsim's threads from 2 * AMAX_GRAIN elements (as :func:`tensor_amax`)."""
    if not isinstance(x2, np.ndarray) or x2.dtype != np.float32 or x2.ndim != 2 \
            or not x2.flags.c_contiguous:
        raise TypeError(f"tensor_amaxes takes a 2-D C-contiguous float32 numpy array, not "
                        f"{getattr(x2, 'dtype', type(x2).__name__)} of shape "
                        f"{getattr(x2, 'shape', None)}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1 \
            or x2.shape[1] % size:
        raise ValueError(f"size={size!r}: tensor_amaxes needs a positive integer that divides "
                         f"the row length {x2.shape[1]} (rows of whole blocks)")
    flat = x2.reshape(-1)
    size = int(size)
    nb = flat.size // size
    bam = np.empty(nb, np.int32)
    amaxes = _amaxes_entry()
    return _threaded_max(nb, flat.size, lambda lo, hi: amaxes(flat, size, bam, lo, hi)), bam


def word_tensor_scale(x2: np.ndarray, bfmt: BlockFormat) -> tuple:
    """(per-tensor scale, ``bam``) for the word kernel of the blocked 2-D float32 ``x2``:
    with rows of whole blocks, the blocks' largest magnitudes from the same pass
    (:func:`tensor_amaxes`); else :func:`tensor_scale_of` and NO_AMAXES."""
    if x2.size and x2.shape[1] % bfmt.block == 0:
        amax, bam = tensor_amaxes(x2, bfmt.block)
        return tensor_scale_from(amax, bfmt), bam
    return tensor_scale_of(x2, bfmt), NO_AMAXES


def tensor_scale_of(x, bfmt: BlockFormat) -> float:
    """NVFP4's per-tensor FP32 scale of the array x (:func:`tensor_scale_from`)."""
    return tensor_scale_from(tensor_amax(np.ascontiguousarray(x).reshape(-1)) if x.size
                             else 0.0, bfmt)


def _reciprocal_finite(pts, smin) -> bool:
    """Whether the kernels' reciprocal of the smallest block scale under the per-tensor
    scale ``pts`` is finite: fp32(fp32(1 / pts) / smin), as block_params and scale_recip
    form it (a zero element times an infinite reciprocal would be NaN)."""
    with np.errstate(over="ignore", divide="ignore"):
        return bool(np.isfinite(np.float32(np.float32(1.0 / np.float32(pts)) / smin)))


def min_tensor_scale(bfmt) -> float:
    """The least per-tensor scale of the block format ``bfmt`` (a float32): the least with
    :func:`_reciprocal_finite`, about 2**-119 for an E4M3 scale (smallest 2**-9)."""
    return _min_tensor_scale(parse_block_format(bfmt))


@functools.lru_cache(maxsize=256)
def _min_tensor_scale(bfmt: BlockFormat) -> float:
    smin = np.float32(bfmt.scale.min_subnormal)
    # from below the least: fp32(1 / pts) finite needs pts >= 1 / float32's largest too
    largest = float(np.finfo(np.float32).max)
    pts = np.float32(max(1.0 / (largest * float(smin)), 1.0 / largest) / 2)
    while not _reciprocal_finite(pts, smin):
        pts = np.nextafter(pts, np.float32(np.inf))
    while _reciprocal_finite(np.nextafter(pts, np.float32(0)), smin):
        pts = np.nextafter(pts, np.float32(0))
    return float(pts)


#: float32's largest value: the per-tensor amax saturates there (:func:`tensor_scale_from`)
FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


def tensor_scale_from(amax: float, bfmt: BlockFormat) -> float:
    """NVFP4's per-tensor FP32 scale of a tensor whose largest finite magnitude is ``amax``:
    fp32(amax32 / (scale max * element max)) with amax32 = fp32(amax) saturated at float32's
    largest value, at least :func:`min_tensor_scale` (NVFP4 scales a tensor below about
    4e-33 as if it reached that, rather than make its zeros NaN); 1 if amax is 0.

    float64 data beyond float32's range saturates as the elements do: the scale is that of
    a tensor reaching float32's largest value (an infinite scale would make every value NaN),
    so the blocks reaching further take the largest block scale and their largest elements
    the element format's largest value."""
    if amax == 0:
        return 1.0
    with np.errstate(over="ignore"):
        amax32 = min(np.float32(amax), FLOAT32_MAX)
    return max(float(np.float32(amax32 / bfmt.tensor_scale_divisor)),
               min_tensor_scale(bfmt))


def checked_tensor_scale(value, bfmt: BlockFormat) -> float:
    """A per-tensor scale given by the caller, as the kernels take it: rounded to float32
    (NVFP4's is an FP32, and both CPU kernels must see the same value), and refused unless
    it is then finite and at least :func:`min_tensor_scale`."""
    try:
        if isinstance(value, (str, bytes, bool, np.bool_)):
            raise TypeError
        pts = float(value)              # numbers, numpy scalars, 0-d tensors
    except (TypeError, ValueError):
        raise TypeError(f"tensor_scale={value!r} must be a number") from None
    with np.errstate(over="ignore"):
        pts32 = float(np.float32(pts))
    least = min_tensor_scale(bfmt)
    if not (np.isfinite(pts32) and pts32 >= least):
        raise ValueError(f"tensor_scale={value!r} must be a float32 from {least:.9g} to "
                         f"{float(np.finfo(np.float32).max):.9g}: the per-tensor scale is an "
                         "FP32, and the reciprocals of the block scales under it must be "
                         "finite")
    return pts32


class Blocked(NamedTuple):
    """The result of :func:`quantize_blocks`: fake-quantized values, element values, scales."""

    values: np.ndarray      # x's shape and dtype: q * s
    elements: np.ndarray    # float64 element values q, blocked layout (rows, length)
    scales: np.ndarray      # float64 scales (rows, blocks per row)
    tensor_scale: float     # per-tensor scale (1.0 without)
    counts: np.ndarray      # int64 (rows, blocks per row, len(BLOCK_COUNTERS)); None when
    #                         lpsim_cuda skipped them (want_counts=False)


def blocked_shape(shape: tuple) -> tuple[int, int]:
    """(rows, length) of the blocked layout of an array of ``shape`` with the block axis
    last (shared with lpsim_cuda): a 0-d array is one block of one, and rows are counted
    (reshape(-1, length) and size // length fail on length 0)."""
    if not shape:
        return 1, 1
    return int(np.prod(shape[:-1])), shape[-1]


def _blocked_view(x, axis):
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis} is out of range for an array of {x.ndim} dimensions")
    moved = x if axis in (-1, x.ndim - 1) else np.moveaxis(x, axis, -1)
    return np.ascontiguousarray(moved).reshape(blocked_shape(moved.shape)), moved.shape


def quantize_blocks(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None,
                    stream: int = 0, sr_bits=None, offset: int = 0, tensor_scale=None,
                    want_elements: bool = True, want_counts: bool = True,
                    out=None) -> Blocked:
    """Block-quantize a float32/float64 numpy array along ``axis`` (blocks of bfmt.block).

    A row whose length is not a multiple of the block size ends in a shorter block.
    tensor_scale: the per-tensor scale to use (default: computed from x when bfmt has one).
    want_counts=False (no stats wanted) skips the element counters; counts is then None, or
    incomplete where the kernel keeps them anyway.  out: where the values go, when it is a
    C-contiguous array of x's shape and dtype that does not overlap x and the blocks run
    along the last axis (else a new array, as without it).
    """
    from .request import plan
    bfmt = parse_block_format(bfmt)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"cannot block-quantize a {type(x).__name__}; accepted: a float32/"
                        "float64 numpy array (lpsim.quantize also takes torch tensors)")
    request = plan(bfmt.saturating_element, rounding, x.dtype, seed=seed, stream=stream,
                   sr_bits=sr_bits, offset=offset, size=x.size)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis={axis!r} must be an integer")
    x2, moved_shape = _blocked_view(np.asarray(x), int(axis) if x.ndim else -1) \
        if x.ndim else (x.reshape(1, 1), (1,))
    want_counts = want_counts or want_elements
    # the float32 word kernel writes no counters: no array for them
    counted = not takes_words(x2, block_params(bfmt), want_elements, want_counts)
    pts, bam = 1.0, NO_AMAXES
    if bfmt.tensor_scale and tensor_scale is not None:
        pts = checked_tensor_scale(tensor_scale, bfmt)
    elif bfmt.tensor_scale:
        pts, bam = (tensor_scale_of(x, bfmt), NO_AMAXES) if counted \
            else word_tensor_scale(x2, bfmt)
    bp = block_params(bfmt, pts)
    p = _element_params(bfmt.saturating_element, request.params.W)
    p32 = element_params32(bfmt)
    sp = kernel_params(bfmt.scale, np.float64)
    rows, length = x2.shape
    nblk = -(-length // bfmt.block) if length else 0
    out2 = out.reshape(x2.shape) if writes_into(out, x, axis) else np.empty_like(x2)
    q2 = np.empty(x2.shape if want_elements else (1, 1), np.float64)
    s2 = np.empty((rows, nblk), np.float64)
    counts = np.zeros((rows, nblk, len(BLOCK_COUNTERS)) if counted else (1, 1, 1), np.int64)
    if x2.size:
        run_blocks(x2, out2, q2, s2, counts, request, p, p32, sp, bp, want_elements,
                   want_counts, bam)
    if not want_counts:
        counts = None
    values = out2.reshape(moved_shape) if x.ndim else out2.reshape(())
    if x.ndim and axis not in (-1, x.ndim - 1):
        values = np.moveaxis(values, -1, axis)
    return Blocked(values, q2 if want_elements else None, s2, pts, counts)


def writes_into(out, x, axis) -> bool:
    """Whether :func:`quantize_blocks` writes x's values straight into ``out``: a writable
    C-contiguous array of x's shape and dtype, apart from x, with the blocks along the last
    axis (elsewhere it writes a new array, which the caller copies)."""
    return (isinstance(out, np.ndarray) and (x.ndim <= 1 or axis in (-1, x.ndim - 1))
            and out.dtype == x.dtype and out.shape == x.shape and out.flags.c_contiguous
            and out.flags.writeable and not np.may_share_memory(out, x))


def add_counts(stats, counts, elements) -> None:
    """Add a call's per-block counts to a RoundingStats (and the block fields of BlockStats)."""
    if stats is None:
        return
    totals = counts.reshape(-1, len(BLOCK_COUNTERS)).sum(axis=0)
    stats.add(elements, totals[:6])
    if isinstance(stats, BlockStats):
        stats.blocks += counts.shape[0] * counts.shape[1]
        stats.clipped_scales += int(totals[6])
        stats.flushed_blocks += int(totals[7])
        stats.nan_blocks += int(totals[8])


class _Words(NamedTuple):
    """What a float32 call without stats needs besides its arrays and keys (the word
    kernel's arguments), cached by :func:`_remember_words` after a first call validated
    the request."""

    bfmt: BlockFormat
    mode: int
    k: int
    p: Params
    p32: Params
    sp: Params
    bp: BlockParams         # with pts = 1 (formats with a tensor scale take theirs per call)
    kernel: object


#: (format as given, rounding, sr_bits, type(sr_bits)) -> _Words; cleared when full
_WORDS: dict = {}
MAX_CACHED = 256


def _remember_words(given, bfmt, rounding, sr_bits) -> None:
    from .request import plan
    request = plan(bfmt.saturating_element, rounding, np.float32, sr_bits=sr_bits)
    bp = block_params(bfmt, 1.0)
    if not bp.f32:
        return
    if len(_WORDS) >= MAX_CACHED:
        _WORDS.clear()
    try:
        _WORDS[given, rounding, sr_bits, type(sr_bits)] = _Words(
            bfmt, request.mode, int(request.k), _element_params(bfmt.saturating_element, 32),
            element_params32(bfmt), kernel_params(bfmt.scale, np.float64), bp,
            word_kernel_entry(request.mode))
    except TypeError:                   # an unhashable argument: no cached path
        pass


def quantize_cached(x, fmt, rounding, axis, seed, stream, sr_bits, out, offset):
    """:func:`quantize` of a float32 numpy array without stats by the word kernel, from the
    plan a first call of the same (format as given, rounding, sr_bits) left; None where the
    general path must run (no plan yet, other layouts, an ``out`` it cannot write straight
    into, keys or offsets that need checking).  A few microseconds: lpsim.quantize calls it
    before parsing the format."""
    try:
        words = _WORDS.get((fmt, rounding, sr_bits, type(sr_bits)))
    except TypeError:                   # an unhashable argument
        return None
    if words is None or x.dtype != np.float32 or x.ndim == 0 or x.size == 0 \
            or not x.flags.c_contiguous or type(axis) is not int or axis not in (-1, x.ndim - 1):
        return None
    if type(offset) is not int or offset < 0 or offset + x.size > MAX_COUNTER:
        return None
    if (seed is not None and type(seed) is not int) or type(stream) is not int:
        return None
    if out is not None and not writes_into(out, x, axis):
        return None
    seed_lo, seed_hi, stream = keys(seed, stream, words.mode)
    bfmt = words.bfmt
    length = x.shape[-1]
    x2 = x.reshape(-1, length)
    bp, bam = words.bp, NO_AMAXES
    if bfmt.tensor_scale:
        pts, bam = word_tensor_scale(x2, bfmt)
        bp = block_params(bfmt, pts)
    result = np.empty_like(x) if out is None else out
    s2 = np.empty((x2.shape[0], -(-length // bfmt.block)), np.float64)
    run_kernel(words.kernel, (x2, result.reshape(x2.shape), s2, bam),
               (words.k, words.p, words.p32, words.sp, bp, seed_lo, seed_hi, stream, offset,
                CHUNK), s2.size, x.size)
    return result


def quantize(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None,
             stream: int = 0, sr_bits=None, stats=None, out=None, offset: int = 0,
             tensor_scale=None):
    """Fake-quantize ``x`` to the block format: the container values q * s (``lpsim.quantize``
    with a block format lands here).  stats: a RoundingStats (element counters) or a
    :class:`BlockStats` (also block counters)."""
    if stats is None and tensor_scale is None and type(x) is np.ndarray:
        done = quantize_cached(x, bfmt, rounding, axis, seed, stream, sr_bits, out, offset)
        if done is not None:
            return done
    check_stats(stats, STATS_ACCEPTED)
    given, bfmt = bfmt, parse_block_format(bfmt)
    module = type(x).__module__
    if not isinstance(x, np.ndarray) and (hasattr(x, "__cuda_array_interface__")
                                          or "numba" in module and "cuda" in module):
        # the CPU backend: lpsim.quantize dispatches CUDA arrays to lpsim_cuda.blocks
        raise TypeError(f"lpsim.blocks.quantize rounds on the CPU, not a {type(x).__name__} "
                        "on a GPU; accepted there: lpsim.quantize(x, fmt, axis=...), or "
                        "lpsim_cuda.blocks.quantize(x, fmt, tensor_scale=...)")
    if module.startswith("torch") or type(out).__module__.startswith("torch"):
        # lpsim.quantize's torch rules (lpsim.tensors): dtypes, autograd, out=
        from .tensors import quantize_tensor

        def round_with(src, fmt, rounding, *, out=None, **kw):
            return quantize(src, fmt, rounding, axis=axis, tensor_scale=tensor_scale, out=out,
                            **kw)
        return quantize_tensor(x, bfmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                               stats=stats, out=out, offset=offset, round_with=round_with)
    from .request import as_container_array, check_out as _check_out
    if isinstance(x, (int, float, np.floating)) and not isinstance(x, (bool, np.bool_)):
        value = quantize(as_container_array(x).reshape(1), bfmt, rounding, seed=seed,
                         stream=stream, sr_bits=sr_bits, stats=stats, offset=offset,
                         tensor_scale=tensor_scale)[0]
        return value if isinstance(x, np.floating) else float(value)
    # any array-like, upcast exactly as lpsim.quantize does (float16, lists, integers)
    x = as_container_array(x)
    if out is not None:
        _check_out(out, x)                  # before anything is counted or written
    direct = writes_into(out, x, axis)
    result = quantize_blocks(x, bfmt, rounding, axis=axis, seed=seed, stream=stream,
                             sr_bits=sr_bits, offset=offset, tensor_scale=tensor_scale,
                             want_elements=False, want_counts=stats is not None,
                             out=out if direct else None)
    add_counts(stats, result.counts, x.size)
    if stats is None and x.dtype == np.float32:
        _remember_words(given, bfmt, rounding, sr_bits)
    if out is not None:
        if not direct:
            out[...] = result.values
        return out
    return result.values


class Encoded(NamedTuple):
    """Element codes and scale codes of a block-quantized array (ml_dtypes bit layouts).

    codes: uint8 (uint16 above 8 bits) element codes in the blocked layout (rows, length):
    ``codes.view(ml_dtypes.float4_e2m1fn)`` etc. where ml_dtypes has the dtype, and
    :func:`lpsim.storage.pack_nibbles` packs 4-bit codes two a byte.  scales: codes of the
    scale format (rows, blocks per row), e.g. ``float8_e8m0fnu``.  NaN blocks carry a NaN
    scale code.
    """

    codes: np.ndarray
    scales: np.ndarray
    tensor_scale: float
    format: BlockFormat
    shape: tuple        # x's shape with the block axis moved last
    axis: int


def _code_dtype(fmt: Format):
    return np.uint8 if fmt.bits <= 8 else np.uint16


def encode(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None, stream: int = 0,
           sr_bits=None, offset: int = 0, tensor_scale=None) -> Encoded:
    """Block-quantize ``x`` (as :func:`quantize`) and return the codes and scale codes.

    ``x``: what :func:`quantize` takes on the CPU (arrays of any float dtype, integer arrays
    exact in float64, Python numbers and lists of them, CPU torch tensors), converted
    exactly as it converts them."""
    from .request import as_container_array
    from .storage import encode_values
    bfmt = parse_block_format(bfmt)
    if type(x).__module__.startswith("torch"):
        x = _torch_host(x)
    x = as_container_array(x)
    r = quantize_blocks(x, bfmt, rounding, axis=axis, seed=seed, stream=stream,
                        sr_bits=sr_bits, offset=offset, tensor_scale=tensor_scale)
    codes = encode_values(r.elements, bfmt.element).astype(_code_dtype(bfmt.element))
    scales = encode_values(r.scales, bfmt.scale).astype(_code_dtype(bfmt.scale))
    shape = np.moveaxis(x, axis, -1).shape if x.ndim else ()
    return Encoded(codes, scales, r.tensor_scale, bfmt, shape, axis)


def _torch_host(t):
    """A torch tensor's values as a numpy array (float16 and bfloat16 exactly as float32)."""
    import torch
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach()
    if t.device.type != "cpu":
        raise TypeError(f"encode takes CPU data, not a tensor on {t.device}; use t.cpu()")
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t.numpy()


def decode(encoded: Encoded, dtype=np.float32) -> np.ndarray:
    """The values q * s (* tensor scale) of :func:`encode`'s codes, in x's layout."""
    from .storage import decode_codes
    bfmt = encoded.format
    q = decode_codes(encoded.codes, bfmt.element)
    s = np.repeat(decode_codes(encoded.scales, bfmt.scale), bfmt.block, axis=1)[:, :q.shape[1]]
    values = q * s * (encoded.tensor_scale if bfmt.tensor_scale else 1.0)
    values = np.where(np.isnan(s), np.nan, values).astype(dtype)
    if encoded.shape == ():                                 # a 0-d x: one block of one
        return values.reshape(())
    return np.moveaxis(values.reshape(encoded.shape), -1, encoded.axis)


__all__ = ["encode", "decode", "Encoded", "BlockFormat", "BlockStats", "block", "PRESETS",
           "as_block_format", "parse_block_format", "quantize", "quantize_blocks", "block_scale",
           "scaled_bits", "Blocked", "RULES"]
