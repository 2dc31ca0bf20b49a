"""Simulated low-precision training of torch models: a recipe's GEMMs in every linear layer.

:func:`simulate` swaps a model's ``nn.Linear`` layers for :class:`SimulatedLinear`, whose
forward and backward run the three GEMMs of a :class:`lpsim.torch.Recipe`, each, bit for
bit, the composition a user could write by hand (:mod:`lpsim.torch.gemms`: operands
quantized along K, :func:`lpsim.ops.matmul` with the recipe's accumulation, the bias in FP32,
the output rounded).

The layers keep the model's own weight and bias Parameters, so any optimizer trains them.
Stochastic rounding draws from the layer's :class:`lpsim.Generator`: every call fresh
counters.  Telemetry (:func:`report`): per layer, GEMM and operand, the counters of
:class:`lpsim.blocks.BlockStats` (saturated and underflowed elements, clipped scales,
blocks flushed to zero).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.nn.utils import parametrize

from ..generator import Generator
# the GEMM machinery lives in lpsim.torch.gemms; its public names (and _Site, which the
# pickles of earlier SimulatedLinear layers name here) stay importable from this module
from .gemms import (LinearGemms, _Site, _telemetry_every, adopt_module_state,  # noqa: F401
                    gemm, keep_out_of_fast_paths, quantize_operand, tensor_scale,
                    gemms_to_run)
from .hadamard import RHT_STREAM, hadamard, rht, rht_signs  # noqa: F401
from .attention import PROJECTIONS, SimulatedMultiheadAttention
from .recipes import PRESETS, Recipe, recipe as as_recipe


class SimulatedLinear(LinearGemms, nn.Linear):
    """An ``nn.Linear`` whose GEMMs follow a recipe; it holds the original's Parameters.

    Made by :func:`simulate` (or :meth:`from_linear`).  As ``nn.Linear``, the output has the
    input's dtype and the gradients their tensors' dtypes: a float16 input's output is the
    recipe's output (bf16 values) cast by torch to float16, which rounds values float16 cannot
    hold (beyond 65504, below its subnormals); bfloat16, float32 and float64 hold bf16 values.
    ``telemetry``: per (gemm, operand) the counters of the counted quantizations of that
    operand so far (every step, or every ``telemetry_every``-th); ``steps``: backward passes
    so far (the RHT's step); the rest of the state as :class:`lpsim.torch.gemms.LinearGemms`.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("make a SimulatedLinear with SimulatedLinear.from_linear(linear, "
                        "recipe) or lpsim.torch.simulate(model, recipe)")

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe, *, generator: Generator | None = None,
                    name: str = "", index: int = 0, telemetry: bool = True):
        r = as_recipe(recipe)
        cls.check(linear, r, name)
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        LinearGemms.__init__(self, r, generator=generator, name=name, index=index,
                             telemetry=telemetry)
        adopt_module_state(self, linear)
        return self

    @classmethod
    def check(cls, linear: nn.Linear, recipe, name: str = "") -> None:
        """Refuse what :meth:`from_linear` cannot simulate, before anything is made: block
        sizes the layer's dimensions do not divide, and a layer whose state or behaviour a
        SimulatedLinear (the weight, the bias and nn.Linear's map) would drop, naming what
        it has and what is accepted."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear={type(linear).__name__}: accepted: an nn.Linear")
        as_recipe(recipe).check_dims(linear.in_features, linear.out_features,
                                     where=f"layer {name!r}: ")
        _check_plain_linear(linear, name)

    def gemm_layers(self) -> dict:
        """The simulated linear maps of this module by name suffix (report's rows)."""
        return {"": self}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"layer {self.layer_name!r}: input of shape {tuple(x.shape)}; "
                             f"accepted: (..., {self.in_features})")
        x2 = x.reshape(-1, self.in_features)
        # wgrad's K and k x k blocks of x and dy count the tokens: refused here, before
        # anything is drawn or counted, for the GEMMs this pass and its backward run
        self.check_dims(self.in_features, self.out_features, x2.shape[0],
                        gemms_to_run(x.requires_grad, self.weight))
        y = self.linear(x2, self.weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features).to(self.output_dtype(x))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name!r}"


def _check_plain_linear(linear: nn.Linear, name: str) -> None:
    """Refuse a layer whose state or behaviour a simulated layer (the weight, the bias and
    nn.Linear's map) would silently drop, naming what it has and what is accepted."""
    if parametrize.is_parametrized(linear):
        raise ValueError(f"layer {name!r} has parametrized {sorted(linear.parametrizations)}"
                         " (weight_norm, say), which a simulated layer cannot keep: it "
                         "would hold one computed weight; accepted: a plain nn.Linear "
                         "(torch.nn.utils.parametrize.remove_parametrizations first, or "
                         "skip the layer)")
    if isinstance(linear, SimulatedLinear):
        return                      # already simulated: it takes the new recipe
    if any(is_lazy(t) for t in (linear.weight, linear.bias) if t is not None):
        raise ValueError(f"layer {name!r} ({type(linear).__name__}) has uninitialized "
                         "parameters; accepted: a layer whose parameters are made (run one "
                         "forward pass of the model before simulate)")
    extra = sorted(set(linear._parameters) - {"weight", "bias"})
    if extra or not isinstance(linear.weight, nn.Parameter):
        raise ValueError(f"layer {name!r} ({type(linear).__name__}) has the parameters "
                         f"{extra} besides its weight and bias (torch.nn.utils.weight_norm and "
                         "spectral_norm compute the weight from theirs; an adapter adds its "
                         "own), which a simulated layer would drop; accepted: a layer whose "
                         "weight is a Parameter and that has no others (remove_weight_norm "
                         f"first, or skip the layer: simulate(..., skip=[{name!r}]))")
    own = [what for what, there in (("forward", type(linear).forward is not nn.Linear.forward),
                                    ("buffers", bool(linear._buffers)),
                                    ("submodules", bool(linear._modules))) if there]
    if own:
        raise ValueError(f"layer {name!r} is a {type(linear).__name__}, an nn.Linear subclass "
                         f"with its own {' and '.join(own)}, which a SimulatedLinear (nn.Linear's"
                         " map of the weight and bias) would drop; accepted: nn.Linear and "
                         "subclasses that add none (skip the layer: simulate(..., skip=["
                         f"{name!r}]))")


def simulate(model: nn.Module, recipe, *, skip=(), generator=None,
             telemetry: bool | int = True, attention: bool = False) -> nn.Module:
    """Swap ``model``'s ``nn.Linear`` layers for :class:`SimulatedLinear` with ``recipe``
    (a name of :data:`lpsim.torch.PRESETS` or a Recipe), in place; returns ``model``.

    attention: also swap each ``nn.MultiheadAttention`` for a
    :class:`lpsim.torch.attention.SimulatedMultiheadAttention`, whose q, k, v and output
    projections run the recipe's GEMMs (named ``<module>.q_proj`` ... ``.out_proj``) and whose
    attention in between is nn.MultiheadAttention's own computation.  With False (the default)
    the attention modules stay as they are (their forward reads the projection weights
    directly, so their ``out_proj`` is not swapped either) and a warning names them.
    skip: names of modules to leave as they are (as ``model.named_modules()`` gives them: a
    linear layer, or an attention module as a whole), or a callable ``skip(name, module) ->
    bool`` (asked of linear layers outside attention modules and of attention modules).
    With ``recipe.keep_first_last`` the first and last layers (in ``named_modules`` order,
    skipped ones counted; an attention module is one layer, all four projections) run the
    ``bf16`` recipe.  ``skip=None`` skips nothing.
    generator: an :class:`lpsim.Generator` (or an integer seed) for stochastic rounding and
    the RHT signs; None draws a seed.  telemetry: count every quantization (True), none
    (False) or those of every N-th step (an integer N; a step ends with a layer's backward
    pass): the counting kernels cost about as much as the rest of a simulated step on the
    CPU (``benchmarks/bench_recipes.py``).  Layers and attention modules already simulated
    take the new recipe.  Every layer is checked before any is swapped: a refused call
    leaves the model as it was.  Under ``torch.autocast`` the GEMMs stay the recipe's and a
    layer's output comes in autocast's dtype where the recipe's output is exact in it
    (:meth:`lpsim.torch.gemms.LinearGemms.output_dtype`).
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
    if not isinstance(attention, (bool, np.bool_)):
        raise TypeError(f"attention={attention!r} is not accepted; accepted: True (simulate "
                        "the projections of nn.MultiheadAttention) or False")
    _telemetry_every(telemetry)
    skipped, names = _skip_rule(model, skip)
    # per attention module: swapped, skipped, or left as it is with a warning
    attentions = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            wanted = attention or isinstance(module, SimulatedMultiheadAttention)
            attentions[name] = ("skip" if skipped(name, module) else "swap") if wanted \
                else "left"
    # the layers in named_modules order (skipped ones too: keep_first_last's first and last
    # are the model's, whatever is skipped), and those to swap
    layers, units, left = [], [], []
    for name, module in model.named_modules():
        owner = next((a for a in attentions if name.startswith(a + ".") or not a), None)
        if attentions.get(name) in ("swap", "skip"):
            layers.append(name)
            if attentions[name] == "swap":
                units.append((name, module))
        elif not isinstance(module, nn.Linear):
            continue
        elif owner is None:
            layers.append(name)
            if not skipped(name, module):
                units.append((name, module))
        elif attentions[owner] == "left":
            left.append(name)
        elif attentions[owner] == "swap" and name in names:
            raise ValueError(f"skip={[name]!r}: a projection of the attention module "
                             f"{owner!r}, whose four projections are simulated together; "
                             f"accepted: skip={[owner]!r} (the module left as it is)")
    if left:
        warnings.warn(f"lpsim.torch.simulate: {left} belong to nn.MultiheadAttention, whose "
                      "forward reads their weights directly; they are not simulated "
                      "(simulate(..., attention=True) simulates the attention projections)",
                      stacklevel=2)
    ends = {layers[0], layers[-1]} if r.keep_first_last and layers else set()
    chosen_of = [PRESETS["bf16"] if name in ends else r for name, _ in units]
    for (name, module), chosen in zip(units, chosen_of):  # every layer checked before any
        kind = SimulatedMultiheadAttention if isinstance(module, nn.MultiheadAttention) \
            else SimulatedLinear                        # is made (which moves its hooks)
        kind.check(module, chosen, name)
    if units and units[0][0] == "":
        kind = "SimulatedLinear.from_linear" if isinstance(model, nn.Linear) else \
            "SimulatedMultiheadAttention.from_attention"
        raise ValueError(f"model is itself the layer to swap ({type(model).__name__}), which "
                         "simulate cannot replace in place; accepted: a model that holds it, "
                         f"or {kind}(model, recipe)")
    made, index = [], 0
    for (name, module), chosen in zip(units, chosen_of):  # every layer made before any swap
        options = dict(generator=generator, name=name, index=index, telemetry=telemetry)
        if isinstance(module, nn.MultiheadAttention):
            made.append((name, SimulatedMultiheadAttention.from_attention(module, chosen,
                                                                          **options)))
            index += len(PROJECTIONS)
        else:
            made.append((name, SimulatedLinear.from_linear(module, chosen, **options)))
            index += 1
    # a module used in several places (named_modules lists it once) is swapped in each
    places = {}
    for name, module in model.named_modules(remove_duplicate=False):
        places.setdefault(id(module), []).append(name)
    originals = dict(units)
    for name, new in made:
        # the original leaves the model: its hook registries are shared, so the handles a
        # user holds still remove the hooks
        adopt_module_state(new, originals[name], share=True)
        for place in places[id(originals[name])]:
            _replace(model, place, new)
    return model


def _skip_rule(model: nn.Module, skip):
    """skip as a callable (name, module) -> bool, and the set of names it was given (empty
    for a callable; None: none); unknown names refused.  A module used in several places
    is skipped where any of its names is given (it is one module, swapped everywhere or
    nowhere)."""
    if callable(skip):
        return skip, set()
    accepted = ("accepted: module names (a str or an iterable of them, as "
                "model.named_modules() gives them), a callable skip(name, module) -> bool, "
                "or None")
    try:
        names = set() if skip is None else {skip} if isinstance(skip, str) else set(skip)
    except TypeError:
        raise TypeError(f"skip={skip!r} is not accepted; {accepted}") from None
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"skip={skip!r} is not accepted; {accepted}")
    places = {}
    for name, module in model.named_modules(remove_duplicate=False):
        places.setdefault(id(module), set()).add(name)
    unknown = names - set().union(*places.values())
    if unknown:
        raise ValueError(f"skip={sorted(unknown)!r}: no such modules in the model")
    return (lambda name, module: bool(places.get(id(module), {name}) & names)), names


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
        """The row with the largest fraction of saturated, underflowed or flushed values
        among those that counted any element; None before anything was counted."""
        def badness(row):
            return (row["saturated"] + row["underflow"]) / row["elements"] + \
                row["flushed_blocks"] / max(row["blocks"], 1)
        return max((row for row in self.rows if row["elements"]), key=badness, default=None)

    def __str__(self) -> str:
        table = [self.COLUMNS] + [tuple(str(row[c]) for c in self.COLUMNS) for row in self.rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(self.COLUMNS))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip()
                         for line in table)


def report(model: nn.Module) -> Report:
    """Per simulated layer, GEMM and operand: how many elements were quantized, saturated
    and underflowed, and how many blocks were clipped or flushed to zero, so far."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={model!r} is not a torch.nn.Module")
    rows = []
    for name, module in model.named_modules():
        if not isinstance(module, (SimulatedLinear, SimulatedMultiheadAttention)):
            continue
        for suffix, layer in module.gemm_layers().items():
            rows.extend(_rows(".".join(filter(None, (name, suffix))), layer))
    return Report(tuple(rows))


def _rows(name: str, layer: LinearGemms) -> list[dict]:
    rows = []
    for (g, role), site in layer.sites.items():
        s = site.stats
        op = layer.recipe.operand(g, role)
        rows.append({"layer": name, "recipe": layer.recipe.name, "gemm": g,
                     "operand": role, "format": "fp32" if op.fmt is None else
                     str(op.fmt), "elements": s.elements, "saturated": s.overflow,
                     "underflow": s.underflow, "blocks": s.blocks,
                     "clipped_scales": s.clipped_scales, "flushed_blocks": s.flushed_blocks})
    return rows


__all__ = ["simulate", "SimulatedLinear", "SimulatedMultiheadAttention", "report", "Report",
           "quantize_operand", "gemm", "rht", "rht_signs", "hadamard", "tensor_scale", "Recipe",
           "RHT_STREAM"]
