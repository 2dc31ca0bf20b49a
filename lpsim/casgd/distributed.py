"""CA-SGD over torch.distributed: 1D block columns, one grouped AllReduce of [r; G] (Sec. 4-6).

Each rank holds n/P feature columns and its slice of x; per outer iteration it issues one
all_reduce per datatype bucket of {u_AR_r, u_AR_G} (gloo cannot mix dtypes in one call),
at torch dtypes float64/float32/bfloat16/float16; any other format travels in its
container and is rounded on both sides.  Launch with
``torchrun --nproc-per-node P -m lpsim.casgd.distributed --m 8192 --n 512``.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile

import numpy as np

from .losses import get_loss
from .recipes import Rounder, as_recipe, container
from .solvers import (IndexStream, block_columns, check_data, check_eta, check_int,
                      outer_iteration)

_TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _torch_dtype(fmt):
    import torch
    name = fmt.preset_name
    return getattr(torch, _TORCH_DTYPES[name]) if name in _TORCH_DTYPES else \
        getattr(torch, str(container(fmt)))


class TorchAllReduce:
    """The grouped AllReduce of [r; G]: one all_reduce per dtype bucket; counts the calls."""

    def __init__(self, group=None, device="cpu"):
        self.group, self.device = group, device
        self.calls = 0
        self.outer = 0

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
        return out["r"], G


def casgd_distributed(A_local, y, *, loss="logistic", eta=0.5, b=32, s=16, H=100,
                      recipe="A", seed=0, group=None):
    """CA-SGD on this rank's column block A_local (m x n_loc) inside an initialised
    process group; returns (x_local, reducer).  Every rank samples the same rows (same seed)."""
    import torch
    import torch.distributed as dist
    loss, recipe = get_loss(loss), as_recipe(recipe)
    b, s, H, eta = check_int("b", b), check_int("s", s), check_int("H", H, 0), check_eta(eta)
    A_local, y = check_data(A_local, y, loss)
    backend = dist.get_backend(group)
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    reducer = TorchAllReduce(group, device)
    rnd = Rounder(seed)
    At = rnd.slot(A_local, recipe.u_A)
    x = rnd.slot(np.zeros(A_local.shape[1]), recipe.u_x).copy()
    stream = IndexStream(A_local.shape[0], seed)
    for _ in range(H):
        idx = stream.take(s * b)
        outer_iteration(At[idx], y[idx], x, [slice(None)], recipe, eta / b, b, s, loss, rnd,
                        reduce=reducer)
    return x, reducer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank, P, port, A, y, kwargs, outdir):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=P)
    try:
        cols = block_columns(A.shape[1], P)[rank]
        x, reducer = casgd_distributed(A[:, cols], y, **kwargs)
        np.savez(os.path.join(outdir, f"rank{rank}.npz"), x=x, calls=reducer.calls,
                 outer=reducer.outer)
    finally:
        dist.destroy_process_group()


def run_local(A, y, P: int, **kwargs):
    """Run :func:`casgd_distributed` on P local gloo processes (spawned); returns
    (x, allreduce calls per rank, outer iterations)."""
    import torch.multiprocessing as mp
    A = np.asarray(A)
    block_columns(A.shape[1], P)   # validates P against n
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_worker, args=(P, free_port(), A, np.asarray(y), kwargs, outdir), nprocs=P,
                 join=True)
        parts = [np.load(os.path.join(outdir, f"rank{p}.npz")) for p in range(P)]
        x = np.concatenate([part["x"] for part in parts])
        return x, [int(part["calls"]) for part in parts], int(parts[0]["outer"])


def main(argv=None):
    """torchrun entry point: synthetic data, block columns per rank, final loss on rank 0."""
    import torch
    import torch.distributed as dist
    from .data import make_synth
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--loss", default="logistic")
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--b", type=int, default=32)
    parser.add_argument("--s", type=int, default=16)
    parser.add_argument("--H", type=int, default=50)
    parser.add_argument("--recipe", default="C")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    A, y, _ = make_synth(args.m, args.n, loss=args.loss, seed=0)
    cols = block_columns(args.n, P)[rank]
    x, reducer = casgd_distributed(A[:, cols], y, loss=args.loss, eta=args.eta, b=args.b,
                                   s=args.s, H=args.H, recipe=args.recipe, seed=args.seed)
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
