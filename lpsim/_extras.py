"""Optional dependencies: import one, or raise an ImportError that names the extra to install;
tell their objects apart without importing them."""

from __future__ import annotations

import importlib
import sys


def is_torch(x) -> bool:
    """Whether ``x`` is a torch object: a tensor (a Parameter or a user's subclass of
    torch.Tensor too) or another object of torch's modules; torch is never imported here
    (a tensor means torch is imported already)."""
    if type(x).__module__.startswith("torch"):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def require(module: str, extra: str, feature: str | None = None):
    """Import and return ``module``; if it is missing, say which ``lpsim[extra]`` provides it.

    A bare ``pip install lpsim`` carries only numpy, numba, rich and tqdm: the modules that need
    more call this at import so that the user reads the install command, not a raw
    ModuleNotFoundError.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = module.split(".")[0]
        needs = feature or "this part of lpsim"
        raise ImportError(f"{needs} needs {package!r}, which is not installed; install it with: "
                          f"pip install \"lpsim[{extra}]\"") from error
