"""The lpsim command: format presets, and values rounded in many formats and modes.

Every rounded value is shown exactly: the shortest decimal that reads back to it (Python's
repr), its hex float, and its code in the format as sign|exponent|mantissa (ml_dtypes' bit
pattern; unsigned formats have no sign field).
"""

from __future__ import annotations

import argparse
import decimal
import itertools
import math
import re
import sys
import time
from fractions import Fraction

import numpy as np

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .formats import PRESETS, Format, parse_format
from .quantize import quantize
from .rounding import MODES, STOCHASTIC_MODES
from .storage import encode_values

DEFAULT_FORMATS = ["bf16", "fp16", "e5m2", "e4m3fn", "fp(4,3,4)"]

EPILOG = """\
examples:
  lpsim formats                       the presets and their ranges
  lpsim formats bf16 'fp(4,3,4)'      only these formats
  lpsim round 0.1                     0.1 in five formats, every rounding mode
  lpsim round 0x1.8p-3 -1e-30 -f bf16 -r nearest -r stochastic --seed 7
  lpsim warmup                        compile the kernels now (cached on disk)
"""


# --- values ---------------------------------------------------------------------------------
class Number(Fraction):
    """A value as typed, exactly (a decimal such as 0.1 or 1e-400 is not a float64), and the
    text it was read from."""

    def __new__(cls, numerator=0, denominator=None, *, text: str | None = None):
        # Fraction's own methods (from_float, in comparisons) call cls(n, d)
        self = super().__new__(cls, numerator, denominator)
        self.text = text
        return self

    def __repr__(self) -> str:
        return self.text if self.text is not None else super().__repr__()


#: |values| beyond 2**HUGE or below 2**-TINY round as any other such value of their sign
#: in every format that fits float64 (overflow; below half of float64's smallest subnormal,
#: with a stochastic fraction under the 2**-62 of a random word): stand-ins keep huge
#: exponents such as 1e-999999999 from making huge integers
HUGE, TINY = 2000, 1400
_HEX = re.compile(r"([+-]?)0x([0-9a-f]*)(?:\.([0-9a-f]*))?(?:p([+-]?[0-9]+))?", re.IGNORECASE)
#: a finite decimal: its exponent may be past what the decimal module takes (10**18)
_DECIMAL = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:e([+-]?[0-9]+))?", re.IGNORECASE)


def _bounded(sign: int, mantissa: int, exp2: int | None, exp10: int | None) -> Fraction:
    """sign * mantissa * 2**exp2 (or * 10**exp10), or its stand-in beyond HUGE / TINY."""
    bits = mantissa.bit_length()       # 2**(bits-1) <= mantissa < 2**bits
    if exp10 is not None:               # 3.32 < log2(10) < 3.33
        low = bits - 1 + exp10 * (3.32 if exp10 > 0 else 3.33)
        top = bits + exp10 * (3.33 if exp10 > 0 else 3.32)
    else:
        low, top = bits - 1 + exp2, bits + exp2
    if low > HUGE:
        return Fraction(sign * 2 ** HUGE)
    if top < -TINY:
        return Fraction(sign, 2 ** TINY)
    power = Fraction(10) ** exp10 if exp10 is not None else Fraction(2) ** exp2
    return sign * mantissa * power


def parse_value(text: str) -> Fraction | float:
    """A value from a decimal ("0.1", "-1e-400", "inf", "nan") or a hex float ("0x1.8p-3"),
    exactly: a :class:`Number` (a Fraction), or a float for zeros (their sign), inf and
    NaN.  A decimal is rounded as written, not its float64 rounding."""
    s = text.strip()
    bad = argparse.ArgumentTypeError(
        f"{s!r} is not a number; accepted: a decimal (0.1, -1e-30, inf, nan) or a hex float "
        "(0x1.8p-3)")
    match = _HEX.fullmatch(s)
    if match:
        sign, whole, frac, exp = match.groups()
        frac = frac or ""
        if not whole + frac:
            raise bad
        value = _bounded(-1 if sign == "-" else 1, int(whole + frac, 16),
                         int(exp or 0) - 4 * len(frac), None)
        zero = -0.0 if sign == "-" else 0.0
    elif (match := _DECIMAL.fullmatch(s)) and (match.group(2) or match.group(3)):
        sign, whole, frac, exp = match.groups()
        frac = frac or ""
        digits = [int(d) for d in whole + frac]
        value = _bounded(-1 if sign == "-" else 1, _digits_int(digits), None,
                         int(exp or 0) - len(frac))
        zero = -0.0 if sign == "-" else 0.0
    else:
        try:
            number = decimal.Decimal(s)
        except decimal.InvalidOperation:
            raise bad from None
        if not number.is_finite():
            try:
                return float(s)
            except ValueError:                  # sNaN
                raise bad from None
        sign, digits, exp = number.as_tuple()   # what the pattern does not take: 1_000
        value = _bounded(-1 if sign else 1, _digits_int(digits), None, exp)
        zero = -0.0 if sign else 0.0
    return Number(value, text=s) if value else zero


def _digits_int(digits) -> int:
    """The integer of a decimal's digits, in pieces: int() of one string refuses more than
    sys.get_int_max_str_digits() (4300) digits, a limit on conversion, not on the value."""
    n = 0
    for i in range(0, len(digits), 4000):
        piece = digits[i:i + 4000]
        n = n * 10 ** len(piece) + int("".join(map(str, piece)))
    return n


def _is_number(text: str) -> bool:
    try:
        parse_value(text)
    except argparse.ArgumentTypeError:
        return False
    return True


def _shield_negative_numbers(argv: list[str]) -> list[str]:
    """Keep "-1e-30" or "-0x1p-3" from being read as options: argparse only knows "-1", "-.5".

    A leading space makes argparse take the token as a value; parse_value strips it.
    """
    return [" " + arg if arg.startswith("-") and arg[1:2] not in ("", "-") and _is_number(arg)
            else arg for arg in argv]


def bit_fields(value: float, fmt: Format) -> str:
    """The code of ``value`` (a value of ``fmt``) as sign|exponent|mantissa bits (no sign
    field in unsigned formats): lpsim.storage.encode_values' code, ml_dtypes' bit pattern."""
    if math.isnan(value) and (not fmt.has_nan or (fmt.specials == "ieee" and not fmt.m)):
        return "NaN (no code)"                   # ieee with m = 0: the top code is inf only
    if math.isinf(value) and not fmt.has_inf:
        return "inf (no code)"
    try:
        code = int(encode_values(np.array([value]), fmt)[0])
    except ValueError:                           # unsigned with m > 0: no standard code
        return "no code"
    if math.isnan(value) and fmt.specials in ("ieee", "fn") and math.copysign(1, value) < 0:
        code |= 1 << (fmt.bits - 1)              # these NaN codes come in both signs
    bits = format(code, f"0{fmt.bits}b")
    s = int(fmt.signed)
    fields = f"{bits[s:s + fmt.e]}|{bits[s + fmt.e:]}"
    return f"{bits[0]}|{fields}" if fmt.signed else fields


# --- tables ---------------------------------------------------------------------------------
_FORMAT_COLUMNS = ("format", "bits", "bias", "emin", "emax", "max finite", "min normal",
                   "min subnormal", "unit roundoff", "epsilon", "inf", "NaN")


def _format_cells(name: str, fmt: Format) -> dict[str, str]:
    return {"name": name, "format": fmt.spec, "bits": str(fmt.bits), "bias": str(fmt.bias),
            "emin": str(fmt.emin), "emax": str(fmt.emax), "max finite": f"{fmt.max_finite:.6g}",
            "min normal": f"{fmt.min_normal:.6g}", "min subnormal": f"{fmt.min_subnormal:.6g}",
            "unit roundoff": f"{fmt.unit_roundoff:.3g}", "epsilon": f"{fmt.epsilon:.3g}",
            "inf": "yes" if fmt.has_inf else "no", "NaN": "yes" if fmt.has_nan else "no"}


def _table(title: str, columns, rows) -> Table:
    table = Table(title=escape(title))
    for column in columns:
        left = column in ("name", "format", "mode", "bits")
        table.add_column(column, justify="left" if left else "right", no_wrap=True)
    for cells in rows:
        table.add_row(*(escape(cells[column]) for column in columns))
    return table


def formats_tables(specs: list[str] | None, width: int) -> list[Table]:
    """The formats' properties: one table where ``width`` allows, else several that each fit."""
    formats = [(name, fmt) for name, fmt in PRESETS.items()] if not specs else \
        [(spec, parse_format(spec)) for spec in specs]
    rows = [_format_cells(name, fmt) for name, fmt in formats]   # every value a float64
    columns, count = list(_FORMAT_COLUMNS), 1
    while True:                          # the fewest tables that fit, their widths balanced
        cuts = [(0, *c, len(columns)) for c in
                itertools.combinations(range(1, len(columns)), count - 1)]
        groups = min(([columns[a:b] for a, b in zip(c, c[1:])] for c in cuts),
                     key=lambda g: max(_width(rows, ["name", *part]) for part in g))
        if max(_width(rows, ["name", *part]) for part in groups) <= width or \
                count == len(columns):
            break
        count += 1
    return [_table("lpsim formats" + (f" ({i + 1}/{len(groups)})" if len(groups) > 1 else ""),
                   ["name", *group], rows) for i, group in enumerate(groups)]


def _width(rows, columns) -> int:
    """Columns a rich table with these columns needs: cells, padding and borders."""
    return sum(max(len(c), *(len(r[c]) for r in rows)) + 3 for c in columns) + 1


def _rounded(value, fmt: Format, mode: str, seed: int) -> float:
    """lpsim.quantize(value, fmt, mode, seed=seed), computed by the exact reference: the same
    bits (it draws the same Philox word), and no kernel to compile for a one-off value.  A
    Fraction (a decimal as typed) is rounded exactly, as a float64 holding it would be."""
    from . import reference
    from .philox import WORD_BITS, random_words
    stochastic = mode in STOCHASTIC_MODES
    if not isinstance(value, Fraction):
        out, _ = reference.quantize(np.array([value], np.float64), fmt, mode,
                                    seed=seed if stochastic else None)
        return float(out[0])
    width = WORD_BITS[8]
    request = reference.plan(fmt, mode, np.float64, seed=seed if stochastic else None)
    uniform = Fraction(int(random_words(1, 8, seed, 0, 0)[0]), 2 ** width) if stochastic \
        else None
    few = request.k if mode == "stochastic" and request.k < width else None
    return float(reference.round_exact(value, fmt, mode, uniform=uniform, sr_bits=few).value)


def _shown(value) -> str:
    """A value for a title: its float64 repr and hex float when it is one, else as typed."""
    if isinstance(value, Fraction):
        try:
            as_float = float(value)
        except OverflowError:           # at or past 2**1024 - 2**970: no float64 rounds it
            as_float = math.inf if value > 0 else -math.inf
        if as_float != value:
            return f"{value!r} (exact, not a float64)"
        value = as_float
    return f"{value!r} ({value.hex()})"


def round_tables(values: list[float], specs: list[str], modes: list[str], seed: int,
                 width: int) -> list[Table]:
    """One table per (value, format): each mode's result as decimal, hex float and bits."""
    tables = []
    for value in values:
        for spec in specs:
            fmt = parse_format(spec)
            rows = []
            for mode in modes:
                r = _rounded(value, fmt, mode, seed)
                rows.append({"mode": mode, "value": repr(r), "hex": r.hex(),
                             "bits": bit_fields(r, fmt)})
            title = f"{_shown(value)} in {spec} = {fmt.spec}"
            columns = ("mode", "value", "hex", "bits")
            if _width(rows, columns) <= width:
                table = _table(title, columns, rows)
            else:                                          # stacked: value / hex / bits
                table = Table(title=escape(title))
                table.add_column("mode", no_wrap=True)
                table.add_column("value / hex float / sign|exponent|mantissa", overflow="fold")
                for r in rows:
                    table.add_row(r["mode"], escape(f"{r['value']}\n{r['hex']}\n{r['bits']}"))
            sign = "1 sign | " if fmt.signed else ""
            table.caption = f"bits: {sign}{fmt.e} exponent | {fmt.m} mantissa" + (
                f"; stochastic modes: seed {seed}, one draw" if any(
                    m.startswith("stochastic") for m in modes) else "")
            tables.append(table)
    return tables


# --- the command ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lpsim", description=__doc__.splitlines()[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"lpsim {__version__}",
                        help="print lpsim's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="formats, round or warmup (COMMAND --help for its options)")
    formats = sub.add_parser("formats", help="the format presets and their properties",
                             description="Print formats: range, precision and special values.")
    formats.add_argument("specs", nargs="*", metavar="FORMAT",
                         help="formats to show (a preset such as bf16, or fp(e,m,b)); "
                              "default: every preset")
    rounder = sub.add_parser(
        "round", help="round values in several formats and modes",
        description="Round values and print each result exactly: shortest round-trip decimal, "
                    "hex float and the bit pattern in the format.")
    rounder.add_argument("values", nargs="+", type=parse_value, metavar="VALUE",
                         help="a decimal (0.1, -1e-30, inf, nan) or a hex float (0x1.8p-3)")
    rounder.add_argument("--format", "-f", action="append", dest="formats", metavar="FORMAT",
                         help="format, repeatable: a preset (bf16, e4m3fn, ...), fp(e,m) or "
                              f"fp(e,m,b); default: {' '.join(DEFAULT_FORMATS)}")
    rounder.add_argument("--rounding", "-r", action="append", dest="modes", choices=list(MODES),
                         metavar="MODE",
                         help=f"rounding mode, repeatable: {', '.join(MODES)}; default: all")
    rounder.add_argument("--seed", type=int, default=0,
                         help="seed of the stochastic modes' random draws (default: 0)")
    sub.add_parser("warmup", help="compile lpsim's CPU kernels now (cached on disk)",
                   description="Compile into numba's on-disk cache the CPU kernels programs "
                               "call first (lpsim.warmup's docstring lists them: quantize to "
                               "element and block formats, lpsim.ops, AdamW and SGD steps), "
                               "so that the first call does not wait for the compiler.")
    return parser


def warmup(console: Console) -> None:
    import numpy as np
    import lpsim
    err = Console(stderr=True)
    err.print("compiling lpsim's kernels (cached on disk for later runs) ...")
    start = time.perf_counter()
    if getattr(lpsim, "warmup", None) is not None:
        lpsim.warmup()
    else:                                      # this lpsim has no warmup(): compile each mode
        for dtype in (np.float32, np.float64):
            for mode in MODES:
                quantize(np.zeros(2, dtype), "bf16", mode, seed=0)
    console.print(f"lpsim kernels ready ({time.perf_counter() - start:.1f} s)")


def main(argv=None) -> int:
    argv = _shield_negative_numbers(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        if args.command == "formats":
            tables = formats_tables(args.specs, console.width)
        elif args.command == "round":
            tables = round_tables(args.values, args.formats or DEFAULT_FORMATS,
                                  args.modes or list(MODES), args.seed, console.width)
        else:
            warmup(console)
            return 0
    except (ValueError, TypeError, OverflowError) as error:
        # bad input (OverflowError: a format whose range float64 cannot hold); the message
        # quotes user input: escape it, or rich reads "[/x]" as markup
        Console(stderr=True, width=console.width).print(f"[red]error:[/red] {escape(str(error))}")
        return 2
    except KeyboardInterrupt:           # Ctrl-C (a warmup's kernels so far stay cached)
        Console(stderr=True, width=console.width).print("interrupted")
        return 130
    for table in tables:
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
