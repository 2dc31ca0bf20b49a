"""GEMM models built from one tensor-core instruction, as the GEMM libraries run it.

A GEMM kernel tiles M and N and walks K one instruction at a time, each instruction's D fed
back as the next one's C (:func:`lpsim.ops.mma`'s fused nodes, bit for bit); tiling does not
change a value.  Some kernels also *promote*: every ``promote`` products the chain's D is
added to a float32 register with one float32 addition and the chain begins again from +0.
Checked on an H100 (``tests/data/tensor-cores-h100.npz``, 17 input families, K = 16 .. 4096):
``torch._scaled_mm`` with ``use_fast_accum=True`` is the ``wgmma`` chain without promotion,
and by default (cuBLASLt) the chain promoted every 128 products, every output code for code.
DeepGEMM promotes every 128 products as well (four ``k32`` steps), and with
``scale_blocks=128`` its fine-grained scaling is modelled whole: A cast to FP8 per 1 x 128
and B per 128 x 128 block as its ``per_token_cast_to_fp8`` and ``per_block_cast_to_fp8`` do
(amax clamped to 1e-4, each value times the float32 max / amax, the scale amax / max), and
each promotion ``final += (scale_a * scale_b) * partial`` one float32 product and one FFMA.

In :func:`lpsim.ops.matmul` the inputs are first rounded to the instruction's A and B types
(``rounding``, random words of streams ``stream`` and ``stream + 1``, modulo 2**64; for a
block-scaled instruction, to blocks along K by :mod:`lpsim.blocks`, whose scales the
instruction applies: OCP MX blocks of 32, or NVFP4's blocks of 16 whose two FP32 tensor
scales multiply the result as the epilogue's alpha, their product rounded to float32 and
one float32 multiplication), and the float32 (or float16) result is rounded to ``out_fmt`` (stream
``stream + 2``), as an epilogue writes it; other per-tensor scales are the caller's,
applied to the result as the epilogue does. Stats count those roundings; the nodes' own roundings are
the instruction's arithmetic and are not counted.

:func:`scaled_matmul` runs the chain on operands already decomposed, as a library hands them
to the kernel: element values, block scales and a per-tensor alpha, from a quantization of
the caller's own (a training recipe's, :mod:`lpsim.torch.recipes`).  Rounding the values
q * s again would not do: the same values can decompose otherwise (another scale rule, a
recomputed tensor scale), and the nodes' arithmetic depends on the elements and scales.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import numpy as np

from ..formats import Format, parse_format
from ..rounding import mode_code
from .mma_table import FORMATS, Instruction, lookup
from .operands import stream_after


@dataclass(frozen=True)
class InstructionModel:
    """A GEMM as one tensor-core ``instruction`` of ``arch`` chained along K (K padded with
    zeros to the instruction's k), promoted to float32 every ``promote`` products (None:
    never; a multiple of the instruction's k, f32 results only), its result rounded to
    ``out_fmt`` with ``out_rounding``.  ``scale_blocks`` (equal to ``promote``, FP8 inputs):
    DeepGEMM's float32 scales per 1 x scale_blocks of A and scale_blocks x scale_blocks of
    B, applied at each promotion (the module's docstring)."""

    arch: str
    instruction: str
    promote: int | None = None
    out_fmt: Format = parse_format("fp32")
    out_rounding: str = "nearest"
    description: str = ""
    scale_blocks: int | None = None

    def __post_init__(self):
        ins = self.spec
        if ins.c_type != ins.d_type:
            raise ValueError(f"instruction={self.instruction!r}: its D ({ins.d_type}) cannot be "
                             f"fed back as its C ({ins.c_type}); accepted: an instruction "
                             "whose C and D types are the same")
        if self.promote is not None:
            if isinstance(self.promote, bool) or not isinstance(
                    self.promote, (int, np.integer)) or self.promote < ins.k or \
                    self.promote % ins.k:
                raise ValueError(f"promote={self.promote!r} is not accepted for "
                                 f"{ins.opcode}; accepted: None or a positive multiple of its "
                                 f"k={ins.k}")
            if ins.d_type != "f32":
                raise ValueError(f"promote={self.promote!r} is not accepted for {ins.opcode}: "
                                 "its result is f16; accepted: None (promotion adds f32 "
                                 "results)")
            object.__setattr__(self, "promote", int(self.promote))
        if self.scale_blocks is not None and (
                self.scale_blocks != self.promote or ins.block
                or ins.a_type not in ("e4m3", "e5m2")):
            raise ValueError(f"scale_blocks={self.scale_blocks!r} is not accepted with "
                             f"promote={self.promote!r} and {ins.opcode}; accepted: None, or "
                             "the promotion interval of an FP8 instruction without block "
                             "scales of its own (DeepGEMM: 128 and 128)")
        object.__setattr__(self, "out_fmt", parse_format(self.out_fmt))
        mode_code(self.out_rounding)

    @property
    def spec(self) -> Instruction:
        """The instruction's shapes, types and node arithmetic (ValueError if unknown)."""
        return _lookup(self.arch, self.instruction)

    def with_(self, **changes) -> "InstructionModel":
        """A copy with the given fields replaced."""
        names = {f.name for f in fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise TypeError(f"unknown model fields {sorted(unknown)}; accepted: {sorted(names)}")
        return replace(self, **changes)


@functools.lru_cache(maxsize=None)
def _lookup(arch, instruction) -> Instruction:
    return lookup(arch, instruction)


def _named(arch, instruction, promote, what):
    return InstructionModel(arch, instruction, promote, description=what)


_FAST = "use_fast_accum=True"
#: GEMMs built from instructions by name: ``lpsim.ops.matmul(model=name)`` takes these names
INSTRUCTION_MODELS: dict[str, InstructionModel] = {
    "hopper-wgmma-e4m3": _named(
        "hopper", "wgmma.m64n256k32.f32.e4m3.e4m3", None,
        "E4M3 inputs, wgmma.f32.e4m3.e4m3 chained along K: torch._scaled_mm with "
        f"{_FAST} on an H100 (every recorded output)"),
    "hopper-wgmma-e4m3-promote128": _named(
        "hopper", "wgmma.m64n256k32.f32.e4m3.e4m3", 128,
        "E4M3 inputs, wgmma.f32.e4m3.e4m3 chained along K and promoted to float32 every 128 "
        "products: torch._scaled_mm's default (cuBLASLt) on an H100 (every recorded output); "
        "DeepGEMM's interval"),
    "hopper-wgmma-e5m2-e4m3": _named(
        "hopper", "wgmma.m64n256k32.f32.e5m2.e4m3", None,
        "E5M2 x E4M3 inputs (gradient times weight), wgmma chained along K, no promotion"),
    "hopper-wgmma-e5m2-e4m3-promote128": _named(
        "hopper", "wgmma.m64n256k32.f32.e5m2.e4m3", 128,
        "E5M2 x E4M3 inputs, wgmma chained along K, promoted to float32 every 128 products"),
    "hopper-deepgemm-e4m3": InstructionModel(
        "hopper", "wgmma.m64n128k32.f32.e4m3.e4m3", 128, out_fmt="bf16", scale_blocks=128,
        description="DeepGEMM's FP8 GEMM (gemm_fp8_fp8_bf16_nt): A cast per 1 x 128 and B "
                    "per 128 x 128 with float32 scales, wgmma chained along K and promoted "
                    "every 128 products by final += (scale_a scale_b) partial (FFMA), BF16 "
                    "output"),
    "blackwell-tcgen05-e4m3": _named(
        "blackwell", "tcgen05.mma.m128n256k32.kind::f8f6f4.f32.e4m3.e4m3", None,
        "E4M3 inputs, tcgen05.mma kind::f8f6f4 chained along K: Blackwell keeps 25 fraction "
        "bits per node where Hopper's FP8 wgmma keeps 13"),
    "blackwell-mxfp8": _named(
        "blackwell", "tcgen05.mma.m128n256k32.kind::mxf8f6f4.block32.f32.e4m3.e4m3.ue8m0",
        None, "MXFP8 inputs (E4M3, E8M0 scale per 32 along K, the OCP rule), block-scaled "
              "tcgen05.mma chained along K"),
    "blackwell-mxfp4": _named(
        "blackwell", "tcgen05.mma.m128n256k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0", None,
        "MXFP4 inputs (E2M1, E8M0 scale per 32 along K, the OCP rule), tcgen05.mma "
        "kind::mxf4 chained along K: exact sums of 16 products, scaled, 35 fraction bits"),
    "blackwell-nvfp4": _named(
        "blackwell", "tcgen05.mma.m128n256k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3",
        None, "NVFP4 inputs (E2M1, UE4M3 scale per 16 along K, FP32 tensor scales), "
              "tcgen05.mma kind::mxf4nvf4 chained along K, the tensor scales' product as the "
              "epilogue's float32 alpha"),
    "hopper-wgmma-bf16": _named(
        "hopper", "wgmma.m64n256k16.f32.bf16.bf16", None,
        "BF16 inputs, wgmma.f32.bf16.bf16 chained along K (a GEMM without split-K)"),
    "ampere-mma-bf16": _named(
        "ampere", "mma.m16n8k16.f32.bf16.bf16.f32", None,
        "BF16 inputs, mma.m16n8k16.f32.bf16.bf16.f32 chained along K (a GEMM without "
        "split-K)"),
    "ampere-mma-fp16-fp16": _named(
        "ampere", "mma.m16n8k16.f16.f16.f16.f16", None,
        "FP16 inputs, mma.m16n8k16.f16.f16.f16.f16 chained along K: FP16 accumulation"),
}


def instruction_matmul(a, b, model: InstructionModel, *, rounding="nearest", seed=None,
                       stream=0, stats=None):
    """a @ b (2-D, or 1-D as numpy.matmul) under an :class:`InstructionModel` (the module's
    docstring); the container is numpy's result type of a and b, float64 when out_fmt does
    not fit float32, as :func:`lpsim.ops.matmul`'s."""
    from ..quantize import quantize
    from .operands import matrix_operands
    a, b, dtype, shaped = matrix_operands(a, b, model.out_fmt, "an instruction model")
    ins = model.spec
    if ins.block:           # blocks along K: the elements, and the scales apart
        qa, sa, qb, sb, alpha = _block_operands(a, b, ins, rounding, seed, stream, stats)
        result = scaled_matmul(qa, sa, qb, sb, model, alpha, who="matmul")
    elif model.scale_blocks:
        a, b, promote_scales = _fine_grained_operands(a, b, ins, model.scale_blocks,
                                                      rounding, seed, stream, stats)
        result = _chain(a, b, model, promote_scales=promote_scales)
    else:
        a = quantize(a, FORMATS[ins.a_type], rounding, seed=seed, stream=stream, stats=stats)
        b = quantize(b, FORMATS[ins.b_type], rounding, seed=seed, stream=stream_after(stream, 1),
                     stats=stats)
        result = _chain(a, b, model)
    # rounded in float32, or in float64 (where the float32 chain result is exact) for an
    # out_fmt float32 cannot hold
    wide = not model.out_fmt.fits(np.float32)[0]
    out = quantize(result.astype(np.float64) if wide else result, model.out_fmt,
                   model.out_rounding, seed=seed, stream=stream_after(stream, 2),
                   stats=stats).astype(dtype, copy=False)
    return shaped(out)


def scaled_matmul(qa, sa, qb, sb, model, alpha=1.0, *, who="scaled_matmul"):
    """D = alpha (A B) as ``model``'s instruction chain computes it from operands already
    decomposed into its types, as a GEMM library receives them: float32, before the model's
    out_fmt (the caller rounds the output, after a bias say).

    qa (M x K) and qb (K x N): values of the instruction's A and B types (numpy arrays,
    CPU torch tensors or array-likes).  sa (M x ceil(K/block)) and sb (ceil(K/block) x N):
    for a block-scaled instruction the scales of the blocks along K, a's per row and b's
    per column (a block whose scale is NaN has NaN products; its elements are not read);
    None otherwise.  K is padded with zero elements of scale 1 to the instruction's k.
    alpha: the product of the per-tensor factors (NVFP4's tensor scales, FP8's inverse
    scales), rounded once to float32 and multiplying D once, as the epilogue's alpha.
    ``model``: an :class:`InstructionModel` or a name of :data:`INSTRUCTION_MODELS`, not one
    with ``scale_blocks`` (it quantizes its own inputs: :func:`lpsim.ops.matmul`).
    """
    model = _as_model(model, who)
    ins = model.spec
    qa, qb = (_matrix(x, name, who) for x, name in ((qa, "qa"), (qb, "qb")))
    (m, k), n = qa.shape, qb.shape[1]
    if qb.shape[0] != k:
        raise ValueError(f"{who}: qa has shape {qa.shape} and qb {qb.shape}; accepted: qa "
                         "(M x K) and qb (K x N), K along qa's rows and qb's columns")
    scales = None
    if ins.block:
        blocks = -(-k // ins.block)
        sa, sb = (_matrix(s, name, who, shape) for s, name, shape in (
            (sa, "sa", (m, blocks)), (sb, "sb", (blocks, n))))
        padded = -(-k // ins.k) * ins.k // ins.block
        scale_a, scale_b = np.ones((m, padded)), np.ones((padded, n))
        scale_a[:, :blocks], scale_b[:blocks] = sa, sb
        scales = (scale_a, scale_b)
        # a NaN scale makes its block's products NaN: its elements (NaN, which FP6 and FP4
        # cannot hold, where lpsim.blocks made the block) are given as zeros
        nan_a = np.repeat(np.isnan(sa), ins.block, axis=1)[:, :k]
        nan_b = np.repeat(np.isnan(sb), ins.block, axis=0)[:k]
        qa = np.where(nan_a, 0.0, qa) if nan_a.any() else qa
        qb = np.where(nan_b, 0.0, qb) if nan_b.any() else qb
    elif sa is not None or sb is not None:
        raise ValueError(f"{who}: {ins.opcode} has no block scales; accepted: sa=None and "
                         "sb=None (per-tensor factors go to alpha)")
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise TypeError(f"{who}: alpha={alpha!r} is not a real number") from None
    return _chain(qa, qb, model, scales=scales, alpha=alpha, who=who,
                  names=("qa", "qb", "sa", "sb"))


def _as_model(model, who) -> InstructionModel:
    """The InstructionModel ``model`` is or names, without scale_blocks."""
    found = model if isinstance(model, InstructionModel) else \
        INSTRUCTION_MODELS.get(model) if isinstance(model, str) else None
    if found is None:
        raise ValueError(f"{who}: model={model!r} is not accepted; accepted: an "
                         "InstructionModel or one of " + ", ".join(INSTRUCTION_MODELS))
    if found.scale_blocks:
        raise ValueError(f"{who}: model={model!r} has scale_blocks={found.scale_blocks} (it "
                         "quantizes its own inputs); accepted: a model without scale_blocks")
    return found


def _matrix(x, name, who, shape=None) -> np.ndarray:
    """x as a 2-D float64 array (of ``shape`` when given), or a ValueError naming it."""
    if x is None:
        raise ValueError(f"{who}: {name} is None; a block-scaled instruction takes the "
                         "scales of qa's and qb's blocks along K")
    with np.errstate(invalid="ignore"):          # signalling NaN codes
        array = np.asarray(x, np.float64)
    if array.ndim != 2 or shape is not None and array.shape != shape:
        want = "a 2-D array" if shape is None else f"shape {shape}"
        raise ValueError(f"{who}: {name} has shape {array.shape}; accepted: {want}")
    return array


def _chain(a, b, model, *, scales=None, promote_scales=None, alpha=1.0, who="matmul",
           names=("a", "b", "scale_a", "scale_b")):
    """The model's chain on element values a and b (:func:`lpsim.ops.mma.chained_matmul`),
    as float32, times alpha rounded to float32 (one float32 multiplication) unless it is 1;
    ``names``: the caller's names of a, b and the scales, for its errors."""
    from .mma import chained_matmul
    with np.errstate(invalid="ignore"):          # signalling NaN codes
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    result = chained_matmul(a, b, model.spec, model.promote, who=who, scales=scales,
                            promote_scales=promote_scales, names=names)
    with np.errstate(invalid="ignore", over="ignore"):
        result = result.astype(np.float32)
        if alpha != 1.0:       # per-tensor factors: the epilogue's float32 alpha
            result *= np.float32(alpha)
    return result


def _fp8_blocks(x, g, tile, fmt, rounding, seed, stream, stats):
    """x (float32, R x K) cast to ``fmt`` per block of ``tile`` rows by ``g`` columns (R and K
    padded with zeros to whole blocks) as DeepGEMM's casts do: (values, float32 scales per
    block)."""
    from ..quantize import quantize
    r, k = x.shape
    rp, kp = -(-r // tile) * tile, -(-k // g) * g
    padded = np.zeros((rp, kp), np.float32)
    padded[:r, :k] = x
    view = padded.reshape(rp // tile, tile, kp // g, g)
    with np.errstate(invalid="ignore"):
        amax = np.maximum(np.abs(view).max(axis=(1, 3), keepdims=True), np.float32(1e-4))
    top = np.float32(parse_format(FORMATS[fmt]).max_finite)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = (view * (top / amax)).reshape(rp, kp)[:r, :k]
    q = quantize(np.ascontiguousarray(scaled), FORMATS[fmt], rounding, seed=seed,
                 stream=stream, stats=stats)
    return q, (amax / top).reshape(rp // tile, kp // g)


def _fine_grained_operands(a, b, ins, g, rounding, seed, stream, stats):
    """DeepGEMM's operands: a per 1 x g along K, b per g x g (its transpose's blocks), both
    rounded to float32 first; the float32 scales per promotion, scale_b per column."""
    from ..quantize import quantize
    a32, b32 = (quantize(x, "fp32", "nearest").astype(np.float32, copy=False)
                for x in (a, b))
    qa, sa = _fp8_blocks(a32, g, 1, ins.a_type, rounding, seed, stream, stats)
    qbt, sbt = _fp8_blocks(np.ascontiguousarray(b32.T), g, g, ins.b_type, rounding, seed,
                           stream_after(stream, 1), stats)
    sb = np.repeat(sbt.T, g, axis=1)[:, :b.shape[1]]
    return qa, qbt.T, (sa, sb)


#: the block format of the operands of each block-scaled instruction, by (element type,
#: products per scale, scale type): OCP MX (E8M0 per 32, the OCP rule), NVFP4 (UE4M3 per 16
#: and an FP32 tensor scale), or E2M1 with E8M0 scales per 16
_BLOCK_FORMATS = {**{(t, 32, "ue8m0"): f for t, f in (
    ("e4m3", "mxfp8_e4m3"), ("e5m2", "mxfp8_e5m2"), ("e3m2", "mxfp6_e3m2"),
    ("e2m3", "mxfp6_e2m3"), ("e2m1", "mxfp4"))},
    ("e2m1", 16, "ue4m3"): "nvfp4", ("e2m1", 16, "ue8m0"): "block(e2m1fn, 16, e8m0fnu, 'floor')"}


def _block_operands(a, b, ins, rounding, seed, stream, stats):
    """a and b in blocks of the instruction's along K (a's rows, b's columns), as
    :func:`scaled_matmul` takes them: a's elements (M x K) and scales (M x K/block), b's
    (K x N and K/block x N), and the product of the two tensor scales (1 without)."""
    from ..blocks.counters import add_counts
    from ..blocks.fake_quantize import quantize_blocks
    parts = []
    for x, t, axis, s in ((a, ins.a_type, 1, stream),
                          (b, ins.b_type, 0, stream_after(stream, 1))):
        q = quantize_blocks(np.ascontiguousarray(x), _BLOCK_FORMATS[t, ins.block,
                                                                    ins.scale_type],
                            rounding, axis=axis, seed=seed, stream=s,
                            want_counts=stats is not None)
        add_counts(stats, q.counts, x.size)
        parts.append(q)
    # along axis 0, lpsim.blocks gives elements and scales with that axis last
    return (parts[0].elements, parts[0].scales, parts[1].elements.T, parts[1].scales.T,
            parts[0].tensor_scale * parts[1].tensor_scale)


__all__ = ["InstructionModel", "INSTRUCTION_MODELS", "instruction_matmul", "scaled_matmul"]
