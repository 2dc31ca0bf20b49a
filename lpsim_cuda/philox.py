"""Philox4x32-10 in 32-bit integers for the CUDA kernels: the same words, fewer instructions.

``lpsim.philox.philox4x32`` is written in 64-bit integers masked to 32 bits, which NVVM
keeps 64-bit; this module registers a CUDA-target overload of it whose body is
:func:`lpsim.philox.philox4x32_ir` with NVVM's ``mulhi``, the same rounds in i32, so every
kernel that draws (quantize, the optimizer, block formats) gets the short form without a
change at its call; :func:`lpsim.philox.philox4x32_keyed`, whose round keys are given, has
one too.
The CPU keeps the Python source (its loops vectorise it); the simulator runs it too.
"""

from __future__ import annotations

from .launch import SIMULATOR

if not SIMULATOR:                                       # pragma: no cover (NVVM only)
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic, overload

    from lpsim.philox import philox4x32, philox4x32_ir, philox4x32_keyed

    def _mulhi(builder, a, b):
        """The high word of a 32 x 32-bit product (``mul.hi.u32``; NVVM would widen an i64
        product of two zero-extended words back to ``mul.lo.s64``)."""
        i32 = ir.IntType(32)
        found = builder.module.globals.get("llvm.nvvm.mulhi.ui")
        if found is None:
            found = ir.Function(builder.module, ir.FunctionType(i32, [i32, i32]),
                                "llvm.nvvm.mulhi.ui")
        return builder.call(found, [a, b])

    @intrinsic
    def _philox_i32(typingctx, c0, c1, c2, c3, k0, k1):
        args = (c0, c1, c2, c3, k0, k1)
        if not all(isinstance(a, types.Integer) for a in args):
            return None

        def codegen(context, builder, signature, values):
            wide = [context.cast(builder, v, t, types.int64)
                    for v, t in zip(values, signature.args)]
            words = philox4x32_ir(builder, wide[:4], wide[4:], _mulhi)
            return context.make_tuple(builder, signature.return_type, words)
        return types.UniTuple(types.int64, 4)(*args), codegen

    @overload(philox4x32, target="cuda")
    def _philox4x32_cuda(c0, c1, c2, c3, k0, k1):
        def impl(c0, c1, c2, c3, k0, k1):
            return _philox_i32(c0, c1, c2, c3, k0, k1)
        return impl

    @intrinsic
    def _philox_keyed_i32(typingctx, c0, c1, c2, c3, ks):
        if not (all(isinstance(a, types.Integer) for a in (c0, c1, c2, c3))
                and isinstance(ks, types.UniTuple) and ks.count == 20
                and isinstance(ks.dtype, types.Integer)):
            return None

        def codegen(context, builder, signature, values):
            wide = [context.cast(builder, v, t, types.int64)
                    for v, t in zip(values[:4], signature.args[:4])]
            kt = signature.args[4].dtype
            keys = [context.cast(builder, builder.extract_value(values[4], i), kt, types.int64)
                    for i in range(20)]
            words = philox4x32_ir(builder, wide, None, _mulhi, keys)
            return context.make_tuple(builder, signature.return_type, words)
        return types.UniTuple(types.int64, 4)(c0, c1, c2, c3, ks), codegen

    @overload(philox4x32_keyed, target="cuda")
    def _philox4x32_keyed_cuda(c0, c1, c2, c3, ks):
        def impl(c0, c1, c2, c3, ks):
            return _philox_keyed_i32(c0, c1, c2, c3, ks)
        return impl
