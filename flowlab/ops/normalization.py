"""``flow.layers.batch_normalization``, OneFlow's fused ``batch_normalization_relu`` / ``_add_relu``, and
``flow.layers.layer_norm`` (at the end).

OneFlow 0.3.4's rules, kept here:

- Variables ``<name>-gamma`` (ones), ``<name>-beta`` (zeros), ``<name>-moving_mean`` (zeros) and
  ``<name>-moving_variance`` (ones), of shape ``(channels,)``; the moving ones are never trainable. ``name`` defaults
  to ``"BatchNorm"`` (also when given as ``None``), and as in OneFlow (``reuse=False``) one name cannot make two
  layers in one job. With
  ``center=False`` / ``scale=False`` beta / gamma are constants of zeros / ones.
- Batch statistics are used only in a train job, and only when ``trainable`` and ``training`` are both true;
  otherwise (predict jobs, frozen layers) the moving statistics, with no update.
- In training each moving statistic becomes ``momentum * moving + (1 - momentum) * batch``, in place, once per step,
  by an update op as an optimizer updates a variable. The batch variance fed to the moving average is the unbiased one
  (``n / (n - 1)`` times the biased variance that normalizes): OneFlow's GPU kernel is cuDNN's
  ``BatchNormalizationForwardTraining``, which does so (OneFlow's CPU fallback, through ``nn.moments``, used the
  biased one). PyTorch's ``BatchNorm2d`` agrees, with ``momentum_torch = 1 - momentum``.
- The fused forms give exactly ``relu(bn(x))`` and ``relu(bn(x) + addend)`` in one op named ``name``.

Kernels view the input as ``(outer, channels, inner)`` (NCHW: ``(N, C, H*W)``; NHWC and 2-D: ``(rows, C, 1)``) and
work through it in contiguous cache-sized blocks (one block on CuPy): the batch mean and variance take one pass over
memory (per-block moments, combined stably), normalizing another, the gradient's two sums one and ``dx`` one.
Per-channel sums run along contiguous memory or as matrix products (a product with ones, a batched dot), several
times faster on NumPy than ``sum`` over two axes. float32 images (NCHW) take compiled kernels instead, one pass each
(see "compiled kernels" below); the NumPy kernels stay their twins (``FLOWLAB_JIT=0``, float64, CuPy).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import graph as g
from ..errors import ShapeError
from ..initializers import ones_initializer, zeros_initializer
from ..runtime import host_threads, jit
from . import Op, apply, as_tensor, normalize_axis, spec
from .array import constant
from .math import host_leading_sum
from .nn import ReluGrad
from .stats import ones_of, row_dots
from .variables import get_variable

# ------------------------------------------------------------------------------------------------------ array helpers


def _split(shape, axis):
    """``(outer, channels, inner)``: the input seen as a 3-D array whose axis 1 is the normalized axis."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _channel_view(xp, a, axis):
    return xp.reshape(a, _split(a.shape, axis))


def _channel_sum(xp, a3):
    """Per-channel sum of ``(outer, C, inner)`` ``a3``."""
    outer, c, inner = a3.shape
    if inner == 1:     # a product with ones: BLAS reads the rows once, ~5x faster than a sum over axis 0
        return xp.ones(outer, a3.dtype) @ a3.reshape(outer, c)
    return a3.sum(axis=2).sum(axis=0)     # contiguous rows: NumPy's pairwise sum (a stacked mat-vec is 20x slower)


def _channel_dot(xp, a3, b3):
    """Per-channel ``sum(a3 * b3)``, with no temporary of the input's size."""
    outer, c, inner = a3.shape
    if inner == 1:
        return xp.einsum("ic,ic->c", a3.reshape(outer, c), b3.reshape(outer, c))
    return xp.matmul(a3[:, :, None, :], b3[:, :, :, None]).reshape(outer, c).sum(axis=0)


_BLOCK = 1 << 18    # elements of a block (NumPy): a block and its scratch stay in cache across the passes over it


def _blocks(xp, shape3):
    """``(rows, channels)`` slice pairs tiling a ``(outer, C, inner)`` array in contiguous blocks of about ``_BLOCK``
    elements, rows outermost (one block on CuPy: there every pass is one kernel anyway)."""
    outer, c, inner = shape3
    if xp is not np:
        return [(slice(0, outer), slice(0, c))]
    if inner > 1 and c * inner > _BLOCK:       # a big image: blocks of channels within one row
        step = max(1, _BLOCK // inner)
        return [(slice(r, r + 1), slice(k, min(k + step, c))) for r in range(outer) for k in range(0, c, step)]
    step = max(1, _BLOCK // (c * inner))
    return [(slice(r, min(r + step, outer)), slice(0, c)) for r in range(0, outer, step)]


def _scratch(xp, blocks, x3):
    """One buffer the size of the largest block, reused by every block."""
    rows = max(b[0].stop - b[0].start for b in blocks)
    channels = max(b[1].stop - b[1].start for b in blocks)
    return xp.empty((rows, channels, x3.shape[2]), x3.dtype)


def _fit(scratch, block):
    return scratch[:block.shape[0], :block.shape[1]]


def _regions(xp, shape3):
    """``(rows, channels)`` slice pairs that split a ``(outer, C, inner)`` array between ``host_threads`` (one region
    spanning everything on CuPy, on one thread, or for small arrays): blocks of rows where there are enough rows,
    else blocks of channels. Each region is then worked through in ``_blocks``."""
    outer, c, inner = shape3
    if xp is not np:
        return [(slice(0, outer), slice(0, c))]
    work = outer * c * inner
    if outer >= host_threads.width():
        return [(rows, slice(0, c)) for rows in host_threads.parts(outer, work=work)]
    return [(slice(0, outer), channels) for channels in host_threads.parts(c, work=work)]


def _in_regions(xp, function, x3):
    """``function(region)`` for each of ``_regions``, on threads: ``[(region, result), ...]``."""
    regions = _regions(xp, x3.shape)
    return list(zip(regions, host_threads.run([lambda r=r: function(r) for r in regions])))


def _moments_of(xp, x3):
    """Per-channel mean and centred sum of squares (float64) of ``x3`` in one pass over memory: each block's own
    mean and centred sum of squares, combined as Chan, Golub and LeVeque do (as stable as two passes)."""
    outer, c, inner = x3.shape
    blocks = _blocks(xp, x3.shape)
    mean, m2 = xp.zeros(c, np.float64), xp.zeros(c, np.float64)
    scratch = _scratch(xp, blocks, x3)
    for rows, channels in blocks:
        block = x3[rows, channels]
        seen, count = rows.start * inner, block.shape[0] * inner
        block_mean = _channel_sum(xp, block) / count
        centred = xp.subtract(block, _per_channel(block_mean, block.dtype), out=_fit(scratch, block))
        delta = block_mean - mean[channels]
        total = seen + count
        mean[channels] += delta * (count / total)
        m2[channels] += _channel_dot(xp, centred, centred) + delta * delta * (seen * count / total)
    return mean, m2


def _moments(xp, x3):
    """Per-channel mean and biased variance (float64): ``_moments_of`` each region, the regions' moments combined
    the same way."""
    outer, c, inner = x3.shape
    mean, m2, seen = xp.zeros(c, np.float64), xp.zeros(c, np.float64), 0
    for (rows, channels), (part_mean, part_m2) in _in_regions(xp, lambda r: _moments_of(xp, x3[r]), x3):
        count = (rows.stop - rows.start) * inner
        if channels.stop - channels.start < c:        # regions of channels: each channel in one region
            mean[channels], m2[channels] = part_mean, part_m2
            continue
        total = seen + count
        delta = part_mean - mean
        mean += delta * (count / total)
        m2 += part_m2 + delta * delta * (seen * count / total)
        seen = total
    return mean, m2 / (outer * inner)


def _per_channel(v, dtype):
    """A ``(C,)`` vector shaped ``(1, C, 1)`` to broadcast over the 3-D view, in the input's dtype."""
    return v.astype(dtype, copy=False).reshape(1, -1, 1)


def _normalize(xp, x3, mean, k, beta, addend3, relu):
    """``x * k + (beta - mean * k)`` (+ addend, through ReLU), block by block so that each block's passes hit cache.
    Two passes where ``(x - mean) * k + beta`` takes three (ResNet-50's normalizations, one thread: -25 %), as
    PyTorch's CPU kernel does; the rounding of ``x * k`` is that of ``x`` itself scaled by ``k``."""
    k = xp.asarray(k, np.float64)
    if _jit_case(xp, x3):
        return _jit_normalize(x3, k, beta - mean * k, addend3, relu)
    y3 = xp.empty_like(x3)
    per = [_per_channel(v, x3.dtype) for v in (k, beta - mean * k)]

    def region(where):
        x_r, y_r, add_r = x3[where], y3[where], None if addend3 is None else addend3[where]
        per_r = [p[:, where[1]] for p in per]
        for rows, channels in _blocks(xp, x_r.shape):
            y = xp.multiply(x_r[rows, channels], per_r[0][:, channels], out=y_r[rows, channels])
            y += per_r[1][:, channels]
            if add_r is not None:
                y += add_r[rows, channels]
            if relu:
                xp.maximum(y, 0, out=y)

    _in_regions(xp, region, x3)
    return y3


# --------------------------------------------------------------------------------------------- compiled kernels
# float32 on NumPy, where each row of a channel holds at least ``_JIT_INNER`` contiguous elements (NCHW images):
# compiled loops (``runtime.jit``) over "planes", the ``inner`` elements of one channel of one row, rows of the
# ``(outer * C, inner)`` view. A kernel takes planes ``p0:p1``, so host threads take ranges of planes. Each does in
# one pass over memory what the NumPy kernels above do in several: a plane's mean and centred sum of squares (its
# second pass reads the plane from cache), ``x * k + offset`` with the addend and the ReLU, the gradient's two sums
# and ``dx`` with the ReLU's mask applied to ``dy`` on the fly. Sums are float64; NaN and inf propagate as in NumPy
# (the mask multiplies, so a NaN ``dy`` stays NaN where ``y <= 0``).

_JIT_INNER = 8      # shorter planes (NHWC, 2-D inputs) stay on NumPy, whose kernels read them as rows


def _jit_case(xp, x3):
    """Whether the compiled kernels take the ``(outer, C, inner)`` view ``x3``."""
    return xp is np and x3.dtype == np.float32 and x3.shape[2] >= _JIT_INNER and jit.enabled()


def _planes(a3):
    """``(outer, C, inner)`` as a C-contiguous ``(outer * C, inner)`` array (a view where it already is one)."""
    return np.ascontiguousarray(a3).reshape(-1, a3.shape[2])


def _over_planes(function, planes, size):
    """``function(p0, p1)`` for ranges of ``planes`` planes (``size`` elements in all) on host threads."""
    host_threads.each(lambda part: function(part.start, part.stop), planes, work=host_threads.compiled_work(size))


@jit.kernel(reduce=True)
def _plane_moments_float32(x, p0, p1, means, m2s):
    """Mean and centred sum of squares (float64) of planes ``p0:p1`` of ``x``."""
    inner = x.shape[1]
    for p in range(p0, p1):
        s = 0.0
        for i in range(inner):
            s += x[p, i]
        m = s / inner
        q = 0.0
        for i in range(inner):
            d = x[p, i] - m
            q += d * d
        means[p] = m
        m2s[p] = q


@jit.kernel
def _normalize_float32(x, k, offset, addend, with_addend, relu, p0, p1, y):
    """``y = x * k + offset`` (per channel; ``+ addend`` where ``with_addend``; then ``max(y, 0)`` keeping NaN where
    ``relu``) over planes ``p0:p1``."""
    channels, inner = k.size, x.shape[1]
    zero = np.float32(0)
    for p in range(p0, p1):
        kc, oc = k[p % channels], offset[p % channels]
        if with_addend and relu:
            for i in range(inner):
                v = x[p, i] * kc + oc + addend[p, i]
                y[p, i] = zero if v < zero else v
        elif with_addend:
            for i in range(inner):
                y[p, i] = x[p, i] * kc + oc + addend[p, i]
        elif relu:
            for i in range(inner):
                v = x[p, i] * kc + oc
                y[p, i] = zero if v < zero else v
        else:
            for i in range(inner):
                y[p, i] = x[p, i] * kc + oc


@jit.kernel(reduce=True)
def _grad_sums_float32(x, dy, y, relu, mean, p0, p1, dbetas, dots):
    """Per plane (float64): ``sum(g)`` and ``sum(g * (x - mean))``, ``g = dy`` masked by ``y > 0`` where
    ``relu``."""
    channels, inner = mean.size, x.shape[1]
    one, zero = np.float32(1), np.float32(0)
    for p in range(p0, p1):
        centre = np.float64(mean[p % channels])
        s = 0.0
        d = 0.0
        if relu:
            for i in range(inner):
                g = dy[p, i] * (one if y[p, i] > zero else zero)
                s += g
                d += g * (x[p, i] - centre)
        else:
            for i in range(inner):
                g = dy[p, i]
                s += g
                d += g * (x[p, i] - centre)
        dbetas[p] = s
        dots[p] = d


@jit.kernel
def _grad_input_float32(x, dy, y, relu, training, k, slope, offset, p0, p1, dx):
    """``dx = g * k + x * slope + offset`` (``training``) or ``g * k`` per channel over planes ``p0:p1``, ``g`` as
    in ``_grad_sums_float32``."""
    channels, inner = k.size, x.shape[1]
    one, zero = np.float32(1), np.float32(0)
    for p in range(p0, p1):
        c = p % channels
        kc, sc, oc = k[c], slope[c], offset[c]
        if relu and training:
            for i in range(inner):
                dx[p, i] = dy[p, i] * (one if y[p, i] > zero else zero) * kc + x[p, i] * sc + oc
        elif relu:
            for i in range(inner):
                dx[p, i] = dy[p, i] * (one if y[p, i] > zero else zero) * kc
        elif training:
            for i in range(inner):
                dx[p, i] = dy[p, i] * kc + x[p, i] * sc + oc
        else:
            for i in range(inner):
                dx[p, i] = dy[p, i] * kc


def _jit_moments(x3):
    """``_moments`` of a ``_jit_case`` input: each plane's moments, combined over the rows (planes of one channel hold
    as many elements each: the mean of their means, and their centred sums plus ``inner`` times the squared
    deviations of their means)."""
    outer, c, inner = x3.shape
    x2 = _planes(x3)
    means, m2s = np.empty(outer * c), np.empty(outer * c)
    _over_planes(lambda p0, p1: _plane_moments_float32(x2, p0, p1, means, m2s), outer * c, x2.size)
    means, m2s = means.reshape(outer, c), m2s.reshape(outer, c)
    mean = means.mean(axis=0)
    spread = means - mean
    m2 = m2s.sum(axis=0) + inner * np.einsum("oc,oc->c", spread, spread)
    return mean, m2 / (outer * inner)


def _jit_normalize(x3, k, offset, addend3, relu):
    """``_normalize`` of a ``_jit_case`` input (``k``, ``offset`` per channel)."""
    x2 = _planes(x3)
    y2 = np.empty_like(x2)
    add2 = x2 if addend3 is None else _planes(addend3)
    k, offset = k.astype(np.float32), offset.astype(np.float32)
    _over_planes(lambda p0, p1: _normalize_float32(x2, k, offset, add2, addend3 is not None, relu, p0, p1, y2),
                 x2.shape[0], x2.size)
    return y2.reshape(x3.shape)


def _jit_bn_grad(x3, dy3, y3, gamma, mean, inv_std, training):
    """``BatchNormGrad`` of a ``_jit_case`` input: ``(dx3, dgamma, dbeta)`` (float64 statistics), ``dy3`` masked by
    ``y3 > 0`` where ``y3`` is given; the same formulas as the NumPy kernel."""
    outer, c, inner = x3.shape
    x2, dy2 = _planes(x3), _planes(dy3)
    y2 = dy2 if y3 is None else _planes(y3)
    relu = y3 is not None
    dbetas, dots = np.empty(outer * c), np.empty(outer * c)
    mean32 = mean.astype(np.float32)
    _over_planes(lambda p0, p1: _grad_sums_float32(x2, dy2, y2, relu, mean32, p0, p1, dbetas, dots),
                 x2.shape[0], x2.size)
    dbeta, dot = dbetas.reshape(outer, c).sum(axis=0), dots.reshape(outer, c).sum(axis=0)
    inv_std = np.asarray(inv_std, np.float64)
    dgamma = dot * inv_std
    k = gamma * inv_std
    n = outer * inner
    slope = -k * inv_std * dgamma / n
    offset = -k * dbeta / n - mean * slope
    per = [np.asarray(v, np.float32) for v in (k, slope, offset)]
    dx2 = np.empty_like(x2)
    _over_planes(lambda p0, p1: _grad_input_float32(x2, dy2, y2, relu, training, *per, p0, p1, dx2),
                 x2.shape[0], x2.size)
    return dx2.reshape(x3.shape), dgamma, dbeta


# ------------------------------------------------------------------------------------------------------------- ops

def _check_inputs(x, params, addend, axis):
    if x.dtype.kind != "f":
        raise ShapeError(f"inputs must be floating point, got {x.logical_blob_name} of dtype {x.dtype}")
    channels = x.shape[axis]
    for p in params:
        if p.shape != (channels,):
            raise ShapeError(f"{p.logical_blob_name} must have shape ({channels},) for axis {axis} of inputs "
                             f"{x.shape}, got {p.shape}")
    if addend and (addend[0].shape != x.shape or addend[0].dtype != x.dtype):
        raise ShapeError(f"addend must have the shape and dtype of inputs {x.shape} {x.dtype}, got "
                         f"{addend[0].shape} {addend[0].dtype} ({addend[0].logical_blob_name})")


class BatchNormTrain(Op):
    """Normalizes with the batch's statistics. Outputs ``y``, the batch ``mean`` and ``inv_variance`` (``1 /
    sqrt(var + epsilon)``, what the gradient reads), and separately ``batch_mean`` / ``batch_variance`` (unbiased),
    which only the moving-average updates read: on several devices an update's input 1 is averaged over the replicas
    before the updates run (``compiler.replicate``), which must not change what this replica's gradient reads."""
    prefix, api = "BatchNorm_", "flow.layers.batch_normalization"
    outputs = ("y", "mean", "inv_variance", "batch_mean", "batch_variance")

    @staticmethod
    def is_nonnegative(node):
        return node.attrs["relu"]       # batch_normalization_relu / _add_relu

    @staticmethod
    def infer(x, gamma, beta, *addend, axis, epsilon, relu):
        _check_inputs(x, (gamma, beta), addend, axis)
        if x.size == x.shape[axis]:
            raise ShapeError(f"batch statistics need more than one value per channel, got inputs {x.shape} "
                             f"normalized along axis {axis}")
        stat = spec((x.shape[axis],), gamma.dtype)
        return [spec(x.shape, x.dtype), stat, stat, stat, stat]

    @staticmethod
    def forward(xp, x, gamma, beta, *addend, axis, epsilon, relu):
        x3 = _channel_view(xp, x, axis)
        n = x3.shape[0] * x3.shape[2]
        mean, variance = _jit_moments(x3) if _jit_case(xp, x3) else _moments(xp, x3)     # biased: what normalizes
        inv_variance = 1 / xp.sqrt(variance + epsilon)
        addend3 = _channel_view(xp, addend[0], axis) if addend else None
        y = _normalize(xp, x3, mean, gamma * inv_variance, beta, addend3, relu).reshape(x.shape)
        stat_dtype = gamma.dtype
        return (y, mean.astype(stat_dtype), inv_variance.astype(stat_dtype), mean.astype(stat_dtype),
                (variance * (n / (n - 1))).astype(stat_dtype))

    @staticmethod
    def vjp(node, dy, *stat_grads):
        if any(d is not None for d in stat_grads):
            raise ShapeError(f"{node.name}: only the normalized output of batch_normalization is differentiable, "
                             "not its batch statistics")
        x, gamma = node.inputs[:2]
        y, mean, inv_variance = node.outputs[:3]
        return _bn_vjp(node, dy, x, gamma, mean, inv_variance, y, training=True)


class BatchNormInfer(Op):
    """Normalizes with given (moving) statistics: ``y = x * k + (beta - mean * k)``, ``k = gamma / sqrt(var + eps)``."""
    prefix, api = "BatchNorm_", "flow.layers.batch_normalization"
    outputs = ("y",)

    @staticmethod
    def is_nonnegative(node):
        return node.attrs["relu"]

    @staticmethod
    def infer(x, gamma, beta, moving_mean, moving_variance, *addend, axis, epsilon, relu):
        _check_inputs(x, (gamma, beta, moving_mean, moving_variance), addend, axis)
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, gamma, beta, moving_mean, moving_variance, *addend, axis, epsilon, relu):
        k = gamma / xp.sqrt(moving_variance + epsilon)
        addend3 = _channel_view(xp, addend[0], axis) if addend else None
        return _normalize(xp, _channel_view(xp, x, axis), moving_mean, k, beta, addend3, relu).reshape(x.shape)

    @staticmethod
    def vjp(node, dy):
        x, gamma, _, moving_mean, moving_variance = node.inputs[:5]
        return _bn_vjp(node, dy, x, gamma, moving_mean, moving_variance, node.output, training=False)


def _bn_vjp(node, dy, x, gamma, mean, spread, y, training):
    """Gradients of either forward op, in its input order. The fused ReLU masks ``dy``: with an addend first (that
    masked gradient is also the addend's), else inside ``BatchNormGrad``, which then reads ``y`` (its compiled kernels
    mask on the fly instead of writing and re-reading a masked copy)."""
    attrs = node.attrs
    has_addend = len(node.inputs) > (3 if training else 5)
    mask = ()
    if attrs["relu"] and has_addend:
        dy = apply(ReluGrad, (y, dy))
    elif attrs["relu"]:
        mask = (y,)
    dx, dgamma, dbeta = apply(BatchNormGrad, (x, dy, gamma, mean, spread) + mask, axis=attrs["axis"],
                              epsilon=attrs["epsilon"], training=training)
    stats = () if training else (None, None)
    return (dx, dgamma, dbeta) + stats + ((dy,) if has_addend else ())


class BatchNormGrad(Op):
    """``dx``, ``d gamma = sum(dy * xhat)`` and ``d beta = sum(dy)``. Input 4 is the ``inv_variance`` of the batch
    (``training``: the full gradient through the batch statistics) or the moving variance (the statistics are
    constants: ``dx = dy * gamma / sqrt(var + eps)``). An optional input 5, the output ``y`` of a
    ``batch_normalization_relu``, masks ``dy`` by ``y > 0`` first (the fused ReLU's gradient)."""
    prefix, api = "BatchNormGrad_", "batch_normalization_grad"
    outputs = ("dx", "gamma_diff", "beta_diff")

    @staticmethod
    def infer(x, dy, gamma, mean, spread, *relu_output, axis, epsilon, training):
        if relu_output and relu_output[0].shape != dy.shape:
            raise ShapeError(f"the ReLU output {relu_output[0].logical_blob_name} {relu_output[0].shape} must have "
                             f"the shape of dy {dy.shape}")
        return [spec(x.shape, x.dtype), spec(gamma.shape, gamma.dtype), spec(gamma.shape, gamma.dtype)]

    @staticmethod
    def forward(xp, x, dy, gamma, mean, spread, *relu_output, axis, epsilon, training):
        inv_std = spread if training else 1 / xp.sqrt(spread + epsilon)
        x3, dy3 = _channel_view(xp, x, axis), _channel_view(xp, dy, axis)
        if _jit_case(xp, x3):
            y3 = _channel_view(xp, relu_output[0], axis) if relu_output else None
            dx3, dgamma, dbeta = _jit_bn_grad(x3, dy3, y3, gamma, mean, inv_std, training)
            return dx3.reshape(x.shape), dgamma.astype(gamma.dtype), dbeta.astype(gamma.dtype)
        if relu_output:                     # one masking pass, as a ReluGrad node took
            dy3 = _channel_view(xp, ReluGrad.forward(xp, relu_output[0], dy), axis)
        n = x3.shape[0] * x3.shape[2]
        centre = _per_channel(mean, x.dtype)

        def sums(where):                  # one pass over memory for both sums, per region
            x_r, dy_r, centre_r = x3[where], dy3[where], centre[:, where[1]]
            blocks = _blocks(xp, x_r.shape)
            scratch = _scratch(xp, blocks, x_r)
            dbeta, dot = xp.zeros(x_r.shape[1], np.float64), xp.zeros(x_r.shape[1], np.float64)
            for rows, channels in blocks:
                block = dy_r[rows, channels]
                dbeta[channels] += _channel_sum(xp, block)
                centred = xp.subtract(x_r[rows, channels], centre_r[:, channels], out=_fit(scratch, block))
                dot[channels] += _channel_dot(xp, block, centred)
            return dbeta, dot

        dbeta, dot = xp.zeros(mean.shape, np.float64), xp.zeros(mean.shape, np.float64)
        for (_, channels), (part_dbeta, part_dot) in _in_regions(xp, sums, x3):
            dbeta[channels] += part_dbeta
            dot[channels] += part_dot
        dgamma = dot * inv_std
        k = gamma * inv_std
        dx3 = xp.empty_like(x3)
        # training: dx = k * (dy - mean(dy) - xhat * mean(dy * xhat)), xhat = (x - mean) * inv_std, taken as
        # dy * k + x * slope + (offset - mean * slope): four passes instead of five (as in ``_normalize``)
        slope = -k * inv_std * dgamma / n
        per = [_per_channel(v, x.dtype) for v in (k, slope, -k * dbeta / n - mean * slope)]

        def gradient(where):
            x_r, dy_r, dx_r = x3[where], dy3[where], dx3[where]
            per_r = [p[:, where[1]] for p in per]
            blocks = _blocks(xp, x_r.shape)
            scratch = _scratch(xp, blocks, x_r) if training else None
            for rows, channels in blocks:
                dx = xp.multiply(dy_r[rows, channels], per_r[0][:, channels], out=dx_r[rows, channels])
                if training:
                    dx += xp.multiply(x_r[rows, channels], per_r[1][:, channels], out=_fit(scratch, dx))
                    dx += per_r[2][:, channels]

        _in_regions(xp, gradient, x3)
        return dx3.reshape(x.shape), dgamma.astype(gamma.dtype), dbeta.astype(gamma.dtype)


class MovingAverageUpdate(Op):
    """``moving = momentum * moving + (1 - momentum) * batch``, in place, once per step: like an optimizer's update
    it changes its first input (a variable) and is kept although nothing reads it."""
    prefix, api = "MovingAverageUpdate_", "flow.layers.batch_normalization"
    outputs = ()
    side_effect = True
    updates_variable = averages_devices = True

    @staticmethod
    def infer(moving, batch, momentum):
        return []

    @staticmethod
    def forward(xp, moving, batch, momentum):
        moving *= moving.dtype.type(momentum)
        moving += batch * moving.dtype.type(1 - momentum)


class BatchNormParts(NamedTuple):
    """What a batch-normalization node reads and makes, for ``watch_health`` (``batch_norm_parts``)."""
    inputs: g.LazyTensor                  # the tensor normalized (a conv layer's pre-activation output)
    addend: g.LazyTensor | None           # the residual added before the ReLU (``batch_normalization_add_relu``)
    batch_mean: g.LazyTensor | None       # this call's batch statistics (unbiased variance); None when the moving
    batch_variance: g.LazyTensor | None   # statistics normalize (predict jobs, frozen layers)
    epsilon: float


def batch_norm_parts(node):
    """The ``BatchNormParts`` of a node made by ``flow.layers.batch_normalization*``, None for any other node."""
    if node.op is BatchNormTrain:
        addend = node.inputs[3] if len(node.inputs) > 3 else None
        return BatchNormParts(node.inputs[0], addend, node.outputs[3], node.outputs[4], node.attrs["epsilon"])
    if node.op is BatchNormInfer:
        addend = node.inputs[5] if len(node.inputs) > 5 else None
        return BatchNormParts(node.inputs[0], addend, None, None, node.attrs["epsilon"])
    return None


# ------------------------------------------------------------------------------------------------------ the layers

def _number(value, argument, api, low=None, high=None):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            (low is not None and not value >= low) or (high is not None and not value <= high):
        bounds = f" in [{low}, {high}]" if high is not None else f" >= {low}" if low is not None else ""
        raise ValueError(f"{api}: {argument} must be a number{bounds}, got {value!r}")
    return float(value)


def _batch_normalization(api, inputs, addend, relu, axis, momentum, epsilon, center, scale, beta_initializer,
                         gamma_initializer, beta_regularizer, gamma_regularizer, moving_mean_initializer,
                         moving_variance_initializer, trainable, training, name):
    x = as_tensor(inputs, argument="inputs")
    graph = g.current_graph(api)
    if x.ndim < 2:
        raise ValueError(f"{api}: inputs must have a batch axis and a channel axis, got shape {x.shape}")
    if x.dtype.kind != "f":
        raise TypeError(f"{api}: inputs must be floating point, got dtype {x.dtype}")
    try:
        axis = normalize_axis(axis, x.ndim)
    except ShapeError as e:
        raise ValueError(f"{api}: {e} for inputs of shape {x.shape}") from None
    momentum = _number(momentum, "momentum", api, 0.0, 1.0)
    epsilon = _number(epsilon, "epsilon", api, 0.0)
    if epsilon <= 0:
        raise ValueError(f"{api}: epsilon must be > 0 (it keeps 1 / sqrt(var + epsilon) finite), got {epsilon!r}")
    name = "BatchNorm" if name is None else name      # OneFlow's default, also for an explicit None
    if not isinstance(name, str) or not name:
        raise TypeError(f"{api}: name must be a non-empty string, got {name!r}")
    if addend is not None:
        addend = as_tensor(addend, argument="addend")
        if addend.shape != x.shape:
            raise ValueError(f"{api}: addend must have the shape of inputs {x.shape}, got {addend.shape}")
    # OneFlow: batch statistics only in a train job, and only when both flags say so
    training = bool(training) and bool(trainable) and graph.is_train
    params_dtype = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    channels = (x.shape[axis],)
    if g.scoped_name(f"{name}-moving_mean") in graph.variables:
        raise ValueError(f"{api}: a batch normalization named {name!r} already exists in this job; give each layer "
                         "its own name (OneFlow creates its variables with reuse=False)")

    def parameter(suffix, wanted, initializer, default, regularizer):
        if not wanted:
            return constant(1.0 if suffix == "gamma" else 0.0, dtype=params_dtype, shape=channels,
                            name=f"{name}-{suffix}")
        return get_variable(f"{name}-{suffix}", shape=channels, dtype=params_dtype,
                            initializer=initializer or default, regularizer=regularizer, trainable=trainable)

    beta = parameter("beta", center, beta_initializer, zeros_initializer(), beta_regularizer)
    gamma = parameter("gamma", scale, gamma_initializer, ones_initializer(), gamma_regularizer)
    moving_mean = get_variable(f"{name}-moving_mean", shape=channels, dtype=params_dtype,
                               initializer=moving_mean_initializer or zeros_initializer(), trainable=False)
    moving_variance = get_variable(f"{name}-moving_variance", shape=channels, dtype=params_dtype,
                                   initializer=moving_variance_initializer or ones_initializer(), trainable=False)
    extra = (addend,) if addend is not None else ()
    attrs = dict(axis=axis, epsilon=epsilon, relu=relu)
    if not training:
        return apply(BatchNormInfer, (x, gamma, beta, moving_mean, moving_variance) + extra, name, **attrs)
    y, _, _, batch_mean, batch_variance = apply(BatchNormTrain, (x, gamma, beta) + extra, name, **attrs)
    apply(MovingAverageUpdate, (moving_mean, batch_mean), f"{name}-moving_mean-update", momentum=momentum)
    apply(MovingAverageUpdate, (moving_variance, batch_variance), f"{name}-moving_variance-update",
          momentum=momentum)
    return y


def batch_normalization(inputs, axis=-1, momentum=0.99, epsilon=0.001, center=True, scale=True,
                        beta_initializer=None, gamma_initializer=None, beta_regularizer=None, gamma_regularizer=None,
                        moving_mean_initializer=None, moving_variance_initializer=None, trainable=True,
                        training=True, name="BatchNorm"):
    """``flow.layers.batch_normalization``: ``gamma * (x - mean) / sqrt(var + epsilon) + beta`` along ``axis``
    (1 for NCHW, 3 or -1 for NHWC), the statistics taken over every other axis (see the module docstring)."""
    return _batch_normalization("flow.layers.batch_normalization", inputs, None, False, axis, momentum, epsilon,
                                center, scale, beta_initializer, gamma_initializer, beta_regularizer,
                                gamma_regularizer, moving_mean_initializer, moving_variance_initializer, trainable,
                                training, name)


def batch_normalization_relu(inputs, axis=-1, momentum=0.99, epsilon=0.001, center=True, scale=True,
                             beta_initializer=None, gamma_initializer=None, beta_regularizer=None,
                             gamma_regularizer=None, moving_mean_initializer=None, moving_variance_initializer=None,
                             trainable=True, training=True, name="BatchNorm"):
    """``flow.layers.batch_normalization_relu``: ``relu(batch_normalization(inputs, ...))`` as one op."""
    return _batch_normalization("flow.layers.batch_normalization_relu", inputs, None, True, axis, momentum, epsilon,
                                center, scale, beta_initializer, gamma_initializer, beta_regularizer,
                                gamma_regularizer, moving_mean_initializer, moving_variance_initializer, trainable,
                                training, name)


def batch_normalization_add_relu(inputs, addend=None, axis=-1, momentum=0.99, epsilon=0.001, center=True, scale=True,
                                 beta_initializer=None, gamma_initializer=None, beta_regularizer=None,
                                 gamma_regularizer=None, moving_mean_initializer=None,
                                 moving_variance_initializer=None, trainable=True, training=True, name="BatchNorm"):
    """``flow.layers.batch_normalization_add_relu``: ``relu(batch_normalization(inputs, ...) + addend)`` as one op
    (``addend=None``: ``batch_normalization_relu``)."""
    return _batch_normalization("flow.layers.batch_normalization_add_relu", inputs, addend, True, axis, momentum,
                                epsilon, center, scale, beta_initializer, gamma_initializer, beta_regularizer,
                                gamma_regularizer, moving_mean_initializer, moving_variance_initializer, trainable,
                                training, name)


# -------------------------------------------------------------------------------------------------------- layer norm

def _normalize_rows(xp, x2, epsilon):
    """``(normalized, mean, inv_variance)`` of the rows of ``x2`` (float16 already widened): the normalized rows a
    new array, the statistics of length ``rows``."""
    n = x2.shape[1]
    if xp is np:
        # row sums as one BLAS product with ones, the centred sums of squares as row dots (both one pass, no
        # temporary), the per-row scalars in place: two passes over the block besides (subtract, scale), the
        # variance of the centred rows as before (no E[x^2] - E[x]^2 cancellation)
        mean = np.dot(x2, ones_of(n, x2.dtype.char))
        mean *= 1.0 / n
        centered = np.subtract(x2, mean[:, None])
        inv = row_dots(centered, centered)
        inv *= 1.0 / n
        inv += epsilon
        np.sqrt(inv, out=inv)
        np.divide(1.0, inv, out=inv)
        centered *= inv[:, None]
    else:
        mean = x2.mean(axis=1)
        centered = x2 - mean[:, None]
        inv = 1 / xp.sqrt((centered * centered).mean(axis=1) + centered.dtype.type(epsilon))
        centered *= inv[:, None]
    return centered, mean, inv


@jit.kernel(reduce=True)
def _layer_norm_affine_float32(x, gamma, beta, epsilon, out, mean, inv, normalized):
    """``LayerNormAffine``'s forward over the rows of a C-contiguous float32 ``(rows, n)`` block, gamma and beta of
    length ``n``, in one pass a row (the row stays in cache): the mean, the centred sum of squares (two sums a row,
    so no ``E[x^2] - E[x]^2`` cancellation, as ``_normalize_rows``), then ``normalized = (x - mean) * inv`` and
    ``out = normalized * gamma + beta``. Sums vectorise (reassociated, as NumPy's and BLAS's are)."""
    rows, n = x.shape
    scale = np.float32(1) / np.float32(n)
    for r in range(rows):
        total = np.float32(0)
        for j in range(n):
            total += x[r, j]
        mu = total * scale
        squares = np.float32(0)
        for j in range(n):
            centred = x[r, j] - mu
            squares += centred * centred
        k = np.float32(1) / math.sqrt(squares * scale + epsilon)
        mean[r] = mu
        inv[r] = k
        for j in range(n):
            y = (x[r, j] - mu) * k
            normalized[r, j] = y
            out[r, j] = y * gamma[j] + beta[j]


@jit.kernel(reduce=True)
def _layer_norm_dx_float32(y, inv, dy, gamma, dx):
    """``_layer_norm_dx`` with gamma of the row length over C-contiguous float32 rows, one pass a row: ``dx = inv g -
    inv mean(g) - y inv mean(g y)``, ``g = dy gamma``."""
    rows, n = y.shape
    scale = np.float32(1) / np.float32(n)
    for r in range(rows):
        sum_g = np.float32(0)
        sum_gy = np.float32(0)
        for j in range(n):
            g = dy[r, j] * gamma[j]
            sum_g += g
            sum_gy += g * y[r, j]
        k = inv[r]
        shift = sum_g * (k * scale)
        slope = sum_gy * (k * scale)
        for j in range(n):
            dx[r, j] = dy[r, j] * gamma[j] * k - shift - y[r, j] * slope


@jit.kernel
def _layer_norm_param_grads_float32(y, dy, dgamma, dbeta):
    """Column sums of ``dy * y`` (dgamma) and of ``dy`` (dbeta) of C-contiguous float32 rows, in one pass: each row
    added to the two accumulators (vectorised along the row; every column summed in row order)."""
    rows, n = dy.shape
    for j in range(n):
        dgamma[j] = np.float32(0)
        dbeta[j] = np.float32(0)
    for r in range(rows):
        for j in range(n):
            d = dy[r, j]
            dgamma[j] += d * y[r, j]
            dbeta[j] += d


def _compiled_rows(*arrays):
    """Whether compiled layer-norm kernels can take ``arrays``: non-empty NumPy float32 (then made C-contiguous;
    empty ones keep the NumPy path's behaviour)."""
    return jit.takes(*arrays) and all(a.size for a in arrays)


def _widened_rows(x, rows):
    """``x`` as ``rows`` rows, float16 widened to float32 (layer norms compute in float32 at least)."""
    x2 = x.reshape(rows, -1)
    return x2.astype(np.float32) if x2.dtype == np.float16 else x2


class LayerNorm(Op):
    """``(x - mean) / sqrt(var + epsilon)`` over the axes from ``begin_norm_axis`` on (the biased variance, as
    PyTorch's ``LayerNorm``); also outputs ``mean`` and ``inv_variance`` (``1 / sqrt(var + epsilon)``) of shape
    ``x.shape[:begin_norm_axis]``, as OneFlow's ``layer_norm`` op does. float16 inputs are normalized in float32.
    The op of a ``layer_norm`` without gamma and beta; with them, ``LayerNormAffine``."""
    prefix, api = "LayerNorm_", "flow.layers.layer_norm"
    outputs = ("out", "mean", "inv_variance")

    @staticmethod
    def infer(x, begin_norm_axis, epsilon):
        if x.dtype.kind != "f":
            raise ShapeError(f"expects a floating-point tensor, got {x.logical_blob_name} of dtype {x.dtype}")
        stats = x.shape[:begin_norm_axis]
        return [spec(x.shape, x.dtype), spec(stats, x.dtype), spec(stats, x.dtype)]

    @staticmethod
    def forward(xp, x, begin_norm_axis, epsilon):
        stats_shape = x.shape[:begin_norm_axis]
        normalized, mean, inv = _normalize_rows(xp, _widened_rows(x, math.prod(stats_shape)), epsilon)
        out = normalized.reshape(x.shape).astype(x.dtype, copy=False)
        return (out, mean.reshape(stats_shape).astype(x.dtype, copy=False),
                inv.reshape(stats_shape).astype(x.dtype, copy=False))

    @staticmethod
    def vjp(node, dy, dmean=None, dinv=None):
        if dmean is not None or dinv is not None:
            raise ShapeError("the mean and inv_variance outputs of layer_norm are not differentiable")
        return (apply(LayerNormGrad, (node.outputs[0], node.outputs[2], dy)),)


class LayerNormGrad(Op):
    """``dx = inv * (g - mean(g) - y * mean(g * y))`` over the normalized axes, ``y`` the normalized output and
    ``g = dy * gamma`` (``dy`` itself without gamma, a fourth input of shape ``dy.shape[begin_params_axis:]``)."""
    prefix, api = "LayerNormGrad_", "layer_norm_grad"

    @staticmethod
    def infer(y, inv, dy, *gamma, begin_params_axis=None):
        return spec(dy.shape, dy.dtype)

    @staticmethod
    def forward(xp, y, inv, dy, *gamma, begin_params_axis=None):
        rows = inv.size
        if gamma and gamma[0].size * rows == dy.size and _compiled_rows(y, inv, dy, gamma[0]):
            # gamma over the normalized axes: the compiled kernel, one pass a row
            y2, dy2 = (np.ascontiguousarray(a).reshape(rows, -1) for a in (y, dy))
            dx = np.empty_like(dy2)
            _layer_norm_dx_float32(y2, np.ascontiguousarray(inv).reshape(rows), dy2,
                                   np.ascontiguousarray(gamma[0]).reshape(-1), dx)
            return dx.reshape(dy.shape)
        y2, dy2 = _widened_rows(y, rows), _widened_rows(dy, rows)
        gamma_rows = None
        if gamma:
            size = math.prod(dy.shape[begin_params_axis:])
            gamma = gamma[0].reshape(size).astype(dy2.dtype, copy=False)
            if size != dy2.shape[1]:
                gamma_rows = dy2.reshape(-1, size)          # a view: rows of gamma's size
        else:
            gamma = None
        dx = _layer_norm_dx(xp, y2, inv, dy2, gamma, gamma_rows)
        return dx.reshape(dy.shape).astype(dy.dtype, copy=False)


def _layer_norm_dx(xp, y2, inv, dy2, gamma, gamma_rows):
    """``inv * (g - mean(g) - y * mean(g * y))`` per row, ``g = dy * gamma`` (``dy`` without gamma).

    ``gamma`` is None, or gamma as a vector of the row length (``gamma_rows`` None), or gamma in the shape of
    ``gamma_rows``, a view of ``dy`` in rows of gamma's size (parameters over fewer or more axes than normalized)."""
    rows, n = y2.shape
    inv = inv.reshape(rows).astype(dy2.dtype, copy=False)
    if gamma is not None:
        # g in a new buffer, then dx in place on it
        g = xp.multiply(gamma_rows, gamma).reshape(rows, n) if gamma_rows is not None else xp.multiply(dy2, gamma)
    else:
        g = None
    source = dy2 if g is None else g
    if xp is np:
        # both row reductions one pass each without a temporary (a BLAS product with ones, row dots), inv folded
        # into the per-row scalars: dx = inv * g - (inv * mean(g)) - y * (inv * mean(g * y))
        scale = inv * (1.0 / n)
        shift = np.dot(source, ones_of(n, source.dtype.char))
        shift *= scale
        slope = row_dots(source, y2)
        slope *= scale
        if g is None:
            dx = np.multiply(dy2, inv[:, None])
        else:
            dx = g
            dx *= inv[:, None]
        dx -= shift[:, None]
        dx -= np.multiply(y2, slope[:, None])
    else:
        dx = source - source.mean(axis=1, keepdims=True)
        dx -= y2 * ((source * y2).sum(axis=1)[:, None] / n)
        dx *= inv[:, None]
    return dx


class LayerNormAffine(Op):
    """A ``layer_norm`` with gamma and/or beta in one op: ``out = normalized * gamma + beta``, ``normalized`` as
    ``LayerNorm``'s ``out`` (kept as output ``normalized`` for the gradient), gamma and beta of shape
    ``x.shape[begin_params_axis:]``. Inputs ``x``, then gamma when ``scale``, then beta when ``center`` (OneFlow's
    ``layer_norm`` op takes them the same way and applies them inside). Its gradient: ``LayerNormGrad`` with gamma
    (dx) and ``LayerNormParamGrad`` (dgamma, dbeta). On NumPy in float32 with gamma and beta over the normalized
    axes, and ``runtime.jit`` on, the three run as compiled loops, one pass a row (``_layer_norm_affine_float32``,
    ``_layer_norm_dx_float32``, ``_layer_norm_param_grads_float32``; BERT's (256, 128) block: forward 44 -> 12 us, dx
    46 -> 9 us, dgamma and dbeta 12 -> 7 us)."""
    prefix, api = "LayerNorm_", "flow.layers.layer_norm"
    outputs = ("out", "mean", "inv_variance", "normalized")

    @staticmethod
    def infer(x, *params, begin_norm_axis, begin_params_axis, epsilon, scale, center):
        if x.dtype.kind != "f":
            raise ShapeError(f"expects a floating-point tensor, got {x.logical_blob_name} of dtype {x.dtype}")
        if len(params) != int(scale) + int(center) or not params:
            raise ShapeError(f"expects gamma (scale={scale}) and beta (center={center}), got {len(params)} "
                             "parameter tensors")
        for p in params:
            if p.shape != x.shape[begin_params_axis:] or p.dtype != x.dtype:
                raise ShapeError(f"expects parameters of shape {x.shape[begin_params_axis:]} and dtype {x.dtype}, "
                                 f"got {p.logical_blob_name} of shape {p.shape} and dtype {p.dtype}")
        stats = x.shape[:begin_norm_axis]
        return [spec(x.shape, x.dtype), spec(stats, x.dtype), spec(stats, x.dtype), spec(x.shape, x.dtype)]

    @staticmethod
    def forward(xp, x, *params, begin_norm_axis, begin_params_axis, epsilon, scale, center):
        stats_shape = x.shape[:begin_norm_axis]
        if scale and center and begin_params_axis == begin_norm_axis and _compiled_rows(x, *params):
            rows = math.prod(stats_shape)
            x2 = np.ascontiguousarray(x).reshape(rows, -1)
            out, normalized = np.empty_like(x2), np.empty_like(x2)
            mean, inv = np.empty(rows, np.float32), np.empty(rows, np.float32)
            gamma, beta = (np.ascontiguousarray(p).reshape(-1) for p in params)
            _layer_norm_affine_float32(x2, gamma, beta, np.float32(epsilon), out, mean, inv, normalized)
            return (out.reshape(x.shape), mean.reshape(stats_shape), inv.reshape(stats_shape),
                    normalized.reshape(x.shape))
        normalized, mean, inv = _normalize_rows(xp, _widened_rows(x, math.prod(stats_shape)), epsilon)
        size = math.prod(x.shape[begin_params_axis:])
        by_params = normalized.reshape(-1, size)          # a view: rows of gamma's size
        gamma = params[0].reshape(size).astype(normalized.dtype, copy=False) if scale else None
        beta = params[-1].reshape(size).astype(normalized.dtype, copy=False) if center else None
        # the affine part in two passes into one new buffer (the normalized rows stay for the gradient)
        if gamma is not None:
            out = xp.multiply(by_params, gamma)
            if beta is not None:
                out += beta
        else:
            out = xp.add(by_params, beta)
        cast = x.dtype
        return (out.reshape(x.shape).astype(cast, copy=False), mean.reshape(stats_shape).astype(cast, copy=False),
                inv.reshape(stats_shape).astype(cast, copy=False),
                normalized.reshape(x.shape).astype(cast, copy=False))

    @staticmethod
    def vjp(node, dy, dmean=None, dinv=None, dnormalized=None):
        if dmean is not None or dinv is not None or dnormalized is not None:
            raise ShapeError("only the first output of layer_norm is differentiable")
        params = node.inputs[1:]
        scale, center = node.attrs["scale"], node.attrs["center"]
        params_axis = node.attrs["begin_params_axis"]
        normalized, inv = node.outputs[3], node.outputs[2]
        dx = apply(LayerNormGrad, (normalized, inv, dy) + ((params[0],) if scale else ()),
                   begin_params_axis=params_axis)
        # the parameters' gradients in an op of their own (OneFlow's layer_norm_param_grad): nothing but their
        # updates reads them, so a second thread can take it while the first carries dx down the network
        param_grads = apply(_PARAM_GRADS[scale, center], (normalized, dy), begin_params_axis=params_axis)
        return (dx,) + (param_grads if isinstance(param_grads, tuple) else (param_grads,))


class LayerNormParamGrad(Op):
    """The gradients of ``LayerNormAffine``'s gamma and beta: ``dgamma = sum(dy * normalized)`` when there is gamma,
    ``dbeta = sum(dy)`` when there is beta, the sums over the axes before ``begin_params_axis``. The subclasses below
    name the outputs of the other combinations."""
    prefix, api = "LayerNormParamGrad_", "layer_norm_param_grad"
    outputs = ("dgamma", "dbeta")
    has_gamma = has_beta = True

    @classmethod
    def infer(cls, y, dy, begin_params_axis):
        params = spec(dy.shape[begin_params_axis:], dy.dtype)
        count = int(cls.has_gamma) + int(cls.has_beta)
        return params if count == 1 else [params] * count

    @classmethod
    def forward(cls, xp, y, dy, begin_params_axis):
        params_shape = dy.shape[begin_params_axis:]
        size = math.prod(params_shape)
        if _compiled_rows(y, dy):
            dgamma, dbeta = np.empty(params_shape, np.float32), np.empty(params_shape, np.float32)
            _layer_norm_param_grads_float32(np.ascontiguousarray(y).reshape(-1, size),
                                            np.ascontiguousarray(dy).reshape(-1, size), dgamma.reshape(-1),
                                            dbeta.reshape(-1))
            grads = [dgamma] * cls.has_gamma + [dbeta] * cls.has_beta
            return grads[0] if len(grads) == 1 else tuple(grads)
        dy_params = dy.reshape(-1, size)                   # views: rows of gamma's size
        if dy_params.dtype == np.float16:
            dy_params = dy_params.astype(np.float32)
        grads = []
        if cls.has_gamma:
            product = xp.multiply(dy_params, y.reshape(-1, size).astype(dy_params.dtype, copy=False))
            grads.append(_column_sums(xp, product))
        if cls.has_beta:
            grads.append(_column_sums(xp, dy_params))
        grads = [gr.reshape(params_shape).astype(dy.dtype, copy=False) for gr in grads]
        return grads[0] if len(grads) == 1 else tuple(grads)


class _LayerNormGammaGrad(LayerNormParamGrad):
    outputs = ("dgamma",)
    has_beta = False


class _LayerNormBetaGrad(LayerNormParamGrad):
    outputs = ("dbeta",)
    has_gamma = False


_PARAM_GRADS = {(True, True): LayerNormParamGrad, (True, False): _LayerNormGammaGrad,
                (False, True): _LayerNormBetaGrad}


def _column_sums(xp, rows):
    """Sums of the columns of a 2-D array: on NumPy one BLAS product with ones where ``math``'s leading-axis sum
    takes it (one pass, no temporary)."""
    if xp is np:
        total = host_leading_sum(rows, 1, None)
        if total is not None:
            return total
    return rows.sum(axis=0)


def layer_norm(inputs, center=True, scale=True, trainable=True, begin_norm_axis=1, begin_params_axis=-1,
               epsilon=1e-5, name="LayerNorm"):
    """``flow.layers.layer_norm``: normalizes over the axes from ``begin_norm_axis`` on, then scales by
    ``<name>-gamma`` (ones) and shifts by ``<name>-beta`` (zeros), of shape ``inputs.shape[begin_params_axis:]``
    (broadcast over the axes before). ``center`` / ``scale`` False leave out beta / gamma; without both nothing is
    trainable. With ``begin_norm_axis = begin_params_axis = -1`` it equals PyTorch's ``LayerNorm(last_dim)``. The
    op is named ``<name>``: ``LayerNormAffine`` with gamma and beta applied inside (outputs ``out``, ``mean``,
    ``inv_variance``, ``normalized``), or ``LayerNorm`` without either."""
    api = LayerNorm.api
    x = as_tensor(inputs, argument="inputs")
    if name is None:
        name = "LayerNorm"
    if not isinstance(name, str) or not name:
        raise TypeError(f"{api}: name must be a non-empty string, got {name!r}")
    try:
        norm_axis = normalize_axis(begin_norm_axis, x.ndim, "begin_norm_axis")
        params_axis = normalize_axis(begin_params_axis, x.ndim, "begin_params_axis")
    except ShapeError as e:
        raise ValueError(f"{api}: {e} for inputs {x.shape}") from None
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
        raise ValueError(f"{api}: epsilon must be a positive number, got {epsilon!r}")
    trainable = bool(trainable) and bool(center or scale)
    param_shape = x.shape[params_axis:]
    with g.name_scope(name):
        gamma = get_variable("gamma", shape=param_shape, dtype=x.dtype, initializer=ones_initializer(),
                             trainable=trainable) if scale else None
        beta = get_variable("beta", shape=param_shape, dtype=x.dtype, initializer=zeros_initializer(),
                            trainable=trainable) if center else None
    if gamma is None and beta is None:
        return apply(LayerNorm, (x,), name, begin_norm_axis=norm_axis, epsilon=float(epsilon))[0]
    params = tuple(p for p in (gamma, beta) if p is not None)
    return apply(LayerNormAffine, (x,) + params, name, begin_norm_axis=norm_axis, begin_params_axis=params_axis,
                 epsilon=float(epsilon), scale=gamma is not None, center=beta is not None)[0]
