"""Formats: derived properties against hand-checked values, parsing, and errors that name the value."""

import os
import numpy as np
import pytest

import lpsim
from lpsim import fp, parse_format


@pytest.mark.parametrize("name, bits, bias, emin, emax, max_finite, min_sub", [
    ("fp32", 32, 127, -126, 127, float(np.finfo(np.float32).max), 2.0 ** -149),
    ("fp16", 16, 15, -14, 15, 65504.0, 2.0 ** -24),
    ("bf16", 16, 127, -126, 127, float(np.finfo(np.float32).max) * (1 - 2 ** -8) / (1 - 2 ** -24),
     2.0 ** -133),
    ("e5m2", 8, 15, -14, 15, 57344.0, 2.0 ** -16),
    ("e4m3", 8, 7, -6, 7, 240.0, 2.0 ** -9),
    ("e4m3fn", 8, 7, -6, 8, 448.0, 2.0 ** -9),
    ("fp(4,3,4)", 8, 11, -10, 3, 15.0, 2.0 ** -13),
    ("tf32", 19, 127, -126, 127, (2 - 2 ** -10) * 2.0 ** 127, 2.0 ** -136),
])
def test_preset_properties(name, bits, bias, emin, emax, max_finite, min_sub):
    fmt = parse_format(name)
    assert (fmt.bits, fmt.bias, fmt.emin, fmt.emax) == (bits, bias, emin, emax)
    assert fmt.max_finite == max_finite
    assert fmt.min_subnormal == min_sub
    assert fmt.min_normal == 2.0 ** emin
    assert fmt.unit_roundoff == 2.0 ** -(fmt.m + 1) and fmt.epsilon == 2.0 ** -fmt.m


def test_presets_match_numpy_and_ml_dtypes():
    import ml_dtypes
    for name, dtype in [("fp16", np.float16), ("bf16", ml_dtypes.bfloat16),
                        ("e5m2", ml_dtypes.float8_e5m2), ("e4m3", ml_dtypes.float8_e4m3),
                        ("e4m3fn", ml_dtypes.float8_e4m3fn)]:
        info = ml_dtypes.finfo(dtype) if dtype is not np.float16 else np.finfo(dtype)
        fmt = parse_format(name)
        assert fmt.max_finite == float(info.max), name
        assert fmt.min_normal == float(info.smallest_normal), name
        assert fmt.min_subnormal == float(info.smallest_subnormal), name
        assert fmt.epsilon == float(info.eps), name


def test_formats_are_immutable_hashable_and_print_as_fp():
    a, b = fp(4, 3, 4), parse_format("fp(4,3,4)")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert repr(a) == "fp(4,3,4)"
    assert repr(fp(5, 3, specials="fn")) == "fp(5,3,0, specials='fn')"
    assert repr(fp(5, 2, subnormals=False)) == "fp(5,2,0, subnormals=False)"
    assert str(fp(4, 3, specials="fn")) == repr(fp(4, 3, specials="fn")) == "e4m3fn"
    with pytest.raises(AttributeError):
        a.m = 2
    assert parse_format("e4m3fn") == fp(4, 3, specials="fn")
    assert parse_format("bfloat16") is lpsim.PRESETS["bf16"]
    assert parse_format("fp(4, 3, -2, saturate)") == fp(4, 3, -2, specials="saturate")
    assert parse_format("e3m2") == fp(3, 2)
    assert fp(4, 3, specials="saturate").saturate
    assert fp(4, 3, specials="saturate").max_finite == 480.0


@pytest.mark.parametrize("spec, error, words", [
    ("fp99", ValueError, "unknown format 'fp99'"),
    ("fp(4)", ValueError, "accepted"),
    (3.5, TypeError, "not float"),
])
def test_parse_errors_name_the_value(spec, error, words):
    with pytest.raises(error, match=words):
        parse_format(spec)


@pytest.mark.parametrize("args, kwargs, words", [
    ((0, 3), {}, "e=0"),
    ((4, -1), {}, "m=-1"),
    ((4, 3), {"specials": "ocp"}, "specials='ocp'.*ieee, saturate, fn"),
    ((1, 2), {}, "no normal numbers"),
    ((12, 3), {}, "e=12"),
])
def test_bad_formats_are_rejected(args, kwargs, words):
    with pytest.raises(ValueError, match=words):
        fp(*args, **kwargs)


def test_fit_in_container_names_format_container_and_reason():
    assert fp(8, 7).fits(np.float32)[0]
    assert fp(8, 7, 4).fits(np.float32)[0]          # emin -130, smallest 2**-137 >= 2**-149
    ok, reason = fp(8, 7, -5).fits(np.float32)
    assert not ok and "exceeds" in reason
    with pytest.raises(ValueError, match="format fp64 does not fit a float32 container"):
        fp(11, 52).check_fits(np.float32)
    with pytest.raises(ValueError, match="finest spacing"):
        fp(8, 20, 10).check_fits(np.float32)


def test_repr_names_the_preset_and_spec_names_every_field():
    for name, fmt in lpsim.PRESETS.items():
        assert repr(fmt) == fmt.preset_name           # the first preset equal to it
        assert parse_format(fmt.spec) == fmt and fmt.spec.startswith("fp(")
    assert repr(parse_format("bfloat16")) == "bf16" and repr(fp(5, 10)) == "fp16"
    assert repr(fp(5, 2)) == "e5m2"                   # = "fp(5,2,0)", listed after e5m2
    assert repr(fp(4, 3, specials="fn", saturate=True)) == "fp(4,3,0, specials='fn', saturate=True)"
    assert fp(8, 7).spec == "fp(8,7,0)" and fp(4, 3, 4).spec == repr(fp(4, 3, 4)) == "fp(4,3,4)"


def test_format_hashes_are_cached_and_hold_in_another_process():
    """Formats and block formats cache their hashes (they key the per-call caches), made of
    ints only: pickled by a process of another hash seed, after its hash was taken, each
    still equals and hashes as the same format made here, and finds its dict entry; a
    changed field gives an unequal format."""
    import pickle
    import subprocess
    import sys
    from dataclasses import replace
    from lpsim.blocks import as_block_format
    code = ("import pickle, sys; from lpsim import parse_format; "
            "from lpsim.blocks import as_block_format; "
            "fs = [parse_format('e4m3fn'), as_block_format('nvfp4'), "
            "as_block_format('mxfp8_e4m3')]; [hash(f) for f in fs]; "
            "sys.stdout.buffer.write(pickle.dumps(fs))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    theirs = pickle.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                         capture_output=True).stdout)
    mine = [parse_format("e4m3fn"), as_block_format("nvfp4"), as_block_format("mxfp8_e4m3")]
    table = {f: i for i, f in enumerate(mine)}
    for i, (a, b) in enumerate(zip(theirs, mine)):
        assert a == b and hash(a) == hash(b) and table[a] == i
    nvfp4 = mine[1]
    for changed in (replace(nvfp4, block=32), replace(nvfp4, rule="floor"),
                    replace(nvfp4, nonfinite="finite"), replace(nvfp4, tensor_scale=False)):
        assert changed != nvfp4 and changed not in table
