"""SGD and AdamW as torch.optim.Optimizer subclasses that train in any weight/state format.

The class validates and holds hyperparameters and state; the math of a step lives in
:mod:`lpsim.optim.step` (fused kernels) and :mod:`lpsim.optim.reference` (torch ops), one
``implementation`` flag apart.
"""

from __future__ import annotations

import collections
import contextlib
import operator
from itertools import chain
import secrets

import numpy as np
import torch
from lpsim.cpu import threads

from lpsim.philox import split_key
from lpsim.stats import RoundingStats

from . import cpu, keys, multi, reference
from .options import OPTIONS, check_float32, check_number, check_options, naming_group
from .setup import STORAGE, Setup, master_weight, resolve
from .step import ADAMW, KAHAN, NCOUNTS, REMAINDER, SGD as _SGD

#: tensor types the multi-tensor route takes (others, e.g. DTensor, are stepped one by one)
_PLAIN = (torch.nn.Parameter, torch.Tensor)


_ABSENT = object()
#: (state names, update, state dtype) -> LowPrecisionOptimizer._needed's answer
_NEEDED: dict = {}


@contextlib.contextmanager
def _hooks_set_aside(optimizer):
    """torch's load_state_dict hooks of ``optimizer`` set aside for the duration (lpsim's
    load_state_dict runs them around its whole load, not around torch's part of it)."""
    names = ("_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")
    held = {name: getattr(optimizer, name) for name in names if hasattr(optimizer, name)}
    try:
        for name in held:
            setattr(optimizer, name, collections.OrderedDict())
        yield
    finally:
        for name, hooks in held.items():
            setattr(optimizer, name, hooks)


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
    foreach: with "fused", step a group's tensors that share a device, dtypes and step count
    with one multi-tensor kernel call (True, the default: :mod:`lpsim.optim.multi` on the
    CPU, one launch over a table of their addresses on a GPU: lpsim_cuda.optim.Table) or
    one call per tensor (False); the bits are the same.  DTensors are stepped one by one;
    parameters are not gathered into flat buffers.

    Options and states are checked at every step: a param group's lpsim options as at
    construction (param_groups are plain dicts), and each state tensor against its parameter
    (size, dtype, device) before a kernel takes it.  A state that the options need but the
    parameter lacks (Kahan or remainder turned on mid-run) starts at zero; a momentum buffer
    starts as the gradient (torch.optim.SGD's first step), whenever the parameter has none.

    torch.optim's flags: ``maximize`` (the gradient negated, exactly), ``foreach`` None
    (True), ``fused`` None/False/True, ``differentiable`` False, and AdamW's ``amsgrad`` and
    ``capturable`` False; other values are refused by name.  ``lr`` may be a 1-element
    tensor (read at each step).  A step checks everything before it changes anything;
    meta parameters step as in torch.optim (states made, counts advanced); non-contiguous
    parameters and gradients step in their logical order, with a contiguous parameter's bits.

    After each step, ``update_stats`` (a RoundingStats) has counted the weight roundings
    (inexact, overflow, ...) and ``cancelled_updates`` the elements whose nonzero update left
    the weight unchanged: the stagnation of nearest rounding.
    """

    _algo = ADAMW
    #: torch.optim's flags of the algorithm beyond those every optimizer takes
    _flags = ()

    def __init__(self, params, defaults, *, update_rounding="nearest", weight_format=None,
                 state_format=None, state_rounding="nearest", sr_bits=None, seed=None,
                 implementation="fused", foreach=None, maximize=False, differentiable=False,
                 fused=None, **flags):
        for name in flags:
            if name not in self._flags:
                raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument "
                                f"{name!r}")
        if seed is None:
            seed = secrets.randbits(64)
        flags.update(maximize=maximize, differentiable=differentiable, fused=fused)
        options = dict(update_rounding=update_rounding, weight_format=weight_format,
                       state_format=state_format, state_rounding=state_rounding,
                       sr_bits=sr_bits, seed=seed, implementation=implementation,
                       foreach=foreach)
        check_options({**options, **flags})
        if foreach is True and fused is True:      # torch.optim's rule
            raise ValueError("foreach=True and fused=True; accepted: at most one of them True")
        defaults.update(options, sr_bits=None if sr_bits is None else int(sr_bits),
                        seed=int(seed), foreach=foreach is not False, **flags)
        super().__init__(params, defaults)
        self._stats = RoundingStats()
        self._cancelled = 0
        self._gpu_counts = {}           # CUDA device -> its NCOUNTS counters, read when asked

    def add_param_group(self, param_group) -> None:
        """torch's add_param_group, refusing a parameter listed twice in one group (torch
        only warns; lpsim would step it twice per step, with two keys), a parameter of a
        dtype the kernels do not store (float64: torch steps it in float64, lpsim's steps
        work in float32) and options its parameters cannot take (a format too wide for its
        storage, remainder without bfloat16), by name, before the group is added."""
        super().add_param_group(param_group)
        try:
            check_options(self.param_groups[-1])
            with naming_group(len(self.param_groups) - 1):
                self._check_hyper(self.param_groups[-1])
        except Exception:               # refused: the optimizer as it was
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
        for position, p in enumerate(params):
            if p.dtype not in STORAGE:
                self.param_groups.pop()
                raise TypeError(f"parameter {position} of a param group (shape "
                                f"{tuple(p.shape)}) has dtype {p.dtype}; lpsim.optim steps "
                                "torch.float32, torch.bfloat16 and torch.float16 parameters "
                                "(convert the model, e.g. model.float())")
        try:        # each format fits its storage, remainder has bfloat16 parameters
            for p in params:
                resolve(self.param_groups[-1], p, p.dtype)
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise

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

    def _first(self, state, group, t: int) -> bool:
        """Whether the step takes the first-step rule (``state``: as before the step)."""
        return t == 1

    @staticmethod
    def _check_hyper(group) -> None:
        """The algorithm's ranges for a group's hyperparameters, as its constructor's."""
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

    def _init_state(self, p, local, group, setup: Setup) -> dict:
        """The parameter's state, its tensors made (zeros, contiguous: the kernels index
        states in the parameter's logical order) where missing."""
        state = self.state[p]
        if "step" not in state:
            state["step"] = 0
        for name, dtype in self._needed(group, setup):
            if name not in state:   # new, or an option that needs it was turned on mid-run
                state[name] = torch.zeros(local.shape, dtype=dtype, device=local.device)
        return state

    def _check_states(self, state, local, group, setup: Setup, index: int) -> int:
        """The step count of a parameter's state (0 when it has none), or a clear error
        unless the count is an integer >= 0 and each state tensor the options need that the
        state holds matches the parameter in size, dtype and device and is contiguous: the
        kernels index them as the parameter in its logical order (a checkpoint of another
        model, or a parameter resized or re-typed, wrote out of bounds before).  Missing
        ones are made by :meth:`_init_state` once every check of the step has passed."""
        step = state.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"parameter {index}'s state 'step' is {step!r}; accepted: an "
                             "integer >= 0")
        for name, dtype in self._needed(group, setup):
            t = state.get(name, _ABSENT)
            if t is _ABSENT:
                continue
            if not torch.is_tensor(t) or t.shape != local.shape or t.dtype != dtype or \
                    t.device != local.device or not t.is_contiguous():
                what = (f"a {type(t).__name__}" if not torch.is_tensor(t) else
                        f"{t.numel()} elements {tuple(t.shape)} of {t.dtype} on {t.device}"
                        + ("" if t.is_contiguous() else ", not contiguous"))
                raise ValueError(
                    f"parameter {index}'s state {name!r} holds {what}; its options need "
                    f"{local.numel()} contiguous elements {tuple(local.shape)} of {dtype} on "
                    f"{local.device} (a state dict of another model, or a parameter resized "
                    "or re-typed after its state was made: convert or drop that state)")
        return int(step)

    def load_state_dict(self, state_dict) -> None:
        """torch's load_state_dict, except that state tensors keep their dtypes.

        torch casts every floating state tensor to its parameter's dtype; lpsim's states have
        their own (float32 moments of bfloat16 weights, the int16 remainder of a float32
        master), which that cast would round or convert, so they are set back afterwards,
        copied to the parameter's device.  A torch.optim state dict (no lpsim options in its
        groups, its step a tensor) loads its hyperparameters and states; the groups keep
        their lpsim options.  torch's load hooks see what torch's own would: the pre-hooks
        the whole dict first (what one returns is loaded), the post-hooks the states as
        loaded.  A dict whose groups lack one of this optimizer's hyperparameters (another
        algorithm's) or hold an option it does not accept is refused before anything
        changes; states of ids no group lists are kept under those ids, as torch keeps
        them.  The next step checks every state against its parameter.
        """
        state_dict = dict(state_dict)
        for hook in list(getattr(self, "_optimizer_load_state_dict_pre_hooks", {}).values()):
            returned = hook(self, state_dict)
            state_dict = state_dict if returned is None else returned
        merged = [self._merged_group(saved, own)
                  for saved, own in zip(state_dict["param_groups"], self.param_groups)]
        tensors = {k: {name: v for name, v in s.items() if torch.is_tensor(v)}
                   for k, s in state_dict["state"].items()}
        stripped = dict(state_dict)
        stripped["state"] = {k: {name: v for name, v in s.items() if not torch.is_tensor(v)}
                             for k, s in state_dict["state"].items()}
        options = [{name: group[name] for name in OPTIONS} for group in merged]
        with _hooks_set_aside(self):        # run here, around the whole load
            super().load_state_dict(stripped)
        for group, own in zip(self.param_groups, options):
            group.update(own)
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        by_id = dict(zip(ids, params))
        for k, values in tensors.items():
            p = by_id.get(k, k)
            for name, value in values.items():
                if name == "step":      # torch.optim keeps its step count as a tensor
                    self.state[p][name] = int(value.item())
                    continue
                self.state[p][name] = value.detach().to(
                    device=getattr(p, "device", value.device),
                    memory_format=torch.contiguous_format, copy=True)
        for hook in list(getattr(self, "_optimizer_load_state_dict_post_hooks", {}).values()):
            hook(self)

    def _merged_group(self, saved: dict, own: dict) -> dict:
        """A saved param group as loading makes it (its lpsim options from ``own``, the
        group it replaces, where a torch.optim dict has none), checked: the options as
        :func:`check_options` does, and every hyperparameter of this optimizer present."""
        merged = dict(saved)
        for name in OPTIONS:
            if name not in merged or (name == "foreach" and merged[name] is None):
                merged[name] = own[name]    # (torch's own foreach is None or a bool)
        check_options(merged)
        self._check_present(merged)
        return merged

    def _check_present(self, group: dict) -> None:
        """A ValueError naming the first of this optimizer's hyperparameters ``group``
        lacks (a group of another algorithm's state dict, or one a user emptied)."""
        missing = [name for name in self.defaults if name not in group]
        if missing:
            names = ", ".join(name for name in self.defaults if name not in OPTIONS)
            raise ValueError(f"a param group has no {missing[0]!r}; {type(self).__name__}'s "
                             f"hyperparameters ({names}) must be in every group")

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
        loads, position = [], 0         # every weight checked before any parameter is set
        for group in self.param_groups:
            for p in group["params"]:
                w32 = master_weight(weights[position], position, p)
                position += 1
                local = p.to_local() if hasattr(p, "to_local") else p
                loads.append((p, w32, group, local, resolve(group, local, local.dtype)))
        for p, w32, group, local, setup in loads:
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
        """One step of every parameter with a gradient.  Every parameter, gradient and state
        is checked first, so a step that raises has changed nothing (parameters, states,
        step counts, counters)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            check_options(group)
            self._check_present(group)
            with naming_group(index):       # a scheduler or a user may have set them
                self._check_hyper(group)
        plans, base = [], 0
        for group in self.param_groups:
            params = group["params"]
            singles = []
            if group["implementation"] == "fused" and group["foreach"] is not False:
                try:
                    sets = self._plan_group(group, base, singles)
                except (TypeError, ValueError):
                    # the sets are checked after the parameters that step alone: raise the
                    # first parameter's error, as the per-tensor route does (both check only)
                    for j, p in enumerate(params):
                        if p.grad is not None:
                            self._prepare(p, base + j, group)
                    raise
            else:
                sets = ()
                singles = [self._prepare(p, base + j, group)
                           for j, p in enumerate(params) if p.grad is not None]
            plans.append((group, base, sets, singles))
            base += len(params)
        for group, base, sets, singles in plans:
            hyper = {}      # step count -> _hyper: one per group and count, not per tensor
            for prepared in singles:
                self._step_param(prepared, group, hyper)
            for planned in sets:
                self._step_set(group, base, planned, hyper)
        return loss

    def _plan_group(self, group, base, singles) -> list:
        """Check a group's parameters for the multi-tensor route, changing nothing: the sets
        (tensors of one dtype pair, Setup and step count), each with its cached table where
        every tensor it points to is as it was; others (meta, DTensor, non-contiguous
        parameters, a gradient on another device, or a check that fails, to raise its error)
        go to ``singles``."""
        sets = {}       # (id of Setup, step count, device) -> [Setup, t, positions, params,
        #                 grads, states]
        state = self.state
        resolved = {}
        last = None
        entry = None
        for j, p in enumerate(group["params"]):
            g = p.grad
            if g is None:
                continue
            device = p.get_device()             # -1: the CPU
            if (type(p) not in _PLAIN or type(g) is not torch.Tensor
                    or not (p.is_cpu or p.is_cuda) or g.get_device() != device
                    or g.is_cpu != p.is_cpu or g.layout is not torch.strided
                    or not p.is_contiguous()
                    or g.numel() != p.numel()):
                singles.append(self._prepare(p, base + j, group))
                continue
            if not g.is_contiguous():           # expanded or transposed: its logical order
                g = g.contiguous()
            dtypes = (p.dtype, g.dtype)
            setup = resolved.get(dtypes)
            if setup is None:
                setup = resolved[dtypes] = resolve(group, p, g.dtype)
            st = state.get(p)
            step = None if st is None else st.get("step")
            if type(step) is int and step >= 0:
                t = step + 1
            else:                       # no state yet, or a step count that is not an int
                t = self._check_states(st or {}, p, group, setup, base + j) + 1
            first = self._first(st, group, t)
            if last is None or last[0] is not setup or last[1:] != (t, device, first):
                last = (setup, t, device, first)                    # another set
                key = (id(setup), t, device, first)
                entry = sets.get(key)
                if entry is None:
                    entry = sets[key] = [setup, t, [], [], [], [], first]
            entry[2].append(j)
            entry[3].append(p)
            entry[4].append(g)
            entry[5].append(st)
        planned = []
        for setup, t, positions, params, grads, states, first in sets.values():
            keys.stream(t, base + positions[-1], 2)             # the keys' range checks
            table = self._cached_table(group, base, setup, positions, params, states)
            planned.append((setup, t, positions, params, grads, states, table, first))
        return planned

    def _table_names(self, group, setup) -> tuple:
        return self._state_names(group) + {KAHAN: ("kahan_comp",),
                                           REMAINDER: ("remainder",)}.get(setup.update, ())

    def _cached_table(self, group, base, setup, positions, params, states):
        """The multi.Table kept for a set while the same parameters and state tensors hold
        the same memory (address, shape, dtype, layout: what the kernel relies on; a
        parameter resized through .data kept its address and wrote past its end before), or
        None after checking the set's states (:meth:`_step_set` builds it)."""
        cache = self.__dict__.setdefault("_table_cache", {})   # not in torch's pickled state
        cached = cache.get((id(group), base, id(setup), tuple(positions)))
        if (cached is not None and cached[0] is group and cached[1] is setup
                and all(map(operator.is_, cached[2], params)) and None not in states):
            # the storages kept with the table hold their memory: a tensor at a kept address
            # is the kept memory, so the addresses, shapes, dtypes and layouts are all the
            # kernel relies on (and what torch.optim would refuse); C-level maps, as each
            # attribute costs a call per tensor
            names, getter = cached[4]
            try:        # the names too: an option turned on mid-run needs another state
                held = list(chain.from_iterable(map(getter, states)))
                same = (names == self._table_names(group, setup)
                        and list(map(_PTR, params)) == cached[3][0]
                        and list(map(_SHAPE, params)) == cached[3][1]
                        and _signature(held) == cached[5])
            except (KeyError, AttributeError, TypeError):     # a state missing, not a tensor
                same = False
            if same:
                return cached[6]
        for j, p, st in zip(positions, params, states):
            if st is not None:
                self._check_states(st, p, group, setup, base + j)
        return None

    def _step_set(self, group, base, planned, hyper) -> None:
        """Step a checked set with one multi-tensor kernel call (lpsim.optim.multi)."""
        setup, t, positions, params, grads, states, table, first = planned
        if table is None:
            table, states = self._table(group, base, setup, positions, params)
        hp = hyper.get(t)
        if hp is None:
            hp = hyper[t] = self._hyper(group, t)
        for st in states:
            st["step"] = t
        if group.get("maximize"):
            grads = [torch.neg(g) for g in grads]      # torch.optim's maximize; exact
        table.refresh(grads)
        ints = (self._algo, setup.update, setup.wmode, setup.wk, setup.smode, setup.sk,
                int(bool(group.get("nesterov", False))), int(first))
        seed = split_key(group["seed"], "seed")
        if params[0].is_cuda:                                 # pragma: no cover (GPU only)
            table.step(hp, ints, seed, t, self._device_counts(params[0]))
            self._stats.add(table.elements, [0] * 6)
            return
        counts = table.step(hp, ints, seed, t)
        self._stats.counts[0] += table.elements
        self._stats.counts[1:] += counts[:6]
        self._cancelled += int(counts[6])

    def _table(self, group, base, setup, positions, params):
        """Build and cache a set's multi.Table, making the states it needs (zeros);
        (table, the parameters' states)."""
        names = self._table_names(group, setup)
        states = [self._init_state(p, p, group, setup) for p in params]
        held = [st[name] for st in states for name in names]
        cache = self.__dict__.setdefault("_table_cache", {})
        if len(cache) >= 256:           # bounded: sets that keep changing are rebuilt anyway
            cache.clear()
        moments = self._state_names(group)
        rows = []
        for k, (j, p) in enumerate(zip(positions, params)):
            by_name = dict(zip(names, held[k * len(names):(k + 1) * len(names)]))
            address = [by_name[name].data_ptr() if name in by_name else 0
                       for name in (moments[0] if moments else "", "exp_avg_sq", "kahan_comp",
                                    "remainder")]
            rows.append((p.data_ptr(), 0, *address, p.numel(), 0,
                         *(keys.stream(0, base + j, slot) for slot in range(3))))
        if params[0].is_cuda:                                 # pragma: no cover (GPU only)
            from lpsim_cuda.optim import Table
            table = Table(rows, setup, params[0].device)
        else:
            table = multi.Table(rows, setup, threads())
        # the tensors are kept with their table, so their ids stay theirs, and so are their
        # storages: a state whose .data is swapped keeps the memory the table points to
        storages = [t.untyped_storage() for t in (*params, *held)]
        cache[id(group), base, id(setup), tuple(positions)] = (
            group, setup, tuple(params), (list(map(_PTR, params)), list(map(_SHAPE, params))),
            (names, _getter(names)), _signature(held), table, storages)
        return table, states

    def _prepare(self, p, index, group) -> tuple:
        """Check one parameter, its gradient and its state for a step, changing nothing;
        what :meth:`_step_param` needs.  Nothing without data (device meta, a tensor whose
        memory a kernel cannot take) reaches a kernel: meta tensors step as in torch.optim
        (their states made, their step counts advanced), others are refused by name."""
        grad = p.grad
        if grad.layout is not torch.strided:
            raise TypeError(f"parameter {index}'s gradient has layout {grad.layout}; "
                            "lpsim.optim does not take sparse gradients (accepted: strided)")
        if type(p) is torch.nn.Parameter or type(p) is torch.Tensor:    # the common case
            offset, local = 0, p
        else:                                   # DTensor (FSDP2, tensor parallel) or other
            offset = keys.global_offset(p)
            local = p.to_local() if hasattr(p, "to_local") else p
        if type(grad) is not torch.Tensor and hasattr(grad, "to_local"):
            grad = grad.to_local()
        if grad.numel() != local.numel() or grad.device != local.device:
            raise ValueError(f"parameter {index} has {local.numel()} elements on "
                             f"{local.device}, its gradient {grad.numel()} on {grad.device}")
        device = local.device.type
        if device not in ("cpu", "cuda", "meta"):
            raise ValueError(f"parameter {index} is on device {local.device}; lpsim.optim "
                             "steps cpu and cuda tensors (and meta ones: states only)")
        if device != "meta":
            for what, t in (("parameter", local), ("gradient", grad)):
                if t.layout is not torch.strided or not _has_data(t):
                    raise TypeError(f"parameter {index}'s {what} (a {type(t).__name__}, layout "
                                    f"{t.layout}) holds no memory a kernel can take; "
                                    "lpsim.optim steps strided tensors with data")
            if not local.is_contiguous() and torch._debug_has_internal_overlap(local) == 1:
                raise ValueError(f"parameter {index} (shape {tuple(local.shape)}, strides "
                                 f"{local.stride()}) has elements that share memory; accepted: "
                                 "a parameter whose elements are distinct (as torch.optim)")
        setup = resolve(group, local, grad.dtype)
        t = self._check_states(self.state.get(p, {}), local, group, setup, index) + 1
        streams = tuple(keys.stream(t, index, slot) for slot in range(3))  # range-checked
        return p, local, grad, setup, offset, index, t, streams

    def _views(self, index, *tensors_and_setup):
        """The numpy bit views of a parameter and its states (lpsim.optim.cpu.bits_view),
        kept between steps while the same tensors hold the same memory (making six views
        cost more than stepping a small parameter); sizes, dtypes and layouts were checked
        by :meth:`_prepare`."""
        *tensors, setup, cache_it = tensors_and_setup
        ident = (*(t.data_ptr() if t is not None else 0 for t in tensors),
                 tensors[0].dtype, tensors[0].numel(), *map(id, tensors))
        cache = self.__dict__.setdefault("_view_cache", {})     # not in torch's pickled state
        cached = cache.get(index)
        if cache_it and cached is not None and cached[0] == ident:
            return cached[2]
        sdummy = np.zeros(1, np.int16 if setup.state_dtype != torch.float32 else np.int32)
        w, m, v, c, r = tensors
        views = (cpu.bits_view(w), *(cpu.bits_view(x, sdummy) for x in (m, v, c)),
                 cpu.bits_view(r))
        if cache_it:        # the tensors are kept with their views: ids and memory stay theirs
            cache[index] = (ident, tuple(tensors), views)
        return views

    def _step_param(self, prepared, group, hyper) -> None:
        """Step one checked parameter (:meth:`_prepare`) by itself.  A non-contiguous one
        (a transposed view, a channels_last weight) is stepped as a contiguous copy in its
        logical order and copied back, so each element gets the bits (and random words, keyed
        by its logical index) it would get in a contiguous parameter."""
        p, local, grad, setup, offset, index, t, streams = prepared
        first = self._first(self.state.get(p), group, t)      # before any state is made
        state = self._init_state(p, local, group, setup)
        state["step"] = t       # every check of the step has passed
        if local.device.type == "meta":
            return
        if group.get("maximize"):
            grad = torch.neg(grad)          # torch.optim's maximize; exact
        contiguous = local.is_contiguous()
        w = local if contiguous else local.contiguous()
        grad = grad if grad.is_contiguous() else grad.contiguous()
        hp = hyper.get(t)
        if hp is None:
            hp = hyper[t] = self._hyper(group, t)
        nesterov = bool(group.get("nesterov", False))
        seed = group["seed"]
        names = self._state_names(group)
        if group["implementation"] == "reference":
            stats = RoundingStats()
            cancelled = reference.step(self._algo, w, grad, state, setup, hp, nesterov,
                                       first, seed, streams, offset, stats)
            self._stats += stats
            self._cancelled += cancelled
        else:
            seed_lo, seed_hi = split_key(seed, "seed")
            ints = (self._algo, setup.update, setup.wmode, setup.wk, setup.smode, setup.sk,
                    int(nesterov), int(first))
            kargs = (setup.kinds, hp, ints, (seed_lo, seed_hi) + streams, offset)
            m = state[names[0]] if names else None
            v = state[names[1]] if len(names) > 1 else None
            c = state.get("kahan_comp")
            r = state.get("remainder")
            if w.is_cuda:                                     # pragma: no cover (GPU only)
                self._step_cuda(w, grad, m, v, c, r, kargs, setup)
            else:
                wb, mb, vb, cb, rb = self._views(index, w, m, v, c, r, setup, contiguous)
                counts = cpu.step(wb, cpu.bits_view(grad), mb, vb, cb, rb, *kargs, setup)
                self._stats.counts[0] += wb.size
                self._stats.counts[1:] += counts[:6]
                self._cancelled += int(counts[6])
        if not contiguous:
            local.copy_(w)

    def _step_cuda(self, w, grad, m, v, c, r, kargs, setup):       # pragma: no cover (GPU)
        from lpsim_cuda.optim import step as cuda_step
        cuda_step(w, grad, m, v, c, r, kargs, setup, self._device_counts(w))
        self._stats.add(w.numel(), [0] * 6)

    def _device_counts(self, w):                                 # pragma: no cover (GPU)
        """The NCOUNTS counters on ``w``'s CUDA device, added to by its kernels."""
        device = w.device.index
        if device not in self._gpu_counts:
            from numba import cuda
            with cuda.gpus[device]:
                self._gpu_counts[device] = cuda.to_device(np.zeros(NCOUNTS, np.int64))
        return self._gpu_counts[device]


_PTR, _SHAPE = torch.Tensor.data_ptr, operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def _signature(tensors) -> tuple:
    """Addresses, shapes, dtypes and contiguity of tensors, compared at each step."""
    return (list(map(_PTR, tensors)), list(map(_SHAPE, tensors)), list(map(_DTYPE, tensors)),
            list(map(torch.Tensor.is_contiguous, tensors)))


def _getter(names):
    """A parameter's state tensors of these names as a tuple (operator.itemgetter's, which
    gives the item itself for one name and takes no empty list)."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    return (lambda st: (st[names[0]],)) if names else (lambda st: ())


def _has_data(t: torch.Tensor) -> bool:
    """Whether a tensor has memory a kernel can be handed (not a fake or functional one)."""
    try:
        return t.data_ptr() != 0 or t.numel() == 0
    except (RuntimeError, NotImplementedError):
        return False


class AdamW(LowPrecisionOptimizer):
    """AdamW (decoupled weight decay, bias correction) in any weight and state format.

    BF16 paper Appendix B Algorithms 4 (stochastic) and 5 (Kahan), SR paper Algorithm 1
    (stochastic, shared randomness): m, v in the state format; the update
    u = lr (m / c1) / (sqrt(v / c2) + eps) + lr wd w is one float32 expression, so weight
    decay is rounded with the update instead of vanishing in a separate bf16 multiply.
    Options shared with SGD: :class:`LowPrecisionOptimizer`.
    """

    _algo = ADAMW
    _flags = ("amsgrad", "capturable")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, capturable=False, **kw):
        self._check_hyper(dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay), amsgrad=amsgrad,
                         capturable=capturable, **kw)

    @staticmethod
    def _check_hyper(group) -> None:
        for name in ("lr", "eps", "weight_decay"):
            check_number(name, group[name])
            check_float32(name, group[name])
        lr, wd = (group[name] for name in ("lr", "weight_decay"))
        check_float32("lr*weight_decay", float(lr) * float(wd))
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas={betas!r} must be a pair (beta1, beta2)")
        for i, beta in enumerate(betas):
            check_number(f"betas[{i}]", beta, 0.0, 1.0, open_high=True)

    def _state_names(self, group):
        return ("exp_avg", "exp_avg_sq")

    def _hyper(self, group, step):
        # Python floats first: a numpy float32 lr would make lr * wd a float32 product
        lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        b1, b2 = (float(b) for b in group["betas"])
        f = np.float32
        c1, c2 = f(1 - b1 ** step), f(1 - b2 ** step)          # in (0, 1]: b < 1, step >= 1
        return (f(lr), f(lr * wd), f(b1), f(1 - b1), f(b2), f(1 - b2), c1, c2, f(eps), f(wd),
                f(0), f(1), f(1) / c1, f(1) / c2)


class SGD(LowPrecisionOptimizer):
    """SGD with momentum, dampening, Nesterov and (coupled) weight decay in any format.

    torch.optim.SGD's rules; BF16 paper Appendix B Algorithms 2 (stochastic) and 3 (Kahan).
    The momentum buffer is the state (state_format, state_rounding).  Options shared with
    AdamW: :class:`LowPrecisionOptimizer`.
    """

    _algo = _SGD

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, **kw):
        self._check_hyper(dict(lr=lr, momentum=momentum, dampening=dampening,
                               weight_decay=weight_decay, nesterov=nesterov))
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=bool(nesterov)), **kw)

    @staticmethod
    def _check_hyper(group) -> None:
        for name in ("lr", "momentum", "weight_decay"):
            check_number(name, group[name])
            check_float32(name, group[name])
        momentum, dampening = group["momentum"], group["dampening"]
        check_number("dampening", dampening, 0.0, 1.0)
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise ValueError(f"nesterov=True needs momentum > 0 and dampening = 0, got "
                             f"momentum={momentum}, dampening={dampening}")

    def _state_names(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _first(self, state, group, t):
        """torch.optim.SGD's rule: the buffer is the gradient where there is none yet (a
        torch state dict has a buffer and no step count)."""
        if group["momentum"] == 0:
            return t == 1
        return not state or "momentum_buffer" not in state

    def _hyper(self, group, step):
        f = np.float32
        lr, mu, damp, wd = (float(group[name]) for name in ("lr", "momentum", "dampening",
                                                             "weight_decay"))
        return (f(lr), f(0), f(0), f(0), f(0), f(0), f(1), f(1), f(0), f(wd), f(mu),
                f(1 - damp), f(1), f(1))
