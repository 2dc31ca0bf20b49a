"""Single PTX instructions that numba-cuda does not expose, for the GPU build of shared steps
and kernels.

Why: a rounding that lpsim writes in integer operations (``lpsim.rounding.round_fast``:
magnitude, bias, mask, sign, range check, ~9 integer instructions) is one conversion
instruction where the hardware has it.  On an H100 or H200 integer instructions issue at half
the rate of float32 ones (64 lanes a clock an SM against 128), and the optimizer's step was
bound by them (``benchmarks/kernel_budget.py``'s ``alu/e``), so each one counts.

``bf16_nearest2(a, b)``: float32 ``a`` and ``b`` rounded to bfloat16 to nearest, ties to
even, as float32s, by one ``cvt.rn.bf16x2.f32`` (IEEE for every non-NaN input, subnormals
included; ``F2FP.BF16.F32.PACK_AB`` on sm_90, where the one-value ``cvt.rn.bf16.f32`` is an
``F2F`` of the quarter-rate conversion unit).  Only the NVVM build defines it: the
simulator runs the shared source's integer rounding, and the tests compare the two on a GPU
(tests/test_optim_cuda.py).

``rcp_approx(x)`` and ``rsqrt_approx(x)``: ``rcp.approx.ftz.f32`` and
``rsqrt.approx.ftz.f32`` (MUFU.RCP, MUFU.RSQ), for operands the caller keeps normal: the
optimizer's quotient, which it then proves correctly rounded
(:func:`lpsim.optim.step.verified_quotient`), and its square root, by the fast path of the
compiler's own ``sqrt.rn`` (``lpsim_cuda.optim``).

``prefetch_l1(a, i, k)``: ``prefetch.global.L1`` of the line holding ``a[i, k]`` (a hint: no
value, no fault), so a later load of that line hits the SM's L1 instead of waiting for L2:
the CA-SGD recurrence asks for the next row of its Gram matrix while it works on this one
(``lpsim_cuda.casgd``).
"""

from __future__ import annotations

from .launch import SIMULATOR

if not SIMULATOR:                                       # pragma: no cover (NVVM only)
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def bf16_nearest2(typingctx, a, b):
        """float32 a and b rounded to bfloat16 (to nearest, ties to even), as float32s."""
        if not (a == types.float32 and b == types.float32):
            return None

        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            # d = (a's code << 16) | b's code
            pair = builder.asm(ir.FunctionType(i32, [f32, f32]), "cvt.rn.bf16x2.f32 $0, $1, $2;",
                               "=r,f,f", list(args), side_effect=False)
            high = builder.and_(pair, ir.Constant(i32, 0xFFFF0000))
            low = builder.shl(pair, ir.Constant(i32, 16))
            values = [builder.bitcast(x, f32) for x in (high, low)]
            return context.make_tuple(builder, signature.return_type, values)
        return types.UniTuple(types.float32, 2)(a, b), codegen

    def _approx(name: str):
        """An intrinsic of one float32 PTX approximation ``name`` (flushing subnormals: the
        callers use it where its operand is a normal)."""
        @intrinsic
        def approx(typingctx, x):
            if x != types.float32:
                return None

            def codegen(context, builder, signature, args):
                f32 = ir.FloatType()
                return builder.asm(ir.FunctionType(f32, [f32]), f"{name} $0, $1;", "=f,f",
                                   list(args), side_effect=False)
            return types.float32(x), codegen
        return approx

    #: 1 / x within an ulp and 1 / sqrt(x) (MUFU.RCP, MUFU.RSQ)
    rcp_approx = _approx("rcp.approx.ftz.f32")
    rsqrt_approx = _approx("rsqrt.approx.ftz.f32")

    @intrinsic
    def prefetch_l1(typingctx, a, i, k):
        """Prefetch the line of element ``a[i, k]`` of a 2-D global array into L1 (the
        caller keeps (i, k) inside ``a``)."""
        if not (isinstance(a, types.Array) and a.ndim == 2 and isinstance(i, types.Integer)
                and isinstance(k, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, value=args[0])
            index = [context.cast(builder, v, t, types.intp)
                     for v, t in zip(args[1:], signature.args[1:])]
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index,
                                           wraparound=False)
            builder.asm(ir.FunctionType(ir.VoidType(), [ptr.type]), "prefetch.global.L1 [$0];",
                        "l", [ptr], side_effect=True)
            return context.get_dummy_value()
        return types.void(a, i, k), codegen
