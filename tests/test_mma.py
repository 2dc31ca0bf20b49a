"""lpsim.ops.mma against MMA-Sim (mmasim), bit for bit, on random bit patterns of every type.

Uniform random codes hold NaN, inf, subnormals and zeros about as often as MMA-Sim's own
tests draw them; C is random FP32 (or FP16) codes.  Outputs are compared as codes: both
return the hardware's canonical NaN, so NaN must match NaN code for code.
"""

import pathlib
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mmasim_nv = pytest.importorskip("mmasim.nv_ptx")

from lpsim.ops import mma                                   # noqa: E402
from lpsim.ops.mma_table import (code_values, instructions, lookup,  # noqa: E402
                                  mmasim_simulator, random_codes, random_scales)

CASES = instructions(32)
OUTPUTS = 2048       # per case


def codes(x):
    return x.view(torch.int16 if x.dtype == torch.float16 else torch.int32)


def compare(arch, instruction, rng, calls, zeros=0.0, c_scale=False):
    ins = lookup(arch, instruction)
    sim = mmasim_simulator(arch, instruction)
    for _ in range(calls):
        a = random_codes((ins.m, ins.k), ins.a_type, rng, zeros)
        b = random_codes((ins.k, ins.n), ins.b_type, rng, zeros)
        c = random_codes((ins.m, ins.n), ins.c_type, rng, zeros)
        scales = {}
        if ins.block:
            scales = dict(
                scale_a=random_scales((ins.m, ins.k // ins.block), rng, ins.scale_type),
                scale_b=random_scales((ins.k // ins.block, ins.n), rng, ins.scale_type))
        want = sim(a, b, c, *scales.values())
        got = mma(code_values(a, ins.a_type), code_values(b, ins.b_type), c, arch=arch,
                  instruction=instruction, **scales)
        assert got.dtype == want.dtype and got.shape == want.shape
        bad = (codes(got) != codes(want)).nonzero()
        if len(bad):
            i, j = bad[0].tolist()
            pytest.fail(f"{arch} {instruction}: {len(bad)} of {want.numel()} outputs differ; "
                        f"first d[{i},{j}]: lpsim {got[i, j].item()!r} "
                        f"(0x{codes(got)[i, j].item() & 0xFFFFFFFF:x}), mmasim "
                        f"{want[i, j].item()!r} (0x{codes(want)[i, j].item() & 0xFFFFFFFF:x})")


@pytest.mark.parametrize("arch,instruction", CASES)
def test_bit_exact_random_codes(arch, instruction):
    ins = lookup(arch, instruction)
    rng = np.random.default_rng(zlib.crc32(f"{arch} {instruction}".encode()))
    compare(arch, instruction, rng, max(1, OUTPUTS // (ins.m * ins.n)))


@pytest.mark.parametrize("arch,instruction", [
    ("volta", "mma.m8n8k4.f32.f16.f16.f32"), ("turing", "mma.m16n8k8.f16.f16.f16.f16"),
    ("ampere", "mma.m16n8k4.f32.tf32.tf32.f32"), ("ada", "mma.m16n8k32.f32.e4m3.e5m2.f32"),
    ("ada", "mma.m16n8k16.f16.e5m2.e5m2.f16"), ("hopper", "mma.m16n8k16.f32.bf16.bf16.f32"),
    ("hopper", "wgmma.m64n16k32.f32.e4m3.e4m3"), ("hopper", "wgmma.m64n16k16.f16.f16.f16")])
def test_bit_exact_with_many_zeros(arch, instruction):
    """Half the inputs zero: nodes whose largest exponent is the zero exponent e_zero."""
    rng = np.random.default_rng(7)
    compare(arch, instruction, rng, 4, zeros=0.5)


FP4_KINDS = [ins for arch, ins in instructions(64) if lookup(arch, ins).group]


@pytest.mark.parametrize("instruction", FP4_KINDS)
@pytest.mark.parametrize("zeros", [0.3, 0.9])
def test_fp4_kinds_with_cancelling_groups_and_small_c(instruction, zeros):
    """kind::mxf4 / mxf4nvf4 against mmasim where the group rule shows: groups whose
    products cancel (pairs a b and a (-b): the group keeps its scales' exponent, which can
    truncate the rest), groups of zeros (e_zero), and C near the scaled sums (random C
    codes mostly dwarf them)."""
    ins = lookup("blackwell", instruction)
    sim = mmasim_simulator("blackwell", instruction)
    rng = np.random.default_rng(zlib.crc32(instruction.encode()) + int(zeros * 10))
    for cancel in (False, True):
        a = random_codes((ins.m, ins.k), "e2m1", rng, zeros)
        b = random_codes((ins.k, ins.n), "e2m1", rng, zeros)
        if cancel:
            a[:, 1::2] = a[:, 0::2]
            b[1::2] = b[0::2] ^ 0x20            # the sign bit of random_codes' FP4 layout
        c = rng.standard_normal((ins.m, ins.n)) * np.exp2(rng.integers(-20, 20, (ins.m, ins.n)))
        c[rng.random(c.shape) < 0.3] = 0.0
        c = torch.from_numpy(c.astype(np.float32))
        sa = random_scales((ins.m, ins.k // ins.block), rng, ins.scale_type)
        sb = random_scales((ins.k // ins.block, ins.n), rng, ins.scale_type)
        want = sim(a, b, c, sa, sb)
        got = mma(code_values(a, "e2m1"), code_values(b, "e2m1"), c, arch="blackwell",
                  instruction=instruction, scale_a=sa, scale_b=sb)
        assert torch.equal(codes(got), codes(want)), \
            f"{int((codes(got) != codes(want)).sum())} of {want.numel()} outputs differ"


NVF4 = "tcgen05.mma.m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3"
MXF4 = "tcgen05.mma.m128n8k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0"


def test_fp4_known_values():
    """A group whose products cancel keeps its scales' exponent: with scales 2**20 each,
    C = 1 falls below 2**(40 - 35) and is truncated away (D = +0); a group of zero products
    takes e_zero instead and C survives.  Within a group the 16 products add exactly: 6 * 6
    plus fifteen 0.5 * 0.5 is 39.75, which no FP32 node could lose."""
    a = np.zeros((128, 64), np.float32)
    b = np.zeros((64, 8), np.float32)
    c = np.zeros((128, 8), np.float32)
    c[0, 0] = c[1, 0] = 1.0
    a[0, 0] = a[0, 1] = 1.0
    b[0, 0], b[1, 0] = 1.0, -1.0
    sa, sb = np.ones((128, 2)), np.ones((2, 8))
    sa[:2, 0], sb[0, 0] = 2.0 ** 20, 2.0 ** 20
    d = mma(a, b, c, arch="blackwell", instruction=MXF4, scale_a=sa, scale_b=sb)
    assert d.view(np.int32)[0, 0] == 0 and d[1, 0] == 1.0
    a[2, :16], b[:16, 1] = 0.5, 0.5
    a[2, 0], b[0, 1] = 6.0, 6.0
    d = mma(a, b, c, arch="blackwell", instruction=NVF4, scale_a=np.ones((128, 4)),
            scale_b=np.ones((4, 8)))
    assert d[2, 1] == 39.75
    sa4 = np.full((128, 4), 0.5)
    sa4[2, 0] = np.nan
    d = mma(a, b, c, arch="blackwell", instruction=NVF4, scale_a=sa4, scale_b=np.ones((4, 8)))
    assert (d.view(np.int32)[2] == 0x7FFFFFFF).all() and d[3, 0] == 0.0


@pytest.mark.parametrize("scale,why", [
    (-1.0, r"scale_a\[5, 1\] = -1.0 is not a UE4M3 scale; accepted: the E4M3 values from "
           r"0 to 448 \(no sign\), and NaN"),
    (1.0625, r"= 1.0625 is not a UE4M3 scale"), (480.0, r"= 480.0 is not a UE4M3 scale"),
    (np.inf, r"= inf is not a UE4M3 scale")])
def test_fp4_refused_scales(scale, why):
    sa = np.ones((128, 4))
    sa[5, 1] = scale
    before = sa.copy()
    with pytest.raises(ValueError, match=why):
        mma(np.ones((128, 64)), np.ones((64, 8)), np.zeros((128, 8)), arch="blackwell",
            instruction=NVF4, scale_a=sa, scale_b=np.ones((4, 8)))
    assert np.array_equal(sa, before)
    with pytest.raises(ValueError, match=r"scale_b has shape \(2, 8\); accepted: \(4, 8\), "
                                         "one UE4M3 scale per 16 products"):
        mma(np.ones((128, 64)), np.ones((64, 8)), np.zeros((128, 8)), arch="blackwell",
            instruction=NVF4, scale_a=np.ones((128, 4)), scale_b=np.ones((2, 8)))
    with pytest.raises(ValueError, match=r"a\[0, 3\] = 5.0 is not a value of type e2m1"):
        x = np.ones((128, 64))
        x[0, 3] = 5.0
        mma(x, np.ones((64, 8)), np.zeros((128, 8)), arch="blackwell", instruction=NVF4,
            scale_a=np.ones((128, 4)), scale_b=np.ones((4, 8)))


@pytest.mark.parametrize("n", [8, 136, 256])
def test_wgmma_n(n):
    rng = np.random.default_rng(n)
    compare("hopper", f"wgmma.m64n{n}k32.f16.e5m2.e4m3", rng, 1)


def test_containers_and_opcode_spelling():
    """float32 numpy containers, ml_dtypes-free values, PTX's full spelling: the same bits."""
    rng = np.random.default_rng(3)
    ins = "wgmma.m64n8k32.f32.e4m3.e4m3"
    a = random_codes((64, 32), "e4m3", rng)
    b = random_codes((32, 8), "e4m3", rng)
    c = random_codes((64, 8), "f32", rng)
    d = mma(a, b, c, arch="hopper", instruction=ins)
    assert isinstance(d, torch.Tensor) and d.dtype == torch.float32
    d2 = mma(a.float().numpy(), b.float().numpy(), c.numpy(), arch="hopper",
             instruction="wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3")
    assert isinstance(d2, np.ndarray) and d2.dtype == np.float32
    assert np.array_equal(d2.view(np.int32), d.numpy().view(np.int32))
    d3 = mma(a.double(), b.double(), c.double(), arch="Hopper", instruction=ins)
    assert torch.equal(codes(d3), codes(d))
    h = mma(np.zeros((16, 16), np.float16), np.zeros((16, 8), np.float16),
            np.full((16, 8), -0.0, np.float16), arch="ampere",
            instruction="mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16")
    assert h.dtype == np.float16 and not np.signbit(h).any()


def test_known_values():
    """Hopper FP8: 1 + 2**-14 loses its low bit (F = 13 below the largest term) where a
    correctly rounded FP32 sum keeps it; the result is truncated, not rounded."""
    a = np.zeros((64, 32), np.float32)
    b = np.zeros((32, 8), np.float32)
    a[0, 0], b[0, 0] = 1.0, 1.0
    a[0, 1], b[1, 0] = 2.0 ** -7, 2.0 ** -7
    c = np.zeros((64, 8), np.float32)
    d = mma(a, b, c, arch="hopper", instruction="wgmma.m64n8k32.f32.e4m3.e4m3")
    assert d[0, 0] == 1.0 and d[1, 0] == 0.0
    a[0, 1] = 2.0 ** -6
    d = mma(a, b, c, arch="hopper", instruction="wgmma.m64n8k32.f32.e4m3.e4m3")
    assert d[0, 0] == 1.0 + 2.0 ** -13
    c[0, 0] = np.inf
    a[1, 0] = np.nan
    d = mma(a, b, c, arch="hopper", instruction="wgmma.m64n8k32.f32.e4m3.e4m3")
    assert d[0, 0] == np.inf and d.view(np.int32)[1, 0] == 0x7FFFFFFF


def _args(ins="wgmma.m64n8k32.f32.e4m3.e4m3"):
    i = lookup("hopper", ins)
    return (np.ones((i.m, i.k), np.float32), np.ones((i.k, i.n), np.float32),
            np.zeros((i.m, i.n), np.float32))


@pytest.mark.parametrize("arch,instruction,match", [
    ("pascal", "mma.m16n8k16.f32.bf16.bf16.f32", "arch='pascal' is unknown; accepted: volta"),
    ("ampere", "mma.m16n8k16.f32.bf16.bf16.f33", "unknown or not modelled; accepted on ampere"),
    ("ampere", "wgmma.m64n8k32.f32.e4m3.e4m3", "ampere lacks it .it runs on hopper"),
    ("volta", "mma.m16n8k32.f32.e4m3.e4m3.f32", "volta lacks it .it runs on ada"),
    ("hopper", "wgmma.m64n12k32.f32.e4m3.e4m3", "unknown or not modelled"),
])
def test_refused_instructions(arch, instruction, match):
    a, b, c = _args()
    with pytest.raises(ValueError, match=match):
        mma(a, b, c, arch=arch, instruction=instruction)
    with pytest.raises(TypeError, match="instruction=3 must be a PTX opcode string"):
        mma(a, b, c, arch="hopper", instruction=3)


def test_bool_operands_are_refused_as_quantize_refuses_them():
    a, b, c = _args()
    with pytest.raises(TypeError, match="mma: a is a bool array"):
        mma(a.astype(bool), b, c, arch="hopper", instruction=E4M3)
    with pytest.raises(TypeError, match="mma: b is a bool tensor"):
        mma(a, torch.from_numpy(b.astype(bool)), c, arch="hopper", instruction=E4M3)


def test_refused_shapes():
    a, b, c = _args()
    with pytest.raises(ValueError, match=r"a has shape \(64, 16\); .* shape \(64, 32\)"):
        mma(a[:, :16], b, c, arch="hopper", instruction="wgmma.m64n8k32.f32.e4m3.e4m3")
    with pytest.raises(ValueError, match=r"c has shape \(64, 4\)"):
        mma(a, b, c[:, :4], arch="hopper", instruction="wgmma.m64n8k32.f32.e4m3.e4m3")
    with pytest.raises(ValueError, match=r"b has shape \(8, 32\)"):
        mma(a, b.T, c, arch="hopper", instruction="wgmma.m64n8k32.f32.e4m3.e4m3")


E4M3 = "wgmma.m64n8k32.f32.e4m3.e4m3"


@pytest.mark.parametrize("operand,where,value,ins,match", [
    ("a", (3, 5), 0.3, E4M3, r"a\[3, 5\] = 0.3 is not a value of type e4m3"),
    ("a", (0, 1), np.inf, E4M3, r"a\[0, 1\] = inf .*no inf"),
    ("b", (2, 7), 480.0, E4M3, r"b\[2, 7\] = 480.0 .*largest finite 448"),
    ("b", (1, 4), 1 + 2 ** -8, "wgmma.m64n8k16.f32.bf16.bf16",
     r"b\[1, 4\] = 1.00390625 is not a value of type bf16"),
    ("a", (9, 2), 1 + 2 ** -11, "wgmma.m64n8k8.f32.tf32.tf32",
     r"a\[9, 2\] = 1.00048828125 is not a value of type tf32"),
    ("c", (5, 6), 1 + 2 ** -30, E4M3, r"c\[5, 6\] = 1.0000000009313226 is not a value of type f32"),
    ("c", (0, 0), 70000.0, "wgmma.m64n8k16.f16.f16.f16",
     r"c\[0, 0\] = 70000.0 is not a value of type f16"),
])
def test_refused_values(operand, where, value, ins, match):
    i = lookup("hopper", ins)
    args = {"a": np.ones((i.m, i.k)), "b": np.ones((i.k, i.n)), "c": np.zeros((i.m, i.n))}
    args[operand][where] = value
    before = {k: v.copy() for k, v in args.items()}
    with pytest.raises(ValueError, match=match):
        mma(args["a"], args["b"], args["c"], arch="hopper", instruction=ins)
    for k in args:
        assert np.array_equal(args[k], before[k], equal_nan=True)


RECORDING = pathlib.Path(__file__).parent / "data" / "tensor-cores-h100.npz"


@pytest.mark.parametrize("setting, promote", [("fp8-fast0", 128), ("fp8-fast1", None)])
def test_h100_recording_both_accumulation_settings(setting, promote):
    """``ops.wgmma_matmul``: torch._scaled_mm on an H100, both ``use_fast_accum`` settings,
    every recorded output code for code.  The default's promotion interval, 128 products
    (four wgmma k32 steps, each partial begun from zero and added in float32), is the one
    that fits: 32, 64, 256 and 512 reproduce 46%, 58%, 70% and 70% of it."""
    from lpsim.ops import wgmma_matmul
    data = np.load(RECORDING)
    families = sorted({k.rsplit("/", 1)[0] for k in data.files if k.endswith("/" + setting)})
    assert len(families) == 17
    for family in families:
        a = torch.from_numpy(data[family + "/a"]).view(torch.float8_e4m3fn)
        b = torch.from_numpy(data[family + "/b"]).view(torch.float8_e4m3fn)
        want = torch.from_numpy(data[family + "/" + setting])
        got = wgmma_matmul(a, b, promote=promote)
        same = (codes(got) == codes(want)) | (got.isnan() & want.isnan())
        assert bool(same.all()), f"{family}: {int((~same).sum())} of {want.numel()} differ"


def test_wgmma_matmul_refuses_by_name():
    from lpsim.ops import wgmma_matmul
    a = np.zeros((3, 40), np.float32)
    with pytest.raises(ValueError, match="promote=100 is not accepted"):
        wgmma_matmul(a, np.zeros((40, 5)), promote=100)
    with pytest.raises(ValueError, match="types='e4m3.bf16' is not accepted"):
        wgmma_matmul(a, np.zeros((40, 5)), types="e4m3.bf16")
    with pytest.raises(ValueError, match=r"a \(3, 40\) and b \(41, 5\)"):
        wgmma_matmul(a, np.zeros((41, 5)))
    a[2, 39] = 0.3
    with pytest.raises(ValueError,
                       match=r"wgmma_matmul: a\[2, 39\] = 0.3\d* is not a value of type e4m3"):
        wgmma_matmul(a, np.zeros((40, 5)))
    b = np.zeros((40, 5))
    b[39, 4] = np.float32(1e-30)
    with pytest.raises(ValueError, match=r"wgmma_matmul: b\[39, 4\] = 1\.0\d*e-30 is not a value "):
        wgmma_matmul(np.zeros((3, 40)), b)
    for shape_a, shape_b in (((0, 40), (40, 5)), ((3, 0), (0, 5)), ((3, 40), (40, 0))):
        got = wgmma_matmul(np.zeros(shape_a), np.zeros(shape_b))    # empty sums are +0
        assert got.dtype == np.float32 and got.shape == (shape_a[0], shape_b[1])
        assert not got.view(np.int32).any()


def test_complex_operands_are_refused_not_truncated():
    """A complex operand's imaginary part would be dropped: refused, numpy and torch."""
    ins = "wgmma.m64n8k32.f32.e4m3.e4m3"
    a, b, c = np.ones((64, 32), np.complex64), np.ones((32, 8)), np.zeros((64, 8))
    with pytest.raises(ValueError, match="a must be .* real numbers, not ndarray"):
        mma(a, b, c, arch="hopper", instruction=ins)
    with pytest.raises(ValueError, match=r"a is a complex tensor \(torch.complex64\)"):
        mma(torch.from_numpy(a), b, c, arch="hopper", instruction=ins)
