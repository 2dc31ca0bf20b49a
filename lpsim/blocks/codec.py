"""Block-quantized arrays as codes: :func:`encode` gives the element codes and scale codes
(ml_dtypes bit layouts: :class:`Encoded`), :func:`decode` the values q * s (* tensor scale)
back in x's layout.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._extras import is_torch
from ..formats import Format
from .fake_quantize import quantize_blocks
from .formats import INT8_MX, BlockFormat, parse_block_format


class Encoded(NamedTuple):
    """Element codes and scale codes of a block-quantized array (ml_dtypes bit layouts).

    codes: uint8 (uint16 above 8 bits) element codes in the blocked layout (rows, length):
    ``codes.view(ml_dtypes.float4_e2m1fn)`` etc. where ml_dtypes has the dtype, and
    :func:`lpsim.storage.pack_nibbles` packs 4-bit codes two a byte.  scales: codes of the
    scale format (rows, blocks per row), e.g. ``float8_e8m0fnu``.  NaN blocks carry a NaN
    scale code.  MXINT8's element codes are OCP's two's complement INT8 (k / 64).
    """

    codes: np.ndarray
    scales: np.ndarray
    tensor_scale: float
    format: BlockFormat
    shape: tuple        # x's shape with the block axis moved last
    axis: int


def _code_dtype(fmt: Format):
    return np.uint8 if fmt.bits <= 8 else np.uint16


def encode(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None, stream: int = 0,
           sr_bits=None, offset: int = 0, tensor_scale=None) -> Encoded:
    """Block-quantize ``x`` (as :func:`quantize`) and return the codes and scale codes.

    ``x``: what :func:`quantize` takes on the CPU (arrays of any float dtype, integer arrays
    exact in float64, Python numbers and lists of them, CPU torch tensors), converted
    exactly as it converts them."""
    from ..request import as_container_array
    from ..storage import encode_values
    bfmt = parse_block_format(bfmt)
    for part, fmt in (("element", bfmt.element), ("scale", bfmt.scale)):
        if fmt.bits > 16:           # its codes would not fit the uint16 they are kept in
            raise ValueError(f"encode: {bfmt}'s {part} format {fmt} has {fmt.bits}-bit codes; "
                             "accepted: element and scale formats of at most 16 bits "
                             "(lpsim.quantize gives any block format's values)")
    if is_torch(x):
        x = _torch_host(x)
    x = as_container_array(x)
    r = quantize_blocks(x, bfmt, rounding, axis=axis, seed=seed, stream=stream,
                        sr_bits=sr_bits, offset=offset, tensor_scale=tensor_scale)
    if bfmt.element.specials == "saturate":
        # no NaN code: a NaN element is marked by its block's NaN scale, which
        # nonfinite="finite" does not make (the NaN would decode as 0)
        block_of = np.arange(r.elements.shape[-1]) // bfmt.block
        lost = np.isnan(r.elements) & ~np.isnan(r.scales[:, block_of])
        if lost.any():
            raise ValueError(f"encode: a NaN element of {bfmt} has no code: its element format "
                             "has none, and with nonfinite='finite' its block's scale does not "
                             "mark it; accepted: data without NaN, or nonfinite='nan'")
    codes = encode_values(r.elements, bfmt.element).astype(_code_dtype(bfmt.element))
    if bfmt.element == INT8_MX:
        codes = _twos_complement(codes)
    scales = encode_values(r.scales, bfmt.scale).astype(_code_dtype(bfmt.scale))
    shape = np.moveaxis(x, axis, -1).shape if x.ndim else ()
    return Encoded(codes, scales, r.tensor_scale, bfmt, shape, axis)


def _twos_complement(codes):
    """MXINT8's element codes as OCP's two's complement INT8 (value k / 64) from lpsim's
    sign-magnitude ones; 0x80 (OCP's -2.0, which lpsim never produces) stays the NaN code."""
    sign, k = codes >> 7, (codes & 0x7F).astype(np.int64)
    return np.where(codes == 0x80, 0x80, np.where(sign == 1, (256 - k) & 0xFF, k)).astype(
        codes.dtype)


def _sign_magnitude(codes):
    """The inverse of :func:`_twos_complement`."""
    c = np.asarray(codes).astype(np.int64)
    return np.where(c == 0x80, 0x80, np.where(c > 0x80, 0x80 | (256 - c), c)).astype(
        np.asarray(codes).dtype)


def _torch_host(t):
    """A torch tensor's values as a numpy array (float16 and bfloat16 exactly as float32)."""
    import torch
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach()
    if t.device.type != "cpu":
        raise TypeError(f"encode takes CPU data, not a tensor on {t.device}; use t.cpu()")
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t.numpy()


def decode(encoded: Encoded, dtype=np.float32) -> np.ndarray:
    """The values q * s (* tensor scale) of :func:`encode`'s codes, in x's layout."""
    from ..storage import decode_codes
    if not isinstance(encoded, Encoded):
        raise TypeError(f"decode: encoded={encoded!r} is not accepted; "
                        "accepted: what lpsim.blocks.encode returns (an Encoded)")
    bfmt = encoded.format
    codes = _sign_magnitude(encoded.codes) if bfmt.element == INT8_MX else encoded.codes
    q = decode_codes(codes, bfmt.element)
    # each element's block by index: repeating the scales block times first would make
    # block x blocks values however short the rows (a block of 2**40 asked for terabytes)
    block_of = np.arange(q.shape[1]) // bfmt.block
    s = decode_codes(encoded.scales, bfmt.scale)[:, block_of]
    values = q * s * (encoded.tensor_scale if bfmt.tensor_scale else 1.0)
    values = np.where(np.isnan(s), np.nan, values).astype(dtype)
    if encoded.shape == ():                                 # a 0-d x: one block of one
        return values.reshape(())
    return np.moveaxis(values.reshape(encoded.shape), -1, encoded.axis)
