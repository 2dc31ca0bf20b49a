"""Floating-point formats fp(e, m, b): one immutable description, derived facts as properties.

A format is 1 sign bit, ``e`` exponent bits, ``m`` stored mantissa bits and an extra exponent
bias ``b`` (the bias is ``2**(e-1) - 1 + b``).  What the top exponent code means is the
*special-value policy*:

============  ==========================================  =============================
policy        top exponent code                           inf input / NaN input
============  ==========================================  =============================
``ieee``      inf (mantissa 0) and NaN                    kept / kept
``saturate``  ordinary finite numbers (no inf, no NaN)    +-max_finite / kept, counted
``fn``        finite, except all-ones mantissa = NaN      NaN (+-max if saturate) / kept
``fnuz``      finite; NaN is the code of -0 (0x80)        NaN (+-max if saturate) / kept
``fnu``       finite; unsigned, no zero, own NaN code     NaN (max if saturate) / kept
============  ==========================================  =============================

``fnuz`` (ml_dtypes' ``float8_e4m3fnuz``, ``float8_e5m2fnuz``) has one unsigned zero: zero
results are +0.  ``fnu`` (``float8_e8m0fnu``, the MX scale) holds positive values only: zero
and negative inputs become NaN, and a positive value below the smallest one rounds up to it
(counted as underflow).  ml_dtypes' ``e2m1fn``, ``e2m3fn``, ``e3m2fn`` ("finite") are the
``saturate`` policy: every code is a number.

``saturate=True`` makes finite overflow clamp to +-max_finite in every rounding mode (it is
implied by the ``saturate`` policy).  ``subnormals=False`` removes the subnormal numbers:
below the smallest normal the representable values are 0 and +-min_normal.

Strings: a preset or ml_dtypes name (``"bf16"``, ``"float4_e2m1fn"``), ``"eXmY"`` /
``"eXmYfn"`` / ``"eXmYfnuz"``, or ``fp(e, m[, b][, policy][, subnormals=..][, specials=..]
[, saturate=..])``.  ``repr`` prints the preset name where there is one (``bf16``), else the
``fp(...)`` spelling (:attr:`Format.spec`), so ``parse_format(repr(fmt)) == fmt``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

#: the signed policies (what lpsim.testing's strategies draw by default)
SPECIALS = ("ieee", "saturate", "fn")
#: every policy: the signed ones, unsigned-zero ``fnuz`` and unsigned ``fnu``
POLICIES = SPECIALS + ("fnuz", "fnu")

# (mantissa bits, exponent bias, min normal exponent, max exponent field) of each container.
CONTAINERS = {
    np.dtype(np.float32): (23, 127, -126, 255),
    np.dtype(np.float64): (52, 1023, -1022, 2047),
}


@dataclass(frozen=True)
class Format:
    """fp(e, m, b) with a special-value policy; build it with :func:`fp`."""

    e: int
    m: int
    b: int = 0
    subnormals: bool = True
    specials: str = "ieee"
    saturate: bool = False

    def __post_init__(self):
        for name in ("e", "m", "b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"fp(): {name}={value!r} must be an integer")
            object.__setattr__(self, name, int(value))
        if not 1 <= self.e <= 11:
            raise ValueError(
                f"fp(): e={self.e} exponent bits is out of range; accepted: 1 <= e <= 11 "
                "(values are held in float32/float64 containers)")
        if not 0 <= self.m <= 52:
            raise ValueError(
                f"fp(): m={self.m} mantissa bits is out of range; accepted: 0 <= m <= 52")
        if not isinstance(self.specials, str):
            raise TypeError(f"fp(): specials={self.specials!r} must be a string; accepted: "
                            f"{', '.join(POLICIES)}")
        if self.specials not in POLICIES:
            raise ValueError(
                f"fp(): specials={self.specials!r} is unknown; accepted: {', '.join(POLICIES)}")
        object.__setattr__(self, "specials", str(self.specials))    # np.str_: a plain str
        for name in ("subnormals", "saturate"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"fp(): {name}={value!r} must be True or False, not a "
                                f"{type(value).__name__}")
        object.__setattr__(self, "subnormals", bool(self.subnormals))
        object.__setattr__(self, "saturate", bool(self.saturate) or self.specials == "saturate")
        if self.top_finite_code < 1:
            raise ValueError(
                f"{self!r} has no normal numbers (with e={self.e} the only exponent code "
                f"below the specials is 0); use e >= 2 or specials='saturate'")
        lo, hi = bias_range(self.e, self.m, self.specials)
        if not lo <= self.b <= hi:
            accepted = f"{lo} <= b <= {hi}" if lo <= hi else "none (no b fits)"
            policy = "" if self.specials == "ieee" else f", specials={self.specials!r}"
            raise ValueError(
                f"fp(): b={self.b} is out of range for fp({self.e},{self.m}{policy}); accepted: "
                f"{accepted}: every value must be a float64 (largest exponent at most 1023, "
                f"finest spacing at least 2**-1074; values are held in float32/float64 "
                f"containers)")

    def __hash__(self) -> int:
        # cached: formats key lpsim's per-call caches (a generated dataclass hash costs more
        # than the rest of a small call's lookups); ints only, so it survives pickling
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.e, self.m, self.b, self.subnormals, POLICIES.index(self.specials),
                      self.saturate))
            object.__setattr__(self, "_hash", h)
        return h

    # --- the layout -------------------------------------------------------------------
    @property
    def bias(self) -> int:
        """Exponent bias, 2**(e-1) - 1 + b."""
        return 2 ** (self.e - 1) - 1 + self.b

    @property
    def bits(self) -> int:
        """Storage width: sign (unless ``fnu``) + e + m."""
        return int(self.signed) + self.e + self.m

    @property
    def top_finite_code(self) -> int:
        """Largest exponent code that holds finite numbers."""
        top = 2 ** self.e - 1
        if self.specials == "ieee" or (self.specials == "fn" and self.m == 0):
            return top - 1
        return top

    @property
    def max_mantissa(self) -> int:
        """Largest stored mantissa at the top finite exponent (fn reserves all-ones for NaN)."""
        full = 2 ** self.m - 1
        if self.specials == "fn" and self.top_finite_code == 2 ** self.e - 1:
            return full - 1
        return full

    # --- derived range ----------------------------------------------------------------
    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        return self.top_finite_code - self.bias

    @property
    def max_finite(self) -> float:
        return math.ldexp(2 ** self.m + self.max_mantissa, self.emax - self.m)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (min_normal when subnormals are off)."""
        return math.ldexp(1.0, self.emin - self.m) if self.subnormals else self.min_normal

    @property
    def unit_roundoff(self) -> float:
        """u = 2**-(m+1): the relative error bound of round-to-nearest."""
        return math.ldexp(1.0, -(self.m + 1))

    @property
    def epsilon(self) -> float:
        """Machine epsilon 2**-m: the gap between 1 and the next number."""
        return math.ldexp(1.0, -self.m)

    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials != "saturate"

    @property
    def signed(self) -> bool:
        """Whether the format has negative numbers (all but ``fnu``)."""
        return self.specials != "fnu"

    @property
    def has_negative_zero(self) -> bool:
        return self.specials in SPECIALS

    @property
    def preset_name(self) -> str | None:
        """The preset this format equals, if any ("bf16", "e4m3fn", ...)."""
        for name, fmt in PRESETS.items():
            if fmt == self:
                return name
        return None

    def within(self, other: "Format") -> bool:
        """Whether every value of this format is exact in the format ``other``: as many
        mantissa bits or fewer, a largest finite value and a finest spacing that ``other``
        reaches, a smallest value it holds where it has no subnormals, its signs and zero
        and its infinities (zeros compare equal: -0 may become +0; NaN stays NaN in every
        format)."""
        if (self.signed and not other.signed) or (self.has_inf and not other.has_inf):
            return False
        return (self.m <= other.m and self.max_finite <= other.max_finite
                and self.emin - self.m >= other.emin - other.m
                and (other.subnormals or self.min_subnormal >= other.min_normal))

    # --- containers -------------------------------------------------------------------
    def fits(self, dtype) -> tuple[bool, str]:
        """Whether every value of the format is exact in ``dtype``; the reason when not."""
        dtype = np.dtype(dtype)
        if dtype not in CONTAINERS:
            return False, f"containers are float32 and float64, not {dtype}"
        cm, _, cemin, _ = CONTAINERS[dtype]
        cemax = np.finfo(dtype).maxexp - 1
        if self.m > cm:
            return False, f"m={self.m} mantissa bits exceed the {dtype} container's {cm}"
        if self.emax > cemax:
            return False, (f"its largest exponent {self.emax} exceeds the {dtype} container's "
                           f"{cemax}")
        finest = self.emin - self.m   # the spacing near min_normal, subnormals or not
        if finest < cemin - cm:
            return False, (f"its finest spacing 2**{finest} is below the {dtype} container's "
                           f"smallest subnormal 2**{cemin - cm}")
        return True, ""

    def check_fits(self, dtype) -> None:
        ok, reason = self.fits(dtype)
        if not ok:
            raise ValueError(f"format {self!r} does not fit a {np.dtype(dtype)} container: "
                             f"{reason}; use a float64 container or a narrower format")

    @property
    def spec(self) -> str:
        """``fp(e,m,b[, options])``: the spelling that names every field (presets included)."""
        extra = []
        if not self.subnormals:
            extra.append("subnormals=False")
        if self.specials != "ieee":
            extra.append(f"specials={self.specials!r}")
        if self.saturate and self.specials != "saturate":
            extra.append("saturate=True")
        return f"fp({self.e},{self.m},{self.b}{''.join(', ' + x for x in extra)})"

    def __repr__(self) -> str:
        """The preset's name ("bf16", "e4m3fn") where one equals this format, else :attr:`spec`;
        :func:`parse_format` reads either back."""
        return self.preset_name or self.spec

    __str__ = __repr__


def bias_range(e: int, m: int, specials: str = "ieee") -> tuple[int, int]:
    """(lo, hi): the extra biases b for which fp(e, m, b) with policy ``specials`` holds only
    float64 values (largest exponent at most 1023, finest spacing 2**(emin - m) at least
    2**-1074, subnormals on or off); lo > hi where none does (fp(11, 52) with a policy whose
    top exponent code is finite)."""
    top = 2 ** e - 1
    if specials == "ieee" or (specials == "fn" and m == 0):
        top -= 1
    return top - 2 ** (e - 1) - 1022, 1076 - 2 ** (e - 1) - m


def fp(e: int, m: int, b: int = 0, *, subnormals: bool = True, specials: str = "ieee",
       saturate: bool = False) -> Format:
    """The format with ``e`` exponent bits, ``m`` mantissa bits and extra bias ``b``."""
    return Format(e, m, b, subnormals, specials, saturate)


PRESETS: dict[str, Format] = {
    "fp64": fp(11, 52),
    "fp32": fp(8, 23),
    "tf32": fp(8, 10),
    "fp16": fp(5, 10),
    "bf16": fp(8, 7),
    "e5m2": fp(5, 2),
    "e4m3": fp(4, 3),
    "e4m3fn": fp(4, 3, specials="fn"),
    # ml_dtypes' small formats, with its semantics (checked code point by code point)
    "e4m3fnuz": fp(4, 3, 1, specials="fnuz"),
    "e5m2fnuz": fp(5, 2, 1, specials="fnuz"),
    "e3m2fn": fp(3, 2, specials="saturate"),
    "e2m3fn": fp(2, 3, specials="saturate"),
    "e2m1fn": fp(2, 1, specials="saturate"),
    "e8m0fnu": fp(8, 0, 1, specials="fnu"),     # 2**-127 .. 2**127 (codes 0x00..0xFE)
    "fp(6,9,0)": fp(6, 9),
    "fp(4,3,4)": fp(4, 3, 4),
    "fp(5,2,0)": fp(5, 2),
}

ALIASES = {
    "float64": "fp64", "double": "fp64", "float32": "fp32", "single": "fp32",
    "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
    "float8_e5m2": "e5m2", "fp8_e5m2": "e5m2", "float8_e4m3": "e4m3", "fp8_e4m3": "e4m3",
    "float8_e4m3fn": "e4m3fn", "fp8_e4m3fn": "e4m3fn",
    "float8_e4m3fnuz": "e4m3fnuz", "float8_e5m2fnuz": "e5m2fnuz",
    "float6_e3m2fn": "e3m2fn", "float6_e2m3fn": "e2m3fn", "float4_e2m1fn": "e2m1fn",
    "fp6_e3m2": "e3m2fn", "fp6_e2m3": "e2m3fn", "fp4_e2m1": "e2m1fn", "fp4": "e2m1fn",
    "float8_e8m0fnu": "e8m0fnu", "e8m0": "e8m0fnu", "ue8m0": "e8m0fnu",
    "float8_e3m4": "fp(3,4,0)", "float8_e4m3b11fnuz": "fp(4,3,4,fnuz)",
    # block scales are positive: NVFP4's UE4M3 takes e4m3fn's values (sign bit clear), and
    # UE5M3 those of an fn-style fp(5,3)
    "ue4m3": "e4m3fn", "ue5m3": "fp(5,3,0,fn)",
}

_FP_CALL = re.compile(r"fp\((.*)\)")
_EM_PATTERN = re.compile(r"e(\d+)m(\d+)(fnuz|fn)?")
_INT = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?(inf|nan)")
_BOOLS = {"true": True, "false": False, "1": True, "0": False}


def _policy_given(positional) -> bool:
    """Whether the positional parts end in a policy name (fp(e, m, b, policy))."""
    return bool(positional) and not _INT.fullmatch(positional[-1])


def _parse_call(spec: str, body: str) -> Format:
    """fp(e, m[, b][, policy][, key=value ...]) -> Format; errors name the bad part."""
    positional, keywords = [], {}
    for part in [p for p in body.split(",")] if body else []:
        if not part:
            raise ValueError(f"format {spec!r} has an empty argument (a trailing or doubled "
                             "comma); accepted: fp(e, m[, b][, policy][, option=value])")
        if "=" in part:
            name, _, value = part.partition("=")
            value = value.strip("'\"")
            if name in keywords or (name == "specials" and _policy_given(positional)):
                raise ValueError(f"format {spec!r} names {name}= twice")
            if name in ("subnormals", "saturate"):
                if value not in _BOOLS:
                    raise ValueError(f"format {spec!r}: {name}={value} must be True or False")
                keywords[name] = _BOOLS[value]
            elif name == "specials":
                keywords[name] = value
            else:
                raise ValueError(f"format {spec!r}: unknown option {name!r}; accepted: "
                                 "subnormals=, specials=, saturate=")
        elif keywords:
            raise ValueError(f"format {spec!r}: positional {part!r} after an option")
        else:
            positional.append(part)
    if positional and not _INT.fullmatch(positional[-1]):
        if "specials" in keywords:
            raise ValueError(f"format {spec!r} names the policy twice")
        if positional[-1] in _BOOLS or _NUMBER.fullmatch(positional[-1]):
            raise ValueError(f"format {spec!r}: {positional[-1]!r} is not an integer; "
                             "accepted: fp(e, m[, b][, policy]) with integers e, m, b and a "
                             f"policy in {', '.join(POLICIES)}")
        keywords["specials"] = positional.pop()
    if keywords.get("specials") == "saturate" and keywords.get("saturate") is False:
        raise ValueError(f"format {spec!r} contradicts itself: the 'saturate' policy always "
                         "saturates; drop saturate=False or choose another policy")
    if not 2 <= len(positional) <= 3 or not all(_INT.fullmatch(p) for p in positional):
        raise ValueError(f"format {spec!r} is not understood; accepted: fp(e, m[, b][, "
                         f"policy][, option=value]) with integers e, m, b")
    for name, p in zip("emb", positional):
        if len(p.lstrip("+-")) > 100:   # past any range (and Python's 4300-digit limit)
            raise ValueError(f"format {spec[:60]!r}...: {name} has {len(p.lstrip('+-'))} "
                             f"digits; accepted: fp(e, m[, b]) with e, m and b in range "
                             "(see lpsim.fp)")
    return fp(*(int(p) for p in positional), **keywords)


def parse_format(spec) -> Format:
    """A format from a preset or ml_dtypes name ("bf16", "float4_e2m1fn"), "e4m3fn" or the
    ``fp(...)`` syntax that ``repr`` prints ("fp(4,3,4)", "fp(4,3,0, specials='fn')")."""
    if isinstance(spec, Format):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a format is an lpsim.Format or a string, not {type(spec).__name__} "
                        f"({spec!r})")
    key = spec.strip().lower().replace(" ", "")
    key = ALIASES.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    match = _FP_CALL.fullmatch(key)
    if match:
        return _parse_call(spec, match.group(1))
    match = _EM_PATTERN.fullmatch(key)
    if match:
        e, m, suffix = match.groups()
        if suffix == "fnuz":
            return fp(int(e), int(m), 1, specials="fnuz")
        return fp(int(e), int(m), specials="fn" if suffix else "ieee")
    raise ValueError(
        f"unknown format {spec!r}; accepted: a preset ({', '.join(PRESETS)}), an alias "
        f"({', '.join(ALIASES)}), 'fp(e,m)', 'fp(e,m,b)', 'fp(e,m,b,policy)' with a policy in "
        f"{', '.join(POLICIES)}, options 'fp(e,m,b, subnormals=False, saturate=True)', or "
        "'eXmY' / 'eXmYfn' / 'eXmYfnuz'")
