"""The nine precision slots of one CA-SGD outer iteration and recipes A-I (Sec. 3.3, Table 3).

A :class:`Slot` is a format with a rounding mode; the GEMM/GEMV slots (``u_G``, ``u_r``,
``u_g``) also name an accumulator and an output format.  Every other slot, the correction
``u_c`` included, is a unit roundoff: every operation of that step rounds to its format
(Table 3 caption).  Slots round through :func:`lpsim.quantize`, :func:`lpsim.ops.matmul` and
lpsim.ops' exactly rounded add and fma, so any fp(e, m, b) that fits float32 works in every slot
and rounding mode, not only hardware ones.  Wider formats round to nearest, and in the kernel
rows and u_c only fp64 itself (an fp64 accumulator) is simulated; :func:`as_slot` refuses the
rest by row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..formats import Format, parse_format
from ..ops import matmul
from ..quantize import quantize
from ..rounding import STOCHASTIC_MODES, mode_code



FP32, FP64 = parse_format("fp32"), parse_format("fp64")
SLOTS = ("u_A", "u_G", "u_r", "u_c", "u_sigma", "u_g", "u_AR_r", "u_AR_G", "u_x")
#: rows whose Table 3 symbols name an input format and an accumulator (GEMM/GEMV kernels)
KERNEL_SLOTS = ("u_G", "u_r", "u_g")


def container(fmt: Format) -> np.dtype:
    """The numpy dtype that holds a format: float32 when it fits, else float64."""
    return np.dtype(np.float32) if fmt.fits(np.float32)[0] else np.dtype(np.float64)


def _native(fmt: Format, dtype) -> bool:
    return (fmt == FP32 and dtype == np.float32) or (fmt == FP64 and dtype == np.float64)


def _narrow(fmt: Format) -> bool:
    return fmt.fits(np.float32)[0]


@dataclass(frozen=True)
class Slot:
    """A precision slot: storage/input format ``fmt`` and rounding; kernels add ``acc``/``out``.

    acc: accumulator format of a GEMM/GEMV (default: ``fmt``); out: format of its result
    (default: ``acc``).  ``Slot("bf16", acc="fp32")`` is BF16-input/FP32-accumulate (Eq. (8)).
    ``rounding`` applies to the output and, when ``acc`` is ``fmt``, to every accumulation
    step; input casts round to nearest.
    """

    fmt: Format
    rounding: str = "nearest"
    acc: Format | None = None
    out: Format | None = None

    def __post_init__(self):
        object.__setattr__(self, "fmt", parse_format(self.fmt))
        mode_code(self.rounding)
        for name in ("acc", "out"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_format(value))
        for name in ("fmt", "acc", "out"):
            fmt = getattr(self, name)
            if fmt is not None and not fmt.signed:
                raise ValueError(f"{name}={fmt!r} holds no negative values and no zero (an "
                                 "unsigned format: weights, margins and gradients would be "
                                 "NaN); accepted: a signed format")

    @property
    def acc_fmt(self) -> Format:
        return self.acc or self.fmt

    @property
    def out_fmt(self) -> Format:
        return self.out or self.acc_fmt

    @property
    def u(self) -> float:
        """Unit roundoff of the storage/input format."""
        return self.fmt.unit_roundoff

    @property
    def dtype(self) -> np.dtype:
        """Container of the slot's stored values."""
        return container(self.out_fmt)

    def __repr__(self):
        """``Slot('bf16', acc='fp32')``: evaluable, formats by preset name where they have one."""
        parts = [repr(str(self.fmt))]
        if self.acc is not None and self.acc != self.fmt:
            parts.append(f"acc={str(self.acc)!r}")
        if self.out is not None and self.out != self.acc_fmt:
            parts.append(f"out={str(self.out)!r}")
        if self.rounding != "nearest":
            parts.append(f"rounding={self.rounding!r}")
        return "Slot(" + ", ".join(parts) + ")"


def as_slot(spec, row: str = "u_A") -> Slot:
    """The slot of Table 3 row ``row`` from a Slot, a format or a Table 3 symbol.

    Only the kernel rows u_G, u_r, u_g read a symbol as input format + accumulator (+ output);
    in every other row it is a unit roundoff, and a Slot there may not name acc/out.  A bad
    value is refused with a ValueError naming the row.
    """
    if isinstance(spec, str) and spec in SYMBOLS:
        fmt, acc, margin_out = SYMBOLS[spec]
        if row not in KERNEL_SLOTS:
            return Slot(fmt)
        return Slot(fmt, acc=acc, out=margin_out if row == "u_r" else acc)
    if not isinstance(spec, (Slot, Format, str)):
        raise ValueError(f"{row}={spec!r} is not a slot; accepted: {_ACCEPTED}")
    try:
        slot = spec if isinstance(spec, Slot) else Slot(parse_format(spec))
    except ValueError as error:
        if not str(error).startswith("unknown format"):
            raise ValueError(f"{row}={spec!r}: {error}") from None
        raise ValueError(f"{row}={spec!r}: unknown format; accepted: {_ACCEPTED}") from None
    if row not in KERNEL_SLOTS and not slot.fmt == slot.acc_fmt == slot.out_fmt:
        raise ValueError(f"{row}={slot!r}: {row} is a unit roundoff (Table 3 caption: only "
                         f"{', '.join(KERNEL_SLOTS)} are kernel accumulations); accepted: a "
                         "Slot without acc/out, a format name or a Table 3 symbol")
    _check_simulated(row, slot)
    return slot


def _check_simulated(row: str, slot: Slot):
    """Refuse, by row, a slot the simulator cannot round exactly: wider than fp32, a slot
    rounds to nearest, and in the kernel rows and u_c (GEMM/GEMV) it is fp64 itself."""
    wide = list(dict.fromkeys(f for f in (slot.fmt, slot.acc_fmt, slot.out_fmt)
                              if not _narrow(f)))
    if not wide:
        return
    if slot.rounding != "nearest":
        raise ValueError(f"{row}={slot!r}: rounding={slot.rounding!r} is simulated for formats "
                         "that fit float32 only; accepted: rounding='nearest' for wider ones")
    kernel = row in KERNEL_SLOTS + ("u_c",)
    if kernel and (wide != [FP64] or slot.acc_fmt != FP64):
        raise ValueError(f"{row}={slot!r}: the products of {row} are simulated for inputs that "
                         "fit float32 (m <= 23, an exponent range within fp32's) or fp64 "
                         "inputs with an fp64 accumulator; accepted: one of those, e.g. 'bf16', "
                         "'fp32' or 'd' (fp64)")


# Table 3 symbols: (input format, accumulator, margin output) of the kernel rows.  The margin
# r is stored in its 16-bit input format (Table 1: "BF16 in; FP32 accum; BF16 out"); the Gram
# and gradient kernels write their accumulator format ("FP32 accum/out").
SYMBOLS = {
    "f": ("fp32", "fp32", "fp32"),
    "t": ("tf32", "fp32", "fp32"),     # TF32 tensor cores (FP32 in/out)
    "h": ("fp16", "fp32", "fp16"),     # FP16 input, FP32 accumulation
    "b": ("bf16", "fp32", "bf16"),     # BF16 input, FP32 accumulation
    "ha": ("fp16", "fp16", "fp16"),    # FP16 input/output, FP16 accumulation (HMMA)
    "d": ("fp64", "fp64", "fp64"),     # the exact reference of the tests
}


@dataclass(frozen=True)
class Recipe:
    """The nine slots of Table 3; strings are Table 3 symbols or format names."""

    u_A: Slot
    u_G: Slot
    u_r: Slot
    u_c: Slot
    u_sigma: Slot
    u_g: Slot
    u_AR_r: Slot
    u_AR_G: Slot
    u_x: Slot
    name: str = "custom"

    def __post_init__(self):
        for name in SLOTS:
            object.__setattr__(self, name, as_slot(getattr(self, name), name))

    def replace(self, **slots) -> "Recipe":
        """A copy with some slots changed, e.g. ``RECIPES["C"].replace(u_AR_r="f")``."""
        unknown = set(slots) - set(SLOTS) - {"name"}
        if unknown:
            raise ValueError(f"unknown slot(s) {sorted(unknown)}; accepted: {', '.join(SLOTS)}")
        slots.setdefault("name", self.name + "*")
        return dataclasses.replace(self, **slots)

    @classmethod
    def uniform(cls, fmt, name: str | None = None) -> "Recipe":
        """Every slot in one format with that format's own accumulation (Corollary 5.8)."""
        slot = Slot(parse_format(fmt))
        return cls(*(slot,) * 9, name=name or f"uniform {slot.fmt}")

    def slots(self) -> dict[str, Slot]:
        return {name: getattr(self, name) for name in SLOTS}

    def __repr__(self):
        """``RECIPES['C']`` for a preset, ``RECIPES['C'].replace(u_x=Slot('fp16'))`` for one
        that differs from its closest preset in at most three slots, else every slot; each
        form evaluates back to an equal Recipe (with ``RECIPES`` and ``Slot`` in scope)."""
        mine = self.slots()
        differ = {key: [row for row in SLOTS if mine[row] != getattr(preset, row)]
                  for key, preset in RECIPES.items()}
        key = min(differ, key=lambda k: len(differ[k]), default=None)
        if key is None or len(differ[key]) > 3:
            return ("Recipe(" + ", ".join(f"{row}={slot!r}" for row, slot in mine.items())
                    + f", name={self.name!r})")
        changes = [f"{row}={mine[row]!r}" for row in differ[key]]
        if self.name != (key + "*" if changes else key):
            changes.append(f"name={self.name!r}")
        return f"RECIPES[{key!r}]" + (f".replace({', '.join(changes)})" if changes else "")


_TABLE3 = {  # columns of Table 3, rows in SLOTS order
    "A": "f f f f f f f f f", "B": "b f f f f f f f f", "C": "b b b f f b b f f",
    "D": "b b b f f b b b f", "E": "h h h f f h h f f", "F": "h ha ha f f ha h f f",
    "G": "f t t t f t f f f", "H": "h ha ha h h ha h h h", "I": "b b b b b b b b b",
}
_ACCEPTED = ("a Slot, a Table 3 symbol (f, t, h, b, ha, d) or a format name such as 'bf16' "
             "or 'fp(5,10)' (lpsim.formats)")
RECIPES: dict[str, Recipe] = {
    key: Recipe(*column.split(), name=key) for key, column in _TABLE3.items()}
RECIPES["fp64"] = Recipe.uniform("fp64", name="fp64")


def as_recipe(spec) -> Recipe:
    """A recipe from a :class:`Recipe`, a key of RECIPES ("A".."I", "fp64") or a format."""
    if isinstance(spec, Recipe):
        return spec
    if isinstance(spec, str) and spec in RECIPES:
        return RECIPES[spec]
    try:
        fmt = parse_format(spec)
    except (ValueError, TypeError):
        raise ValueError(f"unknown recipe {spec!r}; accepted: a Recipe, one of "
                         f"{', '.join(RECIPES)}, or a format name for a uniform recipe") from None
    try:
        return Recipe.uniform(fmt)
    except ValueError as error:         # a format, but not one a recipe can hold
        raise ValueError(f"recipe={spec!r}: {error}") from None


class Rounder:
    """Rounds arrays to slot formats; stochastic slots draw from (seed, a running stream)."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.stream = 0

    def next_stream(self) -> int:
        """A stream number not used before by this rounder: fresh random bits per call."""
        self.stream += 1
        return self.stream

    def __call__(self, x, fmt: Format, rounding: str = "nearest", dtype=None) -> np.ndarray:
        """``x`` rounded to ``fmt``, returned in ``dtype`` (default: the format's container)."""
        x = np.asarray(x)
        dtype = np.dtype(dtype or container(fmt))
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(dtype)
        if rounding in STOCHASTIC_MODES:
            if not fmt.fits(x.dtype)[0]:
                x = x.astype(np.float64)
            y = quantize(x, fmt, rounding, seed=self.seed, stream=self.next_stream())
        elif _native(fmt, x.dtype):
            y = x    # already representable: rounding is the identity
        else:
            if not fmt.fits(x.dtype)[0]:
                x = x.astype(np.float64)
            y = quantize(x, fmt, rounding)
        return y.astype(dtype, copy=False)

    def slot(self, x, slot: Slot, dtype=None) -> np.ndarray:
        """``x`` rounded to the slot's stored (output) format."""
        return self(x, slot.out_fmt, slot.rounding, dtype)

    def exact(self, op, operands, slot: Slot, dtype=None) -> np.ndarray:
        """``op(*operands)`` (:func:`lpsim.ops.add`, ``mul`` or ``fma``): the exact result
        rounded once to the slot's format in its mode, never a float32/float64 result
        rounded again."""
        key = {}
        if slot.rounding in STOCHASTIC_MODES:
            key = {"seed": self.seed, "stream": self.next_stream()}
        y = op(*operands, slot.out_fmt, slot.rounding, **key)
        return np.asarray(y).astype(dtype or slot.dtype, copy=False)


def _slot_matmul(A, B, slot: Slot, rnd: Rounder) -> np.ndarray:
    """GEMM/GEMV at a slot: fl_out(fl_in(A) @ fl_in(B)) accumulated at ``slot.acc``.

    Through :func:`lpsim.ops.matmul`: BLAS for fp32/fp64 accumulators, per-step rounding for
    narrower ones (FP16 "ha", and u_c at its unit roundoff); error factor Eq. (8) or Eq. (1).
    A stochastic slot draws a new stream of ``rnd`` per call.
    """
    acc_rounding = slot.rounding if slot.acc_fmt == slot.fmt else "nearest"
    stream = rnd.next_stream() if slot.rounding in STOCHASTIC_MODES else 0
    if not _narrow(slot.fmt):       # fp64 inputs: float64 operands (BLAS, fp64 accumulator)
        A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
    return matmul(np.ascontiguousarray(A), np.ascontiguousarray(B), in_fmt=slot.fmt,
                  acc_fmt=slot.acc_fmt, out_fmt=slot.out_fmt, acc_rounding=acc_rounding,
                  out_rounding=slot.rounding, seed=rnd.seed, stream=stream)
