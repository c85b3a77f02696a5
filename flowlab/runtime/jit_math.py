"""Helpers that ``jit`` kernels call, which LLVM inlines into them (imported through ``jit``, which imports numba only
when a kernel first needs one)."""
import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

_FAST = {"contract", "arcp"}
_f, _i = np.float32, np.int32
_LOG2E, _LN2_HI, _LN2_LO = _f(1.4426950408889634), _f(0.693359375), _f(-2.12194440e-4)
_ROUND = _f(12582912.0)                # 1.5 * 2^23: adding and subtracting it rounds a float32 to an integer
_EXP_MAX, _EXP_MIN = _f(88.72284), _f(-103.97208)       # exp overflows above, and is below half of 2^-149 below


@intrinsic
def float32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 ``bits`` (a register move; LLVM vectorises it)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))
    return types.float32(types.int32), codegen


@numba.njit(fastmath=_FAST, error_model="numpy")
def exp32(x):
    """``exp`` of a float32 within 1 ulp, in operations LLVM vectorises: ``x = n ln2 + r`` (Cody and Waite's two-part
    ln 2), a degree-6 polynomial for ``exp(r)`` (Cephes' ``expf`` coefficients), and ``2^n`` built from bits in two
    halves, so that subnormal results come out too (one ``2^n`` stops at 2^-126). inf above 88.72, 0 below -103.97,
    NaN stays NaN."""
    c = min(max(x, _EXP_MIN), _EXP_MAX)
    n = (c * _LOG2E + _ROUND) - _ROUND
    r = c - n * _LN2_HI - n * _LN2_LO
    p = _f(1.9875691500e-4)
    p = p * r + _f(1.3981999507e-3)
    p = p * r + _f(8.3334519073e-3)
    p = p * r + _f(4.1665795894e-2)
    p = p * r + _f(1.6666665459e-1)
    p = p * r + _f(5.0000001201e-1)
    p = p * r * r + r + _f(1)
    k = _i(n)
    half = k >> _i(1)
    y = p * float32_from_bits((half + _i(127)) << _i(23)) * float32_from_bits((k - half + _i(127)) << _i(23))
    if x > _EXP_MAX:
        y = _f(np.inf)
    if x < _EXP_MIN:
        y = _f(0)
    if x != x:
        y = x
    return y
