"""What a simulated model keeps outside its ``state_dict``, saved and restored for an exact resume.

Why: a simulated layer's ``state_dict`` holds its parameters only, so that checkpoints of a
plain model load into a simulated one and back, strictly.  A training run also depends on
each layer's step count (the RHT's signs), delayed scaling's amax history and the
generator's position (stochastic rounding's counters); a run resumed from the state_dict
alone restarts them, and its steps differ from the uninterrupted run's.  Save
:func:`simulation_state` beside the state_dict and give it to :func:`load_simulation_state`
after ``load_state_dict``: the resumed steps then equal the uninterrupted ones, bit for bit.
Telemetry counts are not part of it (``report`` counts from the process's first step).
"""

from __future__ import annotations

import torch
from torch import nn

from ..generator import Generator
from .gemms import LinearGemms
from .simulate import SimulatedLinear, SimulatedMultiheadAttention

#: the version of the dictionary :func:`simulation_state` makes
FORMAT = "lpsim.torch.simulation_state/1"
#: steps a layer may have taken (as the generator's counters, far past any training run)
MAX_STEPS = 1 << 62


def _layers(model: nn.Module) -> dict[str, LinearGemms]:
    """Every simulated linear map of ``model`` by name (report's names)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={model!r} is not a torch.nn.Module")
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, (SimulatedLinear, SimulatedMultiheadAttention)):
            for suffix, layer in module.gemm_layers().items():
                found[".".join(filter(None, (name, suffix)))] = layer
    return found


def simulation_state(model: nn.Module) -> dict:
    """Per simulated layer of ``model``: its recipe's name, step count, generator state and,
    per GEMM operand, delayed scaling's amax history (a CPU tensor, or None) and how many
    steps it has seen.  A plain dictionary of ints, strings and tensors (``torch.save``
    takes it)."""
    layers = {}
    for name, layer in _layers(model).items():
        sites = {f"{gemm}.{role}": {"history": None if site.history is None
                                    else site.history.detach().to("cpu", copy=True),
                                    "seen": int(site.seen)}
                 for (gemm, role), site in layer.sites.items()}
        layers[name] = {"recipe": layer.recipe.name, "steps": int(layer.steps),
                        "generator": tuple(layer.generator.get_state()), "sites": sites}
    return {"format": FORMAT, "layers": layers}


def load_simulation_state(model: nn.Module, state: dict) -> None:
    """Restore what :func:`simulation_state` saved into the same model's simulated layers
    (the same names and recipes).  Everything is checked before anything is set: a refused
    state leaves the model as it was."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"state is not accepted; accepted: the dictionary "
                         f"lpsim.torch.simulation_state made (format {FORMAT!r})")
    layers, saved = _layers(model), state.get("layers")
    if not isinstance(saved, dict) or set(saved) != set(layers):
        names = set(saved) if isinstance(saved, dict) else set()
        raise ValueError(f"state's layers do not match the model's simulated layers: missing "
                         f"{sorted(set(layers) - names)}, unknown {sorted(names - set(layers))}")
    plans = []
    for name, layer in layers.items():
        entry = saved[name]
        if not isinstance(entry, dict) or entry.get("recipe") != layer.recipe.name:
            got = entry.get("recipe") if isinstance(entry, dict) else entry
            raise ValueError(f"state of layer {name!r} is of recipe {got!r}; the layer runs "
                             f"{layer.recipe.name!r}")
        steps, sites, generator = entry.get("steps"), entry.get("sites"), entry.get("generator")
        if type(steps) is not int or not 0 <= steps < MAX_STEPS or not isinstance(sites, dict) \
                or set(sites) != {f"{g}.{r}" for g, r in layer.sites} \
                or not isinstance(generator, (tuple, list)):
            raise ValueError(f"state of layer {name!r} is not accepted: its steps (0 <= steps < "
                             "2**62), operands or generator state are not simulation_state's")
        for key, site in sites.items():
            history, seen = site.get("history"), site.get("seen")
            if not (history is None or isinstance(history, torch.Tensor) and history.ndim == 1
                    and history.dtype == torch.float32) or type(seen) is not int or seen < 0:
                raise ValueError(f"state of layer {name!r}, operand {key!r}: accepted: a 1-D "
                                 "float32 amax history or None, and a count >= 0")
        Generator(0).set_state(tuple(generator))            # checked, not set
        plans.append((layer, entry))
    for layer, entry in plans:
        layer.steps = entry["steps"]
        layer.generator.set_state(tuple(entry["generator"]))
        for (gemm, role), site in layer.sites.items():
            saved_site = entry["sites"][f"{gemm}.{role}"]
            history = saved_site["history"]
            site.history = None if history is None else history.detach().clone()
            site.seen = saved_site["seen"]
        layer.__dict__.pop("_replays", None)    # forwards of the run before: none to replay


__all__ = ["simulation_state", "load_simulation_state"]
