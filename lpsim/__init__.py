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
