"""Per-tensor precision assignment (Lee, Sharma and Aiken, TMLR 2023, Sections 3-4).

A model M = (f_1 .. f_n) and a loss f_{n+1} (m = n + 1) give the tensor set of one gradient
computation, TS = {v_i, dv_i | i <= m+1} u {theta_j, dtheta_j | f_j has parameters}:
v_1 the input, v_{i+1} = f_i(v_i), v_{m+1} the loss, dv_i their gradients, theta_j the
parameters of f_j and dtheta_j their gradients.  The operators are the model's leaf modules
in the order a forward pass runs them (functional code inside ``forward`` is not an
operator).  Eq. (1) rounds every tensor of TS through its own format pi(t), with hooks:

* v_{i+1}, dv_{i+1}: a forward hook on f_i replaces its output by ``q(output)``, whose
  forward rounds to pi(v_{i+1}) and backward rounds the incoming gradient to pi(dv_{i+1});
  v_1, dv_1 with a forward pre-hook on f_1 (dv_1 exists only if the input requires grad);
  v_{m+1}, dv_{m+1} in :meth:`PrecisionModel.loss`.
* theta_j, dtheta_j: a parametrization of each parameter of f_j (the master copy stays
  fp32; f_j sees round(theta_j), the master gets round(dtheta_j)).

A precision-candidate assignment C gives each tensor a low and a high format
(:class:`Candidates`; the paper's defaults: high fp(6,9,0), low fp(4,3,4) forward and
fp(5,2,0) backward).  Assignments: ``fp32``, ``uniform`` (all low), ``operator`` (pi_op,
Eq. 2: low for v_i, theta_i, dv_{i+1} of the GEMM operators but the first and last) and
``ours`` (Algorithm 1: group the tensors between adjacent GEMM operators, demote the
largest groups first until the low-precision ratio reaches r).  Algorithm 2 promotes,
after each step, every low forward tensor whose overflow ratio exceeded Theta (0.01).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from ..formats import Format, fp, parse_format
from ..stats import RoundingStats
from .quantizer import Rounding, _Round

#: operators the paper calls GEMM (their inputs and weights feed a matrix multiplication)
GEMM = (nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
        nn.ConvTranspose2d, nn.ConvTranspose3d)
KINDS = ("v", "dv", "theta", "dtheta")
FORWARD = ("v", "theta")
ASSIGNMENTS = ("fp32", "uniform", "operator", "ours")


@dataclass(frozen=True)
class Candidates:
    """C(t, lo) and C(t, hi): the low format of forward and of backward tensors, the high one."""

    hi: Format = fp(6, 9, 0)
    lo_forward: Format = fp(4, 3, 4)
    lo_backward: Format = fp(5, 2, 0)

    def __post_init__(self):
        for name in ("hi", "lo_forward", "lo_backward"):
            object.__setattr__(self, name, parse_format(getattr(self, name)))
        if not (self.lo_forward.bits == self.lo_backward.bits < self.hi.bits):
            raise ValueError(f"candidates need one low bit width below the high one: lo "
                             f"{self.lo_forward} / {self.lo_backward}, hi {self.hi}")

    def format(self, kind: str, level: str) -> Format | None:
        """The format of a tensor of ``kind`` at ``level`` ("lo", "hi"; "fp32" is None)."""
        if level == "fp32":
            return None
        if level == "hi":
            return self.hi
        return self.lo_forward if kind in FORWARD else self.lo_backward


@dataclass(frozen=True)
class TensorSlot:
    """One tensor of TS: name ("v3", "dtheta2"), kind, paper index, shapes, operator."""

    name: str
    kind: str
    index: int
    shapes: tuple
    op: str

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


@dataclass
class PrecisionAssignment:
    """pi: TS -> formats, as a level ("fp32", "hi", "lo") per tensor, with candidates C."""

    tensors: list
    levels: dict
    candidates: Candidates = field(default_factory=Candidates)

    def format(self, name: str) -> Format | None:
        slot = self._slot(name)
        return self.candidates.format(slot.kind, self.levels[name])

    def _slot(self, name):
        for slot in self.tensors:
            if slot.name == name:
                return slot
        raise KeyError(f"no tensor {name!r} in this assignment")

    def ratio_lo(self) -> float:
        """ratio_lo(pi): elements in low precision over all elements of TS (Section 3.2)."""
        total = sum(s.size for s in self.tensors)
        return sum(s.size for s in self.tensors if self.levels[s.name] == "lo") / total

    def aggregate_bits(self) -> int:
        """The model aggregate: total bits of all tensors of TS under pi."""
        return sum(s.size * (32 if self.format(s.name) is None else self.format(s.name).bits)
                   for s in self.tensors)

    def low(self) -> list:
        return [s.name for s in self.tensors if self.levels[s.name] == "lo"]


def group_tensors(tensors, ops) -> list[list]:
    """Algorithm 1's grouping: the tensors between adjacent GEMM operators, one group each
    (plus the groups near v_1 and v_{m+1}); ``ops`` = [(name, module)], the loss last."""
    by_key = {(s.kind, s.index): s for s in tensors}
    groups, current = [], []
    for i, (_, module) in enumerate(ops, start=1):
        for kind in KINDS:
            if (kind, i) in by_key:
                current.append(by_key[(kind, i)])
        if isinstance(module, GEMM):
            groups.append(current)
            current = []
    m = len(ops)
    current += [by_key[(kind, m + 1)] for kind in ("v", "dv")]
    groups.append(current)
    return [g for g in groups if g]


def _real(name: str, value, accepted: str) -> float:
    """``value`` as a float: a real number, numpy's included (bools are refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} is not a number; accepted: {accepted}")
    try:
        return float(value)
    except OverflowError:           # an int past float's range
        return math.inf if value > 0 else -math.inf


def assign(kind: str, tensors, ops, *, r: float = 0.5, candidates=None) -> PrecisionAssignment:
    """The assignment ``kind`` ("fp32", "uniform", "operator", "ours") of the paper."""
    candidates = candidates or Candidates()
    if kind not in ASSIGNMENTS:
        raise ValueError(f"unknown assignment {kind!r}; accepted: {', '.join(ASSIGNMENTS)}")
    if kind == "fp32":
        return PrecisionAssignment(tensors, {s.name: "fp32" for s in tensors}, candidates)
    if kind == "uniform":
        return PrecisionAssignment(tensors, {s.name: "lo" for s in tensors}, candidates)
    levels = {s.name: "hi" for s in tensors}
    pi = PrecisionAssignment(tensors, levels, candidates)
    if kind == "operator":      # Eq. (2)
        gemms = [i for i, (_, mod) in enumerate(ops, start=1) if isinstance(mod, GEMM)]
        names = {s.name for s in tensors}
        for i in gemms[1:-1]:
            for name in (f"v{i}", f"theta{i}", f"dv{i + 1}"):
                if name in names:
                    levels[name] = "lo"
        return pi
    r = _real("r", r, "a number in [0, 1] (the low-precision ratio bound)")
    if not 0 <= r <= 1:
        raise ValueError(f"r={r!r} must be a number in [0, 1] (the low-precision ratio bound)")
    groups = sorted(group_tensors(tensors, ops), key=lambda g: -sum(s.size for s in g))
    for group in groups:         # Algorithm 1: demote the largest groups first
        if pi.ratio_lo() >= r:
            break
        for slot in group:
            levels[slot.name] = "lo"
    return pi


class DynamicLossScaler:
    """Dynamic loss scaling (the paper's initial 2^16, growth 2, back-off 0.5).

    ``scale(loss)`` multiplies the loss; ``step(optimizer)`` unscales the gradients and
    steps if all are finite (then grows the scale every ``growth_interval`` good steps: 2000
    by default, torch.amp.GradScaler's; the paper grows once an epoch), else skips the step
    and backs off.  Returns whether it stepped.  Growing every step would skip every other
    step once the scaled loss gradient reaches the backward format's largest value (57344 for
    the default fp(5,2,0), below 2^16).
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        # an infinite or NaN scale (or growth) would skip every step from then on
        checks = (("init_scale", init_scale, "a finite number > 0", lambda v: v > 0),
                  ("growth_factor", growth_factor, "a finite number >= 1", lambda v: v >= 1),
                  ("backoff_factor", backoff_factor, "a number in (0, 1)",
                   lambda v: 0 < v < 1))
        values = []
        for name, value, accepted, ok in checks:
            v = _real(name, value, accepted)
            if not (math.isfinite(v) and ok(v)):
                raise ValueError(f"{name}={value!r} is not accepted; accepted: {accepted}")
            values.append(v)
        if isinstance(growth_interval, (bool, np.bool_)) \
                or not isinstance(growth_interval, (int, np.integer)) or growth_interval < 1:
            raise ValueError(f"growth_interval={growth_interval!r} must be an integer >= 1")
        self.value, self.growth_factor, self.backoff_factor = values
        self.growth_interval = int(growth_interval)
        self._good = 0

    def scale(self, loss):
        return loss * self.value

    def step(self, optimizer) -> bool:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        finite = all(bool(torch.isfinite(g).all()) for g in grads)
        if finite:
            for g in grads:
                g.div_(self.value)
            optimizer.step()
            self._good += 1
            if self._good % self.growth_interval == 0:
                self.value *= self.growth_factor
        else:
            self.value *= self.backoff_factor
            self._good = 0
        return finite


class _Site:
    """The two rounding sites of a (v, dv) or (theta, dtheta) pair."""

    def __init__(self, fwd: TensorSlot, bwd: TensorSlot, rounding, generator):
        self.slots = (fwd, bwd)
        self.fwd = Rounding(None, rounding, generator, RoundingStats())
        self.bwd = Rounding(None, rounding, generator, RoundingStats())

    def __call__(self, x, counting: bool):
        if not x.is_floating_point():           # token ids: an index, not a value
            return x
        fwd, bwd = self.fwd, self.bwd
        if not counting:
            fwd, bwd = dataclasses.replace(fwd, stats=None), dataclasses.replace(bwd, stats=None)
        if fwd.fmt is None and bwd.fmt is None:
            return x
        return _Round.apply(x, fwd, bwd)


class _Parametrized(nn.Module):
    def __init__(self, site, owner):
        super().__init__()
        self.site, self.owner = site, [owner]      # a list: not a submodule

    def forward(self, theta):
        return self.site(theta, self.owner[0].training)


class _InputHook:
    """The first operator's forward pre-hook: its input is v1.  An object, not a closure, so
    that ``copy.deepcopy`` of a PrecisionModel gives hooks of the copy's own sites."""

    def __init__(self, site, model):
        self.site, self.model = site, model

    def __call__(self, module, args):
        return (self.site(args[0], self.model.training),) + args[1:]


class _OutputHook:
    """An operator's forward hook: its output is the next v."""

    def __init__(self, site, model):
        self.site, self.model = site, model

    def __call__(self, module, args, out):
        return self.site(out, self.model.training)


def _leaf_modules(model):
    return [(name, mod) for name, mod in model.named_modules()
            if not any(True for _ in mod.children())]


class PrecisionModel(nn.Module):
    """``model`` with every tensor of its gradient computation rounded by ``assignment``.

    ``example`` is an input batch: one traced forward pass finds the operators and the
    shapes of TS (``example_target`` feeds the loss; default class labels 0).
    ``loss_fn(output, target)`` is the loss operator f_{n+1}; call :meth:`loss` for it.
    After each optimizer step call :meth:`end_step`: it records the per-tensor counters of
    the step and applies Algorithm 2 when ``promote`` (default: on for "ours").
    ``rounding`` and ``generator`` apply to every site.
    """

    def __init__(self, model: nn.Module, example: torch.Tensor, *, assignment: str = "ours",
                 r: float = 0.5, candidates: Candidates | None = None,
                 loss_fn=nn.functional.cross_entropy, theta: float = 0.01,
                 promote: bool | None = None, rounding: str = "nearest", generator=None,
                 example_target: torch.Tensor | None = None):
        super().__init__()
        if isinstance(theta, (bool, np.bool_)) or not isinstance(theta, numbers.Real):
            raise TypeError(f"theta={theta!r} is not a number; accepted: a real number in "
                            "(0, 1) (the overflow-ratio threshold)")
        if not 0 < theta < 1:
            raise ValueError(f"theta={theta!r} must be in (0, 1) (the overflow-ratio threshold)")
        self.model, self.loss_fn, self.theta = model, loss_fn, theta
        self.promote = assignment == "ours" if promote is None else bool(promote)
        self.ops, self.tensors = self._trace(example, example_target)
        self.assignment = assign(assignment, self.tensors, self.ops, r=r,
                                 candidates=candidates)
        self.groups = group_tensors(self.tensors, self.ops)
        self.step_count = 0
        self.promotions: list[tuple[int, str, float]] = []
        self.history: list[dict] = []
        self.initial_aggregate_bits = self.assignment.aggregate_bits()
        self.initial_ratio_lo = self.assignment.ratio_lo()
        self._sites: dict[str, _Site] = {}
        self._install(rounding, generator)

    # --- tracing --------------------------------------------------------------------------
    def _trace(self, example, target):
        leaves = _leaf_modules(self.model)
        order, shapes = [], {}

        def record(module, inputs, output):
            if module in shapes:
                raise ValueError(f"operator {names[module]!r} ran twice in one forward pass; "
                                 "precision assignment needs one module object per operator")
            if not (inputs and torch.is_tensor(inputs[0]) and torch.is_tensor(output)):
                what = (f"returns a {type(output).__name__}" if not torch.is_tensor(output)
                        else "takes no tensor first")
                raise ValueError(f"operator {names[module]!r} ({type(module).__name__}) "
                                 f"{what}; precision assignment rounds one tensor into and "
                                 "out of each operator: accepted: leaf modules of one tensor "
                                 "in and one out (wrap an LSTM, say, in a module that returns "
                                 "one)")
            shapes[module] = (tuple(inputs[0].shape), tuple(output.shape))
            order.append(module)

        names = {mod: name for name, mod in leaves}
        for name, mod in self.model.named_modules():
            if parametrize.is_parametrized(mod):
                raise ValueError(f"module {name!r} has parametrized "
                                 f"{sorted(mod.parametrizations)} (weight_norm, or a "
                                 "PrecisionModel already on it); accepted: a model without "
                                 "parametrizations (remove them first)")
        handles = [mod.register_forward_hook(record) for _, mod in leaves]
        modes = {mod: mod.training for mod in self.model.modules()}
        self.model.eval()           # the trace must not move batch-norm running statistics
        try:
            with torch.no_grad():
                output = self.model(example)
                if target is None:       # class labels, as cross_entropy takes
                    target = torch.zeros(output.shape[0], dtype=torch.long,
                                         device=output.device)
                loss = self.loss_fn(output, target)
        finally:
            for mod, mode in modes.items():     # each module's own mode (a frozen BatchNorm)
                mod.training = mode
            for h in handles:
                h.remove()
        if not order:
            raise ValueError("the model ran no leaf modules on the example input")
        ops = [(f"{names[mod] or 'model'} ({type(mod).__name__})", mod) for mod in order]
        ops.append(("loss", None))
        tensors = []
        for i, (name, mod) in enumerate(ops, start=1):
            shape = shapes[mod][0] if mod is not None else tuple(output.shape)
            tensors += [TensorSlot(f"v{i}", "v", i, (shape,), name),
                        TensorSlot(f"dv{i}", "dv", i, (shape,), name)]
            params = [] if mod is None else list(mod.parameters(recurse=False))
            if params:
                ps = tuple(tuple(p.shape) for p in params)
                tensors += [TensorSlot(f"theta{i}", "theta", i, ps, name),
                            TensorSlot(f"dtheta{i}", "dtheta", i, ps, name)]
        m = len(ops)
        tensors += [TensorSlot(f"v{m + 1}", "v", m + 1, (tuple(loss.shape),), "loss"),
                    TensorSlot(f"dv{m + 1}", "dv", m + 1, (tuple(loss.shape),), "loss")]
        return ops, tensors

    # --- hooks ----------------------------------------------------------------------------
    def _install(self, rounding, generator):
        slots = {s.name: s for s in self.tensors}
        for s in self.tensors:
            if s.kind in FORWARD:
                d = slots["d" + s.name]
                self._sites[s.name] = _Site(s, d, rounding, generator)
        self._apply_formats()
        first = self.ops[0][1]
        first.register_forward_pre_hook(_InputHook(self._sites["v1"], self.model))
        for i, (_, mod) in enumerate(self.ops[:-1], start=1):
            mod.register_forward_hook(_OutputHook(self._sites[f"v{i + 1}"], self.model))
            if f"theta{i}" in self._sites:
                for pname, _ in list(mod.named_parameters(recurse=False)):
                    parametrize.register_parametrization(
                        mod, pname, _Parametrized(self._sites[f"theta{i}"], self.model))
        for site in self._sites.values():        # registering ran each parametrization once
            site.fwd.stats.reset()
            site.bwd.stats.reset()

    def _apply_formats(self):
        for name, site in self._sites.items():
            site.fwd.fmt = self.assignment.format(name)
            site.bwd.fmt = self.assignment.format("d" + name)

    def remove(self) -> nn.Module:
        """Take the hooks and parametrizations off; returns the plain model."""
        for _, mod in self.ops[:-1]:
            # this model's own hook dicts (a deep copy's handles would point at the original's)
            for hooks in (mod._forward_pre_hooks, mod._forward_hooks):
                for key in [k for k, h in hooks.items() if isinstance(h, (_InputHook,
                                                                          _OutputHook))]:
                    del hooks[key]
            if parametrize.is_parametrized(mod):
                # torch's parametrized class is shared by deep copies of the module, and
                # removing deletes the parametrized attributes from the class: this module
                # takes a class of its own first, so a copy's remove() leaves the original be
                cls = type(mod)
                mod.__class__ = type(cls.__name__, cls.__bases__, {
                    k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")})
                for pname in list(mod.parametrizations.keys()):
                    parametrize.remove_parametrizations(mod, pname, leave_parametrized=False)
        return self.model

    # --- use ------------------------------------------------------------------------------
    def forward(self, x):
        return self.model(x)

    def loss(self, output, target):
        """The loss operator f_{n+1} with v_{m+1} and dv_{m+1} rounded."""
        m = len(self.ops)
        return self._sites[f"v{m + 1}"](self.loss_fn(output, target), self.model.training)

    def site_stats(self, name: str) -> RoundingStats:
        """The counters of tensor ``name`` since the last :meth:`end_step`."""
        if name in self._sites:
            return self._sites[name].fwd.stats
        if isinstance(name, str) and name.startswith("d") and name[1:] in self._sites:
            return self._sites[name[1:]].bwd.stats
        raise KeyError(f"no tensor {name!r} in this model; accepted: a name of "
                       f"self.tensors ({', '.join(slot.name for slot in self.tensors)})")

    def end_step(self) -> list[str]:
        """Record this step's per-tensor counters, then (Algorithm 2, when ``promote``)
        promote every low forward tensor whose overflow ratio exceeded theta; returns the
        promoted names."""
        promoted = []
        for slot in self.tensors:
            stats = self.site_stats(slot.name)
            ratio = stats.overflow / stats.elements if stats.elements else 0.0
            self.history.append(dict(step=self.step_count, tensor=slot.name, op=slot.op,
                                     format=str(self.assignment.format(slot.name) or "fp32"),
                                     **stats.as_dict(), overflow_ratio=ratio))
            if (self.promote and slot.kind in FORWARD and ratio > self.theta
                    and self.assignment.levels[slot.name] == "lo"):
                self.assignment.levels[slot.name] = "hi"
                promoted.append(slot.name)
                self.promotions.append((self.step_count, slot.name, ratio))
            stats.reset()
        if promoted:
            self._apply_formats()
        self.step_count += 1
        return promoted

    def stats_rows(self, step: int | None = None) -> list[dict]:
        """Per-tensor counters of ``step`` (default: the last recorded), one dict each."""
        if not self.history:
            return []
        step = self.history[-1]["step"] if step is None else step
        return [row for row in self.history if row["step"] == step]

    def stats_table(self, step: int | None = None) -> str:
        """:meth:`stats_rows` as a markdown table."""
        cols = ("tensor", "op", "format", "elements", "overflow", "underflow", "inexact",
                "overflow_ratio")
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for row in self.stats_rows(step):
            cells = [f"{row[c]:.4g}" if c == "overflow_ratio" else str(row[c]) for c in cols]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def report(self) -> dict:
        """Low-precision ratio and model aggregate (at the start and now) and promotions."""
        return dict(ratio_lo_start=self.initial_ratio_lo, ratio_lo=self.assignment.ratio_lo(),
                    aggregate_bits_start=self.initial_aggregate_bits,
                    aggregate_bits=self.assignment.aggregate_bits(),
                    promotions=list(self.promotions))


__all__ = ["Candidates", "TensorSlot", "PrecisionAssignment", "PrecisionModel",
           "DynamicLossScaler", "assign", "group_tensors", "GEMM"]
