"""Every ```python block of README.md runs as written.

A block that needs what CI does not have says so on a line of its own, ``# requires: cuda``
(a GPU: it runs with LPSIM_TEST_GPU=1) or ``# requires: torchrun`` (several processes); any
other block must run here, in a fresh namespace, from an empty directory.
"""

import contextlib
import io
import os
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)
REQUIRES = re.compile(r"^#\s*requires:\s*(\w+)\s*$", re.M)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)),
                         ids=[f"block{i}-{b.splitlines()[0][:30]}" for i, b in enumerate(BLOCKS)])
def test_readme_block_runs(index, tmp_path, monkeypatch):
    block = BLOCKS[index]
    needs = set(REQUIRES.findall(block))
    unknown = needs - {"cuda", "torchrun"}
    assert not unknown, f"README block {index}: unknown '# requires:' {sorted(unknown)}"
    if "torchrun" in needs:
        pytest.skip("README block launches several processes (# requires: torchrun)")
    if "cuda" in needs and os.environ.get("LPSIM_TEST_GPU") != "1":
        pytest.skip("README block needs a GPU (# requires: cuda): run with LPSIM_TEST_GPU=1")
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(compile(block, f"README.md python block {index}", "exec"), {"__name__": "readme"})
