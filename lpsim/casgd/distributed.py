"""CA-SGD over torch.distributed: 1D block columns, one grouped AllReduce of [r; G] (Sec. 4-6).

Each rank holds n/P feature columns and its slice of x; per outer iteration it issues one
all_reduce per datatype bucket of {u_AR_r, u_AR_G} (gloo cannot mix dtypes in one call),
at torch dtypes float64/float32/bfloat16/float16; any other format travels in its
container and is rounded on both sides.  Launch with
``torchrun --nproc-per-node P -m lpsim.casgd.distributed --rows 8192 --features 512``
(``--native``: the GPU path of :mod:`lpsim.casgd.native`, NCCL AllReduce of device tensors).
The options are long names because torchrun reads every argument that abbreviates one of its
own (``--m`` would be ``--master-addr``, ``--max-restarts``, ...) as ambiguous.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import tempfile
import threading
from typing import NamedTuple

import numpy as np

from .._extras import require

require("torch", extra="torch", feature="lpsim.casgd.distributed")

from .losses import get_loss
from .recipes import Rounder, as_recipe, container
from .solvers import (block_columns, check_data, check_eta, check_int, check_sampler,
                      check_seed, index_stream, outer_iteration)

_TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _torch_dtype(fmt):
    import torch
    name = fmt.preset_name
    return getattr(torch, _TORCH_DTYPES[name]) if name in _TORCH_DTYPES else \
        getattr(torch, str(container(fmt)))


class TorchAllReduce:
    """The grouped AllReduce of [r; G]: one all_reduce per dtype bucket; counts the calls.

    history=True keeps every reduced (r, G), e.g. to check them against Assumption 5.4.
    """

    def __init__(self, group=None, device="cpu", history: bool = False):
        self.group, self.device = group, device
        self.calls = 0
        self.outer = 0
        self.history = [] if history else None

    def __call__(self, r_parts, G_parts, recipe, rnd):
        import torch
        import torch.distributed as dist
        self.outer += 1
        items = [("r", r_parts[0], recipe.u_AR_r)]
        if G_parts:
            items.append(("G", G_parts[0], recipe.u_AR_G))
        buckets: dict = {}
        for name, part, slot in items:
            local = rnd.slot(part, slot).reshape(-1)
            buckets.setdefault(_torch_dtype(slot.out_fmt), []).append((name, local, slot))
        out = {}
        for dtype, members in buckets.items():
            flat = np.concatenate([local.astype(np.float64) for _, local, _ in members])
            tensor = torch.from_numpy(flat).to(dtype).to(self.device)
            dist.all_reduce(tensor, group=self.group)
            self.calls += 1
            summed = tensor.to("cpu", torch.float64).numpy()
            start = 0
            for name, local, slot in members:
                out[name] = rnd.slot(summed[start:start + local.size], slot)
                start += local.size
        G = out["G"].reshape(G_parts[0].shape) if G_parts else None
        if self.history is not None:
            self.history.append((out["r"], G))
        return out["r"], G


def casgd_distributed(A_local, y, *, loss="logistic", eta=0.5, b=32, s=16, H=100,
                      recipe="A", seed=0, group=None, device=None, history=False,
                      sampler=None):
    """CA-SGD on this rank's column block A_local (m x n_loc) inside an initialised
    process group; returns (x_local, reducer).  Every rank samples the same rows (same seed
    and ``sampler``, default "philox": the rows of :func:`lpsim.casgd.casgd`).

    device: where the collective's tensors live (default: the current CUDA device under
    nccl, else "cpu"); history: keep the reduced [r; G] in ``reducer.history``.
    """
    import torch
    import torch.distributed as dist
    loss, recipe = get_loss(loss), as_recipe(recipe)
    b, s, H, eta = check_int("b", b), check_int("s", s), check_int("H", H, 0), check_eta(eta)
    seed, sampler = check_seed(seed), check_sampler(sampler)
    A_local, y = check_data(A_local, y, loss)
    if device is None:
        nccl = dist.get_backend(group) == "nccl"
        device = f"cuda:{torch.cuda.current_device()}" if nccl else "cpu"
    reducer = TorchAllReduce(group, device, history)
    rnd = Rounder(seed)
    At = rnd.slot(A_local, recipe.u_A)
    x = rnd.slot(np.zeros(A_local.shape[1]), recipe.u_x).copy()
    stream = index_stream(sampler, A_local.shape[0], seed)
    for _ in range(H):
        idx = stream.take(s * b)
        outer_iteration(At[idx], y[idx], x, [slice(None)], recipe, eta / b, b, s, loss, rnd,
                        reduce=reducer)
    return x, reducer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalRun(NamedTuple):
    """A local multi-rank run: weights, all_reduce calls per rank, outer iterations, and
    rank 0's reduced (r, G) per outer iteration when asked for."""

    x: np.ndarray
    calls: list
    outer: int
    history: list | None = None


def _rank_run(rank, P, A, y, kwargs, group=None):
    """casgd_distributed on rank's block columns: (x_local, reducer)."""
    cols = block_columns(A.shape[1], P)[rank]
    return casgd_distributed(A[:, cols], y, group=group, **kwargs)


def _worker(rank, P, port, A, y, kwargs, outdir):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=P)
    try:
        x, reducer = _rank_run(rank, P, A, y, kwargs)
        np.savez(os.path.join(outdir, f"rank{rank}.npz"), x=x, calls=reducer.calls,
                 outer=reducer.outer)
    finally:
        dist.destroy_process_group()


def run_local(A, y, P: int, **kwargs) -> LocalRun:
    """Run :func:`casgd_distributed` on P local gloo processes (spawned)."""
    import torch.multiprocessing as mp
    A = np.asarray(A)
    block_columns(A.shape[1], P)   # validates P against n
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_worker, args=(P, free_port(), A, np.asarray(y), kwargs, outdir), nprocs=P,
                 join=True)
        parts = [np.load(os.path.join(outdir, f"rank{p}.npz")) for p in range(P)]
        x = np.concatenate([part["x"] for part in parts])
        return LocalRun(x, [int(part["calls"]) for part in parts], int(parts[0]["outer"]))


def _run_rank_threads(A, y, P: int, timeout_s: float, rank_fn, prefix: str):
    """``rank_fn(rank, group)`` on P threads, each rank with its own gloo process group over
    a shared in-memory store; a rank's exception is raised here.  Returns their results."""
    import torch.distributed as dist
    block_columns(np.shape(A)[1], P)
    store = dist.HashStore()
    results, errors = [None] * P, []

    def rank_main(rank):
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, P,
                                          datetime.timedelta(seconds=timeout_s))
            results[rank] = rank_fn(rank, group)
        except Exception as err:      # noqa: BLE001 (re-raised in the caller's thread)
            errors.append(err)

    threads = [threading.Thread(target=rank_main, args=(p,)) for p in range(P)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def run_threads(A, y, P: int, timeout_s: float = 60.0, **kwargs) -> LocalRun:
    """Run :func:`casgd_distributed` as P threads of this process, each rank with its own
    gloo process group over a shared in-memory store (no process start-up: fast tests).

    The collectives are gloo's, as in :func:`run_local`; rank 0's reduced [r; G] come back
    in ``history``.  A rank's exception is raised here.
    """
    A, y = np.asarray(A), np.asarray(y)
    results = _run_rank_threads(A, y, P, timeout_s, lambda rank, group: _rank_run(
        rank, P, A, y, dict(kwargs, device="cpu", history=rank == 0), group), "casgd")
    x = np.concatenate([x for x, _ in results])
    reducers = [reducer for _, reducer in results]
    return LocalRun(x, [r.calls for r in reducers], reducers[0].outer, reducers[0].history)


def native_rank_run(rank, P, A, y, kwargs, group=None):
    """:func:`lpsim.casgd.native.casgd_native` on this rank's block columns with the grouped
    AllReduce of [r; G] on device tensors: (x_local, reducer)."""
    from .native import NativeAllReduce, casgd_native
    cols = block_columns(A.shape[1], P)[rank]
    reducer = NativeAllReduce(group)
    res = casgd_native(A[:, cols], y, reduce=reducer, **kwargs)
    return res.x, reducer


def run_native_threads(A, y, P: int, timeout_s: float = 60.0, **kwargs) -> LocalRun:
    """The native path on P gloo ranks as threads of this process (CPU tensors, so under the
    kernel simulator): the collective code NCCL runs on GPUs, tested without them."""
    A, y = np.asarray(A), np.asarray(y)
    results = _run_rank_threads(A, y, P, timeout_s, lambda rank, group: native_rank_run(
        rank, P, A, y, kwargs, group), "native")
    return LocalRun(np.concatenate([x for x, _ in results]), [r.calls for _, r in results],
                    results[0][1].outer)


def cli_parser() -> argparse.ArgumentParser:
    """The torchrun entry point's options: full names only, none a prefix of torchrun's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--rows", type=int, default=8192, metavar="M", help="samples m")
    parser.add_argument("--features", type=int, default=512, metavar="N", help="features n")
    parser.add_argument("--loss", default="logistic")
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=32, metavar="B", help="mini-batch b")
    parser.add_argument("--inner", type=int, default=16, metavar="S",
                        help="inner steps s per outer iteration")
    parser.add_argument("--outer", type=int, default=50, metavar="H",
                        help="outer iterations H")
    parser.add_argument("--recipe", default="C")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--native", action="store_true",
                        help="the native GPU path (lpsim.casgd.native) on each rank's GPU")
    return parser


def main(argv=None):
    """torchrun entry point: synthetic data, block columns per rank, final loss on rank 0."""
    import torch
    import torch.distributed as dist
    from .data import make_synth
    args = cli_parser().parse_args(argv)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    A, y, _ = make_synth(args.rows, args.features, loss=args.loss, seed=0)
    kwargs = dict(loss=args.loss, eta=args.eta, b=args.batch, s=args.inner, H=args.outer,
                  recipe=args.recipe, seed=args.seed)
    if args.native:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        x, reducer = native_rank_run(rank, P, A, y, dict(kwargs, device=device))
    else:
        x, reducer = _rank_run(rank, P, A, y, kwargs)
    gathered = [None] * P
    dist.all_gather_object(gathered, x)
    if rank == 0:
        x_full = np.concatenate(gathered)
        print(f"P={P} recipe={args.recipe} loss={args.loss}: F(x)="
              f"{get_loss(args.loss).objective(A, y, x_full):.8g}, "
              f"{reducer.calls} all_reduce calls in {reducer.outer} outer iterations")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
