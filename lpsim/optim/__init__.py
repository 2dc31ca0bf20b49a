"""lpsim.optim: SGD and AdamW that train in BF16 (or any format) without an FP32 master copy.

Updates round to nearest, stochastically (shared randomness keyed by seed, step, parameter
and global element index: :mod:`lpsim.optim.keys`), with Kahan compensation, or keep the
float32 master as a bfloat16 parameter plus a 16-bit remainder.  Needs torch.
"""

from .._extras import require

require("torch", extra="torch", feature="lpsim.optim")

from .keys import global_offset, stream
from .optimizer import SGD, AdamW, LowPrecisionOptimizer

__all__ = ["SGD", "AdamW", "LowPrecisionOptimizer", "stream", "global_offset"]
