"""SGD and AdamW as torch.optim.Optimizer subclasses that train in any weight/state format.

The class validates and holds hyperparameters and state; the math of a step lives in
:mod:`lpsim.optim.step` (fused kernels) and :mod:`lpsim.optim.reference` (torch ops), one
``implementation`` flag apart.
"""

from __future__ import annotations

import math
import numbers
import operator
import secrets

import numpy as np
import torch
from lpsim.cpu import threads

from lpsim.formats import parse_format
from lpsim.philox import split_key
from lpsim.stats import RoundingStats

from . import cpu, keys, multi, reference
from .setup import STATE_ROUNDINGS, Setup, resolve
from .step import ADAMW, KAHAN, NCOUNTS, REMAINDER, SGD as _SGD, UPDATES

IMPLEMENTATIONS = ("fused", "reference")
#: tensor types the multi-tensor route takes (others, e.g. DTensor, are stepped one by one)
_PLAIN = (torch.nn.Parameter, torch.Tensor)


def _check_number(name, value, low=0.0, high=None, open_high=False):
    """A real hyperparameter (Python or numpy scalar, not a bool) in range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or \
            math.isnan(value):
        raise TypeError(f"{name}={value!r} must be a real number")
    if value < low or (high is not None and (value >= high if open_high else value > high)):
        bound = f"< {high}" if open_high else f"<= {high}"
        raise ValueError(f"{name}={value!r} is out of range; accepted: {low} <= {name}"
                         + (f" {bound}" if high is not None else ""))


#: the options of a param group lpsim reads at every step
OPTIONS = ("update_rounding", "weight_format", "state_format", "state_rounding", "sr_bits",
           "seed", "implementation", "foreach")


def check_options(group: dict) -> None:
    """A clear error for an lpsim option of a param group that is not accepted: at
    construction, in add_param_group and at every step (param_groups are plain dicts a user
    or a loaded state dict may change)."""
    missing = [name for name in OPTIONS if name not in group]
    if missing:
        raise ValueError(f"a param group has no {missing[0]!r}; lpsim's options ("
                         f"{', '.join(OPTIONS)}) must be in every group")
    update_rounding, state_rounding, implementation, foreach, sr_bits = (
        group["update_rounding"], group["state_rounding"], group["implementation"],
        group["foreach"], group["sr_bits"])
    if update_rounding not in UPDATES:
        raise ValueError(f"unknown update_rounding {update_rounding!r}; accepted: "
                         f"{', '.join(UPDATES)}")
    if state_rounding not in STATE_ROUNDINGS:
        raise ValueError(f"unknown state_rounding {state_rounding!r}; accepted: "
                         f"{', '.join(STATE_ROUNDINGS)}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {implementation!r}; accepted: "
                         f"{', '.join(IMPLEMENTATIONS)}")
    for name in ("weight_format", "state_format"):
        if group[name] is not None:
            parse_format(group[name])          # a clear error now, not in a kernel
    if not isinstance(foreach, bool):
        raise TypeError(f"foreach={foreach!r} is not a bool; accepted: True or False")
    if sr_bits is not None:
        if isinstance(sr_bits, bool) or not isinstance(sr_bits, (int, np.integer)):
            raise TypeError(f"sr_bits={sr_bits!r} is not an integer; accepted: 1..32 or None")
        if not 1 <= sr_bits <= 32:
            raise ValueError(f"sr_bits={sr_bits!r} is out of range; accepted: 1..32 or None")
    split_key(group["seed"], "seed")


#: (state names, update, state dtype) -> LowPrecisionOptimizer._needed's answer
_NEEDED: dict = {}


class LowPrecisionOptimizer(torch.optim.Optimizer):
    """What SGD and AdamW share: options, state layout, keys, kernels, counters.

    update_rounding: "nearest", "stochastic", "kahan" (compensation buffer in the state
    format) or "remainder" (bfloat16 parameter + int16 remainder = the float32 master,
    exactly).  weight_format / state_format: any fp(e, m, b) (default: the parameter's
    dtype); bfloat16/float16 states are stored as those dtypes, other formats in float32.
    state_rounding: "nearest" or "stochastic" for the moments.  sr_bits: random bits per
    stochastic decision (1..32; default 32, every random word's bits).  seed: the
    Philox key (default: fresh from ``secrets``), see :mod:`lpsim.optim.keys`.
    implementation: "fused" (numba CPU kernel, lpsim_cuda for CUDA tensors) or "reference".
    foreach: with "fused", step a group's CPU tensors that share dtypes and step count with
    one multi-tensor kernel call (True, the default: :mod:`lpsim.optim.multi`) or one call
    per tensor (False); the bits are the same.  CUDA tensors and DTensors are stepped one by
    one (one launch per tensor); parameters are not gathered into flat buffers.

    Options and states are checked at every step: a param group's lpsim options as at
    construction (param_groups are plain dicts), and each state tensor against its parameter
    (size, dtype, device) before a kernel takes it.  A state that the options need but the
    parameter lacks (momentum, Kahan or remainder turned on mid-run) starts at zero.

    After each step, ``update_stats`` (a RoundingStats) has counted the weight roundings
    (inexact, overflow, ...) and ``cancelled_updates`` the elements whose nonzero update left
    the weight unchanged: the stagnation of nearest rounding.
    """

    _algo = ADAMW

    def __init__(self, params, defaults, *, update_rounding="nearest", weight_format=None,
                 state_format=None, state_rounding="nearest", sr_bits=None, seed=None,
                 implementation="fused", foreach=True):
        if seed is None:
            seed = secrets.randbits(64)
        check_options(dict(update_rounding=update_rounding, weight_format=weight_format,
                           state_format=state_format, state_rounding=state_rounding,
                           sr_bits=sr_bits, seed=seed, implementation=implementation,
                           foreach=foreach))
        defaults.update(update_rounding=update_rounding, weight_format=weight_format,
                        state_format=state_format, state_rounding=state_rounding,
                        sr_bits=None if sr_bits is None else int(sr_bits), seed=int(seed),
                        implementation=implementation, foreach=foreach)
        super().__init__(params, defaults)
        self._stats = RoundingStats()
        self._cancelled = 0
        self._gpu_counts = {}           # CUDA device -> its NCOUNTS counters, read when asked

    def add_param_group(self, param_group) -> None:
        """torch's add_param_group, refusing a parameter listed twice in one group (torch
        only warns; lpsim would step it twice per step, with two keys)."""
        super().add_param_group(param_group)
        try:
            check_options(self.param_groups[-1])
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise
        params = self.param_groups[-1]["params"]
        if len({id(p) for p in params}) != len(params):
            self.param_groups.pop()
            position = next(i for i, p in enumerate(params)
                            if any(p is q for q in params[:i]))
            raise ValueError(f"parameter {position} of a param group (shape "
                             f"{tuple(params[position].shape)}) is listed twice; accepted: each "
                             "parameter once")

    def __getstate__(self):
        state = super().__getstate__()
        self._drain()
        return {**state, "_stats": self._stats.__copy__(), "_cancelled": self._cancelled}

    def __setstate__(self, state):
        state = dict(state)
        stats, cancelled = state.pop("_stats", None), state.pop("_cancelled", 0)
        super().__setstate__(state)
        self._stats = stats if stats is not None else RoundingStats()
        self._cancelled = cancelled
        self._gpu_counts = {}

    @property
    def update_stats(self) -> RoundingStats:
        """Counters of the weight roundings of every step so far (lpsim.RoundingStats)."""
        self._drain()
        return self._stats

    @property
    def cancelled_updates(self) -> int:
        """Elements whose nonzero update left the weight unchanged, over every step."""
        self._drain()
        return self._cancelled

    def _drain(self) -> None:
        for device, counts in self._gpu_counts.items():     # pragma: no cover (GPU only)
            torch.cuda.synchronize(device)
            host = counts.copy_to_host()
            counts.copy_to_device(np.zeros_like(host))
            self._stats.add(0, host[:6])
            self._cancelled += int(host[6])

    # -- per-algorithm pieces --------------------------------------------------------------
    def _state_names(self, group) -> tuple:
        raise NotImplementedError

    def _hyper(self, group, step: int) -> tuple:
        raise NotImplementedError

    # -- state -----------------------------------------------------------------------------
    def _needed(self, group, setup: Setup) -> tuple:
        """(name, dtype) of each state tensor a parameter needs under these options."""
        key = (self._state_names(group), setup.update, setup.state_dtype)
        needed = _NEEDED.get(key)
        if needed is None:
            names, dtype = tuple((name, setup.state_dtype) for name in key[0]), key[2]
            needed = _NEEDED[key] = names + {KAHAN: (("kahan_comp", dtype),),
                                             REMAINDER: (("remainder", torch.int16),)
                                             }.get(setup.update, ())
        return needed

    def _init_state(self, p, local, group, setup: Setup, index: int | None = None) -> dict:
        """The parameter's state, its tensors made (zeros) where missing; with ``index``,
        each checked against the parameter (:meth:`_check_states`)."""
        state = self.state[p]
        if "step" not in state:
            state["step"] = 0
        needed = self._needed(group, setup)
        for name, dtype in needed:
            if name not in state:   # new, or an option that needs it was turned on mid-run
                state[name] = torch.zeros_like(local, dtype=dtype)
        if index is not None:
            self._check_states(state, local, group, setup, index)
        return state

    def _check_states(self, state, local, group, setup: Setup, index: int) -> None:
        """A clear error unless each state tensor the options need matches the parameter in
        size, dtype and device and is contiguous: the kernels index them as the parameter
        (a checkpoint of another model, or a parameter whose dtype changed, wrote out of
        bounds before)."""
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"parameter {index}'s state 'step' is {step!r}; accepted: an "
                             "integer >= 0")
        for name, dtype in self._needed(group, setup):
            t = state[name]
            if not torch.is_tensor(t) or t.numel() != local.numel() or t.dtype != dtype or \
                    t.device != local.device or not t.is_contiguous():
                what = (f"a {type(t).__name__}" if not torch.is_tensor(t) else
                        f"{t.numel()} elements of {t.dtype} on {t.device}"
                        + ("" if t.is_contiguous() else ", not contiguous"))
                raise ValueError(
                    f"parameter {index}'s state {name!r} holds {what}; its options need "
                    f"{local.numel()} contiguous elements of {dtype} on {local.device} (a "
                    "state dict of another model, or a parameter whose dtype changed after "
                    "its state was made: convert or drop that state)")

    def load_state_dict(self, state_dict) -> None:
        """torch's load_state_dict, except that state tensors keep their dtypes.

        torch casts every floating state tensor to its parameter's dtype; lpsim's states have
        their own (float32 moments of bfloat16 weights, the int16 remainder of a float32
        master), which that cast would round or convert, so they are set back afterwards,
        copied to the parameter's device.  A torch.optim state dict (no lpsim options in its
        groups, its step a tensor) loads its hyperparameters and states; the groups keep
        their lpsim options.  The next step checks every state against its parameter.
        """
        tensors = {k: {name: v for name, v in s.items() if torch.is_tensor(v)}
                   for k, s in state_dict["state"].items()}
        stripped = dict(state_dict)
        stripped["state"] = {k: {name: v for name, v in s.items() if not torch.is_tensor(v)}
                             for k, s in state_dict["state"].items()}
        options = [{name: group[name] for name in OPTIONS} for group in self.param_groups]
        super().load_state_dict(stripped)
        for group, own in zip(self.param_groups, options):
            for name, value in own.items():     # a torch.optim state dict has none of them
                if name not in group or (name == "foreach" and group[name] is None):
                    group[name] = value             # (torch's own foreach is None or a bool)
            check_options(group)
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        by_id = dict(zip(ids, params))
        for k, values in tensors.items():
            p = by_id[k]
            for name, value in values.items():
                if name == "step":      # torch.optim keeps its step count as a tensor
                    self.state[p][name] = int(value.item())
                    continue
                self.state[p][name] = value.detach().to(device=p.device, copy=True)

    def memory_bytes(self) -> float:
        """Bytes per parameter element of weights plus optimizer state, from the options.

        bf16 + SR AdamW: 6; bf16 + Kahan: 8; bf16 + remainder: 8; FP32 weights and states: 12
        (mixed precision adds autocast's bf16 copy of the weights, 2, which it does not hold).
        """
        total = count = 0
        for group in self.param_groups:
            for p in group["params"]:
                setup = resolve(group, p, p.dtype)
                per = p.element_size()
                state_bytes = torch.empty(0, dtype=setup.state_dtype).element_size()
                per += state_bytes * len(self._state_names(group))
                per += state_bytes if setup.update == KAHAN else 0
                per += 2 if setup.update == REMAINDER else 0
                total += per * p.numel()
                count += p.numel()
        return total / max(count, 1)

    @torch.no_grad()
    def load_master_weights(self, weights) -> None:
        """Set the parameters from float32 weights (an FP32 checkpoint) without losing them.

        ``weights``: float32 tensors in the optimizer's parameter order.  remainder: the
        bfloat16 parameter and its remainder hold each float32 weight exactly.  kahan: the
        parameter is the weight rounded to nearest and the compensation c = Q_s(w - w32)
        keeps its error (Kahan's w - c is the float32 weight to the state format's
        precision).  Other modes: the parameter is set to the weight rounded to nearest.
        """
        from lpsim.quantize import quantize
        params = [p for group in self.param_groups for p in group["params"]]
        weights = list(weights)
        if len(weights) != len(params):
            raise ValueError(f"load_master_weights got {len(weights)} tensors for "
                             f"{len(params)} parameters (one per parameter, in order)")
        position = 0
        for group in self.param_groups:
            for p in group["params"]:
                w32 = weights[position].detach().to(device=p.device, dtype=torch.float32)
                position += 1
                if w32.shape != p.shape:
                    raise ValueError(f"a master weight has shape {tuple(w32.shape)}, its "
                                     f"parameter {tuple(p.shape)}")
                local = p.to_local() if hasattr(p, "to_local") else p
                setup = resolve(group, local, local.dtype)
                state = self._init_state(p, local, group, setup)
                if setup.update == REMAINDER:
                    code, rem = reference.split_remainder(w32.contiguous())
                    local.copy_(code)
                    state["remainder"].copy_(rem)
                    continue
                w = quantize(w32.cpu().contiguous(), setup.weight_format, "nearest")
                local.copy_(w)
                if setup.update == KAHAN:
                    c = quantize((w.double() - w32.cpu().double()).contiguous(),
                                 setup.state_format, "nearest")
                    state["kahan_comp"].copy_(c.float())

    # -- the step --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            check_options(group)
        base = 0
        for group in self.param_groups:
            params = group["params"]
            if group["implementation"] == "fused" and group.get("foreach", True):
                self._step_group(group, base)
            else:
                hyper = {}      # step count -> _hyper: one per group and count, not per tensor
                for j, p in enumerate(params):
                    if p.grad is not None:
                        self._step_param(p, base + j, group, hyper)
            base += len(params)
        return loss

    def _step_group(self, group, base):
        """Step a group's CPU tensors by sets (dtypes, Setup, step count), one multi-tensor
        kernel call per set (lpsim.optim.multi); others (CUDA, DTensor, or a check that
        fails, to raise its error) one by one."""
        sets = {}       # (id of Setup, step count) -> (Setup, positions, params, grads, states)
        hyper = {}
        state = self.state
        resolved = {}
        last = (None, 0)
        entry = None
        for j, p in enumerate(group["params"]):
            g = p.grad
            if g is None:
                continue
            if (type(p) not in _PLAIN or type(g) is not torch.Tensor or g.is_sparse or p.is_cuda
                    or not p.is_contiguous() or not g.is_contiguous()
                    or g.numel() != p.numel()):
                self._step_param(p, base + j, group, hyper)
                continue
            dtypes = (p.dtype, g.dtype)
            setup = resolved.get(dtypes)
            if setup is None:
                setup = resolved[dtypes] = resolve(group, p, g.dtype)
            st = state[p]
            if "step" not in st:
                st = self._init_state(p, p, group, setup)
            elif type(st["step"]) is not int:       # a numpy integer, or not a count at all
                self._check_states(st, p, group, setup, base + j)
                st["step"] = int(st["step"])
            t = st["step"] + 1          # stored once every check has passed
            if last[0] is not setup or last[1] != t:        # a set other than the last one's
                last = (setup, t)
                entry = sets.get((id(setup), t))
                if entry is None:
                    entry = sets[id(setup), t] = (setup, [], [], [], [])
            entry[1].append(j)
            entry[2].append(p)
            entry[3].append(g)
            entry[4].append(st)
        for (_, t), (setup, positions, params, grads, states) in sets.items():
            keys.stream(t, base + positions[-1], 2)             # the keys' range checks
            table = self._table(group, base, setup, positions, params, states)
            for st in states:
                st["step"] = t
            table.refresh(grads)
            hp = hyper.get(t)
            if hp is None:
                hp = hyper[t] = self._hyper(group, t)
            ints = (self._algo, setup.update, setup.wmode, setup.wk, setup.smode, setup.sk,
                    int(bool(group.get("nesterov", False))), int(t == 1))
            counts = table.step(hp, ints, split_key(group["seed"], "seed"), t)
            self._stats.counts[0] += table.elements
            self._stats.counts[1:] += counts[:6]
            self._cancelled += int(counts[6])

    def _table(self, group, base, setup, positions, params, states):
        """The multi.Table of a set, kept between steps while the same parameters hold the
        same storage and the same state tensors (load_state_dict replaces them)."""
        names = self._state_names(group) + {KAHAN: ("kahan_comp",),
                                            REMAINDER: ("remainder",)}.get(setup.update, ())
        held = [st.get(name) for st in states for name in names]
        ptrs = [p.data_ptr() for p in params]
        cache = self.__dict__.setdefault("_table_cache", {})   # not in torch's pickled state
        key = (id(group), base, id(setup), tuple(positions))
        cached = cache.get(key)
        if (cached is not None and cached[0] is group and cached[1] == ptrs
                and len(cached[3]) == len(held)
                and all(map(operator.is_, cached[2], params))
                and all(map(operator.is_, cached[3], held))):
            return cached[4]
        if len(cache) >= 256:           # bounded: sets that keep changing are rebuilt anyway
            cache.clear()
        # states made where an option turned on mid-run needs them, and every one checked:
        # the kernel indexes them as the parameter
        for k, (j, p) in enumerate(zip(positions, params)):
            self._init_state(p, p, group, setup, base + j)
        held = [st.get(name) for st in states for name in names]
        moments = self._state_names(group)
        rows = []
        for k, (j, p) in enumerate(zip(positions, params)):
            by_name = dict(zip(names, held[k * len(names):(k + 1) * len(names)]))
            address = [by_name[name].data_ptr() if name in by_name else 0
                       for name in (moments[0] if moments else "", "exp_avg_sq", "kahan_comp",
                                    "remainder")]
            rows.append((p.data_ptr(), 0, *address, p.numel(), 0,
                         *(keys.stream(0, base + j, slot) for slot in range(3))))
        table = multi.Table(rows, setup, threads())
        # the tensors are kept with their table, so their ids stay theirs, and so are their
        # storages: a state whose .data is swapped keeps the memory the table points to
        storages = [t.untyped_storage() for t in (*params, *held)]
        cache[key] = (group, ptrs, tuple(params), tuple(held), table, storages)
        return table

    def _views(self, index, *tensors_and_setup):
        """The numpy bit views of a parameter and its states (lpsim.optim.cpu.bits_view),
        kept between steps while the same tensors hold the same storage (making six views
        cost more than stepping a small parameter)."""
        *tensors, setup, state, group = tensors_and_setup
        # the same tensor objects (states are replaced, not reassigned, by load_state_dict),
        # and the parameter's storage, dtype and size (module.to() reassigns param.data)
        w = tensors[0]
        ident = (w.data_ptr(), w.dtype, w.numel(), *map(id, tensors))
        cache = self.__dict__.setdefault("_view_cache", {})     # not in torch's pickled state
        cached = cache.get(index)
        if cached is not None and cached[0] == ident:
            return cached[2]
        self._check_states(state, w, group, setup, index)      # the kernel indexes them as w
        sdummy = np.zeros(1, np.int16 if setup.state_dtype != torch.float32 else np.int32)
        w, m, v, c, r = tensors
        views = (cpu.bits_view(w), *(cpu.bits_view(x, sdummy) for x in (m, v, c)),
                 cpu.bits_view(r))
        # the tensors are kept with their views, so their ids and storage stay theirs
        cache[index] = (ident, tuple(tensors), views)
        return views

    def _step_param(self, p, index, group, hyper):
        grad = p.grad
        if grad.is_sparse:
            raise TypeError("lpsim.optim does not take sparse gradients")
        if type(p) is torch.nn.Parameter or type(p) is torch.Tensor:    # the common case
            offset, local = 0, p
        else:                                   # DTensor (FSDP2, tensor parallel) or other
            offset = keys.global_offset(p)
            local = p.to_local() if hasattr(p, "to_local") else p
        if type(grad) is not torch.Tensor and hasattr(grad, "to_local"):
            grad = grad.to_local()
        if not (local.is_contiguous() and grad.is_contiguous()):
            raise ValueError(f"parameter {index} (shape {tuple(local.shape)}) or its gradient is "
                             "not contiguous; lpsim.optim steps contiguous tensors")
        if grad.numel() != local.numel() or grad.device != local.device:
            raise ValueError(f"parameter {index} has {local.numel()} elements on "
                             f"{local.device}, its gradient {grad.numel()} on {grad.device}")
        setup = resolve(group, local, grad.dtype)
        cpu_fused = group["implementation"] == "fused" and not local.is_cuda
        # the CPU kernel's states are checked where its views are made (:meth:`_views`)
        state = self._init_state(p, local, group, setup, None if cpu_fused else index)
        if type(state["step"]) is not int:
            self._check_states(state, local, group, setup, index)
            state["step"] = int(state["step"])
        t = state["step"] + 1
        streams = tuple(keys.stream(t, index, slot) for slot in range(3))  # range-checked
        hp = hyper.get(t)
        if hp is None:
            hp = hyper[t] = self._hyper(group, t)
        nesterov = bool(group.get("nesterov", False))
        first = t == 1
        seed = group["seed"]
        names = self._state_names(group)
        if group["implementation"] == "reference":
            state["step"] = t       # stored once every check has passed (here and below)
            stats = RoundingStats()
            cancelled = reference.step(self._algo, local, grad, state, setup, hp, nesterov,
                                       first, seed, streams, offset, stats)
            self._stats += stats
            self._cancelled += cancelled
            return
        seed_lo, seed_hi = split_key(seed, "seed")
        ints = (self._algo, setup.update, setup.wmode, setup.wk, setup.smode, setup.sk,
                int(nesterov), int(first))
        kargs = (setup.kinds, hp, ints, (seed_lo, seed_hi) + streams, offset)
        m = state[names[0]] if names else None
        v = state[names[1]] if len(names) > 1 else None
        c = state.get("kahan_comp")
        r = state.get("remainder")
        if local.is_cuda:                                     # pragma: no cover (GPU only)
            from numba import cuda

            from lpsim_cuda.optim import step as cuda_step
            device = local.device.index
            if device not in self._gpu_counts:
                with cuda.gpus[device]:
                    self._gpu_counts[device] = cuda.to_device(np.zeros(NCOUNTS, np.int64))
            state["step"] = t
            cuda_step(local, grad, m, v, c, r, kargs, setup, self._gpu_counts[device])
            self._stats.add(local.numel(), [0] * 6)
            return
        wb, mb, vb, cb, rb = self._views(index, local, m, v, c, r, setup, state, group)
        state["step"] = t
        counts = cpu.step(wb, cpu.bits_view(grad), mb, vb, cb, rb, *kargs, setup)
        self._stats.counts[0] += wb.size
        self._stats.counts[1:] += counts[:6]
        self._cancelled += int(counts[6])


class AdamW(LowPrecisionOptimizer):
    """AdamW (decoupled weight decay, bias correction) in any weight and state format.

    BF16 paper Appendix B Algorithms 4 (stochastic) and 5 (Kahan), SR paper Algorithm 1
    (stochastic, shared randomness): m, v in the state format; the update
    u = lr (m / c1) / (sqrt(v / c2) + eps) + lr wd w is one float32 expression, so weight
    decay is rounded with the update instead of vanishing in a separate bf16 multiply.
    Options shared with SGD: :class:`LowPrecisionOptimizer`.
    """

    _algo = ADAMW

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, **kw):
        _check_number("lr", lr)
        _check_number("eps", eps)
        _check_number("weight_decay", weight_decay)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas={betas!r} must be a pair (beta1, beta2)")
        for i, beta in enumerate(betas):
            _check_number(f"betas[{i}]", beta, 0.0, 1.0, open_high=True)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay), **kw)

    def _state_names(self, group):
        return ("exp_avg", "exp_avg_sq")

    def _hyper(self, group, step):
        # Python floats first: a numpy float32 lr would make lr * wd a float32 product
        lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        b1, b2 = (float(b) for b in group["betas"])
        f = np.float32
        return (f(lr), f(lr * wd), f(b1), f(1 - b1), f(b2), f(1 - b2), f(1 - b1 ** step),
                f(1 - b2 ** step), f(eps), f(wd), f(0), f(1))


class SGD(LowPrecisionOptimizer):
    """SGD with momentum, dampening, Nesterov and (coupled) weight decay in any format.

    torch.optim.SGD's rules; BF16 paper Appendix B Algorithms 2 (stochastic) and 3 (Kahan).
    The momentum buffer is the state (state_format, state_rounding).  Options shared with
    AdamW: :class:`LowPrecisionOptimizer`.
    """

    _algo = _SGD

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, **kw):
        _check_number("lr", lr)
        _check_number("momentum", momentum)
        _check_number("dampening", dampening, 0.0, 1.0)
        _check_number("weight_decay", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"nesterov=True needs momentum > 0 and dampening = 0, got "
                             f"momentum={momentum}, dampening={dampening}")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=bool(nesterov)), **kw)

    def _state_names(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _hyper(self, group, step):
        f = np.float32
        lr, mu, damp, wd = (float(group[name]) for name in ("lr", "momentum", "dampening",
                                                             "weight_decay"))
        return (f(lr), f(0), f(0), f(0), f(0), f(0), f(1), f(1), f(0), f(wd), f(mu),
                f(1 - damp))
