"""A recipe's GEMMs on a tensor-core instruction (Gemm(accumulate=InstructionModel)): forward
and backward equal, bit for bit, the composition written here by hand (each operand's
elements and scales from lpsim.blocks.quantize_blocks or the per-tensor cast, the instruction
chained along K through lpsim.ops.mma tile by tile, the per-tensor factors as a float32
alpha, then bias and BF16); the fake-quantized values and telemetry are those of the
recipe without the instruction; operands the instruction cannot take are refused by field;
and rounding the fake-quantized values again, the shortcut, gives other results."""

import dataclasses

import numpy as np
import pytest

import lpsim

torch = pytest.importorskip("torch")

from lpsim.blocks import BlockFormat, block, quantize_blocks  # noqa: E402
from lpsim.ops import INSTRUCTION_MODELS, matmul, mma  # noqa: E402
from lpsim.ops.mma_table import lookup  # noqa: E402
from lpsim.torch import PRESETS, Gemm  # noqa: E402
from lpsim.torch.gemms import gemm, quantize_operand, quantize_parts, tensor_scale  # noqa: E402
from lpsim.torch.recipes import GEMMS  # noqa: E402

from test_torch_recipes import SEED, equal_over_steps, hand_rht, layer_and_data  # noqa: E402

#: K of 160, 64 and 96: ragged for the k64 instructions, promoted at 128 by Hopper's
DIMS = dict(in_f=160, out_f=64, tokens=96)


def with_instructions(recipe, fprop, dgrad=None, wgrad=None):
    """The recipe with each GEMM's accumulate set to an instruction model's name."""
    names = {"fprop": fprop, "dgrad": dgrad or fprop, "wgrad": wgrad or dgrad or fprop}
    return recipe.with_(**{g: dataclasses.replace(getattr(recipe, g), accumulate=names[g])
                           for g in GEMMS})


RECIPES = {
    "mxfp8": with_instructions(PRESETS["mxfp8"], "blackwell-mxfp8"),
    "mxfp4": with_instructions(PRESETS["mxfp4"], "blackwell-mxfp4"),
    "nvfp4": with_instructions(PRESETS["nvfp4"], "blackwell-nvfp4"),
    "fp8_current": with_instructions(PRESETS["fp8_current"], "hopper-wgmma-e4m3-promote128",
                                     "hopper-wgmma-e5m2-e4m3-promote128"),
}


# --- the composition, by hand -------------------------------------------------------------

def parts_by_hand(t, op, axis, g):
    """One operand quantized as the recipe says, by hand: (elements, the scale of each
    element or None, the per-tensor factor), in t's layout."""
    t = t.detach().float()
    fmt = op.fmt

    def blocks(x, bfmt):            # along x's last axis, with the generator's counters
        x = np.ascontiguousarray(x.numpy())
        seed, offset = g.take(x.size, 4) if op.rounding == "stochastic" else (SEED, 0)
        return quantize_blocks(x, bfmt, op.rounding, seed=seed, offset=offset)

    if isinstance(fmt, BlockFormat) and op.blocks_2d:
        k = fmt.block
        r, c = t.shape
        tiles = t.reshape(r // k, k, c // k, k).transpose(1, 2).reshape(r // k, c // k, k * k)
        q = blocks(tiles, block(fmt.element, k * k, fmt.scale, fmt.rule,
                                tensor_scale=fmt.tensor_scale))
        elements = q.elements.reshape(r // k, c // k, k, k).transpose(0, 2, 1, 3).reshape(r, c)
        scales = np.kron(q.scales.reshape(r // k, c // k), np.ones((k, k)))
        return elements, scales, q.tensor_scale
    if isinstance(fmt, BlockFormat):
        q = blocks(t if axis == -1 else t.t(), fmt)
        scales = np.repeat(q.scales, fmt.block, axis=1)
        return (q.elements, scales, q.tensor_scale) if axis == -1 else \
            (q.elements.T, scales.T, q.tensor_scale)
    amax = float(t.abs().max())
    s = np.float32(np.float32(fmt.max_finite) / np.float32(amax))
    q = lpsim.quantize(t * float(s), fmt, op.rounding, generator=g)
    return q.numpy().astype(np.float64), None, float(np.float32(1) / s)


def chain_by_hand(a, b, model):
    """a @ b (each (elements, per-element scales, factor); a M x K, b K x N) as the model's
    instruction, in its n = 8 form, called through lpsim.ops.mma on every 8-column and
    m-row tile, along K (zero elements of scale 1 pad M, N and K), promoted every
    ``promote`` products to a float32 sum; D times the factors' product in float32."""
    model = INSTRUCTION_MODELS[model] if isinstance(model, str) else model
    instruction = model.instruction.replace("n256", "n8")
    ins = lookup(model.arch, instruction)
    (A, SA, fa), (B, SB, fb) = a, b
    (m, k), n = A.shape, B.shape[1]
    mp, npad, kp = (-(-m // ins.m) * ins.m, -(-n // ins.n) * ins.n, -(-k // ins.k) * ins.k)
    AP, BP = np.zeros((mp, kp)), np.zeros((kp, npad))
    AP[:m, :k], BP[:k, :n] = A, B
    if ins.block:
        SAP, SBP = np.ones((mp, kp)), np.ones((kp, npad))
        SAP[:m, :k], SBP[:k, :n] = SA, SB
        SAP, SBP = SAP[:, ::ins.block], SBP[::ins.block]
    per = ins.k // ins.block if ins.block else 0
    step = kp if model.promote is None else model.promote
    D = np.zeros((mp, npad), np.float32)
    for i in range(0, mp, ins.m):
        for j in range(0, npad, ins.n):
            acc = np.zeros((ins.m, ins.n), np.float32)
            for p0 in range(0, kp, step):
                d = np.zeros((ins.m, ins.n), np.float32)
                for k0 in range(p0, min(p0 + step, kp), ins.k):
                    scales = dict(scale_a=SAP[i:i + ins.m, k0 // ins.block:][:, :per],
                                  scale_b=SBP[k0 // ins.block:][:per, j:j + ins.n]) \
                        if ins.block else {}
                    d = mma(AP[i:i + ins.m, k0:k0 + ins.k], BP[k0:k0 + ins.k, j:j + ins.n],
                            d, arch=model.arch, instruction=instruction, **scales)
                acc = d if model.promote is None else acc + d
            D[i:i + ins.m, j:j + ins.n] = acc
    return torch.from_numpy(D[:m, :n] * np.float32(fa * fb))


def transposed(p):
    return p[0].T, None if p[1] is None else p[1].T, p[2]


class Hand:
    """The recipe's three GEMMs by hand, in the layer's order of random draws."""

    def __init__(self, recipe):
        self.r, self.step, self.g = recipe, 0, lpsim.Generator(SEED)

    def q(self, t, gemm, role, axis):
        g = getattr(self.r, gemm)
        return parts_by_hand(t, g.a if role == GEMMS[gemm][0] else g.b, axis, self.g)

    def out(self, a, b, gemm, bias=None):
        y = chain_by_hand(a, b, getattr(self.r, gemm).accumulate)
        return lpsim.quantize(y if bias is None else y + bias.detach(), "bf16")

    def forward(self, x, w, b):
        self.w = self.q(w, "fprop", "w", -1)
        return self.out(self.q(x, "fprop", "x", -1), transposed(self.w), "fprop", b)

    def backward(self, x, w, dy):
        r = self.r
        dyq = self.q(dy, "dgrad", "dy", -1)
        wq = self.w if r.dgrad.b.blocks_2d else self.q(w, "dgrad", "w", 0)
        dx = self.out(dyq, wq, "dgrad")
        dyw, xw = dy, x.detach().float()
        if r.rht:
            dyw, xw = hand_rht(dyw, self.step, r.rht), hand_rht(xw, self.step, r.rht)
        dw = self.out(self.q(dyw.t(), "wgrad", "dy", -1),
                      self.q(xw, "wgrad", "x", 0), "wgrad")
        self.step += 1
        return dx, dw, dy.sum(0)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_instruction_gemms_equal_their_composition_by_hand(name):
    """y, dX, dW and db over two steps (fresh SR counters, RHT signs per step)."""
    equal_over_steps(RECIPES[name], "cpu", steps=2, hand=Hand, **DIMS)


@pytest.mark.parametrize("name", ["nvfp4", "fp8_current"])
def test_values_draws_and_telemetry_are_the_recipes_own(name):
    """Keeping the parts leaves the fake-quantized values, the generator's counters and the
    telemetry as the recipe without an instruction has them; the parts give the values back."""
    with_parts, x, dy = layer_and_data(RECIPES[name], "cpu", **DIMS)
    without, _, _ = layer_and_data(PRESETS[name], "cpu", **DIMS)
    for layer in (with_parts, without):
        layer(x).backward(dy)
    assert with_parts.generator.get_state() == without.generator.get_state()
    for key, stats in without.telemetry.items():
        assert with_parts.telemetry[key].as_dict() == stats.as_dict(), key
    for op, axis in ((PRESETS[name].fprop.b, -1), (PRESETS[name].wgrad.a, 0)):
        g1, g2 = lpsim.Generator(7), lpsim.Generator(7)
        values = quantize_operand(x, op, axis, generator=g1)
        kept, parts = quantize_parts(x, op, axis, generator=g2)
        assert torch.equal(values, kept) and g1.get_state() == g2.get_state()
        if parts.scales is None:        # per-tensor: the values are fl32(q / s)
            s = tensor_scale(float(x.detach().abs().max()), op.fmt)
            assert parts.factor == np.float32(1) / np.float32(s)
            back = (parts.elements / s).astype(np.float32)
        else:
            scales = np.kron(parts.scales, np.ones(parts.tile))
            back = (parts.elements * scales * parts.factor).astype(np.float32)
        assert np.array_equal(back, values.numpy())


def test_an_instruction_that_does_not_fit_is_refused_by_field():
    mx = PRESETS["mxfp8"]
    with pytest.raises(ValueError, match=r"a\.fmt=block\(e4m3fn, 32.*blackwell-nvfp4.*e2m1fn "
                                         r"elements in blocks of 16 with e4m3fn"):
        Gemm(mx.fprop.a, mx.fprop.b, accumulate="blackwell-nvfp4")
    fp8 = PRESETS["fp8_current"]
    with pytest.raises(ValueError, match=r"a\.fmt=.*scaling='current'.*hopper-wgmma-e4m3.*"
                                         r"e4m3fn with scaling"):
        Gemm(fp8.dgrad.a, fp8.dgrad.b, accumulate="hopper-wgmma-e4m3")
    with pytest.raises(ValueError, match="scale_blocks"):
        Gemm(fp8.fprop.a, fp8.fprop.b, accumulate="hopper-deepgemm-e4m3")
    bf16 = INSTRUCTION_MODELS["hopper-wgmma-e4m3"].with_(out_fmt="bf16")
    with pytest.raises(ValueError, match="out_fmt=bf16"):
        Gemm(fp8.fprop.a, fp8.fprop.b, accumulate=bf16)
    with pytest.raises(ValueError, match="wgrad.*does not fit|does not fit"):
        mx.with_(wgrad=dataclasses.replace(mx.wgrad, accumulate="blackwell-mxfp4"))
    # a refused recipe changes nothing: the preset still runs as before
    assert mx.wgrad.accumulate is None
    assert Gemm(PRESETS["bf16"].fprop.a, PRESETS["bf16"].fprop.b,
                accumulate="hopper-wgmma-bf16").accumulate == INSTRUCTION_MODELS[
                    "hopper-wgmma-bf16"]


def test_rounding_the_fake_quantized_values_again_gives_other_results():
    """The shortcut (the instruction model on the values q * s) is not the hardware's GEMM:
    blocks whose largest element the RCEIL rule makes 224 hold the same values as blocks of
    the OCP rule's scale s / 2 and elements times 2, and with subnormal elements the
    tensor core's sums differ.  The carried parts give the instruction's result by hand."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((16, 64)) * np.exp2(rng.integers(-14, 2, (16, 64))))
    a[:, ::32] = rng.choice([-1, 1], (16, 2)) * 225 * rng.uniform(1.0, 1.02, (16, 2))
    b = rng.standard_normal((8, 64)) * np.exp2(rng.integers(-2, 3, (8, 64)))
    x, w = (torch.tensor(v, dtype=torch.float32) for v in (a, b))
    spec = RECIPES["mxfp8"].fprop
    xq, xp = quantize_parts(x, spec.a, -1)
    wq, wp = quantize_parts(w, spec.b, -1)
    carried = gemm(xq, wq.t(), dataclasses.replace(spec, out=None), parts=(xp, wp.t()))
    shortcut = torch.from_numpy(matmul(xq.numpy(), np.ascontiguousarray(wq.t().numpy()),
                                       model="blackwell-mxfp8"))
    # the same values: the OCP rule decomposes them otherwise
    again = quantize_blocks(xq.numpy(), "mxfp8_e4m3", axis=1)
    assert np.array_equal(again.values, xq.numpy()) and (again.scales != xp.scales).any()
    assert not torch.equal(carried, shortcut)
    want = chain_by_hand((xp.elements, np.repeat(xp.scales, 32, 1), 1.0),
                         transposed((wp.elements, np.repeat(wp.scales, 32, 1), 1.0)),
                         "blackwell-mxfp8")
    assert torch.equal(carried, want)
