"""A 32-bit word for compiled rounding loops: integer arithmetic that stays 32 bits wide.

numba widens every operation on int32/uint32 operands to 64 bits (its integer typing
rule), so a loop over float32 bit patterns runs in 64-bit vector lanes: half the lanes
AVX2 has for 32-bit data, and no unsigned 64-bit compares or min/max to do the rest.
:func:`word` turns a 32-bit integer into a ``word32``, whose ``+ - & | ^ ~ << >>`` and
compares compile to 32-bit instructions; the shared decision
(:func:`lpsim.rounding.round_fast`) is written once and runs on either kind of operand, so
the CPU kernels pass words for float32 containers and everything else (float64 containers,
lpsim_cuda, the CUDA simulator) keeps passing int64.

Semantics: unsigned 32-bit, wrapping; ``>>`` is the logical shift and compares are
unsigned; a shift by 32 or more is undefined (LLVM poison), so the decision shifts words
by less than the container width only.  A word meets an int or bool by taking its low
32 bits; :func:`widen` and array stores take a word back to an integer.  Outside compiled
code (plain Python) :func:`word` and :func:`widen` give int64, the arithmetic the rest of
lpsim uses.
"""

from __future__ import annotations

import operator

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.core.typeconv import Conversion
from numba.extending import box, intrinsic, lower_cast, models, overload, register_model

_I32 = ir.IntType(32)


class Word32(types.Type):
    """numba's type of a 32-bit word (an LLVM i32 with unsigned wrapping arithmetic)."""

    def __init__(self):
        super().__init__(name="word32")

    def can_convert_from(self, typingctx, other):
        if isinstance(other, (types.Integer, types.Boolean)):
            return Conversion.unsafe
        return None

    def unify(self, typingctx, other):
        # a variable set to an int on one path and a word on another is a word
        if isinstance(other, (types.Integer, types.Boolean)):
            return self
        return None


word32 = Word32()


@register_model(Word32)
class _Word32Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _I32)


@box(Word32)
def _box_word(typ, value, c):
    # a word leaving compiled code is the Python int of its 32 bits
    return c.pyapi.long_from_ulonglong(c.builder.zext(value, ir.IntType(64)))


@lower_cast(Word32, types.Integer)
def _word_to_int(context, builder, fromty, toty, value):
    if toty.bitwidth > 32:
        return builder.zext(value, ir.IntType(toty.bitwidth))
    if toty.bitwidth < 32:
        return builder.trunc(value, ir.IntType(toty.bitwidth))
    return value


@lower_cast(types.Integer, Word32)
def _int_to_word(context, builder, fromty, toty, value):
    if fromty.bitwidth > 32:
        return builder.trunc(value, _I32)
    if fromty.bitwidth < 32:
        extend = builder.sext if fromty.signed else builder.zext
        return extend(value, _I32)
    return value


@lower_cast(types.Boolean, Word32)
def _bool_to_word(context, builder, fromty, toty, value):
    return builder.zext(value, _I32)


def _operand(t):
    return isinstance(t, (Word32, types.Integer, types.Boolean))


def _either_word(a, b):
    return (isinstance(a, Word32) or isinstance(b, Word32)) and _operand(a) and _operand(b)


def _intrinsic(result, emit):
    """An intrinsic of two operands taken to words: ``emit(builder, x, y)`` of type ``result``
    (word32 for arithmetic, boolean for compares)."""
    @intrinsic
    def op(typingctx, a, b):
        def codegen(context, builder, signature, args):
            x, y = (context.cast(builder, v, t, word32) for v, t in zip(args, signature.args))
            return emit(builder, x, y)
        return (word32 if result is None else result)(a, b), codegen
    return op


def _register(operators, impl):
    for python_op in operators:
        @overload(python_op)
        def _word_op(a, b):
            if _either_word(a, b):
                return lambda a, b: impl(a, b)
            return None


_ARITHMETIC = {}
for _ops, _instruction in (((operator.add, operator.iadd), "add"),
                           ((operator.sub, operator.isub), "sub"),
                           ((operator.and_, operator.iand), "and_"),
                           ((operator.or_, operator.ior), "or_"),
                           ((operator.xor, operator.ixor), "xor"),
                           ((operator.lshift, operator.ilshift), "shl"),
                           ((operator.rshift, operator.irshift), "lshr")):
    _ARITHMETIC[_instruction] = _intrinsic(
        None, lambda builder, x, y, name=_instruction: getattr(builder, name)(x, y))
    _register(_ops, _ARITHMETIC[_instruction])

for _op, _predicate in ((operator.lt, "<"), (operator.le, "<="), (operator.gt, ">"),
                        (operator.ge, ">="), (operator.eq, "=="), (operator.ne, "!=")):
    _register((_op,), _intrinsic(
        types.boolean, lambda builder, x, y, pred=_predicate: builder.icmp_unsigned(pred, x, y)))

_sub, _xor = _ARITHMETIC["sub"], _ARITHMETIC["xor"]


def _select(predicate):
    """min (``<``) or max (``>``) of two operands taken to words: a compare and a select."""
    return _intrinsic(None, lambda builder, x, y: builder.select(
        builder.icmp_unsigned(predicate, x, y), x, y))


for _builtin, _predicate in ((min, "<"), (max, ">")):
    _register((_builtin,), _select(_predicate))


@overload(operator.neg)
def _word_neg(a):
    if isinstance(a, Word32):
        return lambda a: _sub(0, a)
    return None


@overload(operator.invert)
def _word_invert(a):
    if isinstance(a, Word32):
        return lambda a: _xor(a, -1)
    return None


@intrinsic
def _to_word(typingctx, x):
    def codegen(context, builder, signature, args):
        return context.cast(builder, args[0], signature.args[0], word32)
    return word32(x), codegen


def word(x):
    """x as a word32 when x is a 32-bit integer (in compiled code), else x itself."""
    return np.int64(x)


@overload(word)
def _word(x):
    if isinstance(x, types.Integer) and x.bitwidth == 32:
        return lambda x: _to_word(x)
    if isinstance(x, (Word32, types.Integer)):
        return lambda x: x
    return None


@intrinsic
def _float32_bits(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _I32)
    return word32(x), codegen


def float32_bits(x):
    """The bit pattern of the float32 ``x`` as a word (compiled code; Python: an int64)."""
    return np.int64(np.float32(x).view(np.uint32))


@overload(float32_bits)
def _float32_bits_overload(x):
    if x == types.float32:
        return lambda x: _float32_bits(x)
    return None


@intrinsic
def _bits_float32(typingctx, w):
    if not isinstance(w, Word32):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(w), codegen


def bits_float32(w):
    """The float32 whose bit pattern is the low 32 bits of ``w`` (a word or an integer)."""
    return np.uint32(np.int64(w) & 0xFFFFFFFF).view(np.float32)


@overload(bits_float32)
def _bits_float32_overload(w):
    if isinstance(w, Word32):
        return lambda w: _bits_float32(w)
    if isinstance(w, types.Integer):
        return lambda w: _bits_float32(_to_word(w))
    return None


def like(x, v):
    """The integer ``v`` (a bool, say) as a word when ``x`` is one, else as an int64: flags
    and counts in the width of the operand, so that a loop over words stays 32-bit."""
    return np.int64(v)


@overload(like)
def _like(x, v):
    if isinstance(x, Word32):
        return lambda x, v: _to_word(v)
    return lambda x, v: np.int64(v)


def operand_bits(x):
    """The width of the operand ``x`` in compiled code: 32 for a word32, else 64 (an int64,
    the decision's other operand); a constant, so shifts capped by it fold."""
    return 64


@overload(operand_bits)
def _operand_bits(x):
    width = 32 if isinstance(x, Word32) else 64
    return lambda x: width


def widen(x):
    """x unchanged when it is a word32, else x as an int64: the decision's operand."""
    return np.int64(x)


@overload(widen)
def _widen(x):
    if isinstance(x, Word32):
        return lambda x: x
    if isinstance(x, (types.Integer, types.Boolean)):
        return lambda x: np.int64(x)
    return None


def _extension(how: str):
    """An intrinsic taking a word to an int64 by LLVM's ``zext`` or ``sext``."""
    @intrinsic
    def extend(typingctx, x):
        def codegen(context, builder, signature, args):
            return getattr(builder, how)(args[0], ir.IntType(64))
        return types.int64(x), codegen
    return extend


_word_as_int64, _word_as_signed = _extension("zext"), _extension("sext")


def as_int64(x):
    """x as an int64 (a word32's 32 bits zero-extended): what stores into integer arrays."""
    return np.int64(x)


@overload(as_int64)
def _as_int64(x):
    if isinstance(x, Word32):
        return lambda x: _word_as_int64(x)
    if isinstance(x, (types.Integer, types.Boolean)):
        return lambda x: np.int64(x)
    return None


def _signed(x):
    v = np.int64(x) & 0xFFFFFFFF
    return v - ((v >> 31) << 32)


def as_signed64(x):
    """The low 32 bits of x as a signed int64 (bit 31 extended): float32 container bits the
    way round_bits and the packers take them."""
    return _signed(x)


@overload(as_signed64)
def _as_signed64(x):
    # a word: one sign extension; an integer (or plain Python): the arithmetic above
    return (lambda x: _word_as_signed(x)) if isinstance(x, Word32) else \
        (_signed if isinstance(x, (types.Integer, types.Boolean)) else None)
