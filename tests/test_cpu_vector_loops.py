"""Static checks of the machine code of the CPU's hottest loops (no timings): the block word
kernels' stochastic element loops read their random words with vector loads.  Their index
was once ``rs[(r0 + i) & mask]`` (the mask 0 for the deterministic modes), which the
compiler turned into two gathers per 16 elements and a loop 3.7 times as slow."""

import re

import numpy as np
import pytest
from llvmlite import binding
from numba import njit

from lpsim.blocks import PRESETS
from lpsim.blocks.decisions import block_params, element_params32
from lpsim.blocks.word_counts import _lanes_words, _piece_words
from lpsim.blocks.words import _elements_words
from lpsim.rounding import STOCHASTIC

GATHERS = re.compile(r"\bv(p)?gather", re.IGNORECASE)


@njit
def _stochastic_loops(xf, outf, rs, lanes, rc, s, p32, bp, shift):
    """The three loops over blocks of 16, random words ``shift`` apart from the elements
    (the kernels' r0 is not a multiple of the block)."""
    total = 0
    for b in range(xf.size // 16 - 1):
        lo = np.uint64(16 * b)
        r0 = lo + np.uint64(shift)
        total += _elements_words(xf, outf, rs, lo, r0, 16, rc, s, STOCHASTIC, 0, p32, bp)
        total += _lanes_words(xf, outf, rs, lanes, lo, r0, 16, rc, s, STOCHASTIC, 0, p32, bp,
                              False)
        acc, rest = _piece_words(xf, outf, rs, lo, r0, 16, rc, s, STOCHASTIC, 0, p32, bp)
        total += acc + rest
    return total


@pytest.mark.skipif("+avx2" not in binding.get_host_cpu_features().flatten(),
                    reason="this CPU has no vector gathers (AVX2) for the compiler to choose")
def test_stochastic_block_loops_load_their_words_without_gathers():
    bfmt = PRESETS["nvfp4"]
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    rs = np.arange(x.size, dtype=np.uint32)
    _stochastic_loops(x, np.empty_like(x), rs, np.zeros(32, np.uint32), np.float32(0.75),
                      np.float32(4.0 / 3.0), element_params32(bfmt), block_params(bfmt, 1.0), 3)
    asm = _stochastic_loops.inspect_asm(_stochastic_loops.signatures[0])
    assert "vmul" in asm or "mulps" in asm          # the loops are in what was read
    assert not GATHERS.findall(asm), "a gather in the block word kernels' stochastic loops"
