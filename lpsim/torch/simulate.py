"""Simulated low-precision training of torch models: a recipe's GEMMs in every linear layer.

:func:`simulate` swaps a model's ``nn.Linear`` layers for :class:`SimulatedLinear`, whose
forward and backward run the three GEMMs of a :class:`lpsim.torch.Recipe`.  Each GEMM is,
bit for bit, the composition a user could write by hand (:func:`gemm` is that composition):

1. each operand fake-quantized along the GEMM's K by :func:`quantize_operand`
   (``lpsim.quantize`` with the operand's format, rounding and per-tensor scale; k x k blocks
   as blocks of k*k elements of the tiled tensor), the wgrad operands (tokens along K)
   after :func:`rht` along the tokens when the recipe has one;
2. :func:`lpsim.ops.matmul` with the recipe's accumulation (on a GPU, an FP32 GEMM is
   ``torch.matmul`` with TF32 off; the models of lpsim.ops run on the CPU);
3. the bias added in FP32 (fprop), then the output rounded to nearest in its format.

The layers keep the model's own weight and bias Parameters, so any optimizer trains them.
Stochastic rounding draws from the layer's :class:`lpsim.Generator`: every call fresh
counters.  Telemetry (:func:`report`): per layer, GEMM and operand, the counters of
:class:`lpsim.blocks.BlockStats` (saturated and underflowed elements, clipped scales,
blocks flushed to zero).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from ..blocks.amax import tensor_amax
from ..blocks.counters import BlockStats
from ..blocks.formats import BlockFormat
from ..generator import Generator
from ..ops.reductions import matmul as lp_matmul
from ..philox import random_words
from ..quantize import quantize as lp_quantize
from .recipes import GEMMS, Gemm, Operand, PRESETS, Recipe, recipe as as_recipe

#: the Philox stream of a layer's Hadamard signs is RHT_STREAM + the layer's index
RHT_STREAM = 1 << 40
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def tensor_scale(amax: float, fmt) -> float:
    """The per-tensor scale ``fp32(max / amax)`` (1 when amax is 0 or not finite; float32's
    largest value where the quotient overflows), as TransformerEngine computes it."""
    if not 0.0 < amax < float("inf"):
        return 1.0
    s = float(np.float32(np.float32(fmt.max_finite) / np.float32(amax)))
    return s if s < float("inf") else _FLOAT32_MAX


def _amax(t: torch.Tensor) -> float:
    """The largest finite magnitude (0 for none), as NVFP4's tensor scale takes it: lpsim's
    threaded pass on the CPU (torch's reductions cost ten times more here)."""
    if t.numel() == 0:
        return 0.0
    if t.device.type == "cpu":
        return tensor_amax(t.detach().float().contiguous().numpy().reshape(-1))
    a = t.detach().abs()
    return float(torch.where(torch.isfinite(a), a, 0).max())


def quantize_operand(t: torch.Tensor, op: Operand, axis: int, *, generator=None, stats=None,
                     amax: float | None = None) -> torch.Tensor:
    """The float32 values of the 2-D tensor ``t`` quantized as ``op`` says along ``axis``.

    amax: the per-tensor amax for ``scaling`` (None: this tensor's own).  Element formats
    without scaling and block formats are ``lpsim.quantize``; k x k blocks tile ``t``, make
    each tile a block of k*k elements and untile.
    """
    fmt = op.fmt
    if fmt is None:         # kept: float64 stays float64 (gradcheck of the exact recipe)
        return t.detach() if t.dtype == torch.float64 else t.detach().float()
    t = t.detach().float()

    def rounded(values, fmt, **where):
        return lp_quantize(values, fmt, op.rounding, sr_bits=op.sr_bits, generator=generator,
                           stats=stats, **where)

    if isinstance(fmt, BlockFormat):
        if op.blocks_2d:
            # k x k tiles, each a block of k*k elements along the last axis, then untiled
            k = fmt.block
            rows, cols = t.shape
            tiles = t.reshape(rows // k, k, cols // k, k).permute(0, 2, 1, 3).reshape(
                rows // k, cols // k, k * k)
            q = rounded(tiles, _square(fmt), axis=-1)
            return q.reshape(rows // k, cols // k, k, k).permute(0, 2, 1, 3).reshape(
                rows, cols)
        if t.ndim == 2 and axis in (0, -2):
            # blocks down the columns: the transpose's rows, the same blocks and random
            # counters (C order of the blocked layout); torch's transposing copy is the
            # fastest here, and the result goes back as a view, which the GEMM reads as is
            return rounded(t.t().contiguous(), fmt, axis=-1).t()
        return rounded(t, fmt, axis=axis)
    if op.scaling == "none":
        return rounded(t, fmt)
    s = tensor_scale(_amax(t) if amax is None else amax, fmt)
    q = t * s
    rounded(q, fmt, out=q)
    return q.div_(s)


@functools.lru_cache(maxsize=64)
def _square(bfmt: BlockFormat) -> BlockFormat:
    """``bfmt`` with blocks of block**2 elements: a k x k tile as one block (made once per
    format, not per call)."""
    return replace(bfmt, block=bfmt.block ** 2)


def hadamard(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix (entries +-1), n a power of two."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_signs(seed: int, layer: int, step: int, n: int) -> np.ndarray:
    """The random signs (+-1) of a layer's RHT at a step: the top bits of Philox words
    (seed, stream RHT_STREAM + layer, counters step*n .. step*n + n - 1)."""
    words = random_words(n, 4, seed, RHT_STREAM + layer, step * n)
    return np.where(np.array(words, dtype=np.uint64) >> np.uint64(31), -1.0, 1.0)


def rht(t: torch.Tensor, signs: np.ndarray) -> torch.Tensor:
    """``t`` with each run of n consecutive elements along its last axis (n = len(signs),
    dividing it) multiplied by the orthogonal ``H diag(signs) / sqrt(n)``, in t's dtype:
    ``torch.matmul`` of the runs, as rows, by that matrix's transpose.  The wgrad operands
    are transformed along the tokens, which their transposes hold along the last axis."""
    n = len(signs)
    m = torch.from_numpy(hadamard(n) * signs / np.sqrt(n)).to(t.device, t.dtype)
    return torch.matmul(t.reshape(-1, n), m.t()).reshape(t.shape)


def _product(a: torch.Tensor, b: torch.Tensor, accumulate) -> torch.Tensor:
    if a.device.type == "cpu":      # transposed views go to BLAS as they are
        return lp_matmul(a, b, model=accumulate)
    if accumulate is None:
        flag = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return torch.matmul(a, b)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = flag
    # the models of lpsim.ops are CPU kernels: the operands go there and back
    return lp_matmul(a.cpu(), b.cpu(), model=accumulate).to(a.device)


def gemm(a: torch.Tensor, b: torch.Tensor, spec: Gemm, bias=None) -> torch.Tensor:
    """a @ b (quantized operands, K between them) with ``spec``'s accumulation, plus ``bias``
    in FP32, rounded to ``spec.out`` to nearest."""
    y = _product(a, b, spec.accumulate)
    if bias is not None:
        y = y + bias.detach().to(y.dtype)
    if spec.out is None:
        return y
    return lp_quantize(y, spec.out)


@dataclass
class _Site:
    """One operand of one GEMM of a layer: its counters and, for delayed scaling, amaxes."""

    stats: BlockStats
    history: list


class _LinearFunction(torch.autograd.Function):
    """The three GEMMs of a SimulatedLinear on 2-D inputs (tokens, in_features)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        r = layer.recipe
        xq = layer.quantize(x, "fprop", "x", -1)
        wq = layer.quantize(weight, "fprop", "w", -1)
        y = gemm(xq, wq.t(), r.fprop, bias)
        shared = r.dgrad.b == r.fprop.b and r.fprop.b.blocks_2d
        ctx.layer = layer
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, wq if shared else None)
        return y

    @staticmethod
    def backward(ctx, dy):
        layer = ctx.layer
        r = layer.recipe
        x, weight, wq_shared = ctx.saved_tensors
        dy = dy if dy.dtype == torch.float64 else dy.float()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dyq = layer.quantize(dy, "dgrad", "dy", -1)
            wq = wq_shared if wq_shared is not None else layer.quantize(weight, "dgrad", "w", 0)
            dx = gemm(dyq, wq, r.dgrad).to(x.dtype)
        if ctx.needs_input_grad[1]:
            # K is the tokens: the transposes hold them along the last axis, where the RHT
            # runs and the blocks lie (the same blocks and counters as along axis 0)
            dy_t, x_t = dy.t().contiguous(), x.detach().to(dy.dtype).t().contiguous()
            if r.rht is not None:
                signs = rht_signs(layer.generator.initial_seed(), layer.layer_index,
                                  layer.steps, r.rht)
                dy_t, x_t = rht(dy_t, signs), rht(x_t, signs)
            dyq = layer.quantize(dy_t, "wgrad", "dy", -1)
            xq = layer.quantize(x_t, "wgrad", "x", -1)
            dw = gemm(dyq, xq.t(), r.wgrad).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(0)
        layer.steps += 1
        return dx, dw, db, None


class SimulatedLinear(nn.Linear):
    """An ``nn.Linear`` whose GEMMs follow a recipe; it holds the original's Parameters.

    Made by :func:`simulate` (or :meth:`from_linear`).  As ``nn.Linear``, the output has the
    input's dtype and the gradients their tensors' dtypes: a float16 input's output is the
    recipe's output (bf16 values) cast by torch to float16, which rounds values float16 cannot
    hold (beyond 65504, below its subnormals); bfloat16, float32 and float64 hold bf16 values.
    ``telemetry``: per (gemm, operand) the counters of the counted quantizations of that
    operand so far (every step, or every ``telemetry_every``-th); ``steps``: backward passes
    so far (the RHT's step).
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("make a SimulatedLinear with SimulatedLinear.from_linear(linear, "
                        "recipe) or lpsim.torch.simulate(model, recipe)")

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe, *, generator: Generator | None = None,
                    name: str = "", index: int = 0, telemetry: bool = True):
        r = as_recipe(recipe)
        r.check_dims(linear.in_features, linear.out_features, where=f"layer {name!r}: ")
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.recipe = r
        self.generator = generator if generator is not None else Generator()
        self.layer_name, self.layer_index = name, index
        self.telemetry_every = _telemetry_every(telemetry)
        self.steps = 0
        self.sites = {(g, role): _Site(BlockStats(), [])
                      for g, roles in GEMMS.items() for role in roles}
        return self

    def quantize(self, t, gemm: str, role: str, axis: int) -> torch.Tensor:
        """The operand ``role`` of ``gemm`` quantized along ``axis``, counted and with its
        delayed-scaling amax recorded."""
        op = self.recipe.operand(gemm, role)
        site = self.sites[gemm, role]
        amax = None
        if op.scaling == "delayed":
            amax = max(site.history) if site.history else 0.0
            site.history.append(_amax(t))
            del site.history[:-op.history]
        every = self.telemetry_every
        counted = every is not None and self.steps % every == 0
        return quantize_operand(t, op, axis, generator=self.generator, amax=amax,
                                stats=site.stats if counted else None)

    @property
    def telemetry(self) -> dict:
        return {key: site.stats for key, site in self.sites.items()}

    def reset_telemetry(self) -> None:
        for site in self.sites.values():
            site.stats.reset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"layer {self.layer_name!r}: input of shape {tuple(x.shape)}; "
                             f"accepted: (..., {self.in_features})")
        x2 = x.reshape(-1, self.in_features)
        # wgrad's K is the token count: refused here, before anything is drawn or counted,
        # when a backward pass may follow
        training = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        self.recipe.check_dims(self.in_features, self.out_features,
                               x2.shape[0] if training else None,
                               where=f"layer {self.layer_name!r}: ")
        y = _LinearFunction.apply(x2, self.weight, self.bias, self)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name!r}"


def _telemetry_every(telemetry) -> int | None:
    """Steps between counted steps: True 1, False None, an integer N >= 1 itself."""
    if isinstance(telemetry, (bool, np.bool_)):
        return 1 if telemetry else None
    if isinstance(telemetry, (int, np.integer)) and telemetry >= 1:
        return int(telemetry)
    raise ValueError(f"telemetry={telemetry!r} is not accepted; accepted: True (count every "
                     "step), False, or an integer N >= 1 (count every N-th step)")


def _in_attention(name: str, attention: list[str]) -> bool:
    return any(name.startswith(prefix + ".") for prefix in attention)


def simulate(model: nn.Module, recipe, *, skip=(), generator=None,
             telemetry: bool | int = True) -> nn.Module:
    """Swap ``model``'s ``nn.Linear`` layers for :class:`SimulatedLinear` with ``recipe``
    (a name of :data:`lpsim.torch.PRESETS` or a Recipe), in place; returns ``model``.

    skip: names of linear layers to leave as they are (as ``model.named_modules()`` gives
    them), or a callable ``skip(name, module) -> bool``.  With ``recipe.keep_first_last``
    the first and last linear layers (in ``named_modules`` order) run the ``bf16`` recipe.
    generator: an :class:`lpsim.Generator` (or an integer seed) for stochastic rounding and
    the RHT signs; None draws a seed.  telemetry: count every quantization (True), none
    (False) or those of every N-th step (an integer N; a step ends with a layer's backward
    pass): the counting kernels cost about as much as the rest of a simulated step on the
    CPU (``benchmarks/bench_recipes.py``).  Layers already simulated take the new recipe.
    The projections inside ``nn.MultiheadAttention`` are not swapped (its forward reads
    their weights directly): a warning names them.
    """
    r = as_recipe(recipe)
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        generator = Generator(int(generator))
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(f"generator={generator!r} is not accepted; accepted: an "
                        "lpsim.Generator, an integer seed or None")
    generator = generator if generator is not None else Generator()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={model!r} is not a torch.nn.Module")
    if callable(skip):
        skipped = skip
    else:
        names = set(skip) if not isinstance(skip, str) else {skip}
        known = {n for n, _ in model.named_modules()}
        unknown = names - known
        if unknown:
            raise ValueError(f"skip={sorted(unknown)!r}: no such modules in the model")

        def skipped(name, module):
            return name in names
    attention = [n for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    layers, left = [], []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if _in_attention(name, attention):
            left.append(name)
        elif not skipped(name, module):
            layers.append((name, module))
    if left:
        warnings.warn(f"lpsim.torch.simulate: {left} belong to nn.MultiheadAttention, whose "
                      "forward reads their weights directly; they are not simulated",
                      stacklevel=2)
    _telemetry_every(telemetry)
    made = []
    for index, (name, module) in enumerate(layers):
        first_last = r.keep_first_last and index in (0, len(layers) - 1)
        chosen = PRESETS["bf16"] if first_last else r
        made.append((name, module, chosen, index))
    for name, module, chosen, index in made:      # every layer checked before any swap
        chosen.check_dims(module.in_features, module.out_features, where=f"layer {name!r}: ")
    for name, module, chosen, index in made:
        new = SimulatedLinear.from_linear(module, chosen, generator=generator, name=name,
                                          index=index, telemetry=telemetry)
        _replace(model, name, new)
    return model


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


@dataclass(frozen=True)
class Report:
    """The telemetry of a simulated model: one row per (layer, gemm, operand)."""

    rows: tuple

    COLUMNS = ("layer", "recipe", "gemm", "operand", "format", "elements", "saturated",
               "underflow", "blocks", "clipped_scales", "flushed_blocks")

    def worst(self) -> dict | None:
        """The row with the largest fraction of saturated, underflowed or flushed values."""
        def badness(row):
            n = max(row["elements"], 1)
            return (row["saturated"] + row["underflow"]) / n + \
                row["flushed_blocks"] / max(row["blocks"], 1)
        return max(self.rows, key=badness, default=None)

    def __str__(self) -> str:
        table = [self.COLUMNS] + [tuple(str(row[c]) for c in self.COLUMNS) for row in self.rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(self.COLUMNS))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip()
                         for line in table)


def report(model: nn.Module) -> Report:
    """Per simulated layer, GEMM and operand: how many elements were quantized, saturated
    and underflowed, and how many blocks were clipped or flushed to zero, so far."""
    rows = []
    for name, module in model.named_modules():
        if not isinstance(module, SimulatedLinear):
            continue
        for (g, role), site in module.sites.items():
            s = site.stats
            op = module.recipe.operand(g, role)
            rows.append({"layer": name, "recipe": module.recipe.name, "gemm": g,
                         "operand": role, "format": "fp32" if op.fmt is None else
                         str(op.fmt), "elements": s.elements, "saturated": s.overflow,
                         "underflow": s.underflow, "blocks": s.blocks,
                         "clipped_scales": s.clipped_scales,
                         "flushed_blocks": s.flushed_blocks})
    return Report(tuple(rows))


__all__ = ["simulate", "SimulatedLinear", "report", "Report", "quantize_operand", "gemm", "rht",
           "rht_signs", "hadamard", "tensor_scale", "Recipe"]
