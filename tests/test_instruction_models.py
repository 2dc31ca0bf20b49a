"""GEMM models built from one tensor-core instruction (lpsim.ops.InstructionModel) in
lpsim.ops.matmul: equal to the instruction chained by hand through lpsim.ops.mma (itself
equal to MMA-Sim, tests/test_mma.py), to the H100's recorded torch._scaled_mm outputs, and
refusing what they cannot take by name."""

import pathlib
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lpsim import RoundingStats, quantize                    # noqa: E402
from lpsim.ops import (HARDWARE_MODELS, INSTRUCTION_MODELS, InstructionModel,  # noqa: E402
                       matmul, mma, wgmma_matmul)
from lpsim.ops.mma_table import (FORMATS, code_values, instructions, lookup,  # noqa: E402
                                  random_codes)

RECORDING = pathlib.Path(__file__).parent / "data" / "tensor-cores-h100.npz"


def codes(x):
    x = torch.as_tensor(x)
    return x.view(torch.int16 if x.dtype == torch.float16 else torch.int32)


def chained_by_hand(a, b, arch, instruction, promote):
    """a @ b as instruction calls of lpsim.ops.mma along K, D fed back as C, K padded with
    zeros; every ``promote`` products the chain's D added to a float32 accumulator."""
    ins = lookup(arch, instruction)
    m, k = a.shape
    kp = -(-k // ins.k) * ins.k
    A = torch.zeros((m, kp), dtype=torch.float32)
    B = torch.zeros((kp, ins.n), dtype=torch.float32)
    A[:, :k], B[:k] = a.float(), b.float()
    step = kp if promote is None else promote
    zero = torch.zeros((m, ins.n), dtype=torch.float16 if ins.c_type == "f16"
                       else torch.float32)
    acc = np.zeros((m, ins.n), np.float32)
    for p0 in range(0, kp, step):
        d = zero
        for k0 in range(p0, min(p0 + step, kp), ins.k):
            d = mma(A[:, k0:k0 + ins.k], B[k0:k0 + ins.k], d, arch=arch, instruction=instruction)
        if promote is None:
            return d
        with np.errstate(invalid="ignore", over="ignore"):    # IEEE float32 sums
            acc = acc + d.numpy()
    acc = torch.from_numpy(acc)
    acc[acc.isnan()] = float("nan")
    return acc


# one instruction per (arch, opcode, types): the n of wgmma does not change a value
# (tcgen05's kind::f8f6f4 with both operands of one type: the chaining does not depend on
# the pair, and tests/test_mma.py checks every pair's instruction against mmasim)
CASES = [(arch, ins) for arch, ins in instructions(16)
         if lookup(arch, ins).c_type == lookup(arch, ins).d_type and not lookup(arch, ins).block
         and ("f8f6f4" not in ins or lookup(arch, ins).a_type == lookup(arch, ins).b_type)]


@pytest.mark.parametrize("arch,instruction", CASES)
def test_model_equals_the_instruction_chained_by_hand(arch, instruction):
    """Random codes of the types (NaN, inf, subnormals and zeros included), and normal
    values rounded to the types (the finite path throughout), along a K of three
    instructions and a ragged rest: every output code, without and with promotion."""
    ins = lookup(arch, instruction)
    rng = np.random.default_rng(zlib.crc32(f"{arch} {instruction}".encode()))
    k = 3 * ins.k + ins.k // 2 + 1

    def normal(shape, ptx_type):
        x = rng.standard_normal(shape).astype(np.float32)
        return torch.from_numpy(quantize(x, FORMATS[ptx_type]))

    draws = [(code_values(random_codes((ins.m, k), ins.a_type, rng, 0.1), ins.a_type),
              code_values(random_codes((k, ins.n), ins.b_type, rng, 0.1), ins.b_type)),
             (normal((ins.m, k), ins.a_type), normal((k, ins.n), ins.b_type))]
    promotes = (None, 2 * ins.k) if ins.d_type == "f32" else (None,)
    for (a, b), promote in [(d, p) for d in draws for p in promotes]:
        model = InstructionModel(arch, instruction, promote)
        got = matmul(a.float(), b.float(), model=model)
        want = chained_by_hand(a, b, arch, instruction, promote).float()
        assert got.dtype == torch.float32 and got.shape == want.shape
        same = (codes(got) == codes(want)) | (got.isnan() & want.isnan())
        assert bool(same.all()), (f"{arch} {instruction} promote={promote}: "
                                  f"{int((~same).sum())} of {same.numel()} differ")


@pytest.mark.parametrize("setting, name", [("fp8-fast0", "hopper-wgmma-e4m3-promote128"),
                                           ("fp8-fast1", "hopper-wgmma-e4m3")])
def test_named_models_reproduce_the_h100_recording(setting, name):
    """matmul with the named models gives every output torch._scaled_mm gave on an H100, in
    both use_fast_accum settings, as wgmma_matmul does (test_mma.py)."""
    data = np.load(RECORDING)
    families = sorted({k.rsplit("/", 1)[0] for k in data.files if k.endswith("/" + setting)})
    assert len(families) == 17
    for family in families:
        a = torch.from_numpy(data[family + "/a"]).view(torch.float8_e4m3fn).float().numpy()
        b = torch.from_numpy(data[family + "/b"]).view(torch.float8_e4m3fn).float().numpy()
        want = data[family + "/" + setting]
        got = matmul(a, b, model=name)
        assert got.dtype == np.float32
        same = (got.view(np.int32) == want.view(np.int32)) | (np.isnan(got) & np.isnan(want))
        assert bool(same.all()), f"{family}: {int((~same).sum())} of {want.size} differ"


def test_inputs_and_output_are_rounded_and_counted():
    """Inputs rounded to the instruction's types with the model's rounding, the float32
    result rounded to out_fmt; stats count those roundings, one each."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 70)).astype(np.float32)
    b = rng.standard_normal((70, 3)).astype(np.float32)
    stats = RoundingStats()
    got = matmul(a, b, model="hopper-wgmma-e4m3", out_fmt="bf16", stats=stats)
    qa, qb = quantize(a, "e4m3fn"), quantize(b, "e4m3fn")
    want = quantize(wgmma_matmul(qa, qb, promote=None), "bf16")
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert stats.elements == a.size + b.size + got.size
    vec = matmul(a[0], b, model="hopper-wgmma-e4m3-promote128")    # 1-D as numpy.matmul
    assert vec.shape == (3,) and np.array_equal(
        vec, wgmma_matmul(qa[:1], qb)[0])
    half = matmul(a.astype(np.float64), b, model="ampere-mma-fp16-fp16")
    assert half.dtype == np.float64
    # torch's 8-bit floats are values like any other (exact in float32)
    a8 = torch.from_numpy(qa).to(torch.float8_e4m3fn)
    got8 = matmul(a8, torch.from_numpy(qb), model="hopper-wgmma-e4m3")
    assert np.array_equal(got8.numpy(), wgmma_matmul(qa, qb, promote=None))
    # an interval longer than any K promotes once, at the end: the chain's own result
    once = InstructionModel("hopper", "wgmma.m64n8k32.f32.e4m3.e4m3", 2 ** 70)
    assert np.array_equal(matmul(a, b, model=once), matmul(a, b, model="hopper-wgmma-e4m3"))


@pytest.mark.parametrize("model,bfmt,instruction,bits", [
    ("blackwell-mxfp8", "mxfp8_e4m3",
     "tcgen05.mma.m128n8k32.kind::mxf8f6f4.block32.f32.e4m3.e4m3.ue8m0", 20),
    ("blackwell-mxfp4", "mxfp4", "tcgen05.mma.m128n8k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0",
     20),
    ("blackwell-nvfp4", "nvfp4",
     "tcgen05.mma.m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3", 20)])
def test_block_scaled_model_equals_block_quantization_and_the_instruction_by_hand(
        model, bfmt, instruction, bits):
    """A block-scaled model: a and b in the instruction's blocks along K (lpsim.blocks), then
    the instruction chained along K with each block's scales, K ragged (padded with zero
    elements whose scale is 1); NVFP4's two FP32 tensor scales then multiply D as the
    epilogue's float32 alpha."""
    from lpsim.blocks import quantize_blocks
    rng = np.random.default_rng(11)
    ins = lookup("blackwell", instruction)
    k = 3 * ins.k + 7
    a = (rng.standard_normal((128, k)) * np.exp2(rng.integers(-6, 7, (128, 1)))).astype(
        np.float32)
    b = rng.standard_normal((k, 8)).astype(np.float32)
    stats = RoundingStats()
    got = matmul(a, b, model=model, stats=stats)
    qa = quantize_blocks(a, bfmt, axis=1)
    qb = quantize_blocks(b, bfmt, axis=0)
    kp = 4 * ins.k
    A = np.zeros((128, kp), np.float32)
    B = np.zeros((kp, 8), np.float32)
    A[:, :k], B[:k] = qa.elements, qb.elements.T        # along axis 0: that axis last
    sa, sb = np.ones((128, kp // ins.block)), np.ones((kp // ins.block, 8))
    sa[:, :qa.scales.shape[1]], sb[:qb.scales.shape[1]] = qa.scales, qb.scales.T
    d = np.zeros((128, 8), np.float32)
    per = ins.k // ins.block
    for step in range(4):
        d = mma(A[:, ins.k * step:ins.k * (step + 1)], B[ins.k * step:ins.k * (step + 1)], d,
                arch="blackwell", instruction=instruction,
                scale_a=sa[:, per * step:per * (step + 1)],
                scale_b=sb[per * step:per * (step + 1)])
    alpha = np.float32(qa.tensor_scale * qb.tensor_scale)
    assert (alpha == 1.0) == (bfmt != "nvfp4")
    d = d * alpha
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), d.view(np.int32))
    assert stats.elements == a.size + b.size + got.size
    # the values the blocks hold, through an exact product, are close: the chain keeps 25
    # (FP8) or 35 (FP4) fraction bits per node
    exact = qa.values.astype(np.float64) @ qb.values
    scale = np.abs(qa.values.astype(np.float64)) @ np.abs(qb.values)
    assert np.max(np.abs(got - exact) / scale) < 2.0 ** -bits


@pytest.mark.parametrize("model", ["blackwell-mxfp8", "blackwell-mxfp4", "blackwell-nvfp4"])
def test_block_scaled_model_with_nan_and_inf_inputs(model):
    """A NaN or inf input makes its block's scale NaN, and the instruction makes every
    output that block reaches NaN (the hardware's code); FP4 and FP6 elements, which hold no
    NaN, are not refused for it.  Other outputs stay exact."""
    a = np.ones((3, 40), np.float32)
    a[0, 3], a[1, 35] = np.nan, -np.inf
    b = np.ones((40, 2), np.float32)
    got = matmul(a, b, model=model)
    assert (got.view(np.int32)[:2] == 0x7FFFFFFF).all()
    assert (got[2] == 40.0).all()


def _deepgemm_cast(x, tile):
    """DeepGEMM's per_token_cast_to_fp8 (tile 1) and per_block_cast_to_fp8 (tile 128), as its
    tests write them, on a float32 tensor whose sizes are whole blocks."""
    r, k = x.shape
    view = x.view(r // tile, tile, k // 128, 128)
    amax = view.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = (view * (448.0 / amax)).to(torch.float8_e4m3fn).view(r, k)
    return q, (amax / 448.0).view(r // tile, k // 128)


def _fma32(a, b, c):
    """fl32(a * b + c) with one rounding to nearest even, from the exact sum (Fractions)."""
    from fractions import Fraction
    v = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if v == 0:
        return np.float32(0.0)
    sign, v = (-1 if v < 0 else 1), abs(v)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    e += 1 if Fraction(2) ** (e + 1) <= v else (-1 if Fraction(2) ** e > v else 0)
    q = v / Fraction(2) ** (max(e, -126) - 23)
    n, rest = divmod(q.numerator, q.denominator)
    n += 2 * rest > q.denominator or (2 * rest == q.denominator and n % 2)
    return np.float32(sign * n * 2.0 ** (max(e, -126) - 23))


def test_fma32_rounds_once():
    """(1 + 2**-12)**2 is a float32 midpoint: with +-2**-80 the exact sum lies just above or
    below it, which float64 rounds away (then float32 rounds the tie to even); one rounding
    goes up or down.  Then random cases, cancellations included, against Fractions."""
    from lpsim.ops.mma import fma32
    a = 1 + 2.0 ** -12
    assert np.float32(fma32(a, a, 2.0 ** -80)) == np.float32(1 + 2.0 ** -11 + 2.0 ** -23)
    assert np.float32(fma32(a, a, -2.0 ** -80)) == np.float32(1 + 2.0 ** -11)
    assert np.float32(a * a + 2.0 ** -80) == np.float32(1 + 2.0 ** -11)   # two roundings
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 2000)) * np.exp2(rng.integers(-40, 40, (3, 2000)))).astype(
        np.float32)
    x[2, ::2] = -(x[0, ::2].astype(np.float64) * x[1, ::2]).astype(np.float32)
    for p, q, c in x.T:
        assert np.float32(fma32(float(p), float(q), float(c))) == _fma32(p, q, c), (p, q, c)


def test_deepgemm_model_equals_its_casts_and_promotions_by_hand():
    """hopper-deepgemm-e4m3: DeepGEMM's casts (written here in torch), the wgmma chain over
    each 128 of K from zero (through ops.mma), and final = fma(fl32(sa sb), partial, final)
    rounded once (Fractions), then BF16: code for code, with K and N not whole blocks and
    rows and tiles of very different magnitudes."""
    rng = np.random.default_rng(5)
    m, k, n = 64, 300, 136
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-12, 12, (m, 1)))).astype(
        np.float32)
    b = (rng.standard_normal((k, n)) * np.exp2(rng.integers(-9, 9, (1, n)))).astype(
        np.float32)
    a[3, 17] = 0.0
    got = matmul(a, b, model="hopper-deepgemm-e4m3")
    ta = torch.zeros((m, 384))
    ta[:, :k] = torch.from_numpy(a)
    tb = torch.zeros((256, 384))               # B's transpose (N x K), DeepGEMM's layout
    tb[:n, :k] = torch.from_numpy(b.T)
    qa, sa = _deepgemm_cast(ta, 1)
    qb, sb = _deepgemm_cast(tb, 128)
    final = np.zeros((m, n), np.float32)
    ins = f"wgmma.m64n{n}k32.f32.e4m3.e4m3"
    for kb in range(3):
        part = chained_by_hand(qa[:, 128 * kb:128 * kb + 128].float(),
                               qb[:n, 128 * kb:128 * kb + 128].float().T, "hopper", ins,
                               None).numpy()
        for i in range(m):
            for j in range(n):
                scale = np.float32(sa[i, kb].item() * sb[j // 128, kb].item())
                final[i, j] = _fma32(scale, part[i, j], final[i, j])
    want = torch.from_numpy(final).to(torch.bfloat16).float().numpy()
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    # before the BF16 output, where one FFMA against a multiply and an add shows
    fp32 = INSTRUCTION_MODELS["hopper-deepgemm-e4m3"].with_(out_fmt="fp32")
    assert np.array_equal(matmul(a, b, model=fp32).view(np.int32), final.view(np.int32))
    with pytest.raises(ValueError, match="scale_blocks=64 is not accepted with promote=128"):
        InstructionModel("hopper", "wgmma.m64n8k32.f32.e4m3.e4m3", 128, scale_blocks=64)
    with pytest.raises(ValueError, match="scale_blocks=32 is not accepted .* FP8 instruction"):
        InstructionModel("hopper", "wgmma.m64n8k16.f32.bf16.bf16", 32, scale_blocks=32)


def test_every_named_instruction_model_is_listed_with_a_description():
    """INSTRUCTION_MODELS holds InstructionModels only, HARDWARE_MODELS TensorCoreModels
    only (code that walks it reads their chunk fields), and no name is in both."""
    assert {"hopper-wgmma-e4m3", "hopper-wgmma-e4m3-promote128", "ampere-mma-bf16",
            "blackwell-tcgen05-e4m3"} <= set(INSTRUCTION_MODELS)
    assert not set(INSTRUCTION_MODELS) & set(HARDWARE_MODELS)
    assert not any(isinstance(m, InstructionModel) for m in HARDWARE_MODELS.values())
    for name, model in INSTRUCTION_MODELS.items():
        assert isinstance(model, InstructionModel) and model.description, name
        assert model.spec.arch == model.arch, name


def test_refused_by_name_and_nothing_changes():
    a = np.ones((4, 32), np.float32)
    b = np.ones((32, 8), np.float32)
    before = (a.copy(), b.copy())
    for keyword, value in (("in_fmt", "bf16"), ("acc_fmt", "fp16"), ("fused", False),
                           ("order", "pairwise"), ("acc_rounding", "up")):
        with pytest.raises(ValueError, match=f"{keyword}=.* is not accepted with the "
                                             "instruction model 'hopper-wgmma-e4m3'"):
            matmul(a, b, model="hopper-wgmma-e4m3", **{keyword: value})
    assert np.array_equal(a, before[0]) and np.array_equal(b, before[1])
    with pytest.raises(ValueError, match="promote=48 is not accepted .* multiple of its k=32"):
        InstructionModel("hopper", "wgmma.m64n8k32.f32.e4m3.e4m3", 48)
    with pytest.raises(ValueError, match="promote=True is not accepted"):
        InstructionModel("hopper", "wgmma.m64n8k32.f32.e4m3.e4m3", True)
    with pytest.raises(ValueError, match="promote=32 is not accepted .* its result is f16"):
        InstructionModel("ampere", "mma.m16n8k16.f16.f16.f16.f16", 32)
    with pytest.raises(ValueError, match=r"its D \(f32\) cannot be fed back as its C \(f16\)"):
        InstructionModel("volta", "mma.m8n8k4.f32.f16.f16.f16")
    with pytest.raises(ValueError, match="wgmma"):
        InstructionModel("ampere", "wgmma.m64n8k32.f32.e4m3.e4m3")
    with pytest.raises(ValueError, match="unknown rounding 'sideways'"):
        InstructionModel("hopper", "wgmma.m64n8k32.f32.e4m3.e4m3", out_rounding="sideways")
    with pytest.raises(TypeError, match="unknown model fields"):
        INSTRUCTION_MODELS["hopper-wgmma-e4m3"].with_(chunk=16)
    fp4 = "tcgen05.mma.m64n8k32.kind::f8f6f4.f32.e2m1.e2m1"
    for value, why in ((np.nan, "nan is not a value of type e2m1; accepted: .* no inf, no NaN"),
                       (1.25, "1.25 is not a value of type e2m1")):
        x = np.full((64, 32), 1.5, np.float32)
        x[3, 4] = value
        with pytest.raises(ValueError, match=r"a\[3, 4\] = " + why):
            mma(x, np.ones((32, 8), np.float32), np.zeros((64, 8), np.float32),
                arch="blackwell", instruction=fp4)
    blocked = "tcgen05.mma.m128n8k32.kind::mxf8f6f4.block32.f32.e4m3.e4m3.ue8m0"
    x, y, z = np.ones((128, 32)), np.ones((32, 8)), np.zeros((128, 8))
    with pytest.raises(ValueError, match="takes scale_a and scale_b"):
        mma(x, y, z, arch="blackwell", instruction=blocked)
    with pytest.raises(ValueError, match="takes no scale_a or scale_b"):
        mma(np.ones((64, 32)), y, np.zeros((64, 8)), arch="blackwell", instruction=fp4,
            scale_a=np.ones((64, 1)))
    for scale, why in ((3.0, r"scale_a\[5, 0\] = 3.0 is not an E8M0 scale"),
                       (2.0 ** 128, r"scale_a\[5, 0\] = 3.40\d*e\+38 is not an E8M0")):
        sa = np.ones((128, 1))
        sa[5, 0] = scale
        with pytest.raises(ValueError, match=why):
            mma(x, y, z, arch="blackwell", instruction=blocked, scale_a=sa,
                scale_b=np.ones((1, 8)))
    with pytest.raises(ValueError, match=r"scale_b has shape \(8, 1\); accepted: \(1, 8\)"):
        mma(x, y, z, arch="blackwell", instruction=blocked, scale_a=np.ones((128, 1)),
            scale_b=np.ones((8, 1)))
    with pytest.raises(ValueError, match=r"shapes \(4, 32\) and \(31, 8\)"):
        matmul(a, np.ones((31, 8), np.float32), model="hopper-wgmma-e4m3")
    assert InstructionModel("hopper", "wgmma.m64n8k32.f32.e4m3.e4m3",
                            np.int64(64)).promote == 64


def test_a_recipe_takes_an_instruction_model_its_operands_fit_and_refuses_others():
    """An operand the instruction cannot take as it is (another element type, the model
    quantizing its own inputs) is refused by field; a fitting one is accepted."""
    from lpsim.torch.recipes import Gemm, Operand
    Gemm(Operand("e4m3fn"), Operand("e4m3fn", scaling="current"),
         accumulate="hopper-wgmma-e4m3")
    with pytest.raises(ValueError, match=r"a.fmt=e5m2 does not fit "
                                         r"accumulate='hopper-wgmma-e4m3' .*its A operand is "
                                         r"e4m3\); accepted: the element format e4m3fn"):
        Gemm(Operand("e5m2"), Operand("e4m3fn"), accumulate="hopper-wgmma-e4m3")
    with pytest.raises(ValueError, match="scale_blocks=128 quantizes its own inputs"):
        Gemm(Operand("e4m3fn"), Operand("e4m3fn"), accumulate="hopper-deepgemm-e4m3")


def test_scaled_matmul_takes_the_decomposed_operands_and_refuses_by_name():
    """scaled_matmul on a block quantization's elements and scales is matmul with the model
    (which decomposes its own inputs); alpha multiplies once in float32; shapes, scales and
    models it cannot take are refused by name."""
    from lpsim.blocks import quantize_blocks
    from lpsim.ops import scaled_matmul
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 70)).astype(np.float32)
    b = rng.standard_normal((70, 4)).astype(np.float32)
    qa, qb = quantize_blocks(a, "nvfp4", axis=1), quantize_blocks(b, "nvfp4", axis=0)
    alpha = qa.tensor_scale * qb.tensor_scale
    got = scaled_matmul(qa.elements, qa.scales, qb.elements.T, qb.scales.T, "blackwell-nvfp4",
                        alpha)
    assert np.array_equal(got, matmul(a, b, model="blackwell-nvfp4"))
    plain = scaled_matmul(qa.elements, qa.scales, qb.elements.T, qb.scales.T,
                          "blackwell-nvfp4")
    assert np.array_equal(got, plain * np.float32(alpha))
    e4 = quantize(a, "e4m3fn")
    assert np.array_equal(scaled_matmul(e4, None, quantize(b, "e4m3fn"), None,
                                        "hopper-wgmma-e4m3", 0.5),
                          matmul(e4, b, model="hopper-wgmma-e4m3") * np.float32(0.5))
    refusals = [((qa.elements, qa.scales[:, :2], qb.elements.T, qb.scales.T,
                  "blackwell-nvfp4"), "sa has shape"),
                ((qa.elements, qa.scales, qb.elements, qb.scales.T, "blackwell-nvfp4"),
                 "qb (K x N)"),
                ((qa.elements, None, qb.elements.T, qb.scales.T, "blackwell-nvfp4"),
                 "sa is None"),
                ((e4, e4[:, :1], e4.T, None, "hopper-wgmma-e4m3"), "sa=None"),
                ((e4, None, e4.T, None, "hopper-deepgemm-e4m3"), "scale_blocks"),
                ((e4, None, e4.T, None, "no-such-model"), "model='no-such-model'"),
                ((a, None, b, None, "hopper-wgmma-e4m3"), "scaled_matmul"),
                # the caller's names, not mma's ("a[0, 0]", "mma: scale_a[0, 0]")
                ((np.full((2, 32), 1.01), np.ones((2, 1)), np.ones((32, 2)), np.ones((1, 2)),
                  "blackwell-mxfp8"), r"scaled_matmul: qa\[0, 0\] = 1\.01 is not a value"),
                ((np.ones((2, 32)), np.full((2, 1), 3.0), np.ones((32, 2)), np.ones((1, 2)),
                  "blackwell-mxfp8"), r"scaled_matmul: sa\[0, 0\] = 3\.0 is not an E8M0 scale")]
    for args, words in refusals:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            scaled_matmul(*args)


@pytest.mark.parametrize("out_fmt", ["fp64", "fp(8,30)"])
def test_an_out_fmt_wider_than_float32_rounds_the_chain_result_in_float64(out_fmt):
    # the chain's D is float32; rounded to a wider format in float64, it comes back float64
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 64)), rng.standard_normal((64, 5))
    for x, y in ((a.astype(np.float32), b.astype(np.float32)), (a, b)):
        got = matmul(x, y, model="hopper-wgmma-e4m3", out_fmt=out_fmt)
        d = matmul(x, y, model="hopper-wgmma-e4m3")      # D, exact in float32
        assert got.dtype == np.float64
        assert np.array_equal(got, quantize(d.astype(np.float64), out_fmt))
