"""Sixteen-byte loads and stores of four consecutive 32-bit words, for the specialised kernels.

Why: numba indexes an array one element at a time, so a kernel over float32 issues 4-byte
loads (``LDG.E``); a device copy reaches the memory's bandwidth with 16-byte ones
(``LDG.E.128``), and a thread that owns four consecutive elements has four independent
decisions in flight.  ``load4(a, j)`` reads elements 4j .. 4j+3 of a 1-D int32, float32 or
int16 array as one 16- or 8-byte load (``ld.global.v4``) and ``store4(a, j, w0, w1, w2, w3)``
writes elements 4j .. 4j+3 of a 1-D int32, float32, int16 or int8 array (values cast to its
type, as an array store casts them) as one 16-, 8- or 4-byte store (packed storage: float32 in,
bfloat16 or float8 codes out); both assume the data is aligned to the access's width, which
the caller checks (:func:`lpsim_cuda.specialised.eligible`).  Under the CUDA simulator they
are plain Python over the four elements (same values, no alignment rule to break).

``load4_halves(a, j)`` and ``store4_halves(a, j, b0, b1, b2, b3)`` read and write a bfloat16
array (int16 codes) as float32 bit patterns, a code in the high half of each: made two at a
time from the 8-byte load's words (a shift and a mask) and stored from the high halves of
two words at a time (one ``prmt``), where a code numba loads is sign-extended, shifted and
later shifted back one at a time (the optimizer's bfloat16 weights, gradients and moments).

All of them also take a pointer made by ``pointer(address, proto)``: the int64 device
``address`` seen as elements of ``proto``'s type (indexed as an array: ``p[i]``), which is how
one launch reaches many tensors through a table of their addresses
(:class:`lpsim_cuda.optim.Table`).  The simulator has no addresses: :func:`address_of`
records each array whose address it hands out, and ``pointer`` gives that array back.
"""

from __future__ import annotations

import weakref

import numpy as np

from .launch import SIMULATOR, address

#: the simulator's arrays by the address address_of gave out (pointer's lookup), held only
#: while their owners hold them
_SIMULATED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def address_of(array) -> int:
    """The device address of a numba device array's data, for a table that ``pointer``
    reads (under the simulator, the array is recorded so that ``pointer`` finds it)."""
    found = address(array)
    if SIMULATOR:
        _SIMULATED[found] = array
    return found


if SIMULATOR:
    def pointer(where, proto):
        return _SIMULATED[int(where)]

    def load4(a, j):
        i = 4 * j
        return a[i], a[i + 1], a[i + 2], a[i + 3]

    def store4(a, j, w0, w1, w2, w3):
        i = 4 * j
        a[i], a[i + 1], a[i + 2], a[i + 3] = w0, w1, w2, w3

    def load4_halves(a, j):
        i = 4 * j
        return tuple(int(a[i + k]) << 16 for k in range(4))

    def store4_halves(a, j, b0, b1, b2, b3):
        i = 4 * j
        for k, b in enumerate((b0, b1, b2, b3)):
            a[i + k] = np.int16(((int(b) >> 16) + 0x8000) % 0x10000 - 0x8000)

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    _I32 = ir.IntType(32)
    #: element types store4 writes (load4 reads the 4-byte ones), with their LLVM types
    _STORED = {types.int32: ir.IntType(32), types.int16: ir.IntType(16),
               types.int8: ir.IntType(8), types.float32: ir.FloatType()}

    def _address(context, builder, aryty, ary, index, indexty, vector):
        """A pointer of type ``vector*`` to element 4 * index of the array (or pointer)
        ``ary``."""
        if isinstance(aryty, types.CPointer):
            data = ary
        else:
            data = context.make_array(aryty)(context, builder, ary).data
        j = context.cast(builder, index, indexty, types.intp)
        first = builder.mul(j, ir.Constant(ir.IntType(64), 4))
        return builder.bitcast(builder.gep(data, [first]), vector.as_pointer())

    def _flat(a, element_types) -> bool:
        """A 1-D array, or a pointer, of one of ``element_types``."""
        return (isinstance(a, types.CPointer) or (isinstance(a, types.Array) and a.ndim == 1)) \
            and a.dtype in element_types

    @intrinsic
    def pointer(typingctx, address, proto):
        """``address`` (an integer) as a pointer to elements of the array ``proto``'s type."""
        if not (isinstance(address, types.Integer) and isinstance(proto, types.Array)):
            return None
        ptr = types.CPointer(proto.dtype)

        def codegen(context, builder, signature, args):
            # made in the global address space and cast to a generic pointer (numba's), so
            # that NVVM sees where it points and loads and stores through it are global ones
            # (LDG, STG) rather than generic ones, which must find their space at run time
            value = context.cast(builder, args[0], signature.args[0], types.int64)
            element = context.get_value_type(proto.dtype)
            held = builder.inttoptr(value, element.as_pointer(addrspace=1))
            return builder.addrspacecast(held, element.as_pointer())
        return ptr(address, proto), codegen

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

    @intrinsic
    def load4_halves(typingctx, a, j):
        if not (_flat(a, (types.int16,)) and isinstance(j, types.Integer)):
            return None
        pair = ir.VectorType(_I32, 2)

        def codegen(context, builder, signature, args):
            vector = builder.load(_address(context, builder, signature.args[0], args[0],
                                           args[1], signature.args[1], pair), align=8)
            high = ir.Constant(_I32, 0xFFFF0000)
            out = []
            for k in range(2):
                word = builder.extract_element(vector, ir.Constant(_I32, k))
                out += [builder.shl(word, ir.Constant(_I32, 16)), builder.and_(word, high)]
            return context.make_tuple(builder, signature.return_type, out)
        return types.UniTuple(types.int32, 4)(a, j), codegen

    @intrinsic
    def store4_halves(typingctx, a, j, b0, b1, b2, b3):
        if not (_flat(a, (types.int16,)) and isinstance(j, types.Integer)):
            return None
        pair = ir.VectorType(_I32, 2)

        def codegen(context, builder, signature, args):
            words = [context.cast(builder, v, t, types.int32)
                     for v, t in zip(args[2:], signature.args[2:])]
            vector = ir.Constant(pair, ir.Undefined)
            for k in range(2):
                # the high halves of two words in one (bytes 2, 3 of each)
                both = builder.asm(ir.FunctionType(_I32, [_I32, _I32]),
                                   "prmt.b32 $0, $1, $2, 0x7632;", "=r,r,r",
                                   words[2 * k:2 * k + 2], side_effect=False)
                vector = builder.insert_element(vector, both, ir.Constant(_I32, k))
            builder.store(vector, _address(context, builder, signature.args[0], args[0],
                                           args[1], signature.args[1], pair), align=8)
            return context.get_dummy_value()
        return types.void(a, j, b0, b1, b2, b3), codegen
