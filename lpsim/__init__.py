"""lpsim: simulate any floating-point format fp(e, m, b), bit-exactly, on the CPU and GPU."""

from . import kernel_cache  # noqa: F401  first: stamps every cached kernel by all of lpsim
from . import blocks, reference
from .formats import PRESETS, Format, fp, parse_format
from .fixed import Fixed, fixed
from .generator import Generator
from .quantize import quantize
from .rounding import MODES
from .stats import RoundingStats
from .warmup import warmup

__all__ = ["Format", "fp", "parse_format", "PRESETS", "quantize", "MODES", "RoundingStats",
           "reference", "warmup", "Generator", "fixed", "Fixed", "blocks"]
__version__ = "0.1.0"

#: submodules reached as ``lpsim.X`` after a plain ``import lpsim``, imported on first access
#: (PEP 562) so that ``import lpsim`` stays fast and torch, scipy and hypothesis stay optional;
#: one whose extra is missing raises the ImportError that names it (``lpsim._extras.require``)
_CORE = ("blocks", "cli", "cpu", "exact", "formats", "generator", "kernel_cache",
         "openmp_team", "ops", "philox", "pool", "reference", "request", "rounding", "stats",
         "storage", "word32")
_EXTRAS = ("casgd", "optim", "tensors", "testing", "torch")


def __getattr__(name):
    if name in _CORE or name in _EXTRAS:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    # the core submodules; those of extras once imported (dir() should not import torch)
    return sorted(set(globals()) | set(_CORE))
