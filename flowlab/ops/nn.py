"""``flow.nn``: activations, bias, softmax, cross-entropy losses and dropout."""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..errors import ShapeError
from ..runtime import host_threads, jit
from . import Op, apply, as_tensor, normalize_axis, spec
from . import cupy_elementwise, shape_error
from .math import OutputGrad, multiply, negative, reduce_sum, sum_to_shape
from .stats import (COMPILED_SPLIT_ELEMENTS, ActivationStats, activation_vector, activation_vector_from_sums, ones_of,
                    row_dots, unit_row_sums)


class Relu(Op):
    prefix, api, c_expr = "Relu_", "flow.nn.relu", "max({0}, (T)0)"
    supports_out = True
    inplace = True
    nonnegative = True

    @staticmethod
    def infer(x):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, out=None):
        if xp is np and x.dtype == np.float32 and x.flags.c_contiguous and jit.enabled() and \
                (out is None or (out.dtype == x.dtype and out.shape == x.shape and out.flags.c_contiguous)):
            # one compiled pass: NumPy's clip cost ~2.5 us of call beside the pass (3.9 us at 100 x 128, against
            # 1.2; 113 us at 1M elements, against 94 on one thread)
            out = np.empty_like(x) if out is None else out
            flat_x, flat_out = x.reshape(-1), out.reshape(-1)
            inplace = out is x          # the plan hands the ReLU its input's buffer when the input dies here
            if x.size < host_threads.SPLIT_COMPILED:
                _relu_float32.ready()(flat_x, flat_out, inplace)
            else:
                host_threads.each(lambda part: _relu_float32(flat_x[part], flat_out[part], inplace), x.size, 4096,
                                  work=x.size)
            return out
        if xp is np and x.dtype.kind == "f":
            # NumPy's clip ufunc runs this twice as fast as maximum here (NaN stays NaN, -0.0 stays -0.0)
            return np.clip(x, 0, np.inf, out=out)
        return xp.maximum(x, x.dtype.type(0), out=out)

    @staticmethod
    def vjp(node, dy):
        return (apply(ReluGrad, (node.output, dy)),)


@jit.kernel
def _relu_float32(x, out, inplace):
    """``max(x, 0)`` of flat float32 arrays as ``Relu``'s clip gives it: NaN stays NaN, -0.0 stays -0.0.
    ``inplace``: ``out`` is ``x``, and the loop reads and writes that one array (two that may overlap would keep it
    from vectorising: 3.8 us against 1.2 at 100 x 128)."""
    zero = np.float32(0)
    if inplace:
        for i in range(x.size):
            v = x[i]
            x[i] = zero if v < zero else v
    else:
        for i in range(x.size):
            v = x[i]
            out[i] = zero if v < zero else v


class ReluGrad(OutputGrad):
    prefix, api, c_expr = "ReluGrad_", "relu_grad", "({0} > (T)0 ? {1} : (T)0)"
    inplace = True

    @staticmethod
    def forward(xp, y, dy, out=None):
        if xp is not np and y.dtype == dy.dtype and y.dtype.kind == "f":     # one pass instead of two (mask, product)
            kernel = _cupy_kernel(xp, "relu_grad")
            return kernel(y, dy) if out is None else kernel(y, dy, out)
        flat = xp is np and y.shape == dy.shape and y.flags.c_contiguous and dy.flags.c_contiguous and \
            (out is None or (out.shape == y.shape and out.flags.c_contiguous))
        compiled = flat and y.size >= _RELU_GRAD_COMPILED_FROM and y.dtype == dy.dtype == np.float32 and \
            jit.enabled()
        if flat and (compiled or host_threads.width() > 1):
            out = np.empty(y.shape, dy.dtype) if out is None else out
            flat_y, flat_dy, flat_out = y.reshape(-1), dy.reshape(-1), out.reshape(-1)   # blocks on host threads
            if compiled:            # one pass instead of two (mask, product)
                host_threads.each(lambda part: _relu_grad_float32(flat_y[part], flat_dy[part], flat_out[part]),
                                  y.size, 4096, work=host_threads.compiled_work(y.size))
            else:
                host_threads.each(lambda part: np.multiply(flat_dy[part], flat_y[part] > 0, out=flat_out[part]),
                                  y.size, 4096, work=y.size)
            return out
        return xp.multiply(dy, y > 0, out=out)


_RELU_GRAD_COMPILED_FROM = 4096   # elements: below, NumPy's two passes cost no more than a compiled call (~3.5 us)


@jit.kernel
def _relu_grad_float32(y, dy, out):
    """``dy * (y > 0)`` of flat float32 arrays (a product, so a NaN or inf ``dy`` gives NaN where ``y <= 0``, as
    NumPy's kernel does); ``out`` may be ``dy``."""
    one, zero = np.float32(1), np.float32(0)
    for i in range(y.size):
        out[i] = dy[i] * (one if y[i] > zero else zero)


class ReluActivationStats(Op):
    """A ReLU and ``watch_health``'s ``activation_vector`` of its output, in one pass over the layer's output
    instead of two (the statistics' pass then streams the output back from cache; at a 100 x 128 output the pair
    cost ~15 us a step). Never traced: the compiler's ``fuse_activation_stats`` pass makes it from a ``Relu`` and
    the ``ActivationStats`` reading its output (NumPy, compiled kernels on). Outputs ``(out, stats)``: the ReLU's
    output (``out=`` may be the input's buffer, as ``Relu``'s) and the 7 statistics, a new float64 array a call.
    The compiled pass takes float32 outputs with their units last (a dense layer's) below
    ``stats.COMPILED_SPLIT_ELEMENTS``; anything else runs the twins, ``Relu`` then ``ActivationStats``."""
    prefix, api = "Relu_", "flow.nn.relu"
    outputs = ("out", "stats")
    supports_out = True
    inplace = True
    nonnegative = True

    @staticmethod
    def infer(x, unit_axis, scratch):
        return spec(x.shape, x.dtype), spec((7,), np.float64)

    @staticmethod
    def forward(xp, x, unit_axis, scratch, out=None):
        if xp is np and jit.enabled() and x.dtype == np.float32 and x.ndim and unit_axis % x.ndim == x.ndim - 1 \
                and x.flags.c_contiguous and x.size < COMPILED_SPLIT_ELEMENTS and x.size and \
                (out is None or out.flags.c_contiguous):
            y = np.empty_like(x) if out is None else out
            units = x.shape[-1]
            vector = np.empty(7)
            rows = (x, y) if x.ndim == 2 else (x.reshape(-1, units), y.reshape(-1, units))
            # ``out is x``: the plan hands the ReLU its input's buffer when the input dies here (Relu.inplace)
            squares = _relu_activation_float32.ready()(*rows, out is x, np.zeros(units), vector)
            if squares - squares == 0:
                return y, vector
            return y, activation_vector(np, y, unit_axis, True)      # NaN or Inf: the twin counts them
        y = Relu.forward(xp, x, out=out)
        return y, ActivationStats.forward(xp, y, unit_axis, True, scratch)


@jit.kernel(reduce=True)
def _relu_activation_float32(x, y, inplace, unit_abs, out):
    """``y = max(x, 0)`` (NaN stays NaN, -0.0 stays -0.0, as ``Relu``'s clip) over C-contiguous float32 rows of
    shape ``(outer, units)`` (``inplace``: ``y`` is ``x``), and ``stats._activation_float32``'s sums of ``y`` in the
    same pass, a row at a time while it is in L1: each unit's sum of ``|y|`` added into ``unit_abs`` (float64),
    ``activation_vector`` of ``y`` written into ``out`` (float64, 7 long) when every element is finite. Returns the
    sum of squares (not finite: NaN or Inf, and nothing is written into ``out``)."""
    outer, units = x.shape
    top = np.int32(0)                   # |y|'s bits: non-negative floats order as their bits do
    nonzero = 0
    total, squares = 0.0, 0.0
    bits = y.view(np.int32)
    for o in range(outer):
        row, row_y, row_bits = x[o], y[o], bits[o]
        # the ReLU's loop reads one array when in place: two that may overlap would keep it from vectorising
        if inplace:
            for u in range(units):
                value = row_y[u]
                row_y[u] = np.float32(0.0) if value < np.float32(0.0) else value
        else:
            for u in range(units):
                value = row[u]
                row_y[u] = np.float32(0.0) if value < np.float32(0.0) else value
        top, nonzero, total, squares = unit_row_sums(row_y, row_bits, unit_abs, top, nonzero, total, squares)
    if squares - squares != 0:
        return squares
    activation_vector_from_sums(y, unit_abs, jit.float32_from_bits(top), nonzero, total, squares, out)
    return squares


def relu(x, name=None):
    """``flow.nn.relu``: max(x, 0)."""
    return apply(Relu, (as_tensor(x, argument="x"),), name)


class LeakyRelu(Op):
    """``x`` where ``x > 0``, else ``alpha * x`` (OneFlow's kernel: NaN stays NaN)."""
    prefix, api, c_expr = "LeakyRelu_", "flow.nn.leaky_relu", "({0} > (T)0 ? {0} : {0} * (T){alpha})"
    supports_out = True
    inplace = True

    @classmethod
    def is_nonnegative(cls, node):
        return node.attrs["alpha"] == 0

    @staticmethod
    def infer(x, alpha):
        if x.dtype.kind != "f":
            raise ShapeError(f"expects a floating-point tensor, got {x.logical_blob_name} of dtype {x.dtype}")
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, alpha, out=None):
        slope = xp.where(x > 0, x.dtype.type(1), x.dtype.type(alpha))     # read before out (maybe x) is written
        return xp.multiply(x, slope, out=out)

    @staticmethod
    def vjp(node, dy):
        return (apply(LeakyReluGrad, (node.inputs[0], dy), alpha=node.attrs["alpha"]),)


class LeakyReluGrad(Op):
    """``dy`` where ``x > 0``, else ``alpha * dy``."""
    prefix, api, c_expr = "LeakyReluGrad_", "leaky_relu_grad", "({0} > (T)0 ? {1} : {1} * (T){alpha})"
    supports_out = True

    @staticmethod
    def infer(x, dy, alpha):
        return spec(dy.shape, dy.dtype)

    @staticmethod
    def forward(xp, x, dy, alpha, out=None):
        return xp.multiply(dy, xp.where(x > 0, dy.dtype.type(1), dy.dtype.type(alpha)), out=out)


def leaky_relu(x, alpha=0.2, name=None):
    """``flow.nn.leaky_relu``: ``x`` for ``x > 0``, ``alpha * x`` otherwise (OneFlow's default ``alpha`` 0.2)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) or \
            not np.isfinite(alpha):
        raise ValueError(f"flow.nn.leaky_relu: alpha must be a finite number, got {alpha!r}")
    return apply(LeakyRelu, (as_tensor(x, argument="x"),), name, alpha=float(alpha))


# ----------------------------------------------------------------------------------------------------------- bias_add

# elements: below, NumPy's add costs no more than a compiled call (40 x 128: ~3 us either way)
_BIAS_COMPILED_FROM = 8192


@jit.kernel
def _bias_add_rows_float32(x, b, out, inplace):
    """``out = x + b`` over float32 rows ``(rows, units)`` (``b``: ``(units,)``); ``inplace``: ``out`` is ``x``,
    added to in place (a loop reading and writing two arrays that overlap does not vectorise: 256 x 128 in place
    took 11 us, against 4 into another array)."""
    rows, units = x.shape
    if inplace:
        for r in range(rows):
            for c in range(units):
                x[r, c] += b[c]
    else:
        for r in range(rows):
            for c in range(units):
                out[r, c] = x[r, c] + b[c]


class BiasAdd(Op):
    prefix, api = "BiasAdd_", "flow.nn.bias_add"
    supports_out = True
    inplace = True

    @staticmethod
    def infer(x, b, axis):
        if b.ndim != 1 or b.shape[0] != x.shape[axis]:
            raise ShapeError(f"bias {b.logical_blob_name} must have shape ({x.shape[axis]},) to match axis {axis} "
                             f"of {x.logical_blob_name} {x.shape}, got {b.shape}")
        if b.dtype != x.dtype:
            raise ShapeError(f"bias dtype {b.dtype} differs from input dtype {x.dtype}")
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, b, axis, out=None):
        if xp is np and x.dtype == b.dtype == np.float32 and axis == x.ndim - 1 and x.size >= _BIAS_COMPILED_FROM \
                and x.flags.c_contiguous and (out is None or out is x or (out.flags.c_contiguous and
                                                                          not np.may_share_memory(x, out))) \
                and jit.enabled():
            # a dense layer's bias: NumPy's broadcast add walks each 128-512 long row as its own inner loop (an
            # ``out`` overlapping ``x`` other than as ``x`` itself takes NumPy's add, which buffers what overlaps)
            out = np.empty(x.shape, np.float32) if out is None else out
            rows, target = x.reshape(-1, b.size), out.reshape(-1, b.size)
            if host_threads.compiled_work(x.size):
                host_threads.each(lambda part: _bias_add_rows_float32(rows[part], b, target[part], out is x),
                                  rows.shape[0], 1, work=x.size)
            else:                   # directly: the split's parts and closures cost ~2 us, a third of the add
                _bias_add_rows_float32(rows, b, target, out is x)
            return out
        return xp.add(x, b.reshape(b.shape + (1,) * (x.ndim - axis - 1)), out=out)

    @staticmethod
    def vjp(node, dy):
        x, b = node.inputs
        axis = node.attrs["axis"]
        return dy, reduce_sum(dy, axis=[a for a in range(x.ndim) if a != axis])


def bias_add(value, bias, data_format=None, name=None):
    """``flow.nn.bias_add``: the bias runs along axis 1 (``NC...``, OneFlow's default) or the last axis (``N...C``)."""
    value, bias = as_tensor(value, argument="value"), as_tensor(bias, argument="bias")
    if data_format is None or data_format.startswith("NC"):
        axis = 1 if value.ndim > 1 else 0
    elif data_format.startswith("N") and data_format.endswith("C"):
        axis = value.ndim - 1
    else:
        raise ValueError(f"flow.nn.bias_add: data_format must be None, 'NC...' or 'N...C', got {data_format!r}")
    return apply(BiasAdd, (value, bias), name, axis=axis)


# ------------------------------------------------------------------------------------------------------------ softmax

# rows up to this long have their maxima taken down a transposed copy: NumPy's max over short contiguous rows costs
# ~2 ns an element (a (512, 32) block of attention scores: 29 us), the copy and a reduction over the leading axis
# (one vectorized pass per column of the copy) 13 us
_SHORT_ROW = 64


def _row_max(rows):
    """Per-row maxima of a 2-D host array (NaN where a row has one, as ``max``)."""
    if rows.shape[1] > _SHORT_ROW or rows.shape[0] < 2 * rows.shape[1]:
        return np.maximum.reduce(rows, axis=1)
    return np.maximum.reduce(np.ascontiguousarray(rows.T), axis=0)


@jit.kernel(reduce=True, inline=True)
def _softmax_row_float32(x, out):
    """``_softmax`` of one float32 row into ``out`` (in cache): its maximum, ``e = exp(x - max)`` and ``e / sum(e)``
    (a product with the sum's reciprocal). Returns ``(max, sum)``. A NaN needs no test in the maximum: ``exp(NaN -
    max)`` makes the sum NaN, so the whole row is NaN, as in the NumPy twin (and a row holding +inf is NaN through
    ``inf - inf``, as there)."""
    top = x[0]
    for j in range(1, x.size):
        v = x[j]
        top = v if v > top else top
    total = np.float32(0)
    for j in range(x.size):
        e = jit.exp32(x[j] - top)
        out[j] = e
        total += e
    scale = np.float32(1) / total
    for j in range(x.size):
        out[j] *= scale
    return top, total


@jit.kernel(reduce=True)
def _softmax_rows_float32(x, out):
    """``_softmax`` over the rows of a C-contiguous float32 ``(rows, n)`` block, a row at a time."""
    for r in range(x.shape[0]):
        _softmax_row_float32(x[r], out[r])


@jit.kernel(reduce=True)
def _softmax_grad_rows_float32(y, dy, dx):
    """``SoftmaxGrad`` over C-contiguous float32 rows: ``dx = y (dy - sum(dy y))``, one row at a time."""
    rows, n = y.shape
    for r in range(rows):
        dot = np.float32(0)
        for j in range(n):
            dot += dy[r, j] * y[r, j]
        for j in range(n):
            dx[r, j] = (dy[r, j] - dot) * y[r, j]


def _softmax(xp, x, axis):
    if xp is np and axis == x.ndim - 1 and x.dtype == np.float32 and x.size and jit.enabled():
        rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
        out = np.empty_like(rows)
        _softmax_rows_float32(rows, out)
        return out.reshape(x.shape)
    if xp is np and axis == x.ndim - 1 and x.dtype.char in "fd" and x.size:
        # over the last axis of a host array: the row maxima as above, the row sums as one BLAS product with ones
        # (np.sum over short rows is ~8x slower), the same elementwise passes
        rows = x.reshape(-1, x.shape[-1])
        z = np.subtract(rows, _row_max(rows)[:, None])
        np.exp(z, out=z)
        z /= np.dot(z, ones_of(z.shape[1], z.dtype.char))[:, None]
        return z.reshape(x.shape)
    z = x - x.max(axis=axis, keepdims=True)
    xp.exp(z, out=z)
    z /= z.sum(axis=axis, keepdims=True)
    return z


class Softmax(Op):
    prefix, api = "Softmax_", "flow.nn.softmax"
    nonnegative = True

    @staticmethod
    def distribution_axis(node):
        return node.attrs["axis"]

    @staticmethod
    def infer(x, axis):
        if x.dtype.kind != "f":
            raise ShapeError(f"expects floating-point logits, got {x.dtype}")
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, axis):
        return _softmax(xp, x, axis)

    @staticmethod
    def vjp(node, dy):
        return (apply(SoftmaxGrad, (node.output, dy), axis=node.attrs["axis"]),)


class SoftmaxGrad(Op):
    prefix, api = "SoftmaxGrad_", "softmax_grad"

    @staticmethod
    def infer(y, dy, axis):
        return spec(dy.shape, dy.dtype)

    @staticmethod
    def forward(xp, y, dy, axis):
        if xp is np and axis == y.ndim - 1 and y.dtype.char in "fd" and dy.dtype == y.dtype and dy.shape == y.shape \
                and y.size:
            if y.dtype == np.float32 and jit.enabled():
                y2, dy2 = (np.ascontiguousarray(a).reshape(-1, y.shape[-1]) for a in (y, dy))
                dx = np.empty_like(dy2)
                _softmax_grad_rows_float32(y2, dy2, dx)
                return dx.reshape(y.shape)
            # over the last axis on the host: the row dots without the dy * y temporary, then two passes
            y2, dy2 = y.reshape(-1, y.shape[-1]), dy.reshape(-1, y.shape[-1])
            dx = np.subtract(dy2, row_dots(dy2, y2)[:, None])
            dx *= y2
            return dx.reshape(y.shape)
        return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


def softmax(logits, axis=None, name=None):
    """``flow.nn.softmax(logits, axis=None)``; ``None`` means the last axis."""
    x = as_tensor(logits, argument="logits")
    try:
        axis = normalize_axis(-1 if axis is None else axis, x.ndim)
    except ShapeError as e:
        raise shape_error("flow.nn.softmax", e) from None
    return apply(Softmax, (x,), name, axis=axis)


# ------------------------------------------------------------------------------------------------------ cross entropy

def _labels_in_range(labels, classes):
    """Whether every label is a class id in ``[0, classes)`` (two reductions instead of a mask)."""
    return labels.size == 0 or (bool(labels.min() >= 0) and bool(labels.max() < classes))


# On CuPy each of the two ops is one kernel that masks out-of-range labels itself: asking whether any label is out
# of range would cost a host synchronisation a call (and make the step impossible to capture as a CUDA graph), so
# the GPU gives such rows zero loss and gradient without the NumPy backend's warning. One thread a row for the
# forward (class counts are small next to batch sizes), one an element for the gradient; the arithmetic is the
# NumPy path's, operation for operation.
_CE_FORWARD = """
const ptrdiff_t row = (ptrdiff_t)i * classes;
T top = logits[row];
for (int c = 1; c < classes; ++c) { const T v = logits[row + c]; top = (v > top || v != v) ? v : top; }
T total = 0;
for (int c = 0; c < classes; ++c) { const T e = exp(logits[row + c] - top); prob[row + c] = e; total += e; }
for (int c = 0; c < classes; ++c) prob[row + c] /= total;
loss = (label >= 0 && label < classes) ? log(total) - (logits[row + label] - top) : (T)0;
"""
_CE_GRAD = """
const ptrdiff_t row = i / classes;
const int c = (int)(i - row * classes);
const L label = labels[row];
grad = (label >= 0 && label < classes) ? prob * dy[row] - (c == label ? dy[row] : (T)0) : (T)0;
"""
# This module's CuPy kernels: name -> (inputs, outputs, body), built on first use (``ops.cupy_elementwise``).
_CUPY_KERNELS = {
    # dy * (y > 0) as NumPy computes it (a NaN or Inf gradient where y <= 0 still gives NaN), in one pass
    "relu_grad": ("T y, T dy", "T dx", "dx = dy * (T)(y > (T)0)"),
    "sparse_softmax_ce": ("raw T logits, L label, int32 classes", "T loss, raw T prob", _CE_FORWARD),
    "sparse_softmax_ce_grad": ("raw L labels, T prob, raw T dy, int32 classes", "T grad", _CE_GRAD),
}


def _cupy_kernel(cupy, name):
    return cupy_elementwise(cupy, name, *_CUPY_KERNELS[name])


def _on_cupy_kernel(xp, array):
    return xp is not np and array.dtype in (np.float32, np.float64)


def _contiguous(xp, array):
    """``array`` C-contiguous (``ascontiguousarray`` would also make a 0-d array 1-d)."""
    return array if array.flags.c_contiguous else xp.ascontiguousarray(array)


@jit.kernel(reduce=True)
def _sparse_ce_float32(logits, labels, loss, prob):
    """``SparseSoftmaxCrossEntropy`` over C-contiguous float32 ``(rows, classes)`` logits and int64 labels, a row at
    a time: the softmax as ``_softmax_row_float32`` computes it, and ``loss = log(sum) - (logits[label] - max)``
    (0 for a label outside ``[0, classes)``; NaN and inf reach the row as in the NumPy twin)."""
    rows, classes = logits.shape
    for r in range(rows):
        top, total = _softmax_row_float32(logits[r], prob[r])
        label = labels[r]
        if 0 <= label < classes:
            loss[r] = math.log(total) - (logits[r, label] - top)
        else:
            loss[r] = np.float32(0)


@jit.kernel
def _sparse_ce_grad_float32(labels, prob, dy, grad):
    """``SparseSoftmaxCrossEntropyGrad`` over C-contiguous float32 rows and int64 labels: ``dy (prob - onehot)``, a
    row of zeros for a label outside ``[0, classes)``."""
    rows, classes = prob.shape
    for r in range(rows):
        label = labels[r]
        d = dy[r] if 0 <= label < classes else np.float32(0)
        for j in range(classes):
            grad[r, j] = prob[r, j] * d
        if 0 <= label < classes:
            grad[r, label] -= d


def _compiled_ce(labels, *arrays):
    """Whether the compiled cross-entropy kernels take these NumPy arrays (float32, integer labels)."""
    return labels.dtype.kind in "iu" and jit.takes(*arrays)


class SparseSoftmaxCrossEntropy(Op):
    """Per-example loss ``logsumexp(logits) - logits[label]``; also outputs the softmax the gradient needs.

    A label outside ``[0, classes)`` contributes zero loss and zero gradient (OneFlow's seed programs feed such
    labels); on NumPy flowlab warns once per op when it sees one (on CuPy see ``_CE_FORWARD``).
    """
    prefix, api = "SparseSoftmaxCrossEntropy_", "flow.nn.sparse_softmax_cross_entropy_with_logits"
    outputs = ("out", "prob")

    @staticmethod
    def infer(labels, logits):
        if labels.dtype.kind not in "iu":
            raise ShapeError(f"labels must be integer class ids, got dtype {labels.dtype}")
        if logits.dtype.kind != "f":
            raise ShapeError(f"logits must be floating point, got dtype {logits.dtype}")
        if labels.shape != logits.shape[:-1]:
            raise ShapeError(f"labels shape {labels.shape} must equal logits shape {logits.shape} without its "
                             f"last (class) axis, i.e. {logits.shape[:-1]}")
        return [spec(labels.shape, logits.dtype), spec(logits.shape, logits.dtype)]

    @staticmethod
    def forward(xp, labels, logits, name):
        classes = logits.shape[-1]
        if _on_cupy_kernel(xp, logits):
            logits = _contiguous(xp, logits)
            loss, prob = xp.empty(labels.shape, logits.dtype), xp.empty_like(logits)
            _cupy_kernel(xp, "sparse_softmax_ce")(logits, _contiguous(xp, labels), classes, loss, prob)
            return loss, prob
        all_valid = _labels_in_range(labels, classes)
        if not all_valid:
            warnings.warn(f"{name}: labels outside [0, {classes}) were given zero loss and zero gradient",
                          RuntimeWarning, stacklevel=2)
        if _compiled_ce(labels, logits) and logits.size:
            rows = logits.reshape(-1, classes)
            loss, prob = np.empty(labels.shape, np.float32), np.empty(logits.shape, np.float32)
            _sparse_ce_float32(np.ascontiguousarray(rows), np.ascontiguousarray(labels, np.int64).reshape(-1),
                               loss.reshape(-1), prob.reshape(-1, classes))
            return loss, prob
        valid = True if all_valid else (labels >= 0) & (labels < classes)
        safe = labels if all_valid else xp.where(valid, labels, 0)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        exp = xp.exp(shifted)
        total = exp.sum(axis=-1, keepdims=True)
        flat = shifted.reshape(-1, classes)
        picked = flat[xp.arange(flat.shape[0]), safe.ravel()].reshape(labels.shape)
        loss = xp.log(total)[..., 0]
        loss -= picked
        exp /= total
        if not all_valid:
            loss = xp.where(valid, loss, loss.dtype.type(0))
        return loss, exp

    @staticmethod
    def vjp(node, dy, dprob=None):
        if dprob is not None:
            raise ShapeError("the softmax output of sparse_softmax_cross_entropy_with_logits is not differentiable")
        labels, _ = node.inputs
        return None, apply(SparseSoftmaxCrossEntropyGrad, (labels, node.outputs[1], dy))


class SparseSoftmaxCrossEntropyGrad(Op):
    """``dy * (softmax - onehot(label))`` row by row; zero for rows whose label is out of range."""
    prefix, api = "SparseSoftmaxCrossEntropyGrad_", "sparse_softmax_cross_entropy_grad"

    @staticmethod
    def infer(labels, prob, dy):
        return spec(prob.shape, prob.dtype)

    @staticmethod
    def forward(xp, labels, prob, dy):
        classes = prob.shape[-1]
        if _on_cupy_kernel(xp, prob):
            return _cupy_kernel(xp, "sparse_softmax_ce_grad")(_contiguous(xp, labels), _contiguous(xp, prob),
                                                              _contiguous(xp, dy), classes)
        if _compiled_ce(labels, prob, dy) and prob.size:
            grad = np.empty(prob.shape, np.float32)
            _sparse_ce_grad_float32(np.ascontiguousarray(labels, np.int64).reshape(-1),
                                    np.ascontiguousarray(prob).reshape(-1, classes),
                                    np.ascontiguousarray(dy).reshape(-1), grad.reshape(-1, classes))
            return grad
        if _labels_in_range(labels, classes):     # the usual case: no mask to build
            grad = xp.ascontiguousarray(prob * dy[..., None])   # so that the reshape below is a view
            flat = grad.reshape(-1, classes)
            flat[xp.arange(flat.shape[0]), labels.ravel()] -= dy.ravel()
            return grad
        valid = (labels >= 0) & (labels < classes)
        scale = (dy * valid).astype(prob.dtype)
        grad = xp.ascontiguousarray(prob * scale[..., None])
        rows = xp.arange(labels.size)
        grad.reshape(-1, classes)[rows, xp.where(valid, labels, 0).ravel()] -= scale.ravel()
        return grad


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Per-example softmax cross-entropy of ``logits`` (``[..., classes]``) against integer ``labels`` (``[...]``).
    As in OneFlow, labels of the logits' rank whose last axis has size 1 (BERT's ``(batch, 1)`` next-sentence
    labels) lose that axis first."""
    labels, logits = as_tensor(labels, argument="labels"), as_tensor(logits, argument="logits")
    if labels.ndim == logits.ndim and labels.ndim and labels.shape[-1] == 1:
        from .array import squeeze
        labels = squeeze(labels, axis=[-1])
    loss, _ = apply(SparseSoftmaxCrossEntropy, (labels, logits), name)
    loss.node.attrs["name"] = loss.node.name   # for the out-of-range label warning
    return loss


class SoftmaxCrossEntropy(Op):
    """Per-example ``-sum(labels * log_softmax(logits))`` against label distributions."""
    prefix, api = "SoftmaxCrossEntropy_", "flow.nn.softmax_cross_entropy_with_logits"
    outputs = ("out", "prob")

    @staticmethod
    def infer(labels, logits):
        if labels.shape != logits.shape:
            raise ShapeError(f"labels shape {labels.shape} must equal logits shape {logits.shape}")
        if labels.dtype != logits.dtype or logits.dtype.kind != "f":
            raise ShapeError(f"labels and logits must share one floating dtype, got {labels.dtype} and {logits.dtype}")
        return [spec(logits.shape[:-1], logits.dtype), spec(logits.shape, logits.dtype)]

    @staticmethod
    def forward(xp, labels, logits):
        shifted = logits - logits.max(axis=-1, keepdims=True)
        exp = xp.exp(shifted)
        total = exp.sum(axis=-1, keepdims=True)
        log_prob = shifted - xp.log(total)
        return -(labels * log_prob).sum(axis=-1), exp / total

    @staticmethod
    def vjp(node, dy, dprob=None):
        if dprob is not None:
            raise ShapeError("the softmax output of softmax_cross_entropy_with_logits is not differentiable")
        labels, logits = node.inputs
        prob = node.outputs[1]
        d_logits = apply(SoftmaxCrossEntropyGrad, (labels, prob, dy))
        # d/dlabels = -dy * log_softmax(logits); log(prob) is exact enough away from underflow.
        from .math import log
        from .array import reshape
        d_labels = negative(multiply(reshape(dy, dy.shape + (1,)), log(prob)))
        return sum_to_shape(d_labels, labels.shape), d_logits


class SoftmaxCrossEntropyGrad(Op):
    prefix, api = "SoftmaxCrossEntropyGrad_", "softmax_cross_entropy_grad"

    @staticmethod
    def infer(labels, prob, dy):
        return spec(prob.shape, prob.dtype)

    @staticmethod
    def forward(xp, labels, prob, dy):
        return (prob * labels.sum(axis=-1, keepdims=True) - labels) * dy[..., None]


def softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Cross-entropy of ``softmax(logits)`` against the distributions ``labels`` (each row sums to 1), one
    value per example; the gradient to ``logits`` is ``softmax(logits) * sum(labels) - labels``.
    """
    labels, logits = as_tensor(labels, argument="labels"), as_tensor(logits, argument="logits")
    return apply(SoftmaxCrossEntropy, (labels, logits), name)[0]


class SigmoidCrossEntropy(Op):
    """Per-element logistic loss ``max(x, 0) - x * z + log(1 + exp(-|x|))`` of logits ``x`` against labels ``z``
    (``-z log(sigmoid(x)) - (1 - z) log(1 - sigmoid(x))`` without overflow for any ``x``). Integer labels (Wide &
    Deep's 0/1 clicks) are read as numbers of the logits' dtype and get no gradient."""
    prefix, api = "SigmoidCrossEntropy_", "flow.nn.sigmoid_cross_entropy_with_logits"

    @staticmethod
    def infer(labels, logits):
        if logits.dtype.kind != "f":
            raise ShapeError(f"logits must be floating point, got dtype {logits.dtype}")
        if labels.dtype.kind not in "fiub":
            raise ShapeError(f"labels must be numbers, got dtype {labels.dtype}")
        if labels.shape != logits.shape:
            raise ShapeError(f"labels shape {labels.shape} must equal logits shape {logits.shape}")
        return spec(logits.shape, logits.dtype)

    @staticmethod
    def forward(xp, labels, logits):
        loss = xp.log1p(xp.exp(-xp.abs(logits)))
        loss += xp.maximum(logits, 0)
        loss -= logits * labels.astype(logits.dtype, copy=False)
        return loss

    @staticmethod
    def vjp(node, dy):
        labels, logits = node.inputs
        d_logits = apply(SigmoidCrossEntropyGrad, (labels, logits, dy))
        return (multiply(dy, negative(logits)) if labels.dtype == logits.dtype else None), d_logits


class SigmoidCrossEntropyGrad(Op):
    """``dy * (sigmoid(x) - z)``, the sigmoid written so that ``exp`` only sees ``-|x|``."""
    prefix, api = "SigmoidCrossEntropyGrad_", "sigmoid_cross_entropy_grad"

    @staticmethod
    def infer(labels, logits, dy):
        return spec(logits.shape, logits.dtype)

    @staticmethod
    def forward(xp, labels, logits, dy):
        e = xp.exp(-xp.abs(logits))
        e /= 1 + e                                      # sigmoid(-|x|)
        prob = xp.where(logits >= 0, 1 - e, e)
        prob -= labels.astype(logits.dtype, copy=False)
        prob *= dy
        return prob


def sigmoid_cross_entropy_with_logits(labels, logits, name=None):
    """``flow.nn.sigmoid_cross_entropy_with_logits``: the logistic loss of each element of ``logits`` against
    ``labels`` of the same shape (floats in [0, 1], or integer 0/1 labels)."""
    logits = as_tensor(logits, argument="logits")
    labels = as_tensor(labels, like=logits, argument="labels")
    return apply(SigmoidCrossEntropy, (labels, logits), name)


# ------------------------------------------------------------------------------------------------------------ dropout

class Dropout(Op):
    """Zeroes each element with probability ``rate`` and scales the rest by ``1/(1-rate)``; outputs the mask too."""
    prefix, api = "Dropout_", "flow.nn.dropout"
    outputs = ("out", "mask")
    random = True   # the executor passes a random generator as ``rng``

    @staticmethod
    def infer(x, rate, noise_shape):
        return [spec(x.shape, x.dtype), spec(noise_shape, x.dtype)]

    @staticmethod
    def forward(xp, x, rate, noise_shape, rng):
        keep = rng.random(noise_shape, dtype=np.float32) >= rate
        mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - rate))
        return x * mask, mask

    @staticmethod
    def vjp(node, dy, dmask=None):
        return (multiply(dy, node.outputs[1]),)


def dropout(x, rate, noise_shape=None, seed=None, name=None):
    """``flow.nn.dropout``. In predict jobs it is the identity, as users of every framework expect at inference.

    Differs from OneFlow: a per-op ``seed`` is refused with an error; seed jobs with ``flow.config.seed()``.
    """
    from .. import graph as g
    x = as_tensor(x, argument="x")
    if not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise ValueError(f"flow.nn.dropout: rate must be a number in [0, 1), got {rate!r}")
    if seed is not None:
        raise ValueError("flow.nn.dropout: per-op seeds are not supported; seed jobs with flow.config.seed()")
    noise_shape = x.shape if noise_shape is None else tuple(int(d) for d in noise_shape)
    try:
        if np.broadcast_shapes(noise_shape, x.shape) != x.shape:
            raise ValueError   # a larger mask would change the output's shape
    except ValueError:
        raise shape_error("flow.nn.dropout", f"noise_shape {noise_shape} does not broadcast to {x.shape}") from None
    if rate == 0 or not g.current_graph("flow.nn.dropout").is_train:
        return x
    return apply(Dropout, (x,), name, rate=float(rate), noise_shape=noise_shape)[0]
