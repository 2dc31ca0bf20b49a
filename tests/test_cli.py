"""The ``lpsim`` command at real terminal widths: layout, exact values, inputs, errors, help."""

import argparse
import contextlib
import io
import math
import os
import pathlib
import re
import subprocess
import sys
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import lpsim
from lpsim import reference
from lpsim.cli import bit_fields, build_parser, main, parse_value
from conftest import child_pythonpath

ROOT = pathlib.Path(__file__).resolve().parent.parent


def lpsim_cmd(*args, columns=80, process=False):
    """``lpsim ARGS`` in a terminal ``columns`` wide (rich and argparse read COLUMNS): its
    exit status, stdout and stderr.  In this interpreter through ``lpsim.cli.main`` (an
    interpreter start costs seconds), or with ``process=True`` as ``python -m lpsim``, the
    command itself, which a few tests run end to end."""
    if process:
        env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": child_pythonpath()}
        return subprocess.run([sys.executable, "-m", "lpsim", *args], capture_output=True,
                              text=True, cwd=ROOT, env=env, timeout=300)
    out, err = io.StringIO(), io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exit_:          # argparse: --help, --version, bad usage
                code = 0 if exit_.code is None else exit_.code
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def assert_fits(text, columns):
    lines = text.splitlines()
    assert lines and max(len(line) for line in lines) <= columns, text
    assert "…" not in text, text                                  # no cell cut short


# --- formats --------------------------------------------------------------------------------
@pytest.mark.parametrize("columns", [80, 200])
def test_formats_fit_the_terminal_and_show_every_property(columns):
    done = lpsim_cmd("formats", columns=columns, process=columns == 80)
    assert done.returncode == 0 and done.stderr == ""
    assert_fits(done.stdout, columns)
    cells = set(re.split(r"[\s│┃]+", done.stdout))
    for name, fmt in lpsim.PRESETS.items():
        assert name in cells
        for value in (fmt.bits, fmt.bias, fmt.emin, fmt.emax):
            assert str(value) in cells
        for value in (f"{fmt.max_finite:.6g}", f"{fmt.min_normal:.6g}",
                      f"{fmt.min_subnormal:.6g}", f"{fmt.unit_roundoff:.3g}"):
            assert value in cells, (name, value)
    tables = done.stdout.count("lpsim formats")
    assert (tables == 1) == (columns == 200)                  # one wide table only where it fits


def test_formats_of_given_specs():
    done = lpsim_cmd("formats", "bf16", "fp(3,2,1)")
    assert done.returncode == 0
    assert "fp(3,2,1)" in done.stdout and "fp16" not in done.stdout


# --- round: exact values --------------------------------------------------------------------
def test_round_shows_exact_distinct_values_at_80_columns():
    done = lpsim_cmd("round", "0.1", "-f", "fp(11,40)", "-r", "up", "-r", "down")
    assert done.returncode == 0, done.stderr
    assert_fits(done.stdout, 80)
    fmt = lpsim.fp(11, 40)
    up, down = (float(reference.round_exact(0.1, fmt, mode).value) for mode in ("up", "down"))
    assert up != down
    for value in (up, down):
        assert repr(value) in done.stdout and value.hex() in done.stdout
        assert bit_fields(value, fmt) in done.stdout


def test_round_wide_terminal_puts_value_hex_and_bits_in_columns():
    done = lpsim_cmd("round", "0.1", "-f", "bf16", "-r", "nearest", columns=200)
    value = float(reference.round_exact(0.1, "bf16", "nearest").value)
    row = [line for line in done.stdout.splitlines() if "nearest" in line]
    assert len(row) == 1
    assert repr(value) in row[0] and value.hex() in row[0] and "0|01111011|1001101" in row[0]


def test_round_values_are_lpsim_quantize_bits_for_every_mode_and_seed():
    """The command computes with the exact reference (nothing to compile) and must print
    what lpsim.quantize gives, stochastic draws included."""
    from lpsim.cli import _rounded
    from lpsim.rounding import MODES
    for value in (0.1, -1e-30, 3.0000001, 65519.0, 1e300, -0.0):
        for spec in ("bf16", "e4m3fn", "fp(5,2,0)", "fp(11,40)"):
            fmt = lpsim.parse_format(spec)
            for mode in MODES:
                for seed in (0, 7, 2 ** 63 + 5):
                    want = float(lpsim.quantize(value, fmt, mode, seed=seed))
                    got = _rounded(value, fmt, mode, seed)
                    assert got == want or (math.isnan(got) and math.isnan(want)), \
                        (value, spec, mode, seed)
                    assert math.copysign(1, got) == math.copysign(1, want)


@pytest.mark.parametrize("spec", ["e4m3", "e4m3fn", "fp(4,3,4)", "e5m2", "fp(3,2,1)",
                                  "fp(4,3,0,saturate)"])
def test_bit_fields_walk_every_code(spec):
    """Code i of the format is the i-th value of reference.enumerate_values (built from codes)."""
    fmt = lpsim.parse_format(spec)
    for code, value in enumerate(reference.enumerate_values(fmt)):
        exp_bits, man_bits = format(code >> fmt.m, f"0{fmt.e}b"), format(code % 2 ** fmt.m,
                                                                        f"0{fmt.m}b")
        assert bit_fields(float(value), fmt) == f"0|{exp_bits}|{man_bits}"
        assert bit_fields(-float(value), fmt) == f"1|{exp_bits}|{man_bits}"


def test_bit_fields_match_ml_dtypes_codes():
    x = np.random.default_rng(0).standard_normal(500) * 10.0 ** np.random.default_rng(1).integers(
        -40, 38, 500)
    for spec, dtype in [("bf16", ml_dtypes.bfloat16), ("fp16", np.float16),
                        ("e4m3fn", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)]:
        fmt = lpsim.parse_format(spec)
        with np.errstate(over="ignore"):
            values = np.concatenate([x, [np.inf, -np.inf, np.nan, 0.0, -0.0]]).astype(dtype)
        codes = values.view(np.uint8 if fmt.bits == 8 else np.uint16)
        for value, code in zip(values.astype(np.float64), codes):
            if fmt.specials == "fn" and math.isinf(value):
                continue                                   # ml_dtypes casts inf to NaN here too
            want = format(int(code), f"0{fmt.bits}b")
            want = f"{want[0]}|{want[1:1 + fmt.e]}|{want[1 + fmt.e:]}"
            assert bit_fields(float(value), fmt) == want, (spec, value)



ML_DTYPES = [("e8m0fnu", ml_dtypes.float8_e8m0fnu), ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
             ("e5m2fnuz", ml_dtypes.float8_e5m2fnuz), ("e4m3fn", ml_dtypes.float8_e4m3fn),
             ("e5m2", ml_dtypes.float8_e5m2), ("e2m1fn", ml_dtypes.float4_e2m1fn),
             ("e2m3fn", ml_dtypes.float6_e2m3fn), ("e3m2fn", ml_dtypes.float6_e3m2fn),
             ("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)]


def _fields(code: int, fmt) -> str:
    """``code`` split as sign|exponent|mantissa, or exponent|mantissa when unsigned."""
    bits = format(code, f"0{fmt.bits}b")
    sign = bits[:fmt.bits - fmt.e - fmt.m]
    rest = f"{bits[len(sign):len(sign) + fmt.e]}|{bits[len(sign) + fmt.e:]}"
    return f"{sign}|{rest}" if fmt.signed else rest


@pytest.mark.parametrize("spec, dtype", ML_DTYPES, ids=[spec for spec, _ in ML_DTYPES])
def test_bit_fields_are_ml_dtypes_codes_at_every_code(spec, dtype):
    """Every code point of ml_dtypes' type: bit_fields of its value is that code (a NaN code
    where there are several: one that ml_dtypes reads as NaN); e8m0fnu has no sign bit, fnuz
    NaN is 0x80."""
    fmt, dtype = lpsim.parse_format(spec), np.dtype(dtype)
    codes = np.arange(2 ** fmt.bits, dtype=np.uint8 if fmt.bits <= 8 else np.uint16)
    with np.errstate(invalid="ignore"):
        values = codes.view(dtype).astype(np.float64)
        nan_codes = {int(c) for c, v in zip(codes, values) if math.isnan(v)}
    for code, value in zip(codes.tolist(), values.tolist()):
        shown = bit_fields(value, fmt)
        if math.isnan(value):
            assert int(shown.replace("|", ""), 2) in nan_codes, (spec, code, shown)
            assert shown == _fields(int(shown.replace("|", ""), 2), fmt)
        else:
            assert shown == _fields(code, fmt), (spec, hex(code), value)


def test_round_prints_unsigned_and_fnuz_codes():
    """1 and 0.125 in e8m0fnu are 0x7F and 0x7C (8 exponent bits, no sign); NaN in the fnuz
    formats is 0x80, not 0|1111|100 (the number 192 in e4m3fnuz)."""
    names = {"e8m0fnu": ml_dtypes.float8_e8m0fnu, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
             "e5m2fnuz": ml_dtypes.float8_e5m2fnuz}
    values = ["1", "0.125", "nan"]
    done = lpsim_cmd("round", *values, *(a for n in names for a in ("-f", n)), "-r", "nearest",
                     columns=200)
    assert done.returncode == 0, done.stderr
    shown = [line.split("│")[-2].strip() for line in done.stdout.splitlines()
             if "nearest" in line]
    want = [_fields(int(np.array([float(v)]).astype(d).view(np.uint8)[0]),
                    lpsim.parse_format(n)) for v in values for n, d in names.items()]
    assert shown == want
    assert want[:3] == ["01111111|", "0|1000|000", "0|10000|00"]
    assert want[-2:] == ["1|0000|000", "1|00000|00"]
    assert done.stdout.count("bits: 8 exponent | 0 mantissa") == 3
    assert done.stdout.count("bits: 1 sign | 4 exponent | 3 mantissa") == 3


def test_bit_fields_of_wide_formats_are_numpy_codes():
    """fp32 and fp64 codes (wider than 16 bits) are numpy's float32 and float64 bits."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(300) * 10.0 ** rng.integers(-320, 300, 300)
    x = np.concatenate([x, [0.0, -0.0, np.inf, -np.inf, 5e-324, -np.finfo(np.float64).max]])
    for spec, dtype, view in [("fp64", np.float64, np.uint64), ("fp32", np.float32, np.uint32)]:
        fmt = lpsim.parse_format(spec)
        with np.errstate(over="ignore", under="ignore"):
            values = x.astype(dtype)
        for value, code in zip(values.astype(np.float64).tolist(), values.view(view).tolist()):
            assert bit_fields(value, fmt) == _fields(code, fmt), (spec, value)
    assert bit_fields(math.nan, lpsim.fp(3, 0)) == "NaN (no code)"     # its top code is inf
    assert bit_fields(math.nan, lpsim.parse_format("e2m1fn")) == "NaN (no code)"

# --- inputs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("0x1.8p-3", 0.1875), ("-0x1p-3", -0.125),
                                         ("-1e-30", -1e-30), ("1E5", 1e5), ("-inf", -math.inf)])
def test_values_in_exponent_and_hex_form(text, value):
    exact = value if "x" in text or "inf" in text else Fraction(text)   # decimals as typed
    assert parse_value(text) == exact
    done = lpsim_cmd("round", text, "-f", "fp64", "-r", "nearest", columns=200)
    assert done.returncode == 0, done.stderr
    assert repr(value) in done.stdout


def test_negative_values_next_to_options():
    done = lpsim_cmd("round", "-f", "bf16", "-1e-30", "-r", "toward_zero", "--seed", "3",
                     columns=200)
    assert done.returncode == 0, done.stderr
    want = float(reference.round_exact(-1e-30, "bf16", "toward_zero").value)
    assert want.hex() in done.stdout


# --- errors, version, help ------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["round", "1", "-f", "fp(2)"], "format 'fp(2)' is not understood"),
    (["round", "abc"], "'abc' is not a number"),
    (["round", "0x"], "'0x' is not a number"),
    (["round", "1", "-f", "fp(4,3,-2000)"], "b=-2000 is out of range for fp(4,3)"),
    (["formats", "fp(4,3,-2000)"], "b=-2000 is out of range for fp(4,3)"),
    (["round", "1", "-r", "sideways"], "invalid choice: 'sideways'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_errors_go_to_stderr_with_a_nonzero_exit(args, message):
    done = lpsim_cmd(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert message in done.stderr and "Traceback" not in done.stderr


def test_decimals_are_rounded_as_typed_not_through_float64():
    """1e-400 is not 0: rounded up it is the smallest subnormal (the issue's repro); 0.1 in
    fp64 rounds down to 0x1.9999999999999p-4 (float64's 0.1 is above it); values beyond
    float64 round as the exact values they are."""
    done = lpsim_cmd("round", "1e-400", "-r", "up", "-f", "bf16", columns=200)
    assert done.returncode == 0, done.stderr
    assert (2.0 ** -133).hex() in done.stdout and "1e-400 (exact, not a float64)" in done.stdout
    from lpsim.cli import _rounded
    cases = [("1e-400", "bf16", "up"), ("-1e-400", "fp64", "down"), ("1e-400", "fp64", "up"),
             ("0.1", "fp64", "down"), ("0.1", "fp(11,52)", "up"), ("1e400", "bf16", "toward_zero"),
             ("1e400", "bf16", "nearest"), ("-0x1.00000000000008p0", "fp64", "nearest_away"),
             ("0x1.000000000000080000001p0", "fp64", "nearest"), ("1e-999999999", "fp64", "up"),
             ("-1e999999999", "fp(4,3)", "toward_zero")]
    for text, spec, mode in cases:
        value = parse_value(text)
        # 1e+-999999999 stand for themselves (a Fraction of them would be a huge integer)
        stand_in = value if "999999999" in text or "x" in text else Fraction(text)
        want = float(reference.round_exact(stand_in, spec, mode).value)
        assert _rounded(value, lpsim.parse_format(spec), mode, 0) == want, (text, spec, mode)
    assert _rounded(parse_value("1e-400"), lpsim.parse_format("fp64"), "up", 0) == 5e-324
    assert _rounded(parse_value("0.1"), lpsim.parse_format("fp64"), "down", 0) == \
        float.fromhex("0x1.9999999999999p-4")
    assert _rounded(parse_value("1e-999999999"), lpsim.parse_format("fp64"), "up", 0) == 5e-324


@pytest.mark.parametrize("text, shown", [
    ("0x1.fffffffffffff8p1023", "inf"), ("-1.797693134862315808e308", "-inf")])
def test_values_just_below_two_to_the_1024_are_shown(text, shown):
    """Between 2**1024 - 2**970 and 2**1024 a value has no float64 (Fraction's float()
    overflows there): its title once failed with "integer division result too large";
    fp64 to nearest is inf, toward zero float64's largest."""
    done = lpsim_cmd("round", "-f", "fp64", "-r", "nearest", "-r", "toward_zero", text,
                     columns=200)
    assert done.returncode == 0, done.stderr
    assert f"{text} (exact, not a float64)" in done.stdout
    assert f"│ {shown} " in done.stdout.replace("  ", " ") or f" {shown} " in done.stdout
    assert float.hex(math.copysign(1.7976931348623157e308, float(shown))) in done.stdout


def test_exact_values_take_the_draws_of_lpsim_quantize():
    """A typed value that is a float64 gives lpsim.quantize's bits in every mode and seed
    (the stochastic word of counter 0 in a float64 container)."""
    from lpsim.cli import _rounded
    from lpsim.rounding import MODES
    for text in ("0.1875", "-3.00000011920928955078125", "65519", "0x1.fffffep-127"):
        value = parse_value(text)
        for spec in ("bf16", "e4m3fn", "fp(11,40)"):
            fmt = lpsim.parse_format(spec)
            for mode in MODES:
                for seed in (0, 7, 2 ** 63 + 5):
                    want = float(lpsim.quantize(float(value), fmt, mode, seed=seed))
                    got = _rounded(value, fmt, mode, seed)
                    assert got == want or (math.isnan(got) and math.isnan(want)), \
                        (text, spec, mode, seed)


def test_version():
    done = lpsim_cmd("--version", process=True)
    assert done.returncode == 0 and done.stdout.strip() == f"lpsim {lpsim.__version__}"


def _subparsers(parser):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_argument_has_help_and_help_has_no_markup():
    parser = build_parser()
    for command in [parser, *_subparsers(parser).values()]:
        for action in command._actions:
            assert action.help and action.help != argparse.SUPPRESS, (command.prog, action.dest)
    for args in [["--help"]] + [[name, "--help"] for name in _subparsers(parser)]:
        done = lpsim_cmd(*args)
        assert done.returncode == 0 and done.stderr == ""
        assert_fits(done.stdout, 80)
        assert not re.search(r"\[/?(red|bold|green|yellow|dim|italic)[^\]]*\]", done.stdout)
        assert "\x1b[" not in done.stdout


def test_warmup_calls_lpsim_warmup(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(lpsim, "warmup", lambda: calls.append(1), raising=False)
    assert main(["warmup"]) == 0
    assert calls == [1] and "ready" in capsys.readouterr().out


def test_an_interrupted_warmup_says_so_in_one_line(monkeypatch, capsys):
    """Ctrl-C during `lpsim warmup` printed a traceback of some 230 lines."""
    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(lpsim, "warmup", interrupted, raising=False)
    assert main(["warmup"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted"


@pytest.mark.slow
def test_warmup_without_lpsim_warmup_compiles_every_mode(monkeypatch, capsys):
    monkeypatch.delattr(lpsim, "warmup", raising=False)
    assert main(["warmup"]) == 0
    assert "ready" in capsys.readouterr().out


def test_a_decimal_past_pythons_digit_limit_is_read_exactly():
    """int() of one string refuses more than 4300 digits: argparse's generic "invalid
    parse_value value" came back for a valid number."""
    from lpsim.cli import HUGE
    assert parse_value("1" + "0" * 9000 + "7") == 2 ** HUGE      # past HUGE: its stand-in
    assert parse_value("-" + "1" + "0" * 4301 + "3e-4301") == -(1 + Fraction(3, 10 ** 4302)) * 10


def test_a_decimal_exponent_past_the_decimal_modules_is_read():
    """decimal.Decimal refuses exponents past 10**18 as an invalid operation, so a valid
    decimal was "not a number"; float() reads it (0 and inf), and so does the hex form."""
    from lpsim.cli import HUGE, TINY
    assert parse_value("1e-9999999999999999999") == Fraction(1, 2 ** TINY)   # its stand-in
    assert parse_value("-2.5e9999999999999999999") == -(2 ** HUGE)
    assert parse_value("1_000") == 1000 and parse_value(".5") == Fraction(1, 2)
    for bad in (".", "1e", "e5", "1e5.0"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a number"):
            parse_value(bad)
