"""The simulated GEMMs of a linear map ``y = x Wᵀ + b`` under a training recipe.

A linear map runs three GEMMs (:mod:`lpsim.torch.recipes`); each is, bit for bit, the
composition a user could write by hand (:func:`gemm` is that composition):

1. each operand fake-quantized along the GEMM's K by :func:`quantize_operand`
   (``lpsim.quantize`` with the operand's format, rounding and per-tensor scale; k x k blocks
   as blocks of k*k elements of the tiled tensor), the wgrad operands (tokens along K)
   after the RHT along the tokens when the recipe has one
   (:mod:`lpsim.torch.hadamard`: a defined butterfly order, the same bits on every device;
   on the CPU, block formats take the transform band by band inside the quantization,
   :func:`lpsim.blocks.quantize_hadamard_columns`, the same bits without the transformed
   tensor in memory);
2. :func:`lpsim.ops.matmul` with the recipe's accumulation (on a GPU, an FP32 GEMM is
   ``torch.matmul`` with TF32 off; the models of lpsim.ops run on the CPU); an instruction
   model instead takes the operands' own elements, block scales and per-tensor factors
   (:func:`quantize_parts`: the same values, draws and counts) through
   :func:`lpsim.ops.scaled_matmul`, on the CPU;
3. the bias added in FP32 (fprop), then the output rounded to nearest in its format.

:class:`LinearGemms` holds what one linear map's GEMMs keep between calls: the recipe, the
:class:`lpsim.Generator` that stochastic rounding draws from (every call fresh counters), the
index that keys the RHT's signs, the step count and the telemetry counters
(:class:`lpsim.blocks.BlockStats`) per GEMM and operand.  ``SimulatedLinear``
(:mod:`lpsim.torch.simulate`) is one; ``SimulatedMultiheadAttention``
(:mod:`lpsim.torch.attention`) holds one per projection.
"""

from __future__ import annotations

import collections
import copy
import functools
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from ..blocks.amax import tensor_amax
from ..blocks.columns import takes_columns
from ..blocks.counters import BlockStats, add_counts
from ..blocks.decisions import block_params
from ..blocks.fake_quantize import (quantize_blocks, quantize_hadamard_cached,
                                    quantize_hadamard_columns, takes_hadamard_columns)
from ..blocks.formats import BlockFormat
from ..formats import PRESETS, Format, parse_format
from ..generator import Generator, resolve as resolve_generator
from ..ops.instruction_models import InstructionModel, scaled_matmul
from ..ops.reductions import matmul as lp_matmul
from ..quantize import quantize as lp_quantize
from ..rounding import mode_code
from ..tensors import autocast_off
from .hadamard import factors, rht, rht_signs, rht_tokens, rht_transposed  # noqa: F401
from .recipes import GEMMS, Gemm, Operand, recipe as as_recipe

#: steps whose RHT signs a layer draws and moves to its device at once: a copy from the host
#: makes the host wait for a GPU, which a copy each backward pass would do twice a layer
RHT_WINDOW = 64
#: forwards a layer remembers for activation checkpointing's recompute (:meth:`LinearGemms.
#: linear`): a recompute replays the latest one of the same shapes not yet replayed
REPLAYS = 64
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def tensor_scale(amax: float, fmt) -> float:
    """The per-tensor scale ``fp32(max / amax)`` (1 when amax is 0 or not finite; float32's
    largest value where the quotient overflows), as TransformerEngine computes it."""
    if not 0.0 < amax < float("inf"):
        return 1.0
    s = float(np.float32(np.float32(fmt.max_finite) / np.float32(amax)))
    return s if s < float("inf") else _FLOAT32_MAX


def _amax(t: torch.Tensor):
    """The largest finite magnitude of ``t``'s float32 values (0 for none), as NVFP4's tensor
    scale takes it: a float from lpsim's threaded pass on the CPU (torch's reductions cost
    ten times more there); on a GPU a 0-d float32 tensor there, so the host does not wait."""
    if t.numel() == 0:
        return 0.0
    if t.device.type == "cpu":
        return tensor_amax(t.detach().float().contiguous().numpy().reshape(-1))
    return device_amax(t)


def device_amax(t: torch.Tensor) -> torch.Tensor:
    """:func:`_amax` of a non-empty tensor by three torch operations on its device (NaN and
    inf magnitudes made 0): a 0-d float32 tensor there."""
    return t.detach().float().abs().nan_to_num_(0.0, 0.0, 0.0).max()


def device_tensor_scale(amax: torch.Tensor, fmt) -> torch.Tensor:
    """:func:`tensor_scale` of an ``amax`` tensor (taken as float32), as a float32 tensor on
    its device, by the same IEEE float32 division: a per-tensor scale without a wait for the
    device (a GPU's amax stays there), in five small operations (each a launch on a GPU)."""
    amax = amax.to(torch.float32)
    top = float(np.float32(fmt.max_finite))
    # amax in (0, inf): fp32(top / amax), an overflow clamped to float32's largest; else 1
    return torch.where((amax > 0) & (amax < float("inf")),
                       torch.div(top, amax).clamp_(max=_FLOAT32_MAX), 1.0)


def quantize_operand(t: torch.Tensor, op: Operand, axis: int, *, generator=None, stats=None,
                     amax: float | None = None) -> torch.Tensor:
    """The float32 values of the 2-D tensor ``t`` quantized as ``op`` says along ``axis``.

    amax: the per-tensor amax for ``scaling`` (None: this tensor's own).  Element formats
    without scaling and block formats are ``lpsim.quantize``; k x k blocks tile ``t``, make
    each tile a block of k*k elements and untile.
    """
    return _quantized(t, op, axis, generator, stats, amax, False)[0]


def quantize_parts(t: torch.Tensor, op: Operand, axis: int, *, generator=None, stats=None,
                   amax: float | None = None) -> tuple[torch.Tensor, "Parts"]:
    """:func:`quantize_operand`'s values (the same bits, random counters and counts) and
    their :class:`Parts`, which an instruction model takes (block formats: one
    ``lpsim.blocks.quantize_blocks`` call in place of ``lpsim.quantize``'s, on the CPU)."""
    return _quantized(t, op, axis, generator, stats, amax, True)


@dataclass(frozen=True)
class Parts:
    """An operand's decomposition, as a tensor-core instruction takes it: each value is
    ``elements * scale of its block * factor``.  elements: float64, the values' shape;
    scales: one per block of ``tile`` = (rows, columns) elements, or None (no block scales);
    factor: the per-tensor factor (NVFP4's tensor scale, the float32 ``1/s`` of per-tensor
    scaling, else 1)."""

    elements: np.ndarray
    scales: np.ndarray | None
    tile: tuple
    factor: float

    def t(self) -> "Parts":
        """The transpose's parts."""
        return Parts(self.elements.T, None if self.scales is None else self.scales.T,
                     self.tile[::-1], self.factor)

    def along(self, axis: int):
        """The scales with K along ``axis`` (1: a's, M x K/block; 0: b's, K/block x N): a k x
        k tile's scale repeated for every row (column) it spans."""
        if self.scales is None:
            return None
        rows, cols = self.tile
        return np.repeat(self.scales, rows, axis=0) if axis == 1 else \
            np.repeat(self.scales, cols, axis=1)


def _quantized(t, op, axis, generator, stats, amax, keep):
    """(values, Parts or None): :func:`quantize_operand`'s work, with ``keep`` the parts."""
    fmt = op.fmt
    if fmt is None:         # kept: float64 stays float64 (gradcheck of the exact recipe)
        return (t.detach() if t.dtype == torch.float64 else t.detach().float()), None
    t = t.detach().float()

    def rounded(values, fmt, **where):
        return lp_quantize(values, fmt, op.rounding, sr_bits=op.sr_bits, generator=generator,
                           stats=stats, **where)

    def blocked(x, fmt):
        """x's blocks along its last axis: values (on x's device), and the parts if kept."""
        if not keep:
            return rounded(x, fmt, axis=-1), None
        q = _blocks_kept(x, fmt, op, generator, stats)
        return torch.from_numpy(q.values).to(x.device), q

    if isinstance(fmt, BlockFormat):
        if op.blocks_2d:
            # k x k tiles, each a block of k*k elements along the last axis, then untiled
            k = fmt.block
            rows, cols = t.shape
            tiles = t.reshape(rows // k, k, cols // k, k).permute(0, 2, 1, 3).reshape(
                rows // k, cols // k, k * k)
            q, kept = blocked(tiles, _square(fmt))
            values = q.reshape(rows // k, cols // k, k, k).permute(0, 2, 1, 3).reshape(
                rows, cols)
            return values, kept and Parts(
                kept.elements.reshape(rows // k, cols // k, k, k).transpose(0, 2, 1, 3)
                .reshape(rows, cols), kept.scales.reshape(rows // k, cols // k), (k, k),
                kept.tensor_scale)
        if t.ndim == 2 and axis in (0, -2):
            if not keep and _down_columns(t, fmt, op):
                # lpsim.blocks.columns: the blocks read as they lie, no transposing copy
                return rounded(t, fmt, axis=0), None
            # blocks down the columns: the transpose's rows, the same blocks and random
            # counters (C order of the blocked layout); torch's transposing copy is the
            # fastest here, and the result goes back as a view, which the GEMM reads as is
            q, kept = blocked(t.t().contiguous(), fmt)
            return q.t(), kept and Parts(kept.elements, kept.scales, (1, fmt.block),
                                         kept.tensor_scale).t()
        if not keep:
            return rounded(t, fmt, axis=axis), None
        q, kept = blocked(t.contiguous(), fmt)
        return q, Parts(kept.elements, kept.scales, (1, fmt.block), kept.tensor_scale)
    if op.scaling == "none":
        q = rounded(t, fmt)
        return q, keep and Parts(_float64(q), None, (1, 1), 1.0) or None
    amax = _amax(t) if amax is None else amax
    if isinstance(amax, torch.Tensor) and not keep:
        s = device_tensor_scale(amax.to(t.device), fmt)
    else:                   # the parts' factor 1/s is a host float
        s = tensor_scale(float(amax), fmt)
    q = t * s
    rounded(q, fmt, out=q)
    # the elements are q before the division; an instruction multiplies D by 1/s (float32)
    kept = keep and Parts(_float64(q), None, (1, 1),
                          float(np.float32(1.0) / np.float32(s))) or None
    if not isinstance(s, torch.Tensor) and q.device.type != "cpu":
        # torch divides a GPU tensor by a host number as a product with its reciprocal (a
        # rounding more: other bits than the CPU's division); by a device scalar it divides
        s = torch.full((), s, dtype=torch.float32, device=q.device)
    return q.div_(s), kept


def _down_columns(t: torch.Tensor, fmt, op: Operand) -> bool:
    """Whether ``lpsim.quantize(t, fmt, axis=0)`` quantizes the 2-D ``t`` down its columns
    where it lies (a contiguous float32 CPU tensor that :func:`lpsim.blocks.columns.
    takes_columns` takes; a generator's counters start at multiples of 4), faster than
    torch's transposing copy and the row kernel; elsewhere that copy is the faster route."""
    return (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
            and takes_columns(t.numpy(), 0, block_params(fmt), mode_code(op.rounding), False,
                              False))


def _rht_columns(t: torch.Tensor, signs, op: Operand, generator, stats, c=None):
    """``quantize_operand(rht_tokens(t, signs), op, 0, ...)`` (the same bits, random counters
    and counts) with the transform made band by band in the cache as the blocks down the
    columns are quantized (:func:`lpsim.blocks.quantize_hadamard_columns`: the transformed
    tensor never in memory), or None where that route does not take ``t`` (not a float32
    2-D CPU tensor, a format or rounding of other routes, 2-D blocks).  ``c``: the signs'
    float32 factors as a numpy array, where the caller has them."""
    fmt = op.fmt
    if not (isinstance(fmt, BlockFormat) and not op.blocks_2d and op.scaling != "delayed"
            and t.device.type == "cpu" and t.dtype == torch.float32 and t.ndim == 2):
        return None
    x = t.detach().contiguous().numpy()
    if c is None:
        c = factors(signs, torch.float32, "cpu").numpy()
    want = "totals" if stats is not None else False
    done = quantize_hadamard_cached(x, c, fmt, op.rounding, op.sr_bits, want, generator, stats)
    if done is not None:                # what a first call planned and checked
        return torch.from_numpy(done)
    if not takes_hadamard_columns(x, c.size, fmt, op.rounding, want):
        return None

    def run():
        seed, stream, offset = resolve_generator(generator, x, op.rounding, None, 0, 0)
        q = quantize_hadamard_columns(x, c, fmt, op.rounding, seed=seed, stream=stream,
                                      sr_bits=op.sr_bits, offset=offset, want_counts=want)
        add_counts(stats, q.counts, x.size, q.scales.size)
        return torch.from_numpy(q.values)
    return generator.run(run) if isinstance(generator, Generator) else run()


def _float64(q: torch.Tensor) -> np.ndarray:
    return q.detach().cpu().numpy().astype(np.float64)


def _blocks_kept(x: torch.Tensor, fmt, op: Operand, generator, stats):
    """``lpsim.quantize(x, fmt, axis=-1)`` (x float32) as one ``quantize_blocks`` call on the
    CPU with the same generator counters and counts, its elements and scales kept (the CPU
    and CUDA kernels decide alike: a CUDA tensor's blocks are made here)."""
    array = np.ascontiguousarray(x.cpu().numpy())

    def run():
        seed, stream, offset = resolve_generator(generator, array, op.rounding, None, 0, 0)
        q = quantize_blocks(array, fmt, op.rounding, axis=-1, seed=seed, stream=stream,
                            sr_bits=op.sr_bits, offset=offset, want_counts=stats is not None)
        add_counts(stats, q.counts, array.size)
        return q
    return generator.run(run) if isinstance(generator, Generator) else run()


@functools.lru_cache(maxsize=64)
def _square(bfmt: BlockFormat) -> BlockFormat:
    """``bfmt`` with blocks of block**2 elements: a k x k tile as one block (made once per
    format, not per call)."""
    return replace(bfmt, block=bfmt.block ** 2)


def _product(a: torch.Tensor, b: torch.Tensor, accumulate) -> torch.Tensor:
    if a.device.type == "cpu":      # transposed views go to BLAS as they are
        return lp_matmul(a, b, model=accumulate)
    if accumulate is None:
        flag = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            with autocast_off(a.device.type):
                return torch.matmul(a, b)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = flag
    # the models of lpsim.ops are CPU kernels: the operands go there and back
    return lp_matmul(a.cpu(), b.cpu(), model=accumulate).to(a.device)


def gemm(a: torch.Tensor, b: torch.Tensor, spec: Gemm, bias=None, parts=None) -> torch.Tensor:
    """a @ b (quantized operands, K between them) with ``spec``'s accumulation, plus ``bias``
    in FP32, rounded to ``spec.out`` to nearest.  An instruction model takes the operands'
    ``parts`` (a's and b's :class:`Parts`, b's K x N) in place of their values."""
    if isinstance(spec.accumulate, InstructionModel):
        pa, pb = parts
        y = torch.from_numpy(scaled_matmul(pa.elements, pa.along(1), pb.elements, pb.along(0),
                                           spec.accumulate, pa.factor * pb.factor)).to(a.device)
    else:
        y = _product(a, b, spec.accumulate)
    if bias is not None:            # in place: y is the GEMM's own new tensor
        y.add_(bias.detach().to(y.dtype))
    if spec.out is None:
        return y
    return lp_quantize(y, spec.out, out=y)     # in place too: no new output to allocate


@dataclass
class _Site:
    """One operand of one GEMM of a layer: its counters and, for delayed scaling, the last
    steps' amaxes (a float32 tensor on the operand's device, written round robin: zeros
    before the first steps, so its largest is the largest so far) and how many there were."""

    stats: BlockStats
    history: torch.Tensor | None = None
    seen: int = 0

    def delayed_amax(self, t: torch.Tensor, length: int):
        """The largest amax of the last ``length`` steps (0 before the first), then ``t``'s
        recorded: a float on the CPU, a 0-d tensor on a GPU (no wait for the device)."""
        if self.history is None or self.history.numel() != length:
            self.history, self.seen = torch.zeros(length, dtype=torch.float32), 0
        self.history = self.history.to(t.device)
        if self.history.is_inference() and not torch.is_inference_mode_enabled():
            # made in an inference pass (a validation step first): such a tensor cannot be
            # written outside one, so training went on with a copy that can
            self.history = self.history.clone()
        largest = self.history.max()
        self.history[self.seen % length] = _amax(t)
        self.seen += 1
        return float(largest) if t.device.type == "cpu" else largest


class _LinearFunction(torch.autograd.Function):
    """The three GEMMs of a :class:`LinearGemms` (``layer``) on 2-D inputs (tokens,
    in_features); weight and bias may be views of larger Parameters (autograd takes their
    gradients there)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        r = layer.recipe
        shared = r.dgrad.b == r.fprop.b and r.fprop.b.blocks_2d
        keep = _keeps(r)
        xq, xp = layer.operand(x, "fprop", "x", -1, keep["fprop"])
        wq, wp = layer.operand(weight, "fprop", "w", -1,
                                keep["fprop"] or shared and keep["dgrad"])
        y = gemm(xq, wq.t(), r.fprop, bias, (xp, wp and wp.t()))
        ctx.layer = layer
        ctx.has_bias = bias is not None
        ctx.w_parts = wp if shared else None
        ctx.save_for_backward(x, weight, wq if shared else None)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        # once differentiable: the GEMMs of the backward pass are quantized, detached
        # compositions, so a second derivative through them (create_graph=True: gradient
        # penalties, MAML) is refused by torch with an error, not silently zero
        layer = ctx.layer
        r = layer.recipe
        keep = _keeps(r)
        x, weight, wq_shared = ctx.saved_tensors
        dy = grad = dy if dy.dtype == torch.float64 else dy.float()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dyq, dyp = layer.operand(dy, "dgrad", "dy", -1, keep["dgrad"])
            wq, wp = (wq_shared, ctx.w_parts) if wq_shared is not None else \
                layer.operand(weight, "dgrad", "w", 0, keep["dgrad"])
            dx = gemm(dyq, wq, r.dgrad, parts=(dyp, wp)).to(x.dtype)
        xd = x.detach().to(dy.dtype)
        signs = layer.rht_signs(r.rht, dy.device) if ctx.needs_input_grad[1] \
            and r.rht is not None else None
        if ctx.needs_input_grad[1] and not keep["wgrad"] and dy.device.type == "cpu":
            # K is the tokens, dy's and x's first axis: on the CPU each is transformed and
            # quantized as it lies (the blocks down the columns: lpsim.blocks.columns) and
            # the GEMM reads dy's transpose as a view, so nothing is transposed
            dyq, xq = layer.operand(dy, "wgrad", "dy", 0, False, signs)[0], \
                layer.operand(xd, "wgrad", "x", 0, False, signs)[0]
            dw = gemm(dyq.t(), xq, r.wgrad).to(weight.dtype)
        elif ctx.needs_input_grad[1]:
            # K is the tokens: the transposes hold them along the last axis, where a GPU's
            # kernels and the kept parts take the blocks (the same blocks and counters)
            if signs is not None:
                dy_t, x_t = rht_transposed(dy, signs), rht_transposed(xd, signs)
            else:
                dy_t, x_t = dy.t().contiguous(), xd.t().contiguous()
            dyq, dyp = layer.operand(dy_t, "wgrad", "dy", -1, keep["wgrad"])
            xq, xp = layer.operand(x_t, "wgrad", "x", -1, keep["wgrad"])
            dw = gemm(dyq, xq.t(), r.wgrad, parts=(dyp, xp and xp.t())).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = grad.sum(0)
        layer.steps += 1
        return dx, dw, db, None


def _keeps(r) -> dict:
    """Per GEMM whether its operands' parts are kept: its accumulation is an instruction."""
    return {g: isinstance(getattr(r, g).accumulate, InstructionModel) for g in GEMMS}


def _telemetry_every(telemetry) -> int | None:
    """Steps between counted steps: True 1, False None, an integer N >= 1 itself."""
    if isinstance(telemetry, (bool, np.bool_)):
        return 1 if telemetry else None
    if isinstance(telemetry, (int, np.integer)) and telemetry >= 1:
        return int(telemetry)
    raise ValueError(f"telemetry={telemetry!r} is not accepted; accepted: True (count every "
                     "step), False, or an integer N >= 1 (count every N-th step)")



def check_float_input(x, what: str, where: str) -> None:
    """A TypeError unless ``x`` is a floating point tensor, a ValueError for a 0-d one
    (``where`` names the layer or module, ``what`` the argument)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}{what} of type {type(x).__name__} is not accepted; accepted: "
                        "a floating point torch tensor")
    if not x.is_floating_point():
        raise TypeError(f"{where}{what} of dtype {x.dtype} is not accepted; accepted: a "
                        "floating point tensor (as nn.Linear's weights need)")
    if x.dim() == 0:
        raise ValueError(f"{where}a 0-d {what} is not accepted; accepted: a tensor of at "
                         "least one dimension, its last the features")


class LinearGemms:
    """The state of one simulated linear map's GEMMs: ``recipe``, ``generator`` (stochastic
    rounding and the RHT's seed), ``layer_name``, ``layer_index`` (the RHT's Philox stream
    is RHT_STREAM + it), ``telemetry_every``, ``steps`` (backward passes so far: the RHT's
    step) and ``sites``, per (gemm, operand) the counters and delayed-scaling amaxes.
    :meth:`linear` runs the map."""

    _forward = None         # the forward being run: [generator state, key, delayed amaxes]
    _replay = None          # the remembered forward a recompute is replaying

    def __init__(self, recipe, *, generator: Generator | None = None, name: str = "",
                 index: int = 0, telemetry: bool | int = True):
        self.recipe = as_recipe(recipe)
        self.generator = generator if generator is not None else Generator()
        self.layer_name, self.layer_index = name, index
        self.telemetry_every = _telemetry_every(telemetry)
        self.steps = 0
        self.sites = {(g, role): _Site(BlockStats())
                      for g, roles in GEMMS.items() for role in roles}
        self._rht_window = None             # (seed, n, device, first step, signs tensor)
        self._rht_factors = None            # (signs tensor, its version, its CPU factors)

    def rht_signs(self, n: int, device: torch.device) -> torch.Tensor:
        """This step's RHT signs (:func:`rht_signs`), a float32 row on ``device`` of the
        RHT_WINDOW steps' signs drawn and moved there at once."""
        seed, step = self.generator.initial_seed(), self.steps
        found = self._rht_window
        if (found is None or found[:3] != (seed, n, device)
                or not found[3] <= step < found[3] + RHT_WINDOW):
            signs = rht_signs(seed, self.layer_index, step, n, RHT_WINDOW)
            found = self._rht_window = (seed, n, device, step, torch.from_numpy(signs).to(
                device, torch.float32))
        return found[4][step - found[3]]

    def _cpu_factors(self, signs):
        """The float32 factors of ``signs`` (a CPU float32 tensor) as a numpy array, kept
        for the next call with the same tensor unchanged (a backward pass transforms dy and
        x with one step's signs); None for signs elsewhere."""
        kept = self._rht_factors
        if kept is not None and kept[0] is signs and kept[1] == signs._version:
            return kept[2]
        if not (isinstance(signs, torch.Tensor) and signs.device.type == "cpu"
                and signs.dtype == torch.float32):
            return None
        c = factors(signs, torch.float32, "cpu").numpy()
        self._rht_factors = (signs, signs._version, c)
        return c

    def quantize(self, t, gemm: str, role: str, axis: int) -> torch.Tensor:
        """The operand ``role`` of ``gemm`` quantized along ``axis``, counted and with its
        delayed-scaling amax recorded."""
        return self.operand(t, gemm, role, axis, False)[0]

    def operand(self, t, gemm: str, role: str, axis: int, keep: bool, signs=None):
        """:meth:`quantize`'s values, and their :class:`Parts` when ``keep`` (else None).
        ``signs``: those of an RHT along axis 0 (the tokens) that ``t`` takes first
        (:func:`rht_tokens`; on the CPU, where :func:`_rht_columns` takes it, made band by
        band as the blocks are quantized)."""
        op = self.recipe.operand(gemm, role)
        site = self.sites[gemm, role]
        every = self.telemetry_every
        replay = self._replay               # a recompute: counted once already
        counted = replay is None and every is not None and self.steps % every == 0
        stats = site.stats if counted else None
        if signs is not None:
            done = None if keep else _rht_columns(t, signs, op, self.generator, stats,
                                                  self._cpu_factors(signs))
            if done is not None:
                return done, None
            t = rht_tokens(t, signs)
        amax = None
        if op.scaling == "delayed":
            if replay is not None and (gemm, role) in replay[2]:
                amax = replay[2][gemm, role]
            else:
                amax = site.delayed_amax(t, op.history)
                if self._forward is not None:
                    self._forward[2][gemm, role] = amax
        return _quantized(t, op, axis, self.generator, stats, amax, keep)

    @property
    def telemetry(self) -> dict:
        """Per (gemm, operand) the counters of the counted quantizations so far."""
        return {key: site.stats for key, site in self.sites.items()}

    def reset_telemetry(self) -> None:
        for site in self.sites.values():
            site.stats.reset()

    def check_input(self, x, what: str = "input") -> None:
        """A clear error for an input nn.Linear refuses too: not a tensor, 0-d, or not
        floating point (the GEMMs' float32 values would come back cast to x's dtype,
        an integer input's truncated), naming the layer; and for a nested tensor, whose
        tokens the GEMMs cannot block."""
        where = f"layer {self.layer_name!r}: "
        if isinstance(x, torch.Tensor) and x.is_nested:
            raise ValueError(f"{where}{what} is a nested tensor; accepted: a dense tensor "
                             "(nn.TransformerEncoder makes nested tensors in eval mode given a "
                             "padding mask: build it with enable_nested_tensor=False)")
        check_float_input(x, what, where)

    def check_dims(self, in_features: int, out_features: int, tokens: int | None = None,
                   gemms=GEMMS):
        """The recipe's refusal of block sizes these dimensions do not divide, naming the
        layer, for the ``gemms`` a forward and its backward pass will run
        (:func:`gemms_to_run`; tokens None: not known)."""
        self.recipe.check_dims(in_features, out_features, tokens,
                               where=f"layer {self.layer_name!r}: ", gemms=gemms)

    def output_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype the map returns for the input ``x``: x's own; under ``torch.autocast``
        for x's device (x float32, float16 or bfloat16) autocast's dtype, as nn.Linear's
        there, where the recipe's fprop output is exact in it, else float32 (the values
        stay the recipe's)."""
        device = x.device.type
        if x.dtype not in _AUTOCAST_CASTS or not torch.is_autocast_enabled(device):
            return x.dtype
        low = torch.get_autocast_dtype(device)
        return low if holds(self.recipe.fprop.out, low) else torch.float32

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
        """``x @ weight.T + bias`` for a 2-D ``x`` (tokens, in_features) through the
        recipe's three GEMMs (checked beforehand by :meth:`check_dims`).

        Activation checkpointing (``torch.utils.checkpoint``) runs a forward again inside
        the backward pass and needs the same values: torch restores its own RNG for it, and
        a layer replays its own forward.  Each forward remembers the generator's state and
        its delayed-scaling amaxes (:data:`REPLAYS` of them); a forward that runs while
        autograd runs a backward pass takes the latest remembered one of the same shapes
        and weight version, draws the same counters, uses the same scales, and neither
        counts nor records anything (the generator is left where the backward had it)."""
        key = (tuple(x.shape), x.dtype, tuple(weight.shape), weight._version)
        if torch._C._current_graph_task_id() != -1:
            found = self._remembered(key)
            if found is not None:
                return self._replayed(found, x, weight, bias)
        state = [self.generator.get_state(), key, {}]
        self._forward = state
        try:
            y = _LinearFunction.apply(x, weight, bias, self)
        finally:
            self._forward = None
        replays = self.__dict__.setdefault("_replays", collections.deque(maxlen=REPLAYS))
        replays.append(state)
        return y

    def _remembered(self, key):
        """The latest remembered forward with ``key``, taken off the list; None if none."""
        replays = self.__dict__.get("_replays", ())
        for i in range(len(replays) - 1, -1, -1):
            if replays[i][1] == key:
                found = replays[i]
                del replays[i]
                return found
        return None

    def _replayed(self, state, x, weight, bias):
        now = self.generator.get_state()
        self.generator.set_state(state[0])
        self._replay = state
        try:
            return _LinearFunction.apply(x, weight, bias, self)
        finally:
            self._replay = None
            self.generator.set_state(now)


#: the input dtypes autocast casts (it leaves float64 as it is)
_AUTOCAST_CASTS = (torch.float32, torch.float16, torch.bfloat16)
#: the formats of torch's floating dtypes
_DTYPE_FORMATS = {torch.bfloat16: PRESETS["bf16"], torch.float16: PRESETS["fp16"],
                  torch.float32: PRESETS["fp32"], torch.float64: PRESETS["fp64"]}


def holds(fmt, dtype: torch.dtype) -> bool:
    """Whether every value of the format ``fmt`` (an element format or its name, or None:
    float32) is exact in the torch floating dtype ``dtype``; False for other formats."""
    fmt = PRESETS["fp32"] if fmt is None else parse_format(fmt) if isinstance(fmt, str) \
        else fmt
    wide = _DTYPE_FORMATS.get(dtype)
    if wide is None or not isinstance(fmt, Format):
        return False
    return fmt.within(wide)


def wgrad_follows(weight: torch.Tensor) -> bool:
    """Whether a backward pass may run wgrad, whose K is the token count (checked then):
    only for a weight that takes a gradient (a frozen layer's backward runs dgrad alone)."""
    return torch.is_grad_enabled() and weight.requires_grad


def gemms_to_run(input_grad: bool, weight: torch.Tensor) -> tuple:
    """The GEMMs a forward and the backward pass that may follow it run: fprop; dgrad
    where the input takes a gradient (``input_grad``, under grad mode); wgrad where the
    weight does (:func:`wgrad_follows`).  Their operands' blocks are checked before any
    runs, k x k blocks of x and dy against the token count too."""
    dgrad = torch.is_grad_enabled() and input_grad
    return ("fprop",) + (("dgrad",) if dgrad else ()) + \
        (("wgrad",) if wgrad_follows(weight) else ())



def keep_out_of_fast_paths(module, args) -> None:
    """A forward pre-hook that does nothing: a module with a hook is one that
    ``nn.TransformerEncoderLayer``'s inference fast path does not take, as that path reads
    the weights directly and would run none of the simulated GEMMs."""
    return None


#: nn.Module's hook registries (forward, backward, state-dict and load hooks)
_HOOKS = tuple(sorted(key for key in vars(torch.nn.Module()) if "hook" in key))


#: what nn.Module's own __init__ sets: never taken from the module a simulated one replaces
MODULE_STATE = frozenset(vars(torch.nn.Module()))


def adopt_module_state(new: torch.nn.Module, old: torch.nn.Module, share: bool = False) -> None:
    """``new`` (a simulated module made to replace ``old``) takes ``old``'s training flag,
    the attributes a user or a framework set on it (an init scale, ``_is_hf_initialized``:
    those ``new`` has not set itself) and its hooks: copies of the registries, so ``old``
    stays as it was (a reference layer the user keeps); with ``share`` (simulate's swap in
    place, where ``old`` leaves the model) the same registries, so the handles a user holds
    still remove them.  Then the fast-path guard (:func:`keep_out_of_fast_paths`), once."""
    new.training = old.training
    for key, value in vars(old).items():
        if key not in MODULE_STATE and key not in vars(new) and key != "_replays":
            new.__dict__[key] = value
    for key in _HOOKS:
        registry = getattr(old, key)
        setattr(new, key, registry if share else copy.copy(registry))
    if keep_out_of_fast_paths not in new._forward_pre_hooks.values():
        new.register_forward_pre_hook(keep_out_of_fast_paths)
