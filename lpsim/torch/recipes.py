"""Low-precision training recipes as data: the operand formats of a linear layer's GEMMs.

A linear layer runs three GEMMs, each with its own contraction dimension K:

======  ================  =========================  ==================================
GEMM    product           operand a (K along)        operand b (K along)
======  ================  =========================  ==================================
fprop   Y = X Wᵀ          X, rows (in_features)      W, rows (in_features)
dgrad   dX = dY W         dY, rows (out_features)    W, columns (out_features)
wgrad   dW = dYᵀ X        dY, columns (tokens)       X, columns (tokens)
======  ================  =========================  ==================================

A :class:`Recipe` gives each GEMM (:class:`Gemm`) the format of both operands along its K
(:class:`Operand`: an element format with or without a per-tensor scale, or a block format
of :mod:`lpsim.blocks` in 1 x k or k x k blocks), their rounding, the accumulation (an FP32
GEMM, an :class:`lpsim.ops.AccumulationModel`, a tensor-core model of :mod:`lpsim.ops`, or
a tensor-core instruction that takes the operands' elements and scales as they are)
and the output format; and the recipe as a whole a random Hadamard transform of the wgrad
operands and whether the first and last linear layers stay in BF16.  :data:`PRESETS` holds
the settings of the papers and libraries, each citing its source; :func:`recipe` looks one
up.  :func:`lpsim.torch.simulate` puts a recipe into a model.

Everything is checked when made: a field that cannot work is a ValueError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..blocks.formats import BlockFormat, as_block_format
from ..formats import Format, parse_format
from ..ops.hardware import InstructionModel, hardware_model
from ..ops.mma_table import FORMATS
from ..ops.models import get_model
from ..philox import WORD_BITS
from ..request import check_sr_bits
from ..rounding import NEAREST, STOCHASTIC, mode_code
from .hadamard import RHT_SIZE_LIMIT

#: per-tensor scaling of an element format: none, from this tensor's amax (``current``), or
#: from the largest amax of the tensor's last ``history`` steps (``delayed``)
SCALINGS = ("none", "current", "delayed")
#: the most steps of amax a delayed-scaling operand keeps (4 MiB of float32 each)
MAX_HISTORY = 1 << 20
#: the GEMMs of a linear layer and their operands, in order
GEMMS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}


def _is_fp32(fmt) -> bool:
    return isinstance(fmt, Format) and fmt == parse_format("fp32")


@dataclass(frozen=True)
class Operand:
    """How one GEMM operand is quantized along the GEMM's K.

    fmt: None (used as given, in float32), an element format (``"e4m3fn"``) or a block format
    (``"nvfp4"``, :func:`lpsim.blocks.block`).  rounding, sr_bits: any lpsim mode and few-bit SR.
    scaling (element formats): ``"current"`` multiplies the tensor by
    ``s = fp32(max / amax)`` before rounding to the format with saturation, and divides by
    ``s`` after (TransformerEngine's and torchao's per-tensor FP8 scaling), amax the largest
    finite magnitude; ``"delayed"`` takes amax as the largest of the last ``history`` steps'
    (scale 1 at the first step).
    blocks_2d (block formats): k x k blocks instead of 1 x k, so a weight quantized once
    serves both GEMMs it enters (NVFP4's 16 x 16 weight blocks).
    """

    fmt: object = None
    rounding: str = "nearest"
    sr_bits: int | None = None
    scaling: str = "none"
    history: int = 1024
    blocks_2d: bool = False

    def __post_init__(self):
        fmt = self.fmt
        if fmt is not None:
            block = as_block_format(fmt)
            try:
                fmt = block if block is not None else parse_format(fmt)
            except (TypeError, ValueError) as error:
                raise ValueError(f"fmt={self.fmt!r}: {error}") from None
            element = fmt if isinstance(fmt, Format) else fmt.saturating_element
            if not element.signed:
                raise ValueError(f"fmt={self.fmt!r} holds no negative values (an unsigned "
                                 "format: a negative operand would become NaN); accepted: a "
                                 "signed format")
            fits, why = element.fits(np.float32)
            if not fits and not _is_fp32(fmt):  # the operands round in float32 containers
                raise ValueError(f"fmt={self.fmt!r} does not fit the float32 containers the "
                                 f"operands are rounded in ({why}); accepted: formats whose "
                                 "values float32 holds (None keeps an operand exact)")
            object.__setattr__(self, "fmt", fmt)
        try:
            mode = mode_code(self.rounding)
        except ValueError as error:
            raise ValueError(f"rounding={self.rounding!r}: {error}") from None
        exact = fmt is None or _is_fp32(fmt)
        if exact and mode != NEAREST:
            raise ValueError(f"rounding={self.rounding!r} is asked of an operand kept exact "
                             f"(fmt={self.fmt!r}); accepted there: 'nearest'")
        if self.sr_bits is not None and mode != STOCHASTIC:
            raise ValueError(f"sr_bits={self.sr_bits!r} needs rounding='stochastic', not "
                             f"{self.rounding!r}")
        if self.sr_bits is not None:        # the operands are rounded in float32 containers
            object.__setattr__(self, "sr_bits", check_sr_bits(
                self.sr_bits, "stochastic", WORD_BITS[4], "float32"))
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling={self.scaling!r} is unknown; accepted: "
                             f"{', '.join(map(repr, SCALINGS))}")
        if self.scaling != "none" and not isinstance(fmt, Format):
            raise ValueError(f"scaling={self.scaling!r} needs an element format, not "
                             f"fmt={self.fmt!r} (a block format carries its own scales)")
        if self.scaling != "none" and exact:
            raise ValueError(f"scaling={self.scaling!r} is asked of an operand kept exact "
                             f"(fmt={self.fmt!r})")
        if isinstance(self.history, bool) or not isinstance(self.history, (int, np.integer)) \
                or not 1 <= self.history <= MAX_HISTORY:
            raise ValueError(f"history={self.history!r} is not accepted; accepted: an "
                             f"integer 1 .. {MAX_HISTORY} (steps of amax kept by "
                             "scaling='delayed', a float32 each)")
        object.__setattr__(self, "history", int(self.history))
        if not isinstance(self.blocks_2d, bool):
            raise TypeError(f"blocks_2d={self.blocks_2d!r} must be True or False")
        if self.blocks_2d and not isinstance(fmt, BlockFormat):
            raise ValueError(f"blocks_2d=True needs a block format, not fmt={self.fmt!r}")
        if isinstance(fmt, BlockFormat):
            _check_scales(fmt)
        if self.scaling != "none":
            object.__setattr__(self, "fmt", replace(fmt, saturate=True))

    @property
    def block(self) -> int:
        """The block size along K (1 for element formats and exact operands)."""
        return self.fmt.block if isinstance(self.fmt, BlockFormat) else 1

    def with_(self, **changes) -> "Operand":
        return replace(self, **changes)


def _check_scales(bfmt: BlockFormat) -> None:
    """A block of largest magnitude 1 must get a scale the scale format holds unclipped."""
    need = 1.0 / bfmt.element.max_finite
    lo = bfmt.scale.min_subnormal if bfmt.scale.subnormals else bfmt.scale.min_normal
    if not bfmt.tensor_scale and not lo <= need <= bfmt.scale.max_finite:
        raise ValueError(
            f"fmt={bfmt!r}: its scale format {bfmt.scale!r} cannot hold the scales: a block of "
            f"largest magnitude 1 needs {need!r}, outside [{lo!r}, {bfmt.scale.max_finite!r}]; "
            "accepted: a wider scale format or tensor_scale=True")


def _accumulation(value):
    """None (the FP32 GEMM of the tensors' device), a named model of lpsim.ops or a model;
    an instruction model as it is (:class:`Gemm` checks it against its operands)."""
    if value is None:
        return None
    hw = hardware_model(value)
    if isinstance(hw, InstructionModel):
        return hw
    if hw is not None:
        return hw.with_(in_fmt=None)        # the operands arrive quantized
    try:
        return get_model(value).with_()
    except ValueError as error:
        raise ValueError(f"accumulate={value!r}: {error}; or a name of "
                         "lpsim.ops.HARDWARE_MODELS or lpsim.ops.INSTRUCTION_MODELS, a "
                         "TensorCoreModel, an InstructionModel, or None (an FP32 GEMM)") from None


def _same_values(fmt, ptx_type) -> bool:
    """Whether the element format ``fmt`` holds the values of the PTX type (saturation, a
    rounding choice, aside)."""
    want = parse_format(FORMATS[ptx_type])
    return isinstance(fmt, Format) and replace(fmt, saturate=want.saturate) == want


def _instruction_misfit(op: Operand, ins, ptx_type) -> str | None:
    """Why ``op`` cannot feed ``ins`` as its operand of ``ptx_type``, with what it accepts;
    None when it fits."""
    fmt = op.fmt
    if ins.block:
        scale = _INSTRUCTION_SCALES[ins.scale_type]
        accepted = (f"a block format of {FORMATS[ptx_type]} elements in blocks of {ins.block} "
                    f"with {scale} scales" + (", with or without an FP32 tensor scale"
                                              if ins.scale_type == "ue4m3" else ""))
        fits = isinstance(fmt, BlockFormat) and _same_values(fmt.element, ptx_type) and \
            fmt.block == ins.block and fmt.scale == parse_format(scale)
    else:
        accepted = (f"the element format {FORMATS[ptx_type]} with scaling 'none', 'current' "
                    "or 'delayed'")
        fits = not isinstance(fmt, BlockFormat) and _same_values(fmt, ptx_type)
    return None if fits else accepted


#: the scale format of a block-scaled instruction's scale type (UE4M3: E4M3 scales of
#: non-negative blocks' largest magnitudes)
_INSTRUCTION_SCALES = {"ue8m0": "e8m0fnu", "ue4m3": "e4m3fn"}


def _check_instruction(model: InstructionModel, given, a: Operand, b: Operand) -> None:
    """Refuse, naming the field, an instruction model that cannot take these operands'
    elements and scales (:class:`Gemm`)."""
    ins = model.spec
    if model.scale_blocks:
        raise ValueError(f"accumulate={given!r}: scale_blocks={model.scale_blocks} quantizes "
                         "its own inputs (DeepGEMM), not the recipe's; accepted: an "
                         "InstructionModel without scale_blocks")
    if not _is_fp32(model.out_fmt):
        raise ValueError(f"accumulate={given!r}: out_fmt={model.out_fmt!r}, but the recipe "
                         "rounds the output itself (Gemm.out, after the bias); accepted: a "
                         "model with out_fmt 'fp32' (model.with_(out_fmt='fp32'))")
    for name, op, ptx_type in (("a", a, ins.a_type), ("b", b, ins.b_type)):
        accepted = _instruction_misfit(op, ins, ptx_type)
        if accepted is not None:
            scaling = f", scaling={op.scaling!r}" if op.scaling != "none" else ""
            raise ValueError(f"{name}.fmt={op.fmt!r}{scaling} does not fit accumulate="
                             f"{given!r} ({ins.opcode}: its {name.upper()} operand is "
                             f"{ins.a_type if name == 'a' else ins.b_type}); accepted: "
                             f"{accepted}")


@dataclass(frozen=True)
class Gemm:
    """One GEMM: operand a and b along K, the accumulation and the output format.

    accumulate None: an FP32 GEMM of the device (BLAS through :func:`lpsim.ops.matmul` on the
    CPU, cuBLAS without TF32 on a GPU); a name of :data:`lpsim.ops.MODELS` or
    :data:`lpsim.ops.HARDWARE_MODELS`, or a model: :func:`lpsim.ops.matmul` with that model
    (on the CPU, also for CUDA tensors).  An :class:`lpsim.ops.InstructionModel` or a name of
    :data:`lpsim.ops.INSTRUCTION_MODELS`: the tensor-core instruction chained along K on the
    operands' own elements and scales (:func:`lpsim.ops.scaled_matmul`), where both fit it:
    a block-scaled instruction takes block formats of its element type, block size and
    scale format (an NVFP4 tensor scale, and k x k blocks, too); one without block scales
    takes its element type, unscaled or with a per-tensor scale ``s`` (the elements are then
    the rounded ``t * s``, and the product of the float32 ``1/s`` of a and b multiplies D as
    the epilogue's float32 alpha, as TransformerEngine hands ``scale_inv`` to
    ``torch._scaled_mm``).  An f16-result instruction's D goes on exactly in FP32.  Models
    with ``scale_blocks`` (which quantize their own inputs) or an out_fmt other than FP32
    (``out`` rounds the output) are refused.  out: the format the output is rounded to (to
    nearest, after the bias in fprop), None to keep FP32.
    """

    a: Operand = field(default_factory=Operand)
    b: Operand = field(default_factory=Operand)
    accumulate: object = None
    out: object = "bf16"

    def __post_init__(self):
        for name in ("a", "b"):
            if not isinstance(getattr(self, name), Operand):
                raise TypeError(f"{name}={getattr(self, name)!r} must be an "
                                "lpsim.torch.Operand")
        model = _accumulation(self.accumulate)
        if isinstance(model, InstructionModel):
            _check_instruction(model, self.accumulate, self.a, self.b)
        object.__setattr__(self, "accumulate", model)
        if self.out is not None:
            try:
                out = parse_format(self.out)
            except (TypeError, ValueError) as error:
                raise ValueError(f"out={self.out!r}: {error}") from None
            if not out.signed:
                raise ValueError(f"out={self.out!r} holds no negative values (an unsigned "
                                 "format); accepted: a signed format")
            fits, why = out.fits(np.float32)
            if not fits and (self.a.fmt is not None or self.b.fmt is not None):
                raise ValueError(f"out={self.out!r} does not fit the float32 result of a GEMM"
                                 f" of quantized operands ({why}); accepted: formats whose "
                                 "values float32 holds (wider ones only where both operands "
                                 "are kept exact, fmt=None, as float64 models' are)")
            object.__setattr__(self, "out", out)


@dataclass(frozen=True)
class Recipe:
    """fprop, dgrad and wgrad GEMMs of every simulated linear layer, and the recipe-wide parts.

    rht: None, or the size of the random Hadamard transform applied to both wgrad operands
    along K (tokens) before they are quantized: blocks of ``rht`` tokens times
    ``H diag(d) / sqrt(rht)``, signs ``d`` from lpsim's Philox keyed by layer and step;
    ``dYᵀ X`` is unchanged in exact arithmetic.  keep_first_last: the first and last linear
    layers of a model run the ``bf16`` recipe instead (:func:`lpsim.torch.simulate`).
    """

    fprop: Gemm = field(default_factory=Gemm)
    dgrad: Gemm = field(default_factory=Gemm)
    wgrad: Gemm = field(default_factory=Gemm)
    rht: int | None = None
    keep_first_last: bool = False
    name: str = "custom"
    source: str = ""

    def __post_init__(self):
        for name in GEMMS:
            if not isinstance(getattr(self, name), Gemm):
                raise TypeError(f"{name}={getattr(self, name)!r} must be an lpsim.torch.Gemm")
        if self.rht is not None:
            n = self.rht
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) \
                    or not 2 <= int(n) < RHT_SIZE_LIMIT or int(n) & (int(n) - 1):
                raise ValueError(f"rht={n!r} is not accepted; accepted: None or a power of "
                                 f"two, 2 <= rht < {RHT_SIZE_LIMIT} (a Hadamard matrix's "
                                 "size, the signs of one step)")
            object.__setattr__(self, "rht", int(n))
        if not isinstance(self.keep_first_last, bool):
            raise TypeError(f"keep_first_last={self.keep_first_last!r} must be True or False")

    def operand(self, gemm: str, role: str) -> Operand:
        """The Operand of ``role`` ("x", "w" or "dy") in ``gemm`` ("fprop", ...)."""
        g = getattr(self, gemm)
        return g.a if role == GEMMS[gemm][0] else g.b

    def operands(self):
        """(gemm, role, Operand) for the six operands, in GEMMS order."""
        for gemm, roles in GEMMS.items():
            for role in roles:
                yield gemm, role, self.operand(gemm, role)

    def check_dims(self, in_features: int, out_features: int, tokens: int | None = None,
                   where: str = "", gemms=GEMMS) -> None:
        """Refuse, naming the field, a block size that a GEMM's K (or, for k x k blocks, the
        operand's other dimension) does not divide; tokens None: not known yet.  ``gemms``:
        the GEMMs that will run (their operands alone are checked)."""
        k_of = {"fprop": in_features, "dgrad": out_features, "wgrad": tokens}
        dims = {"x": (tokens, in_features), "w": (out_features, in_features),
                "dy": (tokens, out_features)}
        for gemm, role, op in self.operands():
            if gemm not in gemms:
                continue
            label = f"{where}{gemm}.{'a' if role == GEMMS[gemm][0] else 'b'}.fmt"
            k = k_of[gemm]
            if op.block > 1 and k is not None and k % op.block:
                raise ValueError(f"{label}: block {op.block} does not divide K = {k} of "
                                 f"{gemm} (its {_K_NAME[gemm]}); accepted: a block size "
                                 f"dividing {k}")
            for size in dims[role] if op.blocks_2d else ():
                if size is not None and size % op.block:
                    raise ValueError(f"{label}: {op.block} x {op.block} blocks of {role} need "
                                     f"both its dimensions divisible by {op.block}; {size} "
                                     "is not")
        if self.rht is not None and tokens is not None and "wgrad" in gemms \
                and tokens % self.rht:
            raise ValueError(f"{where}rht={self.rht} does not divide wgrad's K = {tokens} "
                             "tokens; accepted: a token count divisible by rht")

    def with_(self, **changes) -> "Recipe":
        names = {f.name for f in fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise TypeError(f"unknown recipe fields {sorted(unknown)}; accepted: "
                            f"{sorted(names)}")
        return replace(self, **changes)


_K_NAME = {"fprop": "in_features", "dgrad": "out_features", "wgrad": "tokens"}


def _same(op: Operand) -> Gemm:
    return Gemm(op, op)


def _fp8(scaling: str, source: str, name: str) -> Recipe:
    e4m3 = Operand("e4m3fn", scaling=scaling)
    e5m2 = Operand("e5m2", scaling=scaling)
    return Recipe(Gemm(e4m3, e4m3), Gemm(e5m2, e4m3), Gemm(e5m2, e4m3), name=name,
                  source=source)


def _nvfp4() -> Recipe:
    act = Operand("nvfp4")
    weight = Operand("nvfp4", blocks_2d=True)
    grad = Operand("nvfp4", "stochastic")
    return Recipe(Gemm(act, weight), Gemm(grad, weight), Gemm(grad, act), rht=16,
                  keep_first_last=True, name="nvfp4",
                  source="NVIDIA, 'Pretraining Large Language Models with NVFP4' (arXiv "
                         "2509.25149), Sec. 4: E2M1 with E4M3 scales per 16 and an FP32 "
                         "tensor scale, 16 x 16 weight blocks, 16-point RHT on wgrad inputs, "
                         "stochastic rounding of gradients, some layers kept in BF16")


def _presets() -> dict[str, Recipe]:
    bf16 = Operand("bf16")
    mxfp8 = Operand(BlockFormat("e4m3fn", 32, "e8m0fnu", "rceil"))
    mxfp4 = Operand("mxfp4")
    mxfp4_grad = Operand("mxfp4", "stochastic")
    return {
        "bf16": Recipe(_same(bf16), _same(bf16), _same(bf16), name="bf16",
                       source="BF16 operands, FP32 accumulation, BF16 outputs: mixed-precision "
                              "training's baseline (Kalamkar et al., arXiv 1905.12322)"),
        "fp8_current": _fp8("current", "TransformerEngine Float8CurrentScaling (HYBRID): E4M3 "
                            "forward, E5M2 gradients, per-tensor scale from the tensor's amax",
                            "fp8_current"),
        "fp8_delayed": _fp8("delayed", "TransformerEngine DelayedScaling (HYBRID, "
                            "amax_history_len=1024, amax_compute_algo='max', margin 0); "
                            "Micikevicius et al., 'FP8 Formats for Deep Learning' "
                            "(arXiv 2209.05433)", "fp8_delayed"),
        "mxfp8": Recipe(_same(mxfp8), _same(mxfp8), _same(mxfp8), name="mxfp8",
                        source="TransformerEngine MXFP8BlockScaling: E4M3 everywhere, E8M0 "
                               "scales per 32 rounded up (RCEIL) along each GEMM's K, "
                               "rowwise and columnwise copies; OCP MX v1.0"),
        "mxfp4": Recipe(_same(mxfp4), Gemm(mxfp4_grad, mxfp4), Gemm(mxfp4_grad, mxfp4),
                        rht=32, name="mxfp4",
                        source="Tseng et al., 'Training LLMs with MXFP4' (arXiv 2502.20586): "
                               "OCP MXFP4 (E2M1, E8M0 per 32), stochastic rounding and a "
                               "random Hadamard transform in the backward pass"),
        "nvfp4": _nvfp4(),
    }


PRESETS: dict[str, Recipe] = _presets()


def recipe(spec) -> Recipe:
    """The recipe ``spec`` names (a key of :data:`PRESETS`) or ``spec`` itself."""
    if isinstance(spec, Recipe):
        return spec
    try:
        return PRESETS[spec]
    except (KeyError, TypeError):
        raise ValueError(f"unknown recipe {spec!r}; accepted: {', '.join(PRESETS)} or an "
                         "lpsim.torch.Recipe") from None


__all__ = ["Operand", "Gemm", "Recipe", "PRESETS", "recipe", "SCALINGS", "GEMMS"]
