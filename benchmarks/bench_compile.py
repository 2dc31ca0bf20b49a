"""First-call time: import, compile (empty numba cache) and cache load (warm cache).

    python benchmarks/bench_compile.py [--cases "quantize nearest f32,ops.matmul fp16 in and acc"]
                                       [--json out.json]

Each case runs in a fresh Python process: with an empty ``NUMBA_CACHE_DIR`` (every kernel it
needs compiles) and again with the cache that run left behind (every kernel loads from disk).
For each it prints the process's CPU seconds (all threads: the figure that does not depend on
what else the machine runs) and wall seconds of ``import lpsim`` and of the first call, and
attributes the first call's time with numba's compile events (``numba.core.event``): LLVM
(time under the LLVM lock: optimisation and machine code), numba's type inference, numba's
other passes (lowering to LLVM IR, ...), and the rest (Python, cache loads, the work itself).
The peer, in the same run: the first call of a one-line ``@numba.njit`` function in a fresh
process (numba's own floor), and the ratio lpsim / peer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: name -> (import statement, first call); run in the child after the import is timed
CASES = {
    "peer: numba one-line njit": (
        "import numba, numpy as np",
        "numba.njit(lambda x: x + 1.0)(1.0)"),
    "quantize nearest f32": (
        "import lpsim, numpy as np",
        "lpsim.quantize(np.ones(4, np.float32), 'bf16')"),
    "quantize stochastic f32": (
        "import lpsim, numpy as np",
        "lpsim.quantize(np.ones(4, np.float32), 'bf16', 'stochastic', seed=1)"),
    "quantize nearest f64": (
        "import lpsim, numpy as np",
        "lpsim.quantize(np.ones(4), 'bf16')"),
    "quantize stochastic f64": (
        "import lpsim, numpy as np",
        "lpsim.quantize(np.ones(4), 'bf16', 'stochastic', seed=1)"),
    "ops.add bf16": (
        "import lpsim, lpsim.ops as ops, numpy as np",
        "ops.add(np.ones(4, np.float32), np.ones(4, np.float32), 'bf16')"),
    "ops.matmul fp16 in and acc": (
        "import lpsim, lpsim.ops as ops, numpy as np",
        "ops.matmul(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32), "
        "in_fmt='fp16', acc_fmt='fp16')"),
    "ops.dot sequential bf16 acc": (
        "import lpsim, lpsim.ops as ops, numpy as np",
        "ops.dot(np.ones(8, np.float32), np.ones(8, np.float32), acc_fmt='bf16', "
        "order='sequential')"),
    "lpsim round 0.1 (CLI)": (
        "import lpsim, lpsim.cli, io, contextlib",
        "contextlib.redirect_stdout(io.StringIO()).__enter__(); lpsim.cli.main(['round', '0.1'])"),
    "lpsim.warmup()": (
        "import lpsim",
        "lpsim.warmup(progress=False)"),
}

#: the child: times the import and the first call, and splits the call's time by what
#: numba was doing (innermost event wins: LLVM lock > type inference > other pass > compile)
CHILD = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
exec(sys.argv[1])
t1, c1 = time.perf_counter(), time.process_time()
from numba.core import event

class Split(event.Listener):
    def __init__(self):
        self.stack, self.last, self.parts, self.kernels = [], None, {}, {}
    def _charge(self):
        now = time.perf_counter()
        if self.stack:
            self.parts[self.stack[-1]] = self.parts.get(self.stack[-1], 0.0) + now - self.last
        self.last = now
    def _category(self, ev):
        if ev.kind == 'numba:llvm_lock':
            return 'llvm'
        if ev.kind == 'numba:run_pass':
            return 'typing' if 'type_inference' in ev.data['name'] else 'passes'
        if ev.kind == 'numba:compile':
            return 'compile'
        return None
    def on_start(self, ev):
        cat = self._category(ev)
        if cat is None:
            return
        self._charge()
        self.stack.append(cat)
        if ev.kind == 'numba:compile' and self.stack.count('compile') == 1:
            self.top = (getattr(ev.data['dispatcher'].py_func, '__qualname__', '?'),
                        time.perf_counter())
    def on_end(self, ev):
        cat = self._category(ev)
        if cat is None:
            return
        self._charge()
        self.stack.pop()
        if ev.kind == 'numba:compile' and 'compile' not in self.stack:
            name, start = self.top
            self.kernels[name] = self.kernels.get(name, 0.0) + time.perf_counter() - start

split = Split()
for kind in ('numba:llvm_lock', 'numba:run_pass', 'numba:compile'):
    event.register(kind, split)
exec(sys.argv[2])
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"import_wall": t1 - t0, "import_cpu": c1 - c0, "call_wall": t2 - t1,
                  "call_cpu": c2 - c1, "parts": split.parts, "kernels": split.kernels}),
      file=sys.__stdout__)
"""


#: the run-time check: per-call thread CPU seconds (best of 7 batches, one thread) of the
#: kernels whose compile this script measures, so that a cheaper compile is not paid for at
#: run time; compare two trees with --root and --compare (the machine is shared: thread
#: time, not wall time)
RUNTIME = r"""
import json, time, numpy as np, lpsim, lpsim.ops as ops
rng = np.random.default_rng(0)
res = {}
def best(f, n):
    f()
    times = []
    for _ in range(7):
        t = time.thread_time()
        for _ in range(n):
            f()
        times.append((time.thread_time() - t) / n)
    return min(times)
for dt in (np.float32, np.float64):
    for mode in ("nearest", "stochastic"):
        for lg in (4, 12, 16, 20):
            x = (rng.standard_normal(1 << lg) * 1e3).astype(dt)
            out = np.empty_like(x)
            n = max(3, int(2e6 / (1 << lg)))
            for where, o in (("out", out), ("in place", x)):
                res[f"quantize {np.dtype(dt).name} {mode} {where} 2^{lg}"] = best(
                    lambda: lpsim.quantize(x, "bf16", mode, out=o, seed=1), n)
for m in (16, 64, 128):
    a = rng.standard_normal((m, m)).astype(np.float32)
    for name, kw in (("fp16 nearest", dict(in_fmt="fp16", acc_fmt="fp16")),
                     ("bf16 stochastic", dict(acc_fmt="bf16", acc_rounding="stochastic",
                                              seed=1)),
                     ("bf16 pairwise", dict(acc_fmt="bf16", order="pairwise"))):
        res[f"matmul {m}x{m} {name}"] = best(lambda: ops.matmul(a, a, **kw),
                                             max(3, int(3e5 / m ** 3)))
v = rng.standard_normal(1 << 16).astype(np.float32)
res["dot 2^16 sequential bf16"] = best(
    lambda: ops.dot(v, v, acc_fmt="bf16", order="sequential"), 3)
print(json.dumps(res), file=__import__("sys").__stdout__)
"""


def run_time(root: str) -> dict:
    """The RUNTIME check in a fresh one-thread process importing lpsim from ``root``."""
    env = dict(os.environ, PYTHONPATH=root, NUMBA_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", RUNTIME], env=env, cwd=root,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"run-time check failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_case(name: str, cache: str, root: str = ROOT) -> dict:
    """One fresh process running case ``name`` with NUMBA_CACHE_DIR=cache, importing lpsim
    from ``root``."""
    imports, call = CASES[name]
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=root)
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, imports, call], env=env, cwd=root,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode:
        raise RuntimeError(f"case {name!r} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall"] = wall
    result["process_cpu"] = (after.children_user - before.children_user
                             + after.children_system - before.children_system)
    return result


def compare(rows, runtime, path: str) -> None:
    """Each case's first-call CPU seconds in an earlier run (``path``) and now, and the
    ratio: the same machine and conditions are the reader's to check (the headers)."""
    with open(path) as handle:
        earlier = json.load(handle)
    old = {r["case"]: r for r in earlier["rows"]}
    print(f"# compared with: {earlier['header'].splitlines()[0]}")
    print(f"{'case':31s} {'cache':5s} {'cpu was':>8s} {'cpu now':>8s} {'now/was':>8s}")
    for row in rows:
        if row["case"] not in old:
            continue
        for kind in ("fresh", "warm"):
            was, now = old[row["case"]][kind]["call_cpu"], row[kind]["call_cpu"]
            print(f"{row['case'][:31]:31s} {kind:5s} {was:8.2f} {now:8.2f} {now / was:8.2f}")
    if runtime and earlier.get("runtime"):
        print(f"{'run time (us per call)':44s} {'was':>10s} {'now':>10s} {'now/was':>8s}")
        for case, seconds in runtime.items():
            was = earlier["runtime"].get(case)
            if was:
                print(f"{case:44s} {was * 1e6:10.2f} {seconds * 1e6:10.2f} "
                      f"{seconds / was:8.3f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated case names (default: all): " + "; ".join(CASES))
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--root", default=ROOT, help="the lpsim source tree to measure "
                        "(default: this repository; e.g. an exported older commit)")
    parser.add_argument("--runtime", action="store_true", help="also time the kernels "
                        "themselves (per-call thread CPU, one thread): a compile-time change "
                        "must not slow them")
    parser.add_argument("--compare", metavar="JSON", help="a --json file of an earlier run "
                        "(e.g. before a change): print each case's CPU seconds next to it")
    parser.add_argument("--label", default="", help="a label printed with the table "
                        "(e.g. 'before' or 'after')")
    args = parser.parse_args(argv)
    if args.compare and not os.path.exists(args.compare):
        parser.error(f"--compare {args.compare!r}: no such file")
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; accepted: {list(CASES)}")
    from tqdm import tqdm

    rows = []
    for name in tqdm(names, desc="cases (fresh + warm cache)", file=sys.stderr):
        with tempfile.TemporaryDirectory(prefix="lpsim-numba-cache-") as cache:
            fresh = run_case(name, cache, args.root)
            warm = run_case(name, cache, args.root)
        rows.append({"case": name, "fresh": fresh, "warm": warm})

    runtime = run_time(args.root) if args.runtime else None
    import numba
    head = (f"# {datetime.date.today()}  {platform.machine()}, {os.cpu_count()} cores "
            f"(shared with other jobs: compare CPU seconds), numba {numba.__version__}, "
            f"python {platform.python_version()}  {args.label}\n# lpsim from {args.root}")
    print(head)
    print("# cpu/wall: seconds of the first call in a fresh process (import not included); "
          "llvm/typing/passes: its numba compile time by stage (wall); x peer: call cpu / "
          "the one-line njit's")
    peer = {kind: next((r[kind]["call_cpu"] for r in rows if r["case"].startswith("peer")),
                       None) for kind in ("fresh", "warm")}
    print(f"{'case':31s} {'cache':5s} {'import':>6s} {'cpu':>6s} {'wall':>6s} {'llvm':>6s} "
          f"{'typing':>6s} {'passes':>6s} {'x peer':>6s}")
    for row in rows:
        for kind in ("fresh", "warm"):
            r = row[kind]
            parts = r["parts"]
            ratio = f"{r['call_cpu'] / peer[kind]:6.1f}" if peer[kind] else "     -"
            print(f"{row['case'][:31]:31s} {kind:5s} {r['import_cpu']:6.2f} "
                  f"{r['call_cpu']:6.2f} {r['call_wall']:6.2f} {parts.get('llvm', 0):6.2f} "
                  f"{parts.get('typing', 0):6.2f} {parts.get('passes', 0):6.2f} {ratio}")
    print("# fresh-cache compile time per top-level kernel (wall seconds, nested "
          "compiles included)")
    for row in rows:
        kernels = sorted(row["fresh"]["kernels"].items(), key=lambda kv: -kv[1])
        if kernels:
            print(f"{row['case'][:31]:31s} " + ", ".join(f"{k} {v:.2f}" for k, v in kernels))
    if runtime:
        print("# run time: per-call thread CPU microseconds, one thread")
        for case, seconds in runtime.items():
            print(f"{case:44s} {seconds * 1e6:12.2f}")
    if args.compare:
        compare(rows, runtime, args.compare)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"header": head, "rows": rows, "runtime": runtime}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
