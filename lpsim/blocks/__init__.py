"""Block-scaled formats (OCP MX, NVFP4): elements of a small format sharing one scale per block.

A :class:`BlockFormat` is an element format, a block size along an axis, a scale format and a
scale rule.  For a block with largest magnitude ``amax`` the scale is ``s`` and each element
is ``s * round(x / s)``, rounded in the element format with saturation (OCP MX v1.0, Sec. 6.3).
Power-of-two scale formats (``e8m0fnu``: MX) take the exponent from ``amax``
(``emax`` is the element format's largest exponent, ``max`` its largest value):

=========  ================================================================  ================
rule       scale exponent                                                    as in
=========  ================================================================  ================
``floor``  floor(log2 amax) - emax                                           OCP MX, gfloat
``ceil``   ceil(log2 amax) - emax                                            torchao CEIL
``even``   floor(log2 amax') - emax, amax' = amax rounded to the element's    torchao EVEN
           mantissa bits, ties away
``rceil``  ceil(log2 d), d = amax / max rounded to float32                   cuBLAS, TE,
                                                                             torchao RCEIL
=========  ================================================================  ================

clamped to the scale format's exponents (a *clipped scale*).  An all-zero block takes the
smallest scale.  Scale formats with mantissa bits (NVFP4's ``e4m3fn``) take
``t = fp32(amax / max)`` (divided by the per-tensor scale ``fp32(tensor_amax / (scale max *
max))`` when ``tensor_scale``), clamped to the scale format's range and rounded to it: to
nearest (``even``), up (``ceil``, ``rceil``) or down (``floor``); the elements are then
``fp32(x * r)`` with the float32 reciprocal ``r = fp32(fp32(1/pts) / s)``, as torchao's NVFP4
and TransformerEngine compute them (torchao clamps the scale to E4M3's smallest normal 2^-6
rather than its smallest subnormal: docs/guide/blocks.rst lists that difference).  The
per-tensor scale is a float32 (a given one is rounded to float32) of at least
:func:`min_tensor_scale` (about 2**-119 for NVFP4), so that ``r`` stays finite for the
smallest block scale: a tensor whose largest magnitude is below about 4e-33 is scaled as if
it reached it.  The fake-quantized value is ``q * s``
(``* pts``) rounded once to the container.

A block holding a NaN or inf gets a NaN scale and decodes to NaN (``nonfinite="nan"``, OCP),
or takes its scale from its finite elements (``nonfinite="finite"``: NaN stays NaN, inf
saturates).  Element rounding is any lpsim mode with the random bits of
:func:`lpsim.quantize` (element ``i`` of the blocked layout, C order with the block axis last,
uses counter ``offset + i``), ``sr_bits`` included.  The scale decision
(:func:`block_scale`) and the element step (:func:`element_fast`: :func:`scaled_bits`, then
:func:`lpsim.rounding.round_fast_sub`; else :func:`element_exact` with
:func:`lpsim.rounding.round_bits`) are the shared scalar core of the CPU kernels (a vectorised
pass per block, :mod:`lpsim.blocks.kernels`) and of ``lpsim_cuda.blocks``.

The package, by concept (each module says what it holds and why):

=================  ===========================================================================
module             holds
=================  ===========================================================================
``formats``        :class:`BlockFormat` as data, its checks, the presets, parsing
``decisions``      the shared scalar core: :func:`block_scale`, the element steps,
                   :class:`BlockParams` and :func:`block_params` (``register_jitable``: the
                   CPU kernels and ``lpsim_cuda.blocks`` compile the same code)
``counters``       :data:`BLOCK_COUNTERS`, :class:`BlockStats`, :func:`add_counts`
``amax``           largest magnitudes per block and per tensor; NVFP4's per-tensor scale
``word_scales``    the float32 word kernel's scales in integer steps and their tables
``word_counts``    the float32 word kernel's counters (lpsim.quantize with stats)
``words``          the float32 word kernel's loops
``kernels``        the CPU kernels per rounding mode (numba's on-disk cache), threads
``columns``        blocks down the columns of a 2-D array where it lies (no transposing copy)
``hadamard_rows``  the random Hadamard transform's arithmetic on runs of rows, which the
                   column kernel runs band by band before it quantizes
``fake_quantize``  :func:`quantize`, :func:`quantize_blocks`,
                   :func:`quantize_hadamard_columns` and the plan cache of repeated float32
                   calls
``codec``          :func:`encode` and :func:`decode`: element and scale codes
=================  ===========================================================================

Every name of these modules is importable from ``lpsim.blocks`` too.  A module reads its
constants (``CHUNK``, ``AMAX_GRAIN``, ``MAX_CACHED``) from its own namespace: to change one
(as tests do), set it on that module, e.g. ``lpsim.blocks.kernels.SERIAL_BELOW``.
"""

from __future__ import annotations

# every name of the modules, importable from lpsim.blocks (the one module it once was)
from .formats import (  # noqa: F401
    _BLOCK_CALL, ALIASES, CEIL, ELEMENT_EXP_MIN, EVEN, FLOOR, INT8_MX, NONFINITE, PRESETS, RCEIL,
    RULES, SCALE_EXP_RANGE, BlockFormat, as_block_format, block, parse_block_format)
from .counters import (  # noqa: F401
    BLOCK_COUNTERS, STATS_ACCEPTED, BlockStats, add_counts)
from .decisions import (  # noqa: F401
    _INF64, _MAG64, _MAX64, _NORMAL64, _SIGN64, BlockParams, _element_params, _exact_product,
    _f2i_compiled, _i2f_compiled, _reciprocal_finite, _scale_mode, bits_value, block_params,
    block_recip, block_scale, dequantize_element, element_exact, element_fast, element_fast32,
    element_nearest32, element_nearest32_flags, element_ok32, element_params32, element_word,
    f2i, i2f, ilog2, nearest_words_exact, round_scale, scale_recip, scaled_bits, words_exact)
from .amax import (  # noqa: F401
    AMAX_GRAIN, FLOAT32_MAX, NO_AMAXES, _amax_entry, _amaxes_entry, _amaxes_of, _block_amax32,
    _finite_amax, _min_tensor_scale, _threaded_max, block_amaxes, checked_tensor_scale,
    container_bits, finite_amax, finite_bits, min_tensor_scale, tensor_amax, tensor_amaxes,
    tensor_scale_from, tensor_scale_of, word_tensor_scale)
from .word_scales import (  # noqa: F401
    STEPS_FROM, _next_step, _reciprocals, _scale_of, _scale_steps, scale_words)
from .word_counts import (  # noqa: F401
    LANES, PIECE, _block_nearest, _block_words, _clip_side, _exact_step, _group_counted,
    _group_counted_overload, _lanes_nearest, _least_side, _no_counts, _nonfinite_block,
    _piece_nearest, _piece_words, _store, _tally, _tally_block, _tally_lanes, _tally_packed,
    _tally_scratch, clip_bounds, group_counted, tally_scratch)
from .words import (  # noqa: F401
    SCALE_AHEAD, _block_nearest32, _blocks_steps, _chunk_words, _elements_nearest32,
    _elements_words, _group_elements, scale_ahead_scratch)
from .kernels import (  # noqa: F401
    COUNTED_WORD_KERNELS, KERNELS, NO_COUNTS, PARALLEL_GRAIN, SERIAL_BELOW, WORD_COUNTING,
    WORD_KERNELS, _block_bounds, _block_elements, _block_slow, _blocks_kernel, _blocks_range,
    _chunk, _words_kernel, _words_range, kernel_entry, run_blocks, run_kernel, takes_words,
    word_kernel_entry)
from .codec import (  # noqa: F401
    Encoded, _code_dtype, _torch_host, decode, encode)
from .fake_quantize import (  # noqa: F401
    _WORDS, MAX_CACHED, Blocked, _blocked_view, _remember_words, _Words, blocked_shape, quantize,
    quantize_blocks, quantize_cached, quantize_hadamard_columns, takes_hadamard_columns,
    writes_into)


__all__ = ["encode", "decode", "Encoded", "BlockFormat", "BlockStats", "block", "PRESETS",
           "as_block_format", "parse_block_format", "quantize", "quantize_blocks", "block_scale",
           "scaled_bits", "Blocked", "RULES"]
