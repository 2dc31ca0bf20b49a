"""Which tensor-core instructions each NVIDIA generation has, and the arithmetic of each.

Every supported instruction computes D = A B + C as chained fused dot products: K is cut into
nodes of ``L`` products; a node adds C (the previous node's result) and its products in one
fused step that keeps ``F`` fraction bits below the largest term's exponent (zero terms count
with the exponent ``e_zero``) and rounds the sum once (``rho``).  The numbers per generation
are those measured on the hardware by MMA-Sim (Sec. 4 of its paper; package ``mmasim`` 2.1):

==========  ====  ===================  ===========================
generation  F     node (bytes of A)    e_zero (f16 / f32 output)
==========  ====  ===================  ===========================
volta       23    8                    -19 / -131
turing      24    16                   -20 / -132
ampere      24    16                   -20 / -132
ada         24    16                   -20 / -132
hopper      25    32                   -21 / -133
blackwell   25    32                   -21 / -133
==========  ====  ===================  ===========================

FP8 inputs (ada ``mma``, hopper ``wgmma``) keep only F = 13 and round an f32 result toward
zero to 13 fraction bits (E8M13) before it is an FP32 value; Blackwell's ``tcgen05.mma``
keeps F = 25 for every kind, FP8, FP6 (e3m2, e2m3) and FP4 (e2m1) included; its
block-scaled ``kind::mxf8f6f4`` adds two E8M0 scale exponents to each product's.  The FP4
kinds ``kind::mxf4`` and ``kind::mxf4nvf4`` (k = 64, E8M0 or UE4M3 scales per 32 or 16
products) sum each group of 16 products exactly, scale the group sum, and add the four
groups and C in one node with F = 35 and e_zero = -139 (:mod:`lpsim.ops.mma_groups`).  An f32
result is otherwise rounded toward zero, an f16 result to nearest even.  Turing runs Volta's m8n8k4 shapes with
Volta's numbers.  Opcodes are written as PTX writes them; the ``sync``, ``aligned``,
``mma_async``, ``row`` and ``col`` qualifiers may be left out.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

ARCHS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")

_F = {"volta": 23, "turing": 24, "ampere": 24, "ada": 24, "hopper": 25, "blackwell": 25}
_NODE_BYTES = {"volta": 8, "turing": 16, "ampere": 16, "ada": 16, "hopper": 32,
               "blackwell": 32}
_E_ZERO16 = {"volta": -19, "turing": -20, "ampere": -20, "ada": -20, "hopper": -21,
             "blackwell": -21}
_E_ZERO32 = {"volta": -131, "turing": -132, "ampere": -132, "ada": -132, "hopper": -133,
             "blackwell": -133}
_BYTES = {"f16": 2, "bf16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1, "e3m2": 1, "e2m3": 1,
          "e2m1": 1}
# lpsim format of each PTX type (lpsim.formats.parse_format)
FORMATS = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "tf32": "tf32", "e4m3": "e4m3fn",
           "e5m2": "e5m2", "e3m2": "e3m2fn", "e2m3": "e2m3fn", "e2m1": "e2m1fn"}

_FP8 = ("e5m2", "e4m3")
_F8F6F4 = _FP8 + ("e3m2", "e2m3", "e2m1")
# mma shapes and types ("shape.d.a.b.c") by the first generation that has them
_SM70 = ["m8n8k4.f32.f16.f16.f32", "m8n8k4.f32.f16.f16.f16", "m8n8k4.f16.f16.f16.f16"]
_SM75 = ["m16n8k8.f32.f16.f16.f32", "m16n8k8.f16.f16.f16.f16"]
_SM80 = ["m16n8k8.f32.tf32.tf32.f32", "m16n8k4.f32.tf32.tf32.f32",
         "m16n8k16.f32.f16.f16.f32", "m16n8k16.f16.f16.f16.f16",
         "m16n8k16.f32.bf16.bf16.f32", "m16n8k8.f32.bf16.bf16.f32"]
_SM89 = [f"m16n8k{k}.{d}.{a}.{b}.{d}" for k in (32, 16) for d in ("f32", "f16")
         for a in _FP8 for b in _FP8]
MMA_SHAPES = {
    "volta": _SM70,
    "turing": _SM75 + _SM70,
    "ampere": _SM80 + _SM75,
    "ada": _SM89 + _SM80 + _SM75,
    "hopper": _SM80 + _SM75,
    "blackwell": _SM80 + _SM75,
}
# wgmma ("shape.d.a.b", C has D's type): Hopper only, m64, n = 8, 16, ..., 256
_WGMMA_TYPES = (["k8.f32.tf32.tf32", "k16.f32.f16.f16", "k16.f16.f16.f16",
                 "k16.f32.bf16.bf16"]
                + [f"k32.{d}.{a}.{b}" for d in ("f32", "f16") for a in _FP8 for b in _FP8])
WGMMA_N = tuple(range(8, 257, 8))
# tcgen05.mma ("kind.d.a.b", C has D's type; cta_group::1): Blackwell only, m64 or m128,
# n = 8, 16, ..., 256; FP6 and FP4 as kind::f8f6f4 operands
_TCGEN05_TYPES = (["k8.kind::tf32.f32.tf32.tf32", "k16.kind::f16.f32.f16.f16",
                   "k16.kind::f16.f32.bf16.bf16", "k16.kind::f16.f16.f16.f16"]
                  + [f"k32.kind::f8f6f4.{d}.{a}.{b}" for d in ("f32", "f16")
                     for a in _F8F6F4 for b in _F8F6F4])
TCGEN05_M = (64, 128)
# block-scaled tcgen05.mma, m128, a scale per block of A's rows and of B's columns:
# kind::mxf8f6f4 (E8M0 per 32 products, folded into the products' exponents), and the FP4
# kinds (k64: E8M0 per 32 or 16, or UE4M3 per 16; groups of 16 products summed exactly)
_TCGEN05_BLOCK_TYPES = ([f"k32.kind::mxf8f6f4.block32.f32.{a}.{b}.ue8m0" for a in _F8F6F4
                         for b in _F8F6F4]
                        + ["k64.kind::mxf4.block32.f32.e2m1.e2m1.ue8m0",
                           "k64.kind::mxf4nvf4.block32.f32.e2m1.e2m1.ue8m0",
                           "k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue8m0",
                           "k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3"])
# the FP4 kinds' node: F, products summed exactly per group, e_zero (MMA-Sim's GST-FDPA)
_GROUP_F, _GROUP, _GROUP_E_ZERO = 35, 16, -139


def instructions(wgmma_n: int = 8) -> list[tuple[str, str]]:
    """Every (generation, instruction) :func:`lpsim.ops.mma` runs, ``wgmma`` at width
    ``wgmma_n``: the cases the tests and ``benchmarks/bench_mma.py`` check against mmasim."""
    return ([(arch, f"mma.{shape}") for arch in ARCHS for shape in MMA_SHAPES[arch]]
            + [("hopper", f"wgmma.m64n{wgmma_n}{t}") for t in _WGMMA_TYPES]
            + [("blackwell", f"tcgen05.mma.m64n{wgmma_n}{t}") for t in _TCGEN05_TYPES]
            + [("blackwell", f"tcgen05.mma.m128n{wgmma_n}{t}") for t in _TCGEN05_BLOCK_TYPES])

_DROP = {"sync", "aligned", "mma_async", "row", "col", "cta_group::1"}
_SHAPE = re.compile(r"m(\d+)n(\d+)k(\d+)")


@dataclass(frozen=True)
class Instruction:
    """One instruction on one generation: shapes, PTX types and its fused-node arithmetic."""

    arch: str
    opcode: str         # normalised: "mma.m16n8k16.f32.bf16.bf16.f32"
    m: int
    n: int
    k: int
    d_type: str
    a_type: str
    b_type: str
    c_type: str
    F: int              # fraction bits kept below the node's largest exponent
    L: int              # products per fused node
    e_zero: int         # exponent a zero term takes in the node's maximum
    rho: int            # output rounding: RZ_E8M13, RZ_FP32 or RNE_FP16
    block: int = 0      # block-scaled kinds: products per scale (0: no scales)
    scale_type: str = ""    # their scales' type: "ue8m0" or "ue4m3"
    group: int = 0      # FP4 kinds: products summed exactly before their scale (0: none)


RZ_E8M13, RZ_FP32, RNE_FP16 = 0, 1, 2


def _accepted(arch: str) -> str:
    mma = ", ".join(f"mma.{s}" for s in MMA_SHAPES[arch])
    if arch == "blackwell":
        return (mma + "".join(f", tcgen05.mma.mMnN{t}" for t in _TCGEN05_TYPES)
                + "".join(f", tcgen05.mma.m128nN{t}" for t in _TCGEN05_BLOCK_TYPES)
                + " (M = 64 or 128, N = 8, 16, ..., 256)")
    if arch != "hopper":
        return mma
    return (mma + "".join(f", wgmma.m64nN{t}" for t in _WGMMA_TYPES)
            + " (N = 8, 16, ..., 256)")


def _is_tcgen05(op, rest, match) -> bool:
    if op != "tcgen05" or len(rest) not in (6, 8) or rest[0] != "mma" or match is None \
            or int(match.group(2)) not in WGMMA_N:
        return False
    types = f"k{match.group(3)}." + ".".join(rest[2:])
    if len(rest) == 8:
        return int(match.group(1)) == 128 and types in _TCGEN05_BLOCK_TYPES
    return int(match.group(1)) in TCGEN05_M and types in _TCGEN05_TYPES


def lookup(arch, instruction) -> Instruction:
    """The :class:`Instruction` for ``arch`` and a PTX opcode; ValueError naming what is
    accepted when the generation or the opcode is unknown or the generation lacks it."""
    if isinstance(arch, str) and isinstance(instruction, str):
        return _lookup(arch, instruction)
    return _lookup.__wrapped__(arch, instruction)


@functools.lru_cache(maxsize=256)
def _lookup(arch, instruction) -> Instruction:
    if not isinstance(arch, str) or arch.strip().lower() not in ARCHS:
        raise ValueError(f"mma: arch={arch!r} is unknown; accepted: {', '.join(ARCHS)}")
    arch = arch.strip().lower()
    if not isinstance(instruction, str):
        raise TypeError(f"mma: instruction={instruction!r} must be a PTX opcode string such "
                         f"as 'mma.m16n8k16.f32.bf16.bf16.f32'")
    parts = [p for p in instruction.strip().lower().split(".") if p not in _DROP]
    op, rest = (parts[0], parts[1:]) if parts else ("", [])
    at = 1 if op == "tcgen05" else 0            # tcgen05.mma.<shape>
    shape = rest[at] if len(rest) > at else ""
    match = _SHAPE.fullmatch(shape)
    key = ".".join(rest)
    tcgen05 = _is_tcgen05(op, rest, match)
    if tcgen05 and arch == "blackwell":
        d, a, b = rest[-3:] if len(rest) == 6 else rest[4:7]
        c = d
    elif op == "mma" and match and len(rest) == 5 and key in MMA_SHAPES[arch]:
        d, a, b, c = rest[1:]
    elif (op == "wgmma" and match and len(rest) == 4 and arch == "hopper"
          and match.group(1) == "64" and int(match.group(2)) in WGMMA_N
          and f"k{match.group(3)}." + ".".join(rest[1:]) in _WGMMA_TYPES):
        d, a, b = rest[1:]
        c = d
    else:
        where = [g for g in ARCHS
                 if (op == "mma" and key in MMA_SHAPES[g])
                 or (tcgen05 and g == "blackwell")
                 or (op == "wgmma" and g == "hopper" and match and match.group(1) == "64"
                     and int(match.group(2)) in WGMMA_N
                     and f"k{match.group(3)}." + ".".join(rest[1:]) in _WGMMA_TYPES)]
        lacks = (f"{arch} lacks it (it runs on {', '.join(where)})" if where else
                 "it is unknown or not modelled")
        raise ValueError(f"mma: instruction={instruction!r}: {lacks}; accepted on {arch}: "
                         f"{_accepted(arch)}")
    m, n, k = (int(g) for g in match.groups())
    volta_numbers = arch == "turing" and key in _SM70
    numbers = "volta" if volta_numbers else arch
    F = _F[numbers]
    L = min(k, _NODE_BYTES[numbers] // _BYTES[a])
    e_zero = _E_ZERO16[numbers] if d == "f16" else _E_ZERO32[numbers]
    rho = RNE_FP16 if d == "f16" else RZ_FP32
    if a in _FP8 and not tcgen05:      # Blackwell's tcgen05 keeps F = 25 for FP8
        F = 13
        if d == "f32":
            rho = RZ_E8M13
    block, scale_type, group = (int(rest[3].removeprefix("block")), rest[7], 0) \
        if tcgen05 and len(rest) == 8 else (0, "", 0)
    if block and k == 64:
        F, L, e_zero, group = _GROUP_F, k, _GROUP_E_ZERO, _GROUP
    return Instruction(arch, f"{op}.{key}", m, n, k, d, a, b, c, F, L, e_zero, rho, block,
                       scale_type, group)


#: mmasim's names of the generations (its ``MMA`` and ``WGMMA`` take these)
MMASIM_ARCH = {"volta": "Volta", "turing": "Turing", "ampere": "Ampere", "ada": "Ada Lovelace",
               "hopper": "Hopper", "blackwell": "Blackwell"}


def mmasim_simulator(arch: str, instruction: str):
    """mmasim's model of (generation, instruction) (``pip install mmasim``), called with
    A, B, C as :func:`random_codes` draws them: the oracle of the tests and of
    ``benchmarks/bench_mma.py``."""
    from mmasim import nv_ptx
    op, rest = instruction.split(".", 1)
    if op == "tcgen05" and "block" in rest:
        sim = nv_ptx.TCGen05MMABlockScale(MMASIM_ARCH[arch], rest.removeprefix("mma."))
        if sim.packing == 1:
            return sim
        # the FP4 kinds take two codes per byte along K, the first in the high nibble
        return lambda a, b, c, sa, sb: sim(_packed(a), _packed(b.T).T, c, sa, sb)
    if op == "tcgen05":
        return nv_ptx.TCGen05MMA(MMASIM_ARCH[arch], rest.removeprefix("mma."))
    return (nv_ptx.WGMMA if op == "wgmma" else nv_ptx.MMA)(MMASIM_ARCH[arch], rest)


def random_codes(shape, ptx_type: str, rng, zeros: float = 0.0):
    """Uniform random codes of a PTX input type as a torch tensor of its dtype (tf32: float32
    with the 13 low bits zero), so NaN, inf, subnormals and zeros come as often as codes
    hold them: the inputs with which the tests and ``benchmarks/bench_mma.py`` check
    :func:`lpsim.ops.mma` against mmasim.  ``zeros``: the share of entries set to +-0."""
    import torch
    if ptx_type in _F6F4_BITS:          # mmasim's layout: a uint8 per value
        codes = rng.integers(0, 2 ** sum(_F6F4_BITS[ptx_type]), size=shape, dtype=np.uint8)
        if zeros:
            sign = np.uint8(1 << (sum(_F6F4_BITS[ptx_type]) - 1))
            codes = np.where(rng.random(shape) < zeros, codes & sign, codes)
        shift = 6 - sum(_F6F4_BITS[ptx_type])        # FP6 in bits 5:0, FP4 in bits 5:2
        return torch.from_numpy((codes << shift).astype(np.uint8))
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
             "e5m2": torch.float8_e5m2, "f32": torch.float32, "tf32": torch.float32}[ptx_type]
    nbytes = dtype.itemsize
    codes = rng.integers(0, 2 ** (8 * nbytes), size=shape, dtype=np.uint64)
    if ptx_type == "tf32":
        codes &= np.uint64(0xFFFFE000)
    if zeros:
        sign = np.uint64(1 << (8 * nbytes - 1))
        codes = np.where(rng.random(shape) < zeros, codes & sign, codes)
    signed = codes.astype(np.int64) - (codes >= 2 ** (8 * nbytes - 1)) * 2 ** (8 * nbytes)
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32}[nbytes]
    return torch.from_numpy(signed).to(ints).view(dtype)



# sign, exponent and fraction bits of the FP6 and FP4 types (no inf, no NaN)
_F6F4_BITS = {"e3m2": (1, 3, 2), "e2m3": (1, 2, 3), "e2m1": (1, 2, 1)}


def code_values(codes, ptx_type: str):
    """float32 values of :func:`random_codes`' uint8 FP6/FP4 codes (anything else is returned
    as it is): what :func:`lpsim.ops.mma` takes for those types."""
    if ptx_type not in _F6F4_BITS:
        return codes
    import torch
    _, E, M = _F6F4_BITS[ptx_type]
    x = codes.numpy().astype(np.int64) >> (5 - E - M)
    e = (x >> M) & (2 ** E - 1)
    frac = x & (2 ** M - 1)
    mag = (frac + (e > 0) * 2 ** M) * np.exp2(np.maximum(e, 1) - (2 ** (E - 1) - 1) - M)
    return torch.from_numpy(np.where(x >> (E + M) & 1, -mag, mag).astype(np.float32))


def _packed(codes):
    """:func:`random_codes`' FP4 codes (m x k, bits 5:2) packed two per byte along k."""
    import torch
    nibbles = (codes.numpy() >> 2) & 0xF
    return torch.from_numpy((nibbles[:, 0::2] << 4 | nibbles[:, 1::2]).astype(np.uint8))


def random_scales(shape, rng, scale_type: str = "ue8m0"):
    """Random block scales, mostly moderate and a tenth of any code (NaN included): the scales
    with which the tests check the block-scaled instructions against mmasim.  ``"ue8m0"``: a
    torch float8_e8m0fnu tensor, mostly 2**-8 .. 2**8; ``"ue4m3"``: a float8_e4m3fn tensor
    without sign bits (codes 0 .. 0x7F, 0x7F NaN), mostly 2**-3 .. 2**4."""
    import torch
    e4m3 = scale_type == "ue4m3"
    codes = rng.integers(32, 96, size=shape).astype(np.uint8) if e4m3 else \
        rng.integers(119, 136, size=shape).astype(np.uint8)
    anywhere = rng.random(shape) < 0.1         # and a tenth anywhere: extremes and NaN
    codes[anywhere] = rng.integers(0, 128 if e4m3 else 256, size=int(anywhere.sum()),
                                   dtype=np.uint8)
    return torch.from_numpy(codes).view(torch.float8_e4m3fn if e4m3 else
                                        torch.float8_e8m0fnu)
