"""Test set-up: lpsim_cuda kernels run under numba's CUDA simulator unless a GPU is asked for.

Set LPSIM_TEST_GPU=1 on a machine with a GPU to run the same tests on the real device.
"""

import hashlib
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _source_digest() -> str:
    """Hash of the package sources: numba's cache only watches each kernel's own file."""
    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("lpsim*/**/*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache" / _source_digest()))
if os.environ.get("LPSIM_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
from numba.core import config  # noqa: E402  (a pytest plugin may have imported numba already)

config.reload_config()

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=100, derandomize=True)
settings.register_profile("thorough", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
