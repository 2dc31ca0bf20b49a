"""Sixteen-byte loads and stores of four consecutive 32-bit words, for the specialised kernels.

Why: numba indexes an array one element at a time, so a kernel over float32 issues 4-byte
loads (``LDG.E``); a device copy reaches the memory's bandwidth with 16-byte ones
(``LDG.E.128``), and a thread that owns four consecutive elements has four independent
decisions in flight.  ``load4(a, j)`` reads elements 4j .. 4j+3 of a 1-D int32, float32 or
int16 array as one 16- or 8-byte load (``ld.global.v4``) and ``store4(a, j, w0, w1, w2, w3)``
writes elements 4j .. 4j+3 of a 1-D int32, float32, int16 or int8 array (values cast to its
type, as an array store casts them) as one 16-, 8- or 4-byte store (packed storage: float32 in,
bfloat16 or float8 codes out); both assume the data is aligned to the access's width, which
the caller checks (:func:`lpsim_cuda.specialised.eligible`).  Under the CUDA simulator they are plain
Python over the four elements (same values, no alignment rule to break).
"""

from __future__ import annotations

from .launch import SIMULATOR

if SIMULATOR:
    def load4(a, j):
        i = 4 * j
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    def store4(a, j, w0, w1, w2, w3):
        i = 4 * j
        a[i], a[i + 1], a[i + 2], a[i + 3] = w0, w1, w2, w3

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    _I32 = ir.IntType(32)
    #: element types store4 writes (load4 reads the 4-byte ones), with their LLVM types
    _STORED = {types.int32: ir.IntType(32), types.int16: ir.IntType(16),
               types.int8: ir.IntType(8), types.float32: ir.FloatType()}

    def _address(context, builder, aryty, ary, index, indexty, vector):
        """A pointer of type ``vector*`` to element 4 * index of the array ``ary``."""
        data = context.make_array(aryty)(context, builder, ary).data
        j = context.cast(builder, index, indexty, types.intp)
        first = builder.mul(j, ir.Constant(ir.IntType(64), 4))
        return builder.bitcast(builder.gep(data, [first]), vector.as_pointer())

    def _flat(a, element_types) -> bool:
        return isinstance(a, types.Array) and a.dtype in element_types and a.ndim == 1

    @intrinsic
    def load4(typingctx, a, j):
        if not (_flat(a, (types.int32, types.float32, types.int16))
                and isinstance(j, types.Integer)):
            return None
        vty = ir.VectorType(_STORED[a.dtype], 4)
        align = 4 * a.dtype.bitwidth // 8

        def codegen(context, builder, signature, args):
            vector = builder.load(_address(context, builder, signature.args[0], args[0],
                                           args[1], signature.args[1], vty), align=align)
            words = [builder.extract_element(vector, ir.Constant(_I32, k)) for k in range(4)]
            return context.make_tuple(builder, signature.return_type, words)
        return types.UniTuple(a.dtype, 4)(a, j), codegen

    @intrinsic
    def store4(typingctx, a, j, w0, w1, w2, w3):
        if not (_flat(a, tuple(_STORED)) and isinstance(j, types.Integer)):
            return None
        element = a.dtype
        vty = ir.VectorType(_STORED[element], 4)
        align = 4 * element.bitwidth // 8

        def codegen(context, builder, signature, args):
            vector = ir.Constant(vty, ir.Undefined)
            for k in range(4):
                word = context.cast(builder, args[2 + k], signature.args[2 + k], element)
                vector = builder.insert_element(vector, word, ir.Constant(_I32, k))
            builder.store(vector, _address(context, builder, signature.args[0], args[0],
                                           args[1], signature.args[1], vty), align=align)
            return context.get_dummy_value()
        return types.void(a, j, w0, w1, w2, w3), codegen
