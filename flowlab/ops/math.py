"""``flow.math``: elementwise arithmetic with broadcasting (and ``flow.broadcast_like``), unary functions, reductions,
``matmul`` and ``top_k``."""
from __future__ import annotations

import math

import numpy as np

from .. import graph as g
from ..errors import ShapeError
from ..runtime import cublas, host_threads, jit
from . import (Op, apply, as_tensor, keeps_partials, normalize_axes, normalize_axis, same_dtype, shape_error, spec,
               ufunc_op)
from .array import reshape as _reshape
from .stats import ones_of


def _float_only(x):
    if x.dtype.kind != "f":
        raise ShapeError(f"expects a floating-point tensor, got {x.logical_blob_name} of dtype {x.dtype}; "
                         "cast it first")


def _broadcast(a, b):
    try:
        return np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ShapeError(f"shapes {a.shape} ({a.logical_blob_name}) and {b.shape} ({b.logical_blob_name}) "
                         "do not broadcast") from None


def _binary_operands(x, y, api):
    if not hasattr(x, "graph") and not hasattr(y, "graph"):
        raise TypeError(f"{api}: at least one operand must be a tensor, got {type(x).__name__} and {type(y).__name__}")
    for value, tensor, argument in ((x, y, "x"), (y, x, "y")):
        # A number meeting an integer tensor becomes a constant of its dtype: refuse when that changes the number.
        if hasattr(tensor, "graph") and not hasattr(value, "graph") and tensor.dtype.kind in "iu":
            array = np.asarray(value)
            if array.dtype.kind in "fiu" and not np.array_equal(array.astype(tensor.dtype), array):
                raise TypeError(f"{api}: {argument}={value!r} is not exactly representable in dtype {tensor.dtype} "
                                f"of {tensor.logical_blob_name}; cast the tensor first (at {g.user_source_line()})")
    x = as_tensor(x, like=y if hasattr(y, "graph") else None, argument="x")
    y = as_tensor(y, like=x, argument="y")
    return x, y


# ----------------------------------------------------------------------------------------------- broadcasting helpers

class SumToShape(Op):
    """Sum a broadcast gradient back to an input's shape (the VJP of broadcasting)."""
    prefix, api = "SumToShape_", "sum_to_shape"
    supports_out = True

    @staticmethod
    def infer(x, shape):
        return spec(shape, x.dtype)

    @staticmethod
    def forward(xp, x, shape, out=None):
        lead = x.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
        kept = (1,) * lead + tuple(shape)   # the keepdims shape: a view of ``out`` receives the sum in place
        if xp is np and axes == tuple(range(len(axes))):
            total = host_leading_sum(x, len(axes), out)
            if total is not None:
                return out if out is not None else total.reshape(shape)
        total = xp.sum(x, axis=axes, keepdims=True, out=None if out is None else out.reshape(kept))
        return total.reshape(shape) if out is None else out

    @staticmethod
    def vjp(node, dy):
        return (broadcast_to(dy, node.inputs[0].shape),)


class BroadcastTo(Op):
    prefix, api = "BroadcastTo_", "broadcast_to"
    is_view = True   # a read-only broadcast view of the input

    @staticmethod
    def infer(x, shape):
        try:
            np.broadcast_shapes(x.shape, shape)
        except ValueError:
            raise ShapeError(f"cannot broadcast {x.shape} to {shape}") from None
        return spec(shape, x.dtype)

    @staticmethod
    def forward(xp, x, shape):
        return xp.broadcast_to(x, shape)

    @staticmethod
    def vjp(node, dy):
        return (sum_to_shape(dy, node.inputs[0].shape),)


def sum_to_shape(x, shape, name=None):
    shape = tuple(shape)
    return x if x.shape == shape else apply(SumToShape, (x,), name, shape=shape)


def broadcast_to(x, shape, name=None):
    shape = tuple(shape)
    return x if x.shape == shape else apply(BroadcastTo, (x,), name, shape=shape)


def broadcast_like(x, like, broadcast_axes=None, name=None):
    """``flow.broadcast_like(x, like, broadcast_axes=None)``: ``x`` repeated along ``broadcast_axes`` (axes of
    ``like``; ``None``: all of them) to ``like``'s shape. ``x`` is ``like``'s shape with those axes either of size 1
    or removed (the result of a reduction with or without ``keepdims``); the gradient sums them back."""
    api = "flow.broadcast_like"
    x, like = as_tensor(x, argument="x"), as_tensor(like, argument="like")
    if broadcast_axes is None:
        broadcast_axes = tuple(range(like.ndim))
    if not isinstance(broadcast_axes, (list, tuple)) or not 0 < len(broadcast_axes) <= like.ndim:
        raise ValueError(f"{api}: broadcast_axes must be a non-empty list of at most {like.ndim} axes of like "
                         f"{like.shape}, got {broadcast_axes!r}")
    try:
        axes = {normalize_axis(a, like.ndim, "broadcast_axes") for a in broadcast_axes}
    except ShapeError as e:
        raise ValueError(f"{api}: {e}") from None
    kept = tuple(1 if i in axes else d for i, d in enumerate(like.shape))
    removed = tuple(d for i, d in enumerate(like.shape) if i not in axes)
    if x.shape not in (kept, removed):
        raise shape_error(api, f"x {x.logical_blob_name} must have shape {kept} or {removed} (like {like.shape} "
                               f"reduced over axes {sorted(axes)}), got {x.shape}")
    return broadcast_to(_reshape(x, kept), like.shape, name=name)


# ------------------------------------------------------------------------------------------------- binary elementwise

class _Binary(Op):
    supports_out = True
    inplace = True

    @staticmethod
    def infer(x, y):
        same_dtype(None, x, y)
        return spec(_broadcast(x, y), x.dtype)


class _FloatBinary(_Binary):
    @staticmethod
    def infer(x, y):
        same_dtype(None, x, y)
        _float_only(x)
        return spec(_broadcast(x, y), x.dtype)


def _sum_or_difference_join(node, kinds, kind):
    """A mean plus (or minus) a constant or another mean is the mean of the per-device results; a sum only with
    sums (every device would add the constant)."""
    return kind if kind == "mean" or all(k == "sum" for k in kinds) else None


def _product_join(node, kinds, kind):
    """A sum or mean times a value the same on every device is the sum or mean of the scaled pieces."""
    return kind if kind in ("sum", "mean") and "broadcast" in kinds else None


def _quotient_join(node, kinds, kind):
    """A sum or mean over a value the same on every device, likewise."""
    return kind if kind in ("sum", "mean") and kinds[1] == "broadcast" else None


Add = ufunc_op(_Binary, "Add", "flow.math.add", "add", "({0} + {1})", partial_join=_sum_or_difference_join, is_sum=True,
               vjp=lambda node, dy: tuple(sum_to_shape(dy, x.shape) for x in node.inputs))
Subtract = ufunc_op(_Binary, "Subtract", "flow.math.subtract", "subtract", "({0} - {1})", prefix="Sub_",
                    partial_join=_sum_or_difference_join,
                    vjp=lambda node, dy: (sum_to_shape(dy, node.inputs[0].shape),
                                          sum_to_shape(negative(dy), node.inputs[1].shape)))
Multiply = ufunc_op(_Binary, "Multiply", "flow.math.multiply", "multiply", "({0} * {1})", prefix="Mul_",
                    partial_join=_product_join,
                    vjp=lambda node, dy: (sum_to_shape(multiply(dy, node.inputs[1]), node.inputs[0].shape),
                                          sum_to_shape(multiply(dy, node.inputs[0]), node.inputs[1].shape)))


def _divide_vjp(node, dy):
    x, y = node.inputs
    return sum_to_shape(divide(dy, y), x.shape), sum_to_shape(negative(divide(multiply(dy, node.output), y)), y.shape)


def _select_vjp(first_wins):
    """Gradient of max (``first_wins`` on ``x >= y``) or min (on ``y >= x``): to the winner, x on ties."""
    def vjp(node, dy):
        x, y = node.inputs
        a, b = (x, y) if first_wins else (y, x)
        return (sum_to_shape(apply(SelectGrad, (a, b, dy), pick_first=True), x.shape),
                sum_to_shape(apply(SelectGrad, (a, b, dy), pick_first=False), y.shape))
    return vjp


# NumPy's true division of integers gives floats, not the declared integer dtype: floating inputs only
Divide = ufunc_op(_FloatBinary, "Divide", "flow.math.divide", "divide", "({0} / {1})", prefix="Div_",
                  partial_join=_quotient_join, vjp=_divide_vjp)
Maximum = ufunc_op(_Binary, "Maximum", "flow.math.maximum", "maximum", "max({0}, {1})", vjp=_select_vjp(True))
Minimum = ufunc_op(_Binary, "Minimum", "flow.math.minimum", "minimum", "min({0}, {1})", vjp=_select_vjp(False))


class SelectGrad(Op):
    """Gradient of max(x, y): to x where x >= y (x wins ties), else to y."""
    prefix, api = "SelectGrad_", "maximum_grad"

    @staticmethod
    def infer(x, y, dy, pick_first):
        return spec(dy.shape, dy.dtype)

    @staticmethod
    def forward(xp, x, y, dy, pick_first):
        mask = (x >= y) if pick_first else (x < y)
        return xp.where(mask, dy, dy.dtype.type(0))


def _binary(op):
    def fn(x, y, name=None):
        x, y = _binary_operands(x, y, op.api)
        return apply(op, (x, y), name)
    fn.__name__ = fn.__qualname__ = op.api.rsplit(".", 1)[-1]     # what reprs and the API reference name
    fn.__doc__ = f"``{op.api}(x, y)``: elementwise, with NumPy broadcasting; either side may be a number."
    return fn


add = _binary(Add)
subtract = _binary(Subtract)
multiply = _binary(Multiply)
divide = _binary(Divide)
maximum = _binary(Maximum)
minimum = _binary(Minimum)


def add_n(inputs, name=None):
    """Sum of a list of tensors of one shape (autodiff uses it to accumulate gradients)."""
    inputs = list(inputs)
    if not inputs:
        raise ValueError("add_n: inputs must hold at least one tensor, got an empty list")
    total = inputs[0]
    for t in inputs[1:]:
        total = add(total, t, name=None)
    return total


# -------------------------------------------------------------------------------------------------- unary elementwise

class _Unary(Op):
    supports_out = True
    inplace = True

    @staticmethod
    def infer(x):
        return spec(x.shape, x.dtype)


class _FloatUnary(_Unary):
    @staticmethod
    def infer(x):
        if x.dtype.kind != "f":
            raise ShapeError(f"expects a floating-point tensor, got {x.logical_blob_name} of dtype {x.dtype}")
        return spec(x.shape, x.dtype)


Negative = ufunc_op(_Unary, "Negative", "flow.math.negative", "negative", "(-{0})",
                    partial_join=keeps_partials("sum", "mean"), vjp=lambda node, dy: (negative(dy),))
Exp = ufunc_op(_FloatUnary, "Exp", "flow.math.exp", "exp", "exp({0})", nonnegative=True,
               vjp=lambda node, dy: (multiply(dy, node.output),))
Log = ufunc_op(_FloatUnary, "Log", "flow.math.log", "log", "log({0})",
               vjp=lambda node, dy: (divide(dy, node.inputs[0]),))
Sqrt = ufunc_op(_FloatUnary, "Sqrt", "flow.math.sqrt", "sqrt", "sqrt({0})", nonnegative=True,
                vjp=lambda node, dy: (divide(multiply(dy, 0.5), node.output),))
Square = ufunc_op(_Unary, "Square", "flow.math.square", "square", "({0} * {0})",
                  vjp=lambda node, dy: (multiply(dy, multiply(node.inputs[0], 2.0)),))
Abs = ufunc_op(_Unary, "Abs", "flow.math.abs", "abs", "abs({0})", nonnegative=True,
               vjp=lambda node, dy: (multiply(dy, apply(Sign, (node.inputs[0],))),))
Sign = ufunc_op(_Unary, "Sign", "flow.math.sign", "sign", "(({0} > 0) - ({0} < 0))")
Tanh = ufunc_op(_FloatUnary, "Tanh", "flow.math.tanh", "tanh", "tanh({0})",
                vjp=lambda node, dy: (apply(TanhGrad, (node.output, dy)),))


class Sigmoid(_FloatUnary):
    prefix, api = "Sigmoid_", "flow.math.sigmoid"
    nonnegative = True
    # exp of the non-positive side only: exp(-x) overflows for x < -709 in float64 (0 instead of a tiny value)
    c_expr = "({0} >= (T)0 ? (T)1 / ((T)1 + exp(-{0})) : exp({0}) / ((T)1 + exp({0})))"

    @staticmethod
    def forward(xp, x, out=None):
        # 1 / (1 + exp(-x)) written to stay finite: exp only ever sees -|x|.
        e = xp.exp(-xp.abs(x))
        pos = 1 / (1 + e)
        return xp.where(x >= 0, pos, e * pos) if out is None else _assign(xp, out, xp.where(x >= 0, pos, e * pos))

    @staticmethod
    def vjp(node, dy):
        return (apply(SigmoidGrad, (node.output, dy)),)


class OutputGrad(Op):
    """Base of the gradient ops ``f(y, dy)`` of elementwise functions, written in terms of their output ``y``."""
    supports_out = True

    @staticmethod
    def infer(y, dy):
        return spec(dy.shape, dy.dtype)


class SigmoidGrad(OutputGrad):
    prefix, api, c_expr = "SigmoidGrad_", "sigmoid_grad", "({1} * {0} * ((T)1 - {0}))"

    @staticmethod
    def forward(xp, y, dy, out=None):
        out = xp.subtract(1, y, out=out)
        xp.multiply(out, y, out=out)
        return xp.multiply(out, dy, out=out)


class TanhGrad(OutputGrad):
    prefix, api, c_expr = "TanhGrad_", "tanh_grad", "({1} * ((T)1 - {0} * {0}))"

    @staticmethod
    def forward(xp, y, dy, out=None):
        out = xp.multiply(y, y, out=out)
        xp.subtract(1, out, out=out)
        return xp.multiply(out, dy, out=out)


_SQRT_HALF = 0.7071067811865476          # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327       # 1 / sqrt(2 pi)
_LOG_INV_SQRT_2PI = -0.9189385332046728  # log(1 / sqrt(2 pi))

# erfc(z) = t exp(-z² + P(t)) with t = 1 / (1 + z/2), for z >= 0: the Chebyshev fit of Numerical Recipes (Press et
# al., 2nd ed., §6.2, "erfcc"), fractional error below 1.2e-7 everywhere. P's coefficients, constant term first.
# SciPy's float32 erfc computes in float64 through a branchy scalar loop (~17 ns an element here); this fit is ~30
# vectorised passes, evaluated in float64 for float32 Φ (``_normal_cdf``): within 2.2 float32 ulps everywhere (SciPy's
# float32 path: 22 ulps near x = -5, its rounded x / √2 squared in the exponent).
_ERFC_FIT = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
             -0.82215223, 0.17087277)
# Elements per block of the blockwise NumPy kernels: a block, its output and its scratch stay in cache through the
# kernel's ~10-25 passes instead of streaming whole tensors through memory. GELU and its gradient take GELU_BLOCKS
# blocks at a time (128k elements, five float32 buffers of 512 KiB): fewer ufunc calls for the same passes, and on
# this machine's 2 MiB L2 / 32 MiB L3 faster than smaller pieces at 131k elements (BERT's intermediate layer: forward
# 450 -> 410 us, gradient 230 -> 180 us against 2 and 1 blocks) and at 1M (4.0 -> 3.5 ms, 2.3 -> 1.8 ms).
_BLOCK = 1 << 14
GELU_BLOCKS = 8

# GELU in float32 arithmetic: Φ(-a) = exp(-a²/2) P(a) / Q(a) for a = |x| >= 0, P / Q a (4, 5) rational fit of
# Φ(-a) exp(a²/2) = erfcx(a / √2) / 2 on [0, 14.5] (minimax in relative error, iteratively reweighted least squares
# against SciPy's erfcx; 6e-9 with these float32 coefficients; P's constant term first, Q's constant 1 implicit; both
# positive, so neither cancels). Beyond 14.5 exp(-a²/2) underflows float32 and the fit is never needed. Checked against
# the exact GELU (SciPy's float64 erfc) at every float32 with 2^-14 <= |x| < 16: within 5.5 ulps for x >= -1 (4.6 for
# x >= 0), 7.8 for x >= -2, 10.1 for x >= -4, 22.2 for x >= -8 and 68.5 down to the result's underflow (float32
# rounding of ~20 operations, the rational's evaluation most of it near 0; in the tail the rounding of a², 2^-24 a²/2
# relative through exp, dominates). The compiled twin (``_gelu_float32_compiled``, fused multiply-adds, one rounding
# fewer a Horner step), checked the same way: 3.7 ulps for x >= 0, 4.0 for x >= -1, 5.4 for x >= -2, 8.5 for x >= -4,
# 21.2 for x >= -8 and 68.0 down to underflow. PyTorch's float32 GELU (erf, then 1 + erf): 2.6 ulps for
# -1 <= x < 0, 5.3 for x >= 1, 38 near -2, 2200 near -3 and no correct digit below -4. The float64-evaluated
# Chebyshev fit this replaced (``_half_erfc_of_abs``) was within 2.2 ulps everywhere at 2.4x the cost.
_GELU_P = tuple(np.float32(c) for c in (0.5, 0.43827614, 0.1832203, 0.04062797, 0.004115462))
_GELU_Q = tuple(np.float32(c) for c in (1.6744373, 1.2024435, 0.46943125, 0.101845674, 0.010315813))
# |x| up to which the float32 GELU's Horner sums and relu(x) = (x + |x|) / 2 cannot overflow; a block holding a larger
# |x|, an infinity or a NaN (rare) takes the clamped path
_GELU_LARGE = np.float32(1e4)


def _half_erfc_of_abs(x, ax, t, e):
    """``e = erfc(|x| / √2) / 2 = Φ(-|x|)`` of a float64 array through the fit above, with ``ax = |x|`` on return
    (at most 1e150: only an infinite x is larger, and ``ax * e`` is then 0 instead of inf * 0) and ``t`` scratch (all
    four the same size). ``-x²/2`` is formed from ``x`` itself, not from a rounded ``x / √2``."""
    np.abs(x, out=ax)
    np.multiply(ax, 0.5 * _SQRT_HALF, out=t)               # z / 2, z = |x| / √2
    t += 1.0
    np.divide(1.0, t, out=t)
    np.multiply(t, _ERFC_FIT[-1], out=e)
    for c in _ERFC_FIT[-2:0:-1]:
        e += c
        e *= t
    e += _ERFC_FIT[0] - 0.6931471805599453                  # the fit's constant, and log(1/2) for the half
    np.multiply(x, x, out=ax)                              # (ax is scratch until the end)
    ax *= -0.5                                             # -z² = -x²/2
    e += ax
    np.exp(e, out=e)
    e *= t
    np.abs(x, out=ax)
    np.minimum(ax, 1e150, out=ax)
    return e


def _blockwise(kernel, x, out, *others, scratch=None, blocks=1):
    """Run ``kernel(x_block, out_block, *other_blocks, *scratch_blocks)`` over pieces of ``blocks * _BLOCK``
    elements of flat C-contiguous views of ``x``, ``out`` and ``others`` (all of ``x``'s size), with scratch buffers
    of one piece per host thread (``scratch``: ``(dtype, count)``, default three of ``x``'s dtype). Inside a host
    plan's call the pieces are shared among the cores (``runtime.host_threads``; NumPy releases the GIL in its
    ufuncs). Returns ``out`` (allocated when None, copied into when it is not contiguous)."""
    block = blocks * _BLOCK
    x = np.ascontiguousarray(x)
    flat = [x.reshape(-1)] + [np.ascontiguousarray(o).reshape(-1) for o in others]
    target = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, x.dtype)
    flat_out = target.reshape(-1)
    size = x.size
    dtype, count = scratch or (x.dtype, 3)

    def run(part):
        buffers = [np.empty(min(size, block), dtype) for _ in range(count)]
        for start in range(part.start * block, min(part.stop * block, size), block):
            piece = slice(start, min(start + block, size))
            n = piece.stop - piece.start                       # the last block may be shorter
            kernel(flat[0][piece], flat_out[piece], *(f[piece] for f in flat[1:]), *(b[:n] for b in buffers))

    host_threads.each(run, -(-size // block), 1, work=size)
    if out is not None and target is not out:
        out[...] = target
        return out
    return target


def _gelu_float32_block(x, out, a, p, q):
    """GELU of a float32 block in float32 arithmetic (``a``, ``p``, ``q`` scratch): ``x Φ(x) = relu(x) - |x| Φ(-|x|)``
    with ``Φ(-a) = exp(-a²/2) P(a) / Q(a)`` (``_GELU_P``, ``_GELU_Q``): a product for x < 0, so the tail keeps its
    relative accuracy where ``1 + erf`` would cancel, and ``x - x Φ(-x)`` for x >= 0 (``Φ(-x) <= 1/2``: no
    cancellation). 22 passes over the block, one of them ``exp``. GELU(inf) = inf, GELU(-inf) = 0 (its limit), NaN
    stays NaN."""
    np.abs(x, out=a)
    large = not a.max() <= _GELU_LARGE                     # also an inf or a NaN (a NaN max compares False)
    if large:
        relu = np.maximum(x, np.float32(0))
        np.minimum(a, _GELU_LARGE, out=a)                  # Φ(-1e4) is 0 already; NaN stays NaN
    np.multiply(a, _GELU_P[-1], out=p)
    for c in _GELU_P[-2:0:-1]:
        p += c
        p *= a
    p += _GELU_P[0]
    np.multiply(a, _GELU_Q[-1], out=q)
    for c in _GELU_Q[-2::-1]:
        q += c
        q *= a
    q += np.float32(1)
    p /= q
    p *= a
    np.multiply(a, a, out=q)
    q *= np.float32(-0.5)
    np.exp(q, out=q)
    p *= q                                                 # |x| Φ(-|x|)
    if large:
        np.subtract(relu, p, out=out)
        return
    np.add(x, a, out=out)                                  # relu(x) = (x + |x|) / 2, exactly
    out *= np.float32(0.5)
    out -= p


_GELU_P0, _GELU_P1, _GELU_P2, _GELU_P3, _GELU_P4 = _GELU_P
_GELU_Q1, _GELU_Q2, _GELU_Q3, _GELU_Q4, _GELU_Q5 = _GELU_Q
_F32_ZERO, _F32_HALF, _F32_ONE = np.float32(0), np.float32(0.5), np.float32(1)


@jit.kernel
def _gelu_float32_compiled(x, out):
    """``_gelu_float32_block``'s arithmetic in one pass over flat float32 arrays (its twin, and the reference its
    tests compare with): ``relu(x) - |x| Φ(-|x|)``, ``Φ(-a) = exp(-a²/2) P(a) / Q(a)``, ``|x|`` clamped at
    ``_GELU_LARGE`` and ``relu`` a maximum for every element (the twin's path for blocks holding a large value,
    which gives the same bits where nothing is clamped). Horner steps fuse into multiply-adds. NaN stays NaN."""
    for i in range(x.size):
        v = x[i]
        a = min(-v if v < _F32_ZERO else v, _GELU_LARGE)   # (|x|: this module's abs is flow.math.abs)
        p = (((_GELU_P4 * a + _GELU_P3) * a + _GELU_P2) * a + _GELU_P1) * a + _GELU_P0
        q = ((((_GELU_Q5 * a + _GELU_Q4) * a + _GELU_Q3) * a + _GELU_Q2) * a + _GELU_Q1) * a + _F32_ONE
        tail = p / q * a * jit.exp32(a * a * -_F32_HALF)         # |x| Φ(-|x|)
        r = (v if v > _F32_ZERO else _F32_ZERO) - tail
        out[i] = r if v == v else v


def _elementwise_compiled(kernel, out_dtype, *arrays, out=None):
    """``kernel(*flat inputs, flat out)`` over C-contiguous copies of ``arrays`` (one shape); from
    ``host_threads.SPLIT_COMPILED`` on in contiguous pieces shared among the host threads (``host_threads.each``; the
    kernels release the GIL: GELU at 131k elements, ~90 us on one thread, took 100-120 us in halves, at 1M 666 ->
    400 us). Returns ``out`` (allocated when None, copied into when it is not contiguous)."""
    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    shape = arrays[0].shape
    target = out if out is not None and out.flags.c_contiguous else np.empty(shape, out_dtype)
    flat_out = target.reshape(-1)
    size = flat_out.size
    if not host_threads.compiled_work(size):
        kernel(*flat, flat_out)
    else:
        host_threads.each(lambda part: kernel(*(f[part] for f in flat), flat_out[part]), size, _BLOCK, work=size)
    if out is not None and target is not out:
        out[...] = target
        return out
    return target


def _normal_cdf(xp, x):
    """``Φ(x) = erfc(-x / √2) / 2`` of a float array, in one new array, through ``erfc`` (never ``1 + erf``, which
    would cancel for negative x: float32 GELU(-5) off by 25%): float32 on NumPy through the fit above in float64
    (``Φ(-|x|)``, then ``1 -`` it for x >= 0), others through SciPy's (CuPy's) ``erfc``, exactly in float64."""
    if xp is np and x.dtype == np.float32:
        wide = x.astype(np.float64)
        ax, t, e = np.empty_like(wide), np.empty_like(wide), np.empty_like(wide)
        _half_erfc_of_abs(wide, ax, t, e)
        np.subtract(1.0, e, out=e, where=wide >= 0)
        return e.astype(np.float32)
    if xp is np:
        from scipy.special import erfc
    else:
        from cupyx.scipy.special import erfc
    z = x * x.dtype.type(-_SQRT_HALF)
    z = erfc(z, out=z) if z.dtype != np.float16 else erfc(z).astype(np.float16)
    z *= x.dtype.type(0.5)
    return z


class Gelu(_FloatUnary):
    """``x * Φ(x) = 0.5 x (1 + erf(x / √2))``, the exact GELU (OneFlow's kernel and PyTorch's default; OneFlow's
    docstring shows the tanh approximation, which its kernel does not compute). float64 goes through SciPy's exact
    ``erfc`` (finite-difference checks rely on it); float32 on NumPy in float32 arithmetic, block by block, through a
    rational fit of ``Φ(-|x|) exp(x²/2)`` (``_gelu_float32_block``, or its compiled twin in one pass where
    ``runtime.jit`` is on): within 5.5 ulps of the exact GELU for x >= -1, 10.1 for x >= -4 and 68.5 in the far
    negative tail (compiled: 4.0, 8.5 and 68.0; PyTorch's float32 GELU: 5.3, no correct digit below -4)."""
    prefix, api = "Gelu_", "flow.math.gelu"
    c_expr = f"((T)0.5 * {{0}} * erfc({{0}} * (T)-{_SQRT_HALF}))"

    @staticmethod
    def forward(xp, x, out=None):
        if xp is np and x.dtype == np.float32:
            if jit.enabled():
                return _elementwise_compiled(_gelu_float32_compiled, np.float32, x, out=out)
            return _blockwise(_gelu_float32_block, x, out, scratch=(np.float32, 3), blocks=GELU_BLOCKS)
        return xp.multiply(_normal_cdf(xp, x), x, out=out)

    @staticmethod
    def vjp(node, dy):
        return (apply(GeluGrad, (node.inputs[0], node.output, dy)),)


# |x| below this (x² below its square): Φ(x) is 1/2 to float64's precision, and y / x would lose it (y = x Φ(x)
# underflows for subnormal x; 0 / 0 at x = 0)
_GELU_GRAD_SMALL_X = 1e-18


def _gelu_grad_block(x, y, dy, out, q, cdf, _):
    """GELU's gradient of a NumPy block: ``dy (Φ(x) + x φ(x))``, ``Φ(x) = y / x`` read back from the forward output
    (one division instead of a second ``erfc``), ``x φ(x) = x exp(-x²/2 + log(1/√(2π)))``."""
    f = x.dtype.type
    np.multiply(x, x, out=q)
    if q.min() >= f(_GELU_GRAD_SMALL_X ** 2):
        np.divide(y, x, out=cdf)
    else:                                                   # rare (an exact 0): a host branch is free on NumPy
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(y, x, out=cdf)
        cdf[q < f(_GELU_GRAD_SMALL_X ** 2)] = f(0.5)
    q *= f(-0.5)
    q += f(_LOG_INV_SQRT_2PI)
    np.exp(q, out=q)
    q *= x
    cdf += q
    np.multiply(cdf, dy, out=out)


_GELU_GRAD_SMALL_X2 = np.float32(_GELU_GRAD_SMALL_X ** 2)
_F32_LOG_INV_SQRT_2PI = np.float32(_LOG_INV_SQRT_2PI)


@jit.kernel
def _gelu_grad_float32_compiled(x, y, dy, out):
    """``_gelu_grad_block``'s arithmetic in one pass over flat float32 arrays: ``dy (y / x + x exp(-x²/2 +
    log(1/√(2π))))``, ``Φ = 1/2`` where ``x² < 1e-36`` (a NaN x stays on the division, so NaN stays NaN)."""
    for i in range(x.size):
        v = x[i]
        square = v * v
        cdf = _F32_HALF if square < _GELU_GRAD_SMALL_X2 else y[i] / v
        out[i] = (cdf + v * jit.exp32(square * -_F32_HALF + _F32_LOG_INV_SQRT_2PI)) * dy[i]


class GeluGrad(Op):
    """``dy * (Φ(x) + x φ(x))``, ``φ`` the standard normal density, with ``Φ(x) = y / x`` read back from the forward
    output ``y`` (``Φ(0) = 1/2``): no second ``erfc``. float32 on NumPy: one compiled pass where ``runtime.jit`` is on
    (``_gelu_grad_float32_compiled``), else ~10 NumPy passes block by block."""
    prefix, api = "GeluGrad_", "flow.math.gelu_grad"
    c_expr = (f"({{2}} * (({{0}} != (T)0 ? {{1}} / {{0}} : (T)0.5) "
              f"+ {{0}} * (T){_INV_SQRT_2PI} * exp((T)-0.5 * {{0}} * {{0}})))")
    supports_out = True

    @staticmethod
    def infer(x, y, dy):
        return spec(dy.shape, dy.dtype)

    @staticmethod
    def forward(xp, x, y, dy, out=None):
        if xp is np and x.dtype in (np.float32, np.float64) and x.shape == y.shape == dy.shape:
            if jit.enabled() and x.dtype == y.dtype == dy.dtype == np.float32:
                return _elementwise_compiled(_gelu_grad_float32_compiled, np.float32, x, y, dy, out=out)
            return _blockwise(lambda xb, ob, yb, db, *scratch: _gelu_grad_block(xb, yb, db, ob, *scratch),
                              x, out, y, dy, blocks=GELU_BLOCKS)
        t = x.dtype.type
        zero = x == 0
        cdf = xp.divide(y, xp.where(zero, t(1), x))
        cdf[zero] = t(0.5)
        density = xp.square(x)
        density *= t(-0.5)
        xp.exp(density, out=density)
        density *= x
        density *= t(_INV_SQRT_2PI)
        cdf += density
        return xp.multiply(cdf, dy, out=out)

    @staticmethod
    def vjp(node, dy):
        """d/dx of ``g (Φ + x φ)`` is ``g φ (2 - x²)`` (a GELU's second derivative; ``y`` only caches ``x Φ(x)``, so
        this is the whole derivative through ``x`` and ``y`` gets none), and d/dg is ``GeluGrad`` itself."""
        x, y, g = node.inputs
        density = multiply(exp(multiply(square(x), -0.5)), _INV_SQRT_2PI)
        curvature = multiply(density, subtract(2.0, square(x)))
        return multiply(multiply(dy, g), curvature), None, apply(GeluGrad, (x, y, dy))


class Rsqrt(_FloatUnary):
    """``1 / sqrt(x)``."""
    prefix, api, c_expr = "Rsqrt_", "flow.math.rsqrt", "rsqrt({0})"
    nonnegative = True

    @staticmethod
    def forward(xp, x, out=None):
        out = xp.sqrt(x, out=out)
        return xp.divide(1, out, out=out)

    @staticmethod
    def vjp(node, dy):
        """d/dx x^(-1/2) = -y³ / 2."""
        y = node.output
        return (multiply(dy, multiply(multiply(square(y), y), -0.5)),)


class Pow(Op):
    prefix, api, c_expr = "ScalarPow_", "flow.math.pow", "pow({0}, (T){exponent})"
    supports_out = True
    inplace = True

    @staticmethod
    def infer(x, exponent):
        if x.dtype.kind != "f" and not (float(exponent).is_integer() and exponent >= 0):
            raise ShapeError(f"an integer tensor ({x.logical_blob_name} of dtype {x.dtype}) takes only non-negative "
                             f"integer exponents, got {exponent}; cast it to a floating dtype first")
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, exponent, out=None):
        return xp.power(x, x.dtype.type(exponent), out=out)

    @staticmethod
    def vjp(node, dy):
        x, = node.inputs
        p = node.attrs["exponent"]
        return (multiply(dy, multiply(pow(x, p - 1), float(p))),)


def _assign(xp, out, value):
    out[...] = value
    return out


def _unary(op):
    def fn(x, name=None):
        return apply(op, (as_tensor(x, argument="x"),), name)
    fn.__name__ = fn.__qualname__ = op.api.rsplit(".", 1)[-1]     # what reprs and the API reference name
    fn.__doc__ = f"Elementwise {fn.__name__} of a tensor (``{op.api}``)."
    return fn


negative = _unary(Negative)
exp = _unary(Exp)
log = _unary(Log)
sqrt = _unary(Sqrt)
square = _unary(Square)
abs = _unary(Abs)  # noqa: A001 - OneFlow's name
sign = _unary(Sign)
sigmoid = _unary(Sigmoid)
tanh = _unary(Tanh)


gelu = _unary(Gelu)
rsqrt = _unary(Rsqrt)


def pow(x, exponent, name=None):  # noqa: A001 - OneFlow's name
    """``x`` raised to the number ``exponent``, elementwise."""
    if not isinstance(exponent, (int, float, np.number)):
        raise TypeError(f"flow.math.pow: exponent must be a number, got {type(exponent).__name__}")
    return apply(Pow, (as_tensor(x, argument="x"),), name, exponent=float(exponent))


# ---------------------------------------------------------------------------------------------------------- reductions

class _Reduce(Op):
    supports_out = True

    @staticmethod
    def split_join(node, kinds):
        """Over the batch axis: a per-device reduction of the op's kind; over other axes the batch stays split."""
        return node.op.reduction if 0 in node.attrs["axes"] else "split"

    @staticmethod
    def infer(x, axes, keepdims):
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keepdims else \
            [d for i, d in enumerate(x.shape) if i not in axes]
        return spec(shape, x.dtype)


def _keep_shape(x_shape, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(x_shape))


class ReduceSum(_Reduce):
    prefix, api, reduction = "ReduceSum_", "flow.math.reduce_sum", "sum"

    @staticmethod
    def forward(xp, x, axes, keepdims, out=None):
        lead = len(axes)
        if xp is np:
            if axes == tuple(range(lead)):
                total = host_leading_sum(x, lead, out)
                if total is not None:
                    return out if out is not None else \
                        total.reshape(_keep_shape(x.shape, axes) if keepdims else x.shape[lead:])
            # the ufunc method directly: np.sum's Python wrapper costs a few µs per call
            return np.add.reduce(x, axis=axes, dtype=x.dtype, out=out, keepdims=keepdims)
        if 0 < lead < x.ndim and axes == tuple(range(lead)) and x.dtype in (np.float32, np.float64) \
                and x.flags.c_contiguous and (out is None or out.flags.c_contiguous):
            return _cupy_leading_sum(xp, x, lead, keepdims, out)
        return xp.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype, out=out)   # NumPy widens small ints

    @staticmethod
    def vjp(node, dy):
        x, = node.inputs
        return (broadcast_to(_reshape(dy, _keep_shape(x.shape, node.attrs["axes"])), x.shape),)


_device_ones = {}     # (device, size, dtype char) -> ones, for sums over leading axes as products
_HOST_ONES_UP_TO = 1 << 16    # leading sums over up to this many rows run as products with (cached) ones


def host_leading_sum(x, lead, out):
    """Sum of a C-contiguous float32/float64 NumPy array over its first ``lead`` (>= 1, not all) axes as
    ``ones @ rows``, or None where that does not apply. A bias or layer norm gradient, (tokens, hidden) -> (hidden,):
    BLAS reads the rows at memory speed, ~4x faster than ``np.add.reduce`` over axis 0 at BERT's sizes, which adds
    row after row as well (no less accurate). ``out`` (any shape of the result's size) receives it when it can."""
    if not 0 < lead < x.ndim or x.dtype.char not in "fd" or not x.flags.c_contiguous:
        return None
    rows = x.reshape(-1, math.prod(x.shape[lead:]))
    if rows.shape[0] > _HOST_ONES_UP_TO:
        return None
    ones = ones_of(rows.shape[0], x.dtype.char)
    if out is not None and out.dtype == x.dtype and out.flags.c_contiguous:
        np.dot(ones, rows, out=out.reshape(-1))
        return out
    total = np.dot(ones, rows)
    if out is not None:
        out[...] = total.reshape(out.shape)
        return out
    return total


def _cupy_leading_sum(cupy, x, lead, keepdims, out):
    """Sum of a C-contiguous CuPy array over its first ``lead`` axes (a bias gradient) as ``ones @ x``: cuBLAS
    reads the rows coalesced, where CuPy's axis reduction walks the columns with strides (many times slower on
    a 4096 x 4096 gradient). ``target`` is C-contiguous: its reshape is a view."""
    rows = x.reshape(-1, int(np.prod(x.shape[lead:])))
    key = (x.device.id, rows.shape[0], x.dtype.char)
    ones = _device_ones.get(key)
    if ones is None:
        ones = cupy.ones(rows.shape[0], x.dtype)
        if not cupy.cuda.get_current_stream().is_capturing():   # a CUDA graph's memory is the graph's own
            if len(_device_ones) > 64:
                _device_ones.clear()
            _device_ones[key] = ones
    shape = (1,) * lead + x.shape[lead:] if keepdims else x.shape[lead:]
    target = out if out is not None else cupy.empty(shape, x.dtype)
    if cublas.gemm(cupy, ones.reshape(1, -1), rows, target.reshape(1, rows.shape[1])) is None:
        cupy.matmul(ones, rows, out=target.reshape(rows.shape[1]))
    return target


class ReduceMean(_Reduce):
    prefix, api, reduction = "ReduceMean_", "flow.math.reduce_mean", "mean"

    @staticmethod
    def infer(x, axes, keepdims):
        _float_only(x)   # NumPy's mean of integers is a float, not the declared integer dtype
        return _Reduce.infer(x, axes, keepdims)

    @staticmethod
    def forward(xp, x, axes, keepdims, out=None):
        return xp.mean(x, axis=axes, keepdims=keepdims, out=out)

    @staticmethod
    def vjp(node, dy):
        x, = node.inputs
        n = int(np.prod([x.shape[a] for a in node.attrs["axes"]], dtype=np.int64))
        grad = broadcast_to(_reshape(dy, _keep_shape(x.shape, node.attrs["axes"])), x.shape)
        return (multiply(grad, 1.0 / max(n, 1)),)


class ReduceMax(_Reduce):
    prefix, api, reduction = "ReduceMax_", "flow.math.reduce_max", "max"

    @staticmethod
    def forward(xp, x, axes, keepdims, out=None):
        return xp.max(x, axis=axes, keepdims=keepdims, out=out)

    @staticmethod
    def vjp(node, dy):
        x, = node.inputs
        keep = _keep_shape(x.shape, node.attrs["axes"])
        return (apply(ReduceMaxGrad, (x, _reshape(node.output, keep), _reshape(dy, keep))),)


class ReduceMaxGrad(Op):
    """Ties share the gradient equally, as TensorFlow does."""
    prefix, api = "ReduceMaxGrad_", "reduce_max_grad"

    @staticmethod
    def infer(x, y, dy):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, y, dy):
        mask = (x == y).astype(x.dtype)
        axes = tuple(i for i, d in enumerate(y.shape) if d == 1 and x.shape[i] != 1)
        count = xp.sum(mask, axis=axes, keepdims=True)
        return mask * (dy / count)


def _reduce(op):
    def fn(input_tensor, axis=None, keepdims=False, name=None):
        x = as_tensor(input_tensor, argument="input_tensor")
        try:
            axes = normalize_axes(axis, x.ndim)
        except ShapeError as e:
            raise shape_error(op.api, e) from None
        return apply(op, (x,), name, axes=axes, keepdims=bool(keepdims))
    fn.__name__ = fn.__qualname__ = op.api.rsplit(".", 1)[-1]     # what reprs and the API reference name
    fn.__doc__ = f"``{op.api}(input_tensor, axis=None, keepdims=False, name=None)``."
    return fn


reduce_sum = _reduce(ReduceSum)
reduce_mean = _reduce(ReduceMean)
reduce_max = _reduce(ReduceMax)


# -------------------------------------------------------------------------------------------------------------- matmul

class MatMul(Op):
    prefix, api = "Matmul_", "flow.matmul"
    supports_out = True
    amp = "float16"         # on OneFlow 0.3.4's white list (matmul, batch_matmul)

    @staticmethod
    def split_join(node, kinds):
        """``aᵀ b`` sums over the batch rows of ``a``: a partial sum flowlab does not track."""
        return None if node.attrs["transpose_a"] else Op.split_join(node, kinds)

    @staticmethod
    def infer(a, b, transpose_a, transpose_b, alpha):
        same_dtype(None, a, b)
        if a.ndim < 2 or b.ndim < 2 or a.ndim != b.ndim:
            raise ShapeError(f"expects two matrices or two batches of matrices of one rank, got {a.shape} and {b.shape}")
        if a.shape[:-2] != b.shape[:-2]:
            raise ShapeError(f"batch dimensions differ: {a.shape[:-2]} and {b.shape[:-2]}")
        m, k = a.shape[-2:][::-1] if transpose_a else a.shape[-2:]
        k2, n = b.shape[-2:][::-1] if transpose_b else b.shape[-2:]
        if k != k2:
            raise ShapeError(f"inner dimensions differ: a {a.shape}{' transposed' if transpose_a else ''} "
                             f"({a.logical_blob_name}) has {k}, b {b.shape}{' transposed' if transpose_b else ''} "
                             f"({b.logical_blob_name}) has {k2}")
        return spec(a.shape[:-2] + (m, n), a.dtype)

    @staticmethod
    def gemm_macs(node):
        a, transpose_a = node.inputs[0], node.attrs["transpose_a"]
        return node.outputs[0].size * a.shape[-2 if transpose_a else -1]

    @staticmethod
    def forward(xp, a, b, transpose_a, transpose_b, alpha, out=None):
        if xp is np and a.dtype == np.float16:
            return _half_product_on_host(a, b, transpose_a, transpose_b, alpha, out)
        if xp is not np and a.ndim == 2:    # cuBLAS directly: capturable in a CUDA graph, less host time
            a2, b2 = (a.T if transpose_a else a), (b.T if transpose_b else b)
            target = out if out is not None else xp.empty((a2.shape[0], b2.shape[1]), a.dtype)
            if cublas.gemm(xp, a2, b2, target) is not None:
                if alpha != 1.0:
                    target *= alpha
                return target
        # NumPy: inside a host plan's call BLAS runs on one thread and host_threads.matmul splits large products
        # over the cores itself (a plain matmul then used one core of two)
        product_of = host_threads.matmul if xp is np else xp.matmul
        if transpose_b and not transpose_a and _swapped_gemm_pays(xp, a, b):
            # (b @ aᵀ)ᵀ: same product, the orientation OpenBLAS runs faster for these shapes
            product = product_of(b, a.T).T
            if out is None:
                out = xp.empty(product.shape, product.dtype)
            xp.copyto(out, product)
        else:
            if transpose_a:
                a = a.swapaxes(-1, -2)
            if transpose_b:
                b = b.swapaxes(-1, -2)
            out = product_of(a, b, out=out)
        if alpha != 1.0:
            out *= alpha
        return out

    @staticmethod
    def vjp(node, dy):
        a, b = node.inputs
        ta, tb, alpha = node.attrs["transpose_a"], node.attrs["transpose_b"], node.attrs["alpha"]
        if not ta and not tb:
            da, db = matmul(dy, b, transpose_b=True, alpha=alpha), matmul(a, dy, transpose_a=True, alpha=alpha)
        elif not ta and tb:
            da, db = matmul(dy, b, alpha=alpha), matmul(dy, a, transpose_a=True, alpha=alpha)
        elif ta and not tb:
            da, db = matmul(b, dy, transpose_b=True, alpha=alpha), matmul(a, dy, alpha=alpha)
        else:
            da = matmul(b, dy, transpose_a=True, transpose_b=True, alpha=alpha)
            db = matmul(dy, a, transpose_a=True, transpose_b=True, alpha=alpha)
        return da, db


class MatMulInLayout(Op):
    """A matrix product written straight into the layout a ``Transpose`` (``perm``) then a ``Reshape`` (``shape``)
    of it give: ``reshape(transpose(op(a) @ op(b), perm), shape)`` without the reshape's copy. Attention's heads
    are merged back this way (``(batch, heads, seq, d)`` -> ``(batch, seq, heads, d)`` -> ``(batch * seq, heads *
    d)``, in the forward pass and for the query, key and value gradients): BLAS writes each head's rows into a
    strided view of the merged array (its row stride is ``heads * d``), the same values as ``MatMul`` then the copy.
    Never traced: the compiler's ``write_products_in_layout`` pass makes it from the three nodes (NumPy)."""
    prefix, api = "Matmul_", "flow.matmul"
    supports_out = True
    gemm_macs = MatMul.gemm_macs

    @staticmethod
    def infer(a, b, transpose_a, transpose_b, alpha, perm, shape):
        product = MatMul.infer(a, b, transpose_a, transpose_b, alpha)
        if sorted(perm) != list(range(len(product.shape))) or math.prod(shape) != math.prod(product.shape):
            raise ShapeError(f"perm {perm} and shape {shape} do not rearrange a product of shape {product.shape}")
        return spec(shape, a.dtype)

    @staticmethod
    def forward(xp, a, b, transpose_a, transpose_b, alpha, perm, shape, out=None):
        m = a.shape[-1] if transpose_a else a.shape[-2]
        n = b.shape[-2] if transpose_b else b.shape[-1]
        laid_out = tuple((a.shape[:-2] + (m, n))[p] for p in perm)
        merged = out if out is not None and out.flags.c_contiguous else xp.empty(shape, a.dtype)
        # the product's axes in ``merged``'s memory: the inverse permutation of the layout (in Python: NumPy's
        # argsort of a 4-tuple costs ~5 us, as much as the copy saved)
        inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
        MatMul.forward(xp, a, b, transpose_a, transpose_b, alpha, out=merged.reshape(laid_out).transpose(inverse))
        if out is not None and merged is not out:
            out[...] = merged
            return out
        return merged


def _half_product_on_host(a, b, transpose_a, transpose_b, alpha, out):
    """A float16 product on NumPy: float32 BLAS over the float16 values, rounded to float16 once. That is a float16
    GEMM accumulating in float32 (cuBLAS's under mixed precision, and what NumPy's own float16 matmul computes,
    without BLAS and about 6x slower)."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    product = np.matmul(a.swapaxes(-1, -2) if transpose_a else a, b.swapaxes(-1, -2) if transpose_b else b)
    if alpha != 1.0:
        product *= np.float32(alpha)
    if out is None:
        return product.astype(np.float16)
    np.copyto(out, product, casting="same_kind")
    return out


def _swapped_gemm_pays(xp, a, b):
    """Whether ``a @ bᵀ`` runs faster as ``(b @ aᵀ)ᵀ`` plus a transposing copy: on NumPy's OpenBLAS for float32
    products with few rows (m <= 100), at least twice as many columns and a long inner dimension (k >= 256), e.g. a
    dense layer on a batch of 100: 10-15% faster there, slower for larger m, short k or float64
    (``benchmarks/RESULTS.md``, "CPU step at the limit")."""
    if xp is not np or a.ndim != 2 or a.dtype != np.float32:
        return False
    m, k = a.shape
    return m <= 100 and b.shape[0] >= 2 * m and k >= 256


def matmul(a, b, transpose_a=False, transpose_b=False, alpha=1.0, name=None):
    """``flow.matmul``: ``op(a) @ op(b)`` for matrices or same-shaped batches, ``op`` an optional transpose."""
    a, b = as_tensor(a, argument="a"), as_tensor(b, argument="b")
    return apply(MatMul, (a, b), name, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b),
                 alpha=float(alpha))


# ------------------------------------------------------------------------------------------------- non-differentiable

class ArgMax(Op):
    prefix, api = "ArgMax_", "flow.math.argmax"

    @staticmethod
    def infer(x, axis):
        return spec(x.shape[:axis] + x.shape[axis + 1:], np.int32)

    @staticmethod
    def forward(xp, x, axis):
        return xp.argmax(x, axis=axis).astype(np.int32)


def argmax(input, axis=-1, name=None):  # noqa: A002 - OneFlow's name
    """The index of the largest value of ``input`` along ``axis`` (int32); the first one on ties."""
    x = as_tensor(input, argument="input")
    from . import normalize_axis
    try:
        axis = normalize_axis(axis, x.ndim)
    except ShapeError as e:
        raise shape_error("flow.math.argmax", e) from None
    return apply(ArgMax, (x,), name, axis=axis)


class TopK(Op):
    """The int32 indices of the ``k`` largest entries along the last axis, largest first when ``sorted`` (else in
    index order); among equal values the lower index comes first."""
    prefix, api = "TopK_", "flow.math.top_k"

    @staticmethod
    def infer(x, k, sorted):
        return spec(x.shape[:-1] + (k,), np.int32)

    @staticmethod
    def forward(xp, x, k, sorted):
        n = x.shape[-1]
        if k == 1:
            picked = xp.argmax(x, axis=-1)[..., None]
        elif xp is np and 4 * k < n:   # a partition first, then sort only the k kept (stable on ties by index)
            part = np.argpartition(-x, k - 1, axis=-1)[..., :k]
            values = np.take_along_axis(x, part, axis=-1)
            # order the k kept: by value (descending), then by index
            order = np.lexsort((part, -values), axis=-1)
            picked = np.take_along_axis(part, order, axis=-1)
            threshold = np.take_along_axis(values, order[..., -1:], axis=-1)
            # argpartition may keep a later index of a value tied with the k-th: fall back where that happened
            ties = (x == threshold).sum(axis=-1) > (values == threshold).sum(axis=-1)
            if ties.any():
                full = np.argsort(-x, axis=-1, kind="stable")[..., :k]
                picked = np.where(ties[..., None], full, picked)
        else:
            picked = xp.argsort(-x, axis=-1, kind="stable")[..., :k]
        if not sorted:
            picked = xp.sort(picked, axis=-1)
        return picked.astype(np.int32)


def top_k(input, axis=-1, k=1, sorted=True, name=None):  # noqa: A002 - OneFlow's names
    """``flow.math.top_k(input, axis=-1, k=1, sorted=True)``: as OneFlow, only the int32 *indices* of the ``k``
    largest entries along ``axis`` (largest first when ``sorted``; ties: lower index first)."""
    api = TopK.api
    x = as_tensor(input, argument="input")
    from . import normalize_axis
    try:
        axis = normalize_axis(axis, x.ndim)
    except ShapeError as e:
        raise shape_error(api, e) from None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= x.shape[axis]:
        raise ValueError(f"{api}: k must be an int in [1, {x.shape[axis]}] (the size of axis {axis} of "
                         f"{x.logical_blob_name} {x.shape}), got {k!r}")
    from .array import transpose
    last = x.ndim - 1
    perm = tuple(i for i in range(x.ndim) if i != axis) + (axis,)
    moved = x if axis == last else transpose(x, perm)
    out = apply(TopK, (moved,), name, k=int(k), sorted=bool(sorted))
    return out if axis == last else transpose(out, tuple(int(i) for i in np.argsort(perm)))


class _Compare(Op):
    @staticmethod
    def infer(x, y):
        return spec(_broadcast(x, y), np.int8)


class Equal(_Compare):
    prefix, api = "Equal_", "flow.math.equal"

    @staticmethod
    def forward(xp, x, y):
        return xp.equal(x, y).astype(np.int8)


class Greater(_Compare):
    prefix, api = "Greater_", "flow.math.greater"

    @staticmethod
    def forward(xp, x, y):
        return xp.greater(x, y).astype(np.int8)


class Less(_Compare):
    prefix, api = "Less_", "flow.math.less"

    @staticmethod
    def forward(xp, x, y):
        return xp.less(x, y).astype(np.int8)


equal = _binary(Equal)
greater = _binary(Greater)
less = _binary(Less)


# -------------------------------------------------------------------------------------------------------- clipping

class ClipByValue(Op):
    """``min(max(x, lo), hi)``; a bound of ``None`` is not applied."""
    prefix, api = "ClipByValue_", "flow.clip_by_value"
    supports_out = True
    inplace = True

    @staticmethod
    def is_nonnegative(node):
        return node.attrs["lo"] is not None and node.attrs["lo"] >= 0     # relu6 = clip_by_value(x, 0, 6)

    @staticmethod
    def infer(x, lo, hi):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, lo, hi, out=None):
        if lo is not None and hi is not None:
            return xp.clip(x, x.dtype.type(lo), x.dtype.type(hi), out=out)
        if lo is not None:
            return xp.maximum(x, x.dtype.type(lo), out=out)
        return xp.minimum(x, x.dtype.type(hi), out=out)

    @staticmethod
    def vjp(node, dy):
        return (apply(ClipByValueGrad, (node.inputs[0], dy), **node.attrs),)


class ClipByValueGrad(Op):
    """``dy`` where ``lo <= x <= hi`` (OneFlow passes the gradient at the bounds themselves), else 0."""
    prefix, api = "ClipByValueGrad_", "clip_by_value_grad"

    @staticmethod
    def infer(x, dy, lo, hi):
        return spec(dy.shape, dy.dtype)

    @staticmethod
    def forward(xp, x, dy, lo, hi):
        inside = xp.ones(x.shape, bool) if lo is None else x >= x.dtype.type(lo)
        if hi is not None:
            inside &= x <= x.dtype.type(hi)
        return dy * inside


def clip_by_value(values, min_value=None, max_value=None, name=None):
    """``flow.clip_by_value`` (also ``flow.math.clip_by_value``, ``flow.clip``, ``flow.clamp``,
    ``flow.clip_by_scalar``): ``min(max(values, min_value), max_value)``; either bound may be ``None``."""
    api = ClipByValue.api
    x = as_tensor(values, argument="values")
    bounds = []
    for argument, value in (("min_value", min_value), ("max_value", max_value)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.number))):
            raise TypeError(f"{api}: {argument} must be a number or None, got {value!r}")
        # OneFlow keeps integral bounds for integer tensors: int(value)
        bounds.append(None if value is None else float(value) if x.dtype.kind == "f" else int(value))
    lo, hi = bounds
    if lo is None and hi is None:
        raise ValueError(f"{api}: min_value and max_value cannot both be None")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{api}: min_value {min_value} must not exceed max_value {max_value}")
    return apply(ClipByValue, (x,), name, lo=lo, hi=hi)
