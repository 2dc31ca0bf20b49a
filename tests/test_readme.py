"""Every ```python block of README.md runs as written, each in a fresh interpreter.

A block that needs what CI does not have says so on a line of its own, ``# requires: cuda``
(a GPU: it runs with LPSIM_TEST_GPU=1) or ``# requires: torchrun`` (several processes); any
other block must run here, in a new process started from an empty directory, as a reader
pastes it into ``python``: with only what the block itself imports (one process for all blocks
let a block lean on a module an earlier block, or a kernel compile, had imported).  The
environment is the suite's, NUMBA_CACHE_DIR included, so the kernels load from its cache.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)
REQUIRES = re.compile(r"^#\s*requires:\s*(\w+)\s*$", re.M)


def run_block(block, cwd):
    """Run ``block`` with ``python -`` in ``cwd``, this checkout's lpsim first on the path."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-"], input=block, cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": path})


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


def test_a_block_runs_in_a_process_of_its_own(tmp_path):
    # what the old in-process runner could not see: a module another block had imported
    done = run_block("import sys, os, lpsim\n"
                     "assert 'lpsim.ops' not in sys.modules and 'torch' not in sys.modules\n"
                     "print(os.getcwd(), lpsim.__file__)\n", tmp_path)
    assert done.returncode == 0, done.stderr
    cwd, where = done.stdout.split()
    assert pathlib.Path(cwd) == tmp_path and not any(tmp_path.iterdir())
    assert pathlib.Path(where) == ROOT / "lpsim" / "__init__.py"
    assert run_block("raise SystemExit(3)", tmp_path).returncode == 3


@pytest.mark.parametrize("index", range(len(BLOCKS)),
                         ids=[f"block{i}-{b.splitlines()[0][:30]}" for i, b in enumerate(BLOCKS)])
def test_readme_block_runs(index, tmp_path):
    block = BLOCKS[index]
    needs = set(REQUIRES.findall(block))
    unknown = needs - {"cuda", "torchrun"}
    assert not unknown, f"README block {index}: unknown '# requires:' {sorted(unknown)}"
    if "torchrun" in needs:
        pytest.skip("README block launches several processes (# requires: torchrun)")
    if "cuda" in needs and os.environ.get("LPSIM_TEST_GPU") != "1":
        pytest.skip("README block needs a GPU (# requires: cuda): run with LPSIM_TEST_GPU=1")
    done = run_block(block, tmp_path)
    assert done.returncode == 0, f"README python block {index}:\n{block}\n{done.stderr}"


def test_readme_is_a_short_entry():
    # the details live in the user guide (docs/guide/); the README is where a user starts
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_ci_runs_the_readme_test_command():
    """The README's test command is what .ci/run runs, with extras CI installs."""
    text = README.read_text(encoding="utf-8")
    commands = [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
                if "pytest" in b]
    assert len(commands) == 1, commands
    install, run = commands[0].split(" && ")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(rf"^{re.escape(run)}$", ci, re.M), f"{run!r} is not a line of .ci/run"
    extras = re.fullmatch(r'pip install -e "\.\[([\w,]+)\]" -c constraints\.txt', install)
    ci_extras = re.search(r'-e "\.\[([\w,]+)\]" -c constraints\.txt', ci)
    assert extras and ci_extras, (install, ci_extras)
    assert set(extras.group(1).split(",")) <= set(ci_extras.group(1).split(","))
