"""Block formats as data: :class:`BlockFormat` (element format, block size, scale format,
scale rule, per-tensor scale, what a non-finite block becomes), :func:`block`, the presets
(MX, NVFP4) and :func:`parse_block_format`.

A BlockFormat is a frozen dataclass that checks itself when made: what the kernels cannot
round exactly (formats wider than float64, power-of-two scales beyond float64's normals,
elements below 2**ELEMENT_EXP_MIN) is refused here by name, before any kernel runs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace

import numpy as np

from ..formats import Format, parse_format

RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
NONFINITE = ("nan", "finite")
FLOOR, CEIL, EVEN, RCEIL = range(4)


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
                or not 1 <= self.block <= 2 ** 63 - 1:
            raise ValueError(f"block={self.block!r} is not accepted; accepted: an integer >= 1 "
                             "and <= 2**63 - 1 (the kernels index blocks in int64)")
        object.__setattr__(self, "block", int(self.block))
        if not isinstance(self.rule, str) or self.rule not in RULES:    # a list: unhashable
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

    def __hash__(self) -> int:
        # cached, as Format's: a block format keys the routes a torch call looks up twice a
        # call, where the generated hash of its six fields took ~1.2 us a lookup; ints only,
        # so a pickled format's hash holds in the process that loads it
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((hash(self.element), self.block, hash(self.scale), RULES[self.rule],
                      bool(self.tensor_scale), NONFINITE.index(self.nonfinite)))
            object.__setattr__(self, "_hash", h)
        return h

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
            if name in kwargs:                  # the last would win, as no call of block() can
                raise ValueError(f"block format {spec!r}: option {name!r} is given twice; "
                                 "accepted: each option once")
            value = value.strip("'\"")
            kwargs[name] = {"true": True, "false": False}.get(value, value)
        elif re.fullmatch(r"[a-z_]\w*=.*", part):      # an option block() does not take
            raise ValueError(f"block format {spec!r}: option {part.partition('=')[0]!r} is "
                             "unknown; accepted: tensor_scale=, nonfinite=")
        else:
            args.append(part.strip("'\""))
    if len(args) >= 2:
        if not re.fullmatch(r"[+-]?\d+", args[1]):
            raise ValueError(f"block format {spec!r}: block size {args[1]!r} is not an integer")
        args[1] = int(args[1])                  # a negative one: block() names its range
    return block(*args, **kwargs)


def parse_block_format(spec) -> BlockFormat:
    """A block format from a preset name ("mxfp4", "nvfp4") or ``repr`` syntax."""
    bfmt = as_block_format(spec)
    if bfmt is None:
        raise ValueError(f"unknown block format {spec!r}; accepted: a preset "
                         f"({', '.join(PRESETS)}) or 'block(element, size, scale, rule)'")
    return bfmt
