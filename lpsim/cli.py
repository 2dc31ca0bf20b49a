"""The ``lpsim`` command: the format presets, and rounding a value in several formats and modes."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .formats import PRESETS, parse_format
from .quantize import quantize
from .rounding import MODES


def formats_table() -> Table:
    table = Table(title="lpsim format presets")
    for column in ("name", "format", "bits", "bias", "emin", "emax", "max finite",
                   "min normal", "min subnormal", "unit roundoff", "epsilon", "inf", "NaN"):
        table.add_column(column, justify="right" if column not in ("name", "format") else "left")
    for name, fmt in PRESETS.items():
        table.add_row(name, repr(fmt), str(fmt.bits), str(fmt.bias), str(fmt.emin),
                      str(fmt.emax), f"{fmt.max_finite:.6g}", f"{fmt.min_normal:.6g}",
                      f"{fmt.min_subnormal:.6g}", f"{fmt.unit_roundoff:.3g}", f"{fmt.epsilon:.3g}",
                      "yes" if fmt.has_inf else "no", "yes" if fmt.has_nan else "no")
    return table


def round_table(value: float, formats: list[str], modes: list[str], seed: int) -> Table:
    table = Table(title=escape(f"{value!r} rounded (stochastic modes: seed {seed}, one draw)"))
    table.add_column("format")
    for mode in modes:
        table.add_column(mode, justify="right")
    for spec in formats:
        fmt = parse_format(spec)
        cells = [f"{quantize(value, fmt, mode, seed=seed):.9g}" for mode in modes]
        table.add_row(escape(spec), *cells)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lpsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("formats", help="print the format presets and their properties")
    rounder = sub.add_parser("round", help="round a value in several formats and modes")
    rounder.add_argument("value", type=float)
    rounder.add_argument("--format", "-f", action="append", dest="formats",
                         help="format (repeatable); default: bf16 fp16 e5m2 e4m3fn fp(4,3,4)")
    rounder.add_argument("--rounding", "-r", action="append", dest="modes", choices=list(MODES),
                         help="rounding mode (repeatable); default: all")
    rounder.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 170)
    try:
        if args.command == "formats":
            console.print(formats_table())
        else:
            console.print(round_table(args.value,
                                      args.formats or ["bf16", "fp16", "e5m2", "e4m3fn",
                                                       "fp(4,3,4)"],
                                      args.modes or list(MODES), args.seed))
    except (ValueError, TypeError) as error:
        # the message quotes user input: escape it, or rich reads "[/x]" as markup
        Console(stderr=True, width=console.width).print(f"[red]error:[/red] {escape(str(error))}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
