"""Optional dependencies: import one, or raise an ImportError that names the extra to install."""

from __future__ import annotations

import importlib


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
