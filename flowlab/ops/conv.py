"""``flow.nn.conv2d``, ``max_pool2d`` and ``avg_pool2d`` with OneFlow 0.x's arguments, layouts and op names.

Convolutions take one of five routes. On NumPy, a 1x1 convolution without padding is a plain matrix product in the
caller's layout (no im2col, no transposes); a 3x3 stride-1 NCHW convolution over large enough images runs
Winograd's F(4x4, 3x3) or F(2x2, 3x3) (4x or 2.25x fewer multiply-adds); and any other NCHW convolution with one
group gathers its im2col matrix straight from NCHW with the batch folded into the long axis (one BLAS product per
convolution and gradient, no padded copy, no NHWC transposes); see those sections below. On NumPy these kernels split
their work over host threads inside a host plan's call (``runtime.host_threads``). Depthwise convolutions (groups ==
in_channels == out_channels, MobileNet's) skip im2col: one multiply-add of the whole output per kernel position.
Everything else (NHWC, other grouped convolutions, and every convolution on CuPy) computes in NHWC, where an im2col
row is long contiguous runs of channels: NCHW tensors are transposed on the way in and back on the way out, and NCHW
filters ``(O, C/g, kh, kw)`` take the same permutation to ``(O, kh, kw, C/g)``; windows are gathered with
``as_strided`` into one im2col matrix per group for one batched matmul, and the gradients reuse that matrix (filters)
or scatter-add over the ``kh*kw`` kernel positions (col2im, input). Average pooling computes in NHWC too; max pooling
reads whole windows of one channel and stays in the input's layout.

Padding is ``"VALID"``, ``"SAME"`` (TensorFlow's: output ``ceil(in / stride)``, the odd pixel padded at the end; also
``"SAME_UPPER"``, and ``"SAME_LOWER"`` with the odd pixel at the start) or explicit ``((top, bottom), (left, right))``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import ShapeError
from ..runtime import cublas
from ..runtime import host_threads, jit
from . import Op, apply, as_tensor, spec


# -------------------------------------------------------------------------------------------- arguments and geometry

def _is_int(v, minimum):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= minimum


def _pair(value, argument, api, minimum=1):
    """An int or a pair of ints (each >= ``minimum``) as a pair."""
    items = (value, value) if _is_int(value, minimum) else tuple(value) if isinstance(value, (list, tuple)) else ()
    if len(items) != 2 or not all(_is_int(v, minimum) for v in items):
        raise ValueError(f"{api}: {argument} must be an int >= {minimum} or a pair of them, got {value!r}")
    return int(items[0]), int(items[1])


def _data_format(data_format, api):
    fmt = data_format.upper() if isinstance(data_format, str) else None
    if fmt not in ("NCHW", "NHWC"):
        raise ValueError(f"{api}: data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    return fmt


def _before_after(entry):
    pair = (entry, entry) if _is_int(entry, 0) else tuple(entry) if isinstance(entry, (list, tuple)) else ()
    return (int(pair[0]), int(pair[1])) if len(pair) == 2 and all(_is_int(v, 0) for v in pair) else None


def _padding(padding, data_format, api):
    """``"VALID"``, ``"SAME_UPPER"``, ``"SAME_LOWER"`` or ``((top, bottom), (left, right))``."""
    if isinstance(padding, str):
        mode = padding.upper()
        mode = "SAME_UPPER" if mode == "SAME" else mode
        if mode in ("VALID", "SAME_UPPER", "SAME_LOWER"):
            return mode
    elif isinstance(padding, (list, tuple)):
        entries = [_before_after(e) for e in padding]
        if len(entries) == 4:   # OneFlow's one pair per axis, in data_format order: batch and channel get none
            h = 2 if data_format == "NCHW" else 1
            others = [e for a, e in enumerate(entries) if a not in (h, h + 1)]
            entries = entries[h:h + 2] if all(e == (0, 0) for e in others) else []
        if len(entries) == 2 and None not in entries:
            return tuple(entries)
    raise ValueError(f"{api}: padding must be 'SAME', 'VALID', [pad_h, pad_w] (ints or (before, after) pairs) or "
                     f"4 (before, after) pairs in {data_format} order with (0, 0) for batch and channel, "
                     f"got {padding!r}")


def _geometry(in_hw, kernel, strides, dilations, padding):
    """``(pads, out_hw)``: ``((top, bottom), (left, right))`` and the output size (< 1 if the kernel does not fit)."""
    pads, out = [], []
    for axis, (n, k, s, d) in enumerate(zip(in_hw, kernel, strides, dilations)):
        span = (k - 1) * d + 1
        if padding == "VALID":
            before = after = 0
        elif isinstance(padding, str):
            total = max((-(-n // s) - 1) * s + span - n, 0)
            after = total - total // 2 if padding == "SAME_UPPER" else total // 2
            before = total - after
        else:
            before, after = padding[axis]
        pads.append((before, after))
        out.append((n + before + after - span) // s + 1)
    return tuple(pads), tuple(out)


def _nchw_shape(shape, data_format):
    return tuple(shape) if data_format == "NCHW" else (shape[0], shape[3], shape[1], shape[2])


def _layout_shape(nchw_shape, data_format):
    return tuple(nchw_shape) if data_format == "NCHW" else _nhwc_shape(nchw_shape, "NCHW")


def _nhwc_shape(shape, data_format):
    return tuple(shape) if data_format == "NHWC" else (shape[0], shape[2], shape[3], shape[1])


def _nhwc(xp, a, data_format):
    """An input, gradient or filters (all permute ``(0, 2, 3, 1)``) as a contiguous NHWC array."""
    return xp.ascontiguousarray(a if data_format == "NHWC" else a.transpose(0, 2, 3, 1))


def _out(xp, a, data_format):
    """A result computed in NHWC, as a contiguous array in the caller's layout."""
    return xp.ascontiguousarray(a if data_format == "NHWC" else a.transpose(0, 3, 1, 2))


def _check_fits(x, in_hw, kernel, strides, dilations, padding, argument):
    pads, out_hw = _geometry(in_hw, kernel, strides, dilations, padding)
    if min(out_hw) < 1:
        spans = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
        padded = tuple(n + b + a for n, (b, a) in zip(in_hw, pads))
        raise ShapeError(f"{argument} {kernel} (dilated: {spans}) is larger than the padded input (height, width) "
                         f"{padded} of input {x.shape} with padding {padding!r}")
    return out_hw


# ------------------------------------------------------------------------------------------------------ array helpers

def _hw_axes(data_format):
    return (2, 3) if data_format == "NCHW" else (1, 2)


def _pad(xp, x, pads, data_format="NHWC", value=0):
    """``x`` padded by ``pads`` on its height and width axes, in its own layout."""
    if not any(p for pair in pads for p in pair):
        return x
    widths = [(0, 0)] * 4
    h, w = _hw_axes(data_format)
    widths[h], widths[w] = pads
    return xp.pad(x, widths, constant_values=value)


def _windows(xp, x, kernel, strides, dilations, pads, out_hw):
    """A read-only ``(N, Ho, Wo, kh, kw, C)`` view of the padded NHWC ``x``: element ``[n, r, c, i, j]`` is the input
    under kernel position ``(i, j)`` of output pixel ``(r, c)``."""
    x = _pad(xp, x, pads)
    sn, sh, sw, sc = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, (x.shape[0],) + tuple(out_hw) + tuple(kernel) + (x.shape[3],),
        (sn, sh * strides[0], sw * strides[1], sh * dilations[0], sw * dilations[1], sc))


def _positions(kernel, strides, dilations, out_hw):
    """``(index, rows, cols)`` per kernel position: the slices of the padded input that position reads."""
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            rows = slice(i * dilations[0], i * dilations[0] + strides[0] * (out_hw[0] - 1) + 1, strides[0])
            cols = slice(j * dilations[1], j * dilations[1] + strides[1] * (out_hw[1] - 1) + 1, strides[1])
            yield i * kernel[1] + j, rows, cols


def _scatter(xp, part, dtype, in_shape, kernel, strides, dilations, pads, out_hw):
    """col2im: add ``part(index)`` (``(N, Ho, Wo, C)``) of each kernel position where that position read; NHWC."""
    (top, bottom), (left, right) = pads
    n, h, w, c = in_shape
    dx = xp.zeros((n, h + top + bottom, w + left + right, c), dtype=dtype)
    for index, rows, cols in _positions(kernel, strides, dilations, out_hw):
        dx[:, rows, cols] += part(index)   # one position never reads an element twice, so += is exact
    return dx[:, top:top + h, left:left + w]


# ------------------------------------------------------------------------------------------------------------ conv2d

def _columns(xp, x, kernel, groups, strides, dilations, pads, out_hw):
    """im2col of NHWC ``x``: ``(groups, N*Ho*Wo, kh*kw*C/groups)``, one row per output pixel."""
    win = _windows(xp, x, kernel, strides, dilations, pads, out_hw)
    win = win.reshape(win.shape[:5] + (groups, x.shape[3] // groups))
    return win.transpose(5, 0, 1, 2, 3, 4, 6).reshape(groups, win.shape[0] * out_hw[0] * out_hw[1], -1)


def _grouped_matmul(xp, a, b):
    """``a @ b`` of ``(groups, m, k)`` and ``(groups, k, n)``. One group on CuPy goes to cuBLAS directly
    (``runtime.cublas``), so that a CUDA graph can capture the convolution; else ``xp.matmul``."""
    if xp is not np and a.shape[0] == 1:
        out = xp.empty((1, a.shape[1], b.shape[2]), a.dtype)
        if cublas.gemm(xp, a[0], b[0], out[0]) is not None:
            return out
    if xp is np and a.dtype == np.float16:
        # NumPy's float16 matmul has no BLAS: float32 BLAS rounded once is float16 GEMM with float32 accumulation
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return xp.matmul(a, b)


def _dy_rows(dy, groups):
    """NHWC ``dy`` as ``(groups, N*Ho*Wo, O/groups)``, rows ordered like ``_columns``."""
    return dy.reshape(-1, groups, dy.shape[3] // groups).transpose(1, 0, 2)


def _conv_geometry(x_shape, w_shape, strides, dilations, padding, data_format):
    kernel = _nchw_shape(w_shape, data_format)[2:]
    pads, out_hw = _geometry(_nchw_shape(x_shape, data_format)[2:], kernel, strides, dilations, padding)
    return kernel, pads, out_hw


def _conv_macs(conv_output, filters_shape, data_format):
    """Multiply-adds of a convolution's matrix product (its two gradients multiply the same matrices)."""
    n, o, ho, wo = _nchw_shape(conv_output.shape, data_format)
    return n * ho * wo * math.prod(filters_shape)


def _check_operands(x, w, layout, data_format):
    """Both 4-D, of one floating dtype (``layout`` describes the filters in messages)."""
    if x.ndim != 4:
        raise ShapeError(f"input must be a 4-D {data_format} tensor, got shape {x.shape}")
    if w.ndim != 4:
        raise ShapeError(f"filters must be 4-D {layout} for {data_format}, got shape {w.shape}")
    if x.dtype != w.dtype or x.dtype.kind != "f":
        raise ShapeError(f"input and filters must share one floating dtype, got {x.dtype} and {w.dtype}")


class Conv2d(Op):
    prefix, api = "Conv2d_", "flow.nn.conv2d"
    amp = "float16"     # conv2d is on OneFlow 0.3.4's white list; its gradients are products too

    @staticmethod
    def gemm_macs(node):
        return _conv_macs(node.outputs[0], node.inputs[1].shape, node.attrs["data_format"])

    @staticmethod
    def infer(x, w, strides, dilations, padding, groups, data_format):
        layout = "(out_channels, in_channels/groups, kh, kw)" if data_format == "NCHW" else \
            "(out_channels, kh, kw, in_channels/groups)"
        _check_operands(x, w, layout, data_format)
        n, c, h, wd = _nchw_shape(x.shape, data_format)
        o, cg, kh, kw = _nchw_shape(w.shape, data_format)
        if c != cg * groups:
            raise ShapeError(f"input {x.shape} has {c} channels ({data_format}) but filters {w.shape} {layout} "
                             f"expect in_channels/groups * groups = {cg} * {groups} = {cg * groups}")
        if o % groups:
            raise ShapeError(f"filters {w.shape}: out_channels {o} must be divisible by groups {groups}")
        ho, wo = _check_fits(x, (h, wd), (kh, kw), strides, dilations, padding, "filters kernel (kh, kw)")
        return spec(_layout_shape((n, o, ho, wo), data_format), x.dtype)

    @staticmethod
    def forward(xp, x, w, strides, dilations, padding, groups, data_format):
        kernel, pads, out_hw = _conv_geometry(x.shape, w.shape, strides, dilations, padding, data_format)
        if _is_depthwise(x.shape, w.shape, groups, data_format):
            return _depthwise_forward(xp, x, w, kernel, strides, dilations, pads, out_hw, data_format)
        if _is_pointwise(xp, kernel, groups, pads):
            return _pointwise_forward(xp, x, w, strides, out_hw, data_format)
        algo = _winograd(xp, x.dtype, x.shape, w.shape, kernel, strides, dilations, groups, data_format, out_hw)
        if algo is not None:
            return _winograd_forward(xp, x, w, pads, out_hw, algo)
        if _is_folded(xp, groups, data_format):
            return _folded_forward(xp, x, w, kernel, strides, dilations, pads, out_hw)
        x, w = _nhwc(xp, x, data_format), _nhwc(xp, w, data_format)
        n, o = x.shape[0], w.shape[0]
        cols = _columns(xp, x, kernel, groups, strides, dilations, pads, out_hw)
        y = _grouped_matmul(xp, cols, w.reshape(groups, o // groups, -1).transpose(0, 2, 1))  # (groups, N*Ho*Wo, O/g)
        y = y.reshape((groups, n) + out_hw + (o // groups,)).transpose(1, 2, 3, 0, 4).reshape((n,) + out_hw + (o,))
        return _out(xp, y, data_format)

    @staticmethod
    def vjp(node, dy):
        x, w = node.inputs
        return (apply(ConvInputGrad, (dy, w), input_shape=x.shape, **node.attrs),
                apply(ConvFilterGrad, (x, dy), filter_shape=w.shape, **node.attrs))


class ConvInputGrad(Op):
    """``d input``: each kernel position's share of ``dy @ W`` scatter-added back where it read (col2im)."""
    prefix, api = "ConvInputGrad_", "conv2d_input_grad"
    amp = "float16"     # conv2d is on OneFlow 0.3.4's white list; its gradients are products too
    side_by_side = "conv2d gradients"   # dx and dw of one dy: one a thread (compiler.side_by_side)

    @staticmethod
    def gemm_macs(node):
        return _conv_macs(node.inputs[0], node.inputs[1].shape, node.attrs["data_format"])

    @staticmethod
    def infer(dy, w, input_shape, **conv):
        return spec(input_shape, dy.dtype)

    @staticmethod
    def forward(xp, dy, w, input_shape, strides, dilations, padding, groups, data_format):
        kernel, pads, out_hw = _conv_geometry(input_shape, w.shape, strides, dilations, padding, data_format)
        if _is_depthwise(input_shape, w.shape, groups, data_format):
            return _depthwise_input_grad(xp, dy, w, input_shape, kernel, strides, dilations, pads, out_hw, data_format)
        if _is_pointwise(xp, kernel, groups, pads):
            return _pointwise_input_grad(xp, dy, w, input_shape, strides, data_format)
        algo = _winograd(xp, dy.dtype, input_shape, w.shape, kernel, strides, dilations, groups, data_format, out_hw)
        if algo is not None:
            return _winograd_input_grad(xp, dy, w, input_shape, pads, out_hw, algo)
        if _is_folded(xp, groups, data_format):
            return _folded_input_grad(xp, dy, w, input_shape, kernel, strides, dilations, pads, out_hw)
        dy, w = _nhwc(xp, dy, data_format), _nhwc(xp, w, data_format)
        o, cg = w.shape[0], w.shape[3]
        in_shape = _nhwc_shape(input_shape, data_format)
        dcols = _grouped_matmul(xp, _dy_rows(dy, groups), w.reshape(groups, o // groups, -1))  # (g, N*Ho*Wo, kh*kw*Cg)
        dcols = dcols.reshape((groups, in_shape[0]) + out_hw + (kernel[0] * kernel[1], cg))

        def part(index):   # (N, Ho, Wo, C); a view when groups == 1
            return dcols[..., index, :].transpose(1, 2, 3, 0, 4).reshape(in_shape[:1] + out_hw + in_shape[3:])

        dx = _scatter(xp, part, dy.dtype, in_shape, kernel, strides, dilations, pads, out_hw)
        return _out(xp, dx, data_format)


class ConvFilterGrad(Op):
    """``d filters = dy^T @ im2col(input)``, per group."""
    prefix, api = "ConvFilterGrad_", "conv2d_filter_grad"
    amp = "float16"     # conv2d is on OneFlow 0.3.4's white list; its gradients are products too
    side_by_side = "conv2d gradients"   # dx and dw of one dy: one a thread (compiler.side_by_side)

    @staticmethod
    def gemm_macs(node):
        return _conv_macs(node.inputs[1], node.attrs["filter_shape"], node.attrs["data_format"])

    @staticmethod
    def infer(x, dy, filter_shape, **conv):
        return spec(filter_shape, x.dtype)

    @staticmethod
    def forward(xp, x, dy, filter_shape, strides, dilations, padding, groups, data_format):
        kernel, pads, out_hw = _conv_geometry(x.shape, filter_shape, strides, dilations, padding, data_format)
        if _is_depthwise(x.shape, filter_shape, groups, data_format):
            return _depthwise_filter_grad(xp, x, dy, filter_shape, kernel, strides, dilations, pads, out_hw,
                                          data_format)
        if _is_pointwise(xp, kernel, groups, pads):
            return _pointwise_filter_grad(xp, x, dy, filter_shape, strides, data_format)
        algo = _winograd(xp, x.dtype, x.shape, filter_shape, kernel, strides, dilations, groups, data_format, out_hw)
        if algo is not None:
            return _winograd_filter_grad(xp, x, dy, filter_shape, pads, out_hw, algo)
        if _is_folded(xp, groups, data_format):
            return _folded_filter_grad(xp, x, dy, filter_shape, kernel, strides, dilations, pads, out_hw)
        x, dy = _nhwc(xp, x, data_format), _nhwc(xp, dy, data_format)
        cols = _columns(xp, x, kernel, groups, strides, dilations, pads, out_hw)
        # (groups, kh*kw*Cg, O/groups): BLAS is much faster with the long N*Ho*Wo axis inner in both operands
        dw = _grouped_matmul(xp, cols.transpose(0, 2, 1), _dy_rows(dy, groups)).transpose(0, 2, 1)
        return _out(xp, dw.reshape(_nhwc_shape(filter_shape, data_format)), data_format)


def conv2d(input, filters, strides, padding, data_format="NCHW", dilations=None, groups=1, name=None):  # noqa: A002
    """``flow.nn.conv2d``: 2-D cross-correlation of ``input`` with ``filters``.

    ``filters`` is ``(out_channels, in_channels/groups, kh, kw)`` for NCHW, ``(out_channels, kh, kw,
    in_channels/groups)`` for NHWC; ``strides`` and ``dilations`` are an int or a pair.
    """
    api = Conv2d.api
    x, w = as_tensor(input, argument="input"), as_tensor(filters, argument="filters")
    fmt = _data_format(data_format, api)
    if not _is_int(groups, 1):
        raise ValueError(f"{api}: groups must be a positive int, got {groups!r}")
    return apply(Conv2d, (x, w), name, strides=_pair(strides, "strides", api),
                 dilations=_pair(1 if dilations is None else dilations, "dilations", api),
                 padding=_padding(padding, fmt, api), groups=int(groups), data_format=fmt)


def compat_conv2d(input, filters, strides, padding, data_format="NCHW", dilations=None, groups=1,  # noqa: A002
                  name=None):
    """``flow.nn.compat_conv2d``: ``conv2d`` with TensorFlow's padding words: ``"SAME"`` pads as TensorFlow does
    (output ``ceil(in / stride)``, the odd pixel at the end), ``"VALID"`` not at all; OneFlow's ``"SAME_UPPER"`` and
    ``"SAME_LOWER"`` pass through."""
    mode = padding.upper() if isinstance(padding, str) else None
    if mode not in ("SAME", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ValueError(f"flow.nn.compat_conv2d: padding must be 'SAME' or 'VALID' (or 'SAME_UPPER' / "
                         f"'SAME_LOWER'), got {padding!r}")
    return conv2d(input, filters, strides, "SAME_UPPER" if mode == "SAME" else mode, data_format, dilations, groups,
                  name)


# ------------------------------------------------------------------------------------------ transposed convolution
# A transposed convolution is the input gradient of the convolution that maps its output back to its input: the
# kernels of ``ConvInputGrad`` compute it, and its own gradients are that convolution (input) and its filter
# gradient (filters). Its filters are the convolution's, ``(in_channels, out_channels, kh, kw)`` for NCHW.


class Conv2dTranspose(Op):
    """``flow.nn.conv2d_transpose``; attrs are those of the convolution it transposes (``padding`` explicit)."""
    prefix, api = "Deconv2d_", "flow.nn.conv2d_transpose"

    @staticmethod
    def gemm_macs(node):
        return _conv_macs(node.inputs[0], node.inputs[1].shape, node.attrs["data_format"])

    @staticmethod
    def infer(x, w, output_hw, strides, dilations, padding, data_format):
        layout = "(in_channels, out_channels, kh, kw)" if data_format == "NCHW" else \
            "(in_channels, kh, kw, out_channels)"
        _check_operands(x, w, layout, data_format)
        n, c = _nchw_shape(x.shape, data_format)[:2]
        in_channels, out_channels = _nchw_shape(w.shape, data_format)[:2]
        if c != in_channels:
            raise ShapeError(f"input {x.shape} has {c} channels ({data_format}) but filters {w.shape} {layout} "
                             f"expect {in_channels}")
        return spec(_layout_shape((n, out_channels) + tuple(output_hw), data_format), x.dtype)

    @staticmethod
    def forward(xp, x, w, output_hw, strides, dilations, padding, data_format):
        n, out_channels = x.shape[0], _nchw_shape(w.shape, data_format)[1]
        shape = _layout_shape((n, out_channels) + tuple(output_hw), data_format)
        return ConvInputGrad.forward(xp, x, w, shape, strides, dilations, padding, 1, data_format)

    @staticmethod
    def vjp(node, dy):
        x, w = node.inputs
        conv = dict(strides=node.attrs["strides"], dilations=node.attrs["dilations"],
                    padding=node.attrs["padding"], groups=1, data_format=node.attrs["data_format"])
        return (apply(Conv2d, (dy, w), **conv), apply(ConvFilterGrad, (dy, x), filter_shape=w.shape, **conv))


def _transpose_pads(api, in_hw, out_hw, kernel, strides, dilations, padding):
    """The padding ``((top, bottom), (left, right))`` of the convolution from ``out_hw`` back to ``in_hw``, as
    OneFlow 0.3.4's ``conv2d_transpose`` derives it: ``"VALID"`` pads nothing and takes outputs ``(in - 1) * stride
    + span`` plus up to ``stride - 1`` (its ``output_padding``); ``"SAME"`` takes outputs with ``ceil(out /
    stride) == in`` and crops ``max(0, (in - 1) * stride + span - out)`` pixels, the odd one at the end."""
    pads = []
    for axis, (n, out, k, s, d) in enumerate(zip(in_hw, out_hw, kernel, strides, dilations)):
        span = (k - 1) * d + 1
        if padding == "VALID":
            low, high, before, after = (n - 1) * s + span, (n - 1) * s + span + s - 1, 0, 0
        else:
            low, high = (n - 1) * s + 1, n * s
            before = max(0, (n - 1) * s + span - out) // 2
            after = max(0, (n - 1) * s + span - out) - before
        if not low <= out <= high:
            raise ValueError(f"{api}: output_shape's {('height', 'width')[axis]} {out} cannot come from input "
                             f"{('height', 'width')[axis]} {n} with kernel {k}, stride {s}, dilation {d} and "
                             f"padding {padding!r}: expected {low}" + (f"..{high}" if high > low else ""))
        pads.append((before, after))
    return tuple(pads)


def conv2d_transpose(value=None, filter=None, output_shape=None, strides=None, padding="VALID",  # noqa: A002
                     data_format="NCHW", name=None, input=None, filters=None, dilations=None):  # noqa: A002
    """``flow.nn.conv2d_transpose``: the transposed (fractionally strided) 2-D convolution, OneFlow's ``deconv2d``.

    ``value`` (or ``input``) is ``(N, C_in, H, W)`` for NCHW; ``filter`` (or ``filters``) is ``(C_in, C_out, kh,
    kw)`` for NCHW, ``(C_in, kh, kw, C_out)`` for NHWC. ``output_shape`` is the 4-D output shape in
    ``data_format`` order: its batch must be the input's and its height and width must fit ``padding`` (see
    ``_transpose_pads``); its channel entry is not read: the output has the filters' ``C_out`` channels (OneFlow
    0.2 and 0.3.5 ignore it; 0.3.1-0.3.4 assert it, though OneFlow-Benchmark's DCGAN passes the input's channels).
    Without ``output_shape`` the output is ``in * stride`` for ``"SAME"`` and ``(in - 1) * stride + span`` for
    ``"VALID"``. ``strides`` and ``dilations`` are an int or a pair (default 1).
    """
    api = Conv2dTranspose.api
    if (value is None) == (input is None):
        raise ValueError(f"{api}: give the input as exactly one of value= and input=")
    if (filter is None) == (filters is None):
        raise ValueError(f"{api}: give the filters as exactly one of filter= and filters=")
    x = as_tensor(value if input is None else input, argument="input")
    w = as_tensor(filter if filters is None else filters, argument="filters")
    fmt = _data_format(data_format, api)
    mode = padding.upper() if isinstance(padding, str) else None
    if mode not in ("SAME", "VALID"):
        raise ValueError(f"{api}: padding must be 'SAME' or 'VALID', got {padding!r}")
    strides = _pair(1 if strides is None else strides, "strides", api)
    dilations = _pair(1 if dilations is None else dilations, "dilations", api)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"{api}: input and filters must be 4-D, got shapes {x.shape} and {w.shape}")
    in_hw, kernel = _nchw_shape(x.shape, fmt)[2:], _nchw_shape(w.shape, fmt)[2:]
    if output_shape is None:
        output_hw = tuple(n * s if mode == "SAME" else (n - 1) * s + (k - 1) * d + 1
                          for n, k, s, d in zip(in_hw, kernel, strides, dilations))
    else:
        shape = tuple(output_shape) if isinstance(output_shape, (list, tuple)) else ()
        if len(shape) != 4 or not all(_is_int(v, 1) for v in shape):
            raise ValueError(f"{api}: output_shape must be 4 positive ints in {fmt} order, got {output_shape!r}")
        if shape[0] != x.shape[0]:
            raise ValueError(f"{api}: output_shape {shape} must keep the input's batch size {x.shape[0]}")
        output_hw = _nchw_shape(shape, fmt)[2:]
    pads = _transpose_pads(api, in_hw, output_hw, kernel, strides, dilations, mode)
    return apply(Conv2dTranspose, (x, w), name, output_hw=tuple(int(v) for v in output_hw), strides=strides,
                 dilations=dilations, padding=pads, data_format=fmt)


# --------------------------------------------------------------------------------------------- 1x1 convolutions
# A 1x1 convolution without padding (ResNet's bottleneck ends and projections: two thirds of its convolutions) is a
# plain matrix product in either layout, with no im2col, col2im or layout transposes: in NCHW one ``(O, C) @ (C,
# H*W)`` product per image (BLAS's stacked ``matmul``), in NHWC one ``(N*H*W, C) @ (C, O)``. Small NCHW images (below
# ``_FOLD_BELOW`` pixels) fold the batch into one product instead, ``(O, C) @ (C, N*H*W)``: per-image products that
# thin repack the whole filter matrix for each image (ResNet-50's 7x7x2048 layers at batch 4, one thread: forward
# 11.2 -> 8.7 ms, input gradient 15.2 -> 9.9 ms), while the two layout copies cost ~0.1 ms. A stride subsamples the
# input first (its gradient lands on that subsample). On NumPy only: CuPy keeps the im2col route it was tested with.

_FOLD_BELOW = 256      # NCHW: below this many pixels per image, one product over the whole batch


def _is_pointwise(xp, kernel, groups, pads):
    return xp is np and kernel == (1, 1) and groups == 1 and not any(p for pair in pads for p in pair)


def _subsample(x, strides, data_format):
    """The pixels a strided 1x1 convolution reads (a view)."""
    if strides == (1, 1):
        return x
    sh, sw = strides
    return x[:, :, ::sh, ::sw] if data_format == "NCHW" else x[:, ::sh, ::sw, :]


def _pointwise_forward(xp, x, w, strides, out_hw, data_format):
    x = _subsample(x, strides, data_format)
    w2 = w.reshape(w.shape[0], -1)                          # (O, C) in both filter layouts
    if data_format == "NCHW":
        n, c = x.shape[:2]
        if out_hw[0] * out_hw[1] < _FOLD_BELOW:
            y = _to_images(host_threads.matmul(w2, _channels_first(x)), n)     # (O, N*Ho*Wo) -> (N, O, Ho*Wo)
        else:
            y = host_threads.matmul(w2, x.reshape(n, c, -1))     # (N, O, Ho*Wo)
        return y.reshape((n, w2.shape[0]) + tuple(out_hw))
    y = host_threads.matmul(x.reshape(-1, x.shape[3]), w2.T)
    return y.reshape(x.shape[:3] + (w2.shape[0],))


def _pointwise_input_grad(xp, dy, w, input_shape, strides, data_format):
    w2 = w.reshape(w.shape[0], -1)
    if data_format == "NCHW":
        n, o, ho, wo = dy.shape
        if ho * wo < _FOLD_BELOW:
            d = _to_images(host_threads.matmul(w2.T, _channels_first(dy)), n).reshape(n, w2.shape[1], ho, wo)
        else:
            d = host_threads.matmul(w2.T, dy.reshape(n, o, -1)).reshape(n, w2.shape[1], ho, wo)
    else:
        d = host_threads.matmul(dy.reshape(-1, dy.shape[3]), w2).reshape(dy.shape[:3] + (w2.shape[1],))
    if strides == (1, 1):
        return d
    dx = xp.empty(input_shape, d.dtype)
    if data_format == "NCHW":
        def spread(channels):     # threads take blocks of channels (ResNet-50's 56x56x256 one: ~1 ms on one core)
            dx[:, channels] = 0                             # pixels the stride skipped get no gradient
            _subsample(dx[:, channels], strides, data_format)[...] = d[:, channels]

        host_threads.each(spread, input_shape[1], work=dx.size)
    else:
        dx[...] = 0
        _subsample(dx, strides, data_format)[...] = d
    return dx


def _pointwise_filter_grad(xp, x, dy, filter_shape, strides, data_format):
    x = _subsample(x, strides, data_format)
    if data_format == "NHWC":
        dw = host_threads.matmul(dy.reshape(-1, dy.shape[3]).T, x.reshape(-1, x.shape[3]))
        return dw.reshape(filter_shape)
    n, c = x.shape[:2]
    if x.shape[2] * x.shape[3] < _FOLD_BELOW:   # thin per-image products: one with the batch in the contraction
        return host_threads.matmul(_channels_first(dy), _channels_first(x).T).reshape(filter_shape)
    x3, dy3 = x.reshape(n, c, -1), dy.reshape(n, dy.shape[1], -1)
    dw = xp.empty((dy3.shape[1], c), np.result_type(x3, dy3))

    def accumulate(rows):               # long contractions: per image, no transposed copies; threads split rows
        part = dw[rows]
        np.matmul(dy3[0, rows], x3[0].T, out=part)
        for i in range(1, n):
            part += dy3[i, rows] @ x3[i].T

    host_threads.each(accumulate, dw.shape[0], 8, work=dw.size * n * x3.shape[2], per_thread=1)     # products
    return dw.reshape(filter_shape)


# ------------------------------------------------------------------------------------ NCHW convolutions, batch folded
# Other NCHW convolutions (ResNet's 3x3 and 7x7 ones) on NumPy skip the NHWC transposes of input, output and both
# gradients: im2col is gathered straight from NCHW into a ``(C*kh*kw, N*Ho*Wo)`` matrix, the batch folded into the
# long axis so that each product is one large BLAS call (per-image products are thin at 7x7 or 14x14 pixels). The
# matrix is written position by position from the unpadded input, zero only where a position reads padding (no
# padded copy of the input); col2im adds each position straight into the unpadded gradient. Only the output and
# ``dy`` change layout (``(O, N, Ho*Wo)`` <-> NCHW). One thread, ResNet-50 layers (batch 4): 10-25 % less time than
# the NHWC route on 3x3 layers, 30 % less on the 7x7 stem's filter gradient.


def _is_folded(xp, groups, data_format):
    return xp is np and groups == 1 and data_format == "NCHW"


def _valid_range(size, k, stride, dilation, before, out):
    """``(first, stop, source)`` per kernel position along one axis: outputs ``first:stop`` read real input (not
    padding), the first of them at input index ``source``."""
    ranges = []
    for i in range(k):
        offset = i * dilation - before              # input index read by output 0
        first = max(0, -(offset // stride)) if offset < 0 else 0     # ceil(-offset / stride)
        stop = min(out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
        ranges.append((first, max(first, stop), first * stride + offset))
    return ranges


def _folded_positions(in_hw, kernel, strides, dilations, pads, out_hw):
    """Per kernel position ``(i, j, out_index, in_index)``: the output pixels that read real input and the input
    pixels they read (the padding they would read contributes nothing); both None where it reads only padding."""
    rows = _valid_range(in_hw[0], kernel[0], strides[0], dilations[0], pads[0][0], out_hw[0])
    cols = _valid_range(in_hw[1], kernel[1], strides[1], dilations[1], pads[1][0], out_hw[1])
    for i, (r0, r1, h0) in enumerate(rows):
        for j, (c0, c1, w0) in enumerate(cols):
            if r0 == r1 or c0 == c1:                # this position reads only padding
                yield i, j, None, None
                continue
            out_index = (slice(r0, r1), slice(c0, c1))
            in_index = (slice(h0, h0 + (r1 - r0 - 1) * strides[0] + 1, strides[0]),
                        slice(w0, w0 + (c1 - c0 - 1) * strides[1] + 1, strides[1]))
            yield i, j, out_index, in_index


def _folded_columns(xp, x, kernel, strides, dilations, pads, out_hw):
    """im2col of NCHW ``x`` as ``(C*kh*kw, N*Ho*Wo)``: row ``(c, i, j)``, column ``(n, r, q)`` holds the input
    under kernel position ``(i, j)`` of output pixel ``(r, q)`` of image ``n`` (0 over padding)."""
    n, c = x.shape[:2]
    cols = xp.empty((c,) + tuple(kernel) + (n,) + tuple(out_hw), x.dtype)
    images = x.transpose(1, 0, 2, 3)                         # (C, N, H, W) view: rows of cols are channels
    positions = list(_folded_positions(x.shape[2:], kernel, strides, dilations, pads, out_hw))

    def gather(channels):                                    # threads take blocks of channels
        for i, j, out_index, in_index in positions:
            target = cols[channels, i, j]
            if out_index is None:
                target[...] = 0
                continue
            (rows, columns), (h, w) = out_index, in_index
            target[:, :, rows, columns] = images[channels, :, h, w]
            if rows.start > 0:                               # padding above, below, left and right: zeros
                target[:, :, :rows.start] = 0
            if rows.stop < out_hw[0]:
                target[:, :, rows.stop:] = 0
            if columns.start > 0:
                target[:, :, rows, :columns.start] = 0
            if columns.stop < out_hw[1]:
                target[:, :, rows, columns.stop:] = 0

    host_threads.each(gather, c, work=cols.size)
    return cols.reshape(c * kernel[0] * kernel[1], -1)


# Compiled col2im of the folded route (float32 on NumPy, ``runtime.jit``): host threads take ranges of channels, as
# above; one (image, channel) plane of the gradient stays in cache while every kernel position adds into it (NumPy:
# one strided pass over the whole gradient per position). The positions add in the NumPy kernel's order: the same
# sums. ResNet-50's stride-2 3x3 layers, one thread: 6.0 / 3.7 / 2.4 -> 4.2 / 2.3 / 0.9 ms. (A compiled im2col
# was slower than NumPy's strided copies: 3.9 / 2.4 / 1.5 -> 5.6 / 3.2 / 2.0 ms on the stem and those layers.)


def _jit_folded_case(xp, dtype):
    """Whether the compiled col2im kernels (the folded route's, Winograd's) take a gradient of ``dtype``."""
    return xp is np and dtype == np.float32 and jit.enabled()


@jit.kernel(inline=True)
def _inside_columns(off, stride, w, wo):
    """``(q0, q1)``: the output columns ``q0 <= q < q1`` (of ``wo``) whose input column ``q * stride + off`` lies in
    ``[0, w)`` (one kernel position's columns, clear of the padding), for the compiled col2im and max pool loops."""
    q0 = min(wo, 0 if off >= 0 else (stride - 1 - off) // stride)
    return q0, max(q0, min(wo, (w - 1 - off) // stride + 1))


@jit.kernel
def _col2im_float32(dcols, sh, sw, dh, dw, top, left, c0, c1, dx):
    """NCHW ``dx`` for channels ``c0:c1``: ``dcols[c, i, j, n, r, q]`` (C, kh, kw, N, Ho, Wo) added at ``dx[n, c,
    r sh + i dh - top, q sw + j dw - left]`` (skipped over padding), kernel positions in order."""
    kh, kw, n, ho, wo = dcols.shape[1], dcols.shape[2], dcols.shape[3], dcols.shape[4], dcols.shape[5]
    h, w = dx.shape[2], dx.shape[3]
    for c in range(c0, c1):
        for b in range(n):
            dx[b, c] = 0
            for i in range(kh):
                for j in range(kw):
                    off = j * dw - left
                    q0, q1 = _inside_columns(off, sw, w, wo)
                    for r in range(ho):
                        row = r * sh + i * dh - top
                        if row >= 0 and row < h:
                            for q in range(q0, q1):
                                dx[b, c, row, q * sw + off] += dcols[c, i, j, b, r, q]


def _to_images(y, n):
    """A ``(K, N*...)`` product (rows are channels) as a contiguous ``(N, K, ...)`` array; threads copy blocks of
    channels."""
    k = y.shape[0]
    y = y.reshape((k, n, -1))
    out = np.empty((n, k, y.shape[2]), y.dtype)
    host_threads.each(lambda rows: np.copyto(out[:, rows], y[rows].transpose(1, 0, 2)), k, work=y.size)
    return out


def _channels_first(a):
    """NCHW ``a`` (any strides, e.g. ``dy`` or a strided subsample) as a contiguous ``(C, N*H*W)`` array, columns
    ordered like ``_folded_columns``; threads copy blocks of channels."""
    n, c = a.shape[:2]
    out = np.empty((c, n) + a.shape[2:], a.dtype)
    host_threads.each(lambda rows: np.copyto(out[rows], a[:, rows].transpose(1, 0, 2, 3)), c, work=a.size)
    return out.reshape(c, -1)


def _folded_forward(xp, x, w, kernel, strides, dilations, pads, out_hw):
    cols = _folded_columns(xp, x, kernel, strides, dilations, pads, out_hw)
    y = host_threads.matmul(w.reshape(w.shape[0], -1), cols)          # (O, N*Ho*Wo)
    return _to_images(y, x.shape[0]).reshape((x.shape[0], w.shape[0]) + tuple(out_hw))


def _folded_input_grad(xp, dy, w, input_shape, kernel, strides, dilations, pads, out_hw):
    n, o = dy.shape[:2]
    c = input_shape[1]
    dcols = host_threads.matmul(w.reshape(o, -1).T, _channels_first(dy))
    dcols = dcols.reshape((c,) + tuple(kernel) + (n,) + tuple(out_hw))
    dx = xp.empty(input_shape, dy.dtype)
    if _jit_folded_case(xp, dx.dtype):
        geometry = tuple(strides) + tuple(dilations) + (pads[0][0], pads[1][0])
        host_threads.each(lambda part: _col2im_float32(dcols, *geometry, part.start, part.stop, dx), c,
                          work=host_threads.compiled_work(dcols.size))
        return dx
    images = dx.transpose(1, 0, 2, 3)                        # (C, N, H, W) view of dx
    positions = list(_folded_positions(input_shape[2:], kernel, strides, dilations, pads, out_hw))

    def scatter(channels):                                   # threads take blocks of channels
        images[channels] = 0
        for i, j, out_index, in_index in positions:
            if out_index is not None:              # one position never reads an element twice: += is exact
                images[(channels, slice(None)) + in_index] += dcols[(channels, i, j, slice(None)) + out_index]

    host_threads.each(scatter, c, work=dcols.size)
    return dx


def _folded_filter_grad(xp, x, dy, filter_shape, kernel, strides, dilations, pads, out_hw):
    cols = _folded_columns(xp, x, kernel, strides, dilations, pads, out_hw)
    return host_threads.matmul(_channels_first(dy), cols.T).reshape(filter_shape)   # N*Ho*Wo inner in both operands


# ------------------------------------------------------------------------------- Winograd 3x3 stride-1 convolutions
# Winograd's minimal filtering F(m x m, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
# 2016): each m x m block of output pixels ("tile") is ``A^T [(G g G^T) * (B^T d B)] A`` of the t x t input window
# ``d`` (t = m + 2) under it and the 3x3 filter ``g``, so that after transforming filters (``U = G g G^T``) and input
# windows (``V = B^T d B``), a convolution is t*t independent products ``M[xi] = U[xi] @ V[xi]`` over channels, one
# per position ``xi`` of the transformed tile: F(4x4, 3x3) takes 36 multiply-adds per tile and channel pair against
# 144 directly (4x fewer), F(2x2, 3x3) 16 against 36 (2.25x fewer); the rest is linear maps of the input and
# output. Both gradients are the transposed maps of the same algebra, exact in exact arithmetic: ``dM = A dy A^T``
# per tile, input ``dV = U^T dM`` mapped back by ``B dV B^T`` and added over the overlapping windows, filters ``dU =
# dM V^T`` mapped back by ``G^T dU G``. The transforms of inputs and outputs are small matrix products over a tile
# axis, taken here as products with the whole tensor (BLAS), and gathers of strided slices; the filters' (9 numbers
# to t*t and back) are one product with ``G (x) G``. The price is rounding: F(4x4)'s transforms scale values by up to
# ~100, so float32 results differ from a direct convolution by ~1e-5 relative to the output's scale (against ~1e-7;
# F(2x2)'s by ~1e-6); float64 stays within ~1e-13.
#
# Taken for float32 and float64 NCHW convolutions with 3x3 filters, stride 1, no dilation and one group on NumPy
# (float16 would lose ~10 % in the transforms). F(4x4) when the batch has at least ``_WINOGRAD_PIXELS`` output pixels
# per input and output channel (ResNet-50's 56x56x64 and 28x28x128 layers at batch 4); on smaller images with more
# channels its 36 filter positions per 9 taps (filters transformed each call) and its thin products over few tiles
# cost more than they save, and F(2x2) is taken down to ``_WINOGRAD2_PIXELS`` per channel. One thread, batch 4,
# forward / input gradient / filter gradient in ms, F(4x4) | F(2x2) | im2col: 56x56x64 12.1/13.8/12.6 | 18.9/20.0/15.5 |
# 17.0/17.5/14.4; 28x28x128 7.5/7.9/7.6 | 11.4/12.2/10.0 | 12.4/12.9/12.2; 14x14x256 9.9/10.8/9.1 | 8.8/9.2/8.3 |
# 11.2/11.8/10.7; 7x7x512 17.2/22.3/16.4 | 14.4/16.9/13.3 | 11.1/12.7/10.6 (there the filter transform alone, 16 or
# 36 numbers written for each of 2.4M taps, takes 4-8 ms).

_WINOGRAD_PIXELS = 8
_WINOGRAD2_PIXELS = 1
_WINO_CHUNK = 1 << 16     # elements of a chunk of the input transform's row buffer (NumPy)
_WINO_BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                     [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)           # interpolation points 0, +-1,
_WINO_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                    [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)                # +-2 and infinity
_WINO_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
                    np.float64)
_WINO2_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)   # points 0, +-1, inf
_WINO2_G = np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]], np.float64)
_WINO2_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


class _Winograd(NamedTuple):
    """One F(m x m, 3x3) algorithm: ``bt`` (t, t), ``g`` (t, 3), ``at`` (m, t), t = m + 2."""
    m: int
    bt: np.ndarray
    g: np.ndarray
    at: np.ndarray

    @property
    def t(self):
        return self.m + 2

    def filter_map(self, dtype):
        """``G (x) G`` as ``(t*t, 9)``: row ``t b + a`` (the positions of ``_wino_input``), column ``3 p + q`` (tap
        ``(p, q)`` of a filter), so that ``U = filter_map @ g.reshape(9)``."""
        t = self.t
        return np.einsum("ap,bq->bapq", self.g, self.g).reshape(t * t, 9).astype(dtype)


F43 = _Winograd(4, _WINO_BT, _WINO_G, _WINO_AT)
F23 = _Winograd(2, _WINO2_BT, _WINO2_G, _WINO2_AT)


def _winograd(xp, dtype, x_shape, w_shape, kernel, strides, dilations, groups, data_format, out_hw):
    """The Winograd algorithm (``F43`` or ``F23``) that computes this convolution, or None (another route)."""
    if not (xp is np and dtype in (np.float32, np.float64) and kernel == (3, 3) and strides == (1, 1) and
            dilations == (1, 1) and groups == 1 and data_format == "NCHW"):     # float16 would lose ~1e-1
        return None
    pixels, channels = x_shape[0] * out_hw[0] * out_hw[1], max(x_shape[1], w_shape[0])
    if pixels >= _WINOGRAD_PIXELS * channels:
        return F43
    return F23 if pixels >= _WINOGRAD2_PIXELS * channels else None


def _is_winograd(xp, dtype, x_shape, w_shape, kernel, strides, dilations, groups, data_format, out_hw):
    return _winograd(xp, dtype, x_shape, w_shape, kernel, strides, dilations, groups, data_format, out_hw) is not None


def _wino_matmul(xp, a, b):
    return host_threads.matmul(a, b) if xp is np else xp.matmul(a, b)


def _wino_tiles(out_hw, m):
    return tuple(-(-o // m) for o in out_hw)


def _wino_input(xp, x, pads, tiles, algo):
    """``V = B^T d B`` of every t x t input window ``d`` (zero over padding) as ``(t*t, C, N*th*tw)``; position
    ``xi = t b + a`` holds row ``a``, column ``b`` of the transformed tile.

    On NumPy the channels go through in chunks of about ``_WINO_CHUNK`` elements, each chunk's gathers and two
    transform products staying in cache (whole-tensor passes were memory-bound: ResNet-50's 56x56x64 layer, one
    thread, 6.1 -> 4.4 ms), and host threads take ranges of chunks."""
    n, c, h, w = x.shape
    (th, tw), m, t = tiles, algo.m, algo.t
    (top, _), (left, _) = pads
    bt = xp.asarray(algo.bt, x.dtype)
    images = x.transpose(1, 0, 2, 3)                                # (C, N, H, W) view
    spans = _valid_range(h, t, m, 1, top, th)
    width = tw * m + 2
    v = xp.empty((t, t, c, n * th * tw), x.dtype)
    per_channel = t * n * th * width
    step = c if xp is not np else max(1, min(c, _WINO_CHUNK // per_channel))

    def transform(channels):
        buffers = {}
        for start in range(channels.start, channels.stop, step):
            stop = min(start + step, channels.stop)
            k = stop - start
            if k not in buffers:    # rows[p][:, :, i] = padded input row m i + p; padding stays zero across chunks
                buffers[k] = (xp.zeros((t, k, n, th, width), x.dtype), xp.empty((t, t, k, n, th, tw), x.dtype))
            rows, windows = buffers[k]
            for p, (first, last_tile, source) in enumerate(spans):
                if last_tile > first:
                    last = source + (last_tile - first - 1) * m + 1
                    rows[p, :, :, first:last_tile, left:left + w] = images[start:stop, :, source:last:m]
            mixed = xp.matmul(bt, rows.reshape(t, -1)).reshape(rows.shape)         # over p: (a, k, N, th, W')
            for q in range(t):                                      # windows[q, a] = column m j + q of row a
                windows[q] = mixed[..., q:q + m * (tw - 1) + 1:m]
            chunk = xp.matmul(bt, windows.reshape(t, -1))           # over q: (b, a*k*T)
            v[:, :, start:stop] = chunk.reshape(t, t, k, -1)

    host_threads.each(transform, c, step, work=v.size)
    return v.reshape(t * t, c, -1)


def _wino_filters(xp, w, algo):
    """``U = G g G^T`` of each 3x3 filter as ``(t*t, O, C)``, positions as in ``_wino_input``: one product of the
    ``(t*t, 9)`` map with all filters (two passes of 3-wide products, and the transpose between them, took 2-3x
    longer)."""
    o, c = w.shape[:2]
    taps = w.reshape(o * c, 9)
    return _wino_matmul(xp, xp.asarray(algo.filter_map(w.dtype)), taps.T).reshape(algo.t ** 2, o, c)


def _wino_output_grad(xp, dy, tiles, algo):
    """``A dy A^T`` of every m x m tile of ``dy`` (zero beyond its edge) as ``(t*t, O, N*th*tw)``: the transpose of
    the output transform."""
    n, o, ho, wo = dy.shape
    (th, tw), m, t = tiles, algo.m, algo.t
    if (ho, wo) != (th * m, tw * m):
        padded = xp.zeros((n, o, th * m, tw * m), dy.dtype)
        padded[:, :, :ho, :wo] = dy
        dy = padded
    blocks = xp.empty((m, m, o, n, th, tw), dy.dtype)               # blocks[v, u] = pixel (u, v) of each tile
    grid = dy.reshape(n, o, th, m, tw, m)

    def gather(channels):
        xp.copyto(blocks[:, :, channels], grid[:, channels].transpose(5, 3, 1, 0, 2, 4))

    host_threads.each(gather, o, work=blocks.size)
    a = xp.asarray(algo.at.T, dy.dtype)                             # (t, m)
    by_column = _wino_matmul(xp, a, blocks.reshape(m, -1)).reshape(t, m, -1)     # over v: (b, u, O*T)
    return _wino_matmul(xp, a, by_column).reshape(t * t, o, -1)                  # over u: (b, a, O, T)


def _winograd_forward(xp, x, w, pads, out_hw, algo=F43):
    n, o = x.shape[0], w.shape[0]
    tiles = _wino_tiles(out_hw, algo.m)
    (th, tw), m, t = tiles, algo.m, algo.t
    products = _wino_matmul(xp, _wino_filters(xp, w, algo), _wino_input(xp, x, pads, tiles, algo))  # (t*t, O, T)
    at = xp.asarray(algo.at, x.dtype)
    by_row = _wino_matmul(xp, at, products.reshape(t, t, -1))                  # over a: (b, u, O*T)
    pixels = _wino_matmul(xp, at, by_row.reshape(t, -1)).reshape(m, m, o, n, th, tw)     # over b: (v, u, ...)
    y = xp.empty((n, o, th * m, tw * m), x.dtype)
    grid = y.reshape(n, o, th, m, tw, m)

    def scatter(channels):
        xp.copyto(grid[:, channels], pixels[:, :, channels].transpose(3, 2, 4, 1, 5, 0))

    host_threads.each(scatter, o, work=y.size)
    return y if y.shape[2:] == tuple(out_hw) else xp.ascontiguousarray(y[:, :, :out_hw[0], :out_hw[1]])


def _winograd_input_grad(xp, dy, w, input_shape, pads, out_hw, algo=F43):
    n, c, h, wd = input_shape
    tiles = _wino_tiles(out_hw, algo.m)
    t = algo.t
    dv = _wino_matmul(xp, _wino_filters(xp, w, algo).transpose(0, 2, 1),
                      _wino_output_grad(xp, dy, tiles, algo))                  # (t*t, C, T)
    b = xp.asarray(algo.bt.T, dy.dtype)
    by_column = _wino_matmul(xp, b, dv.reshape(t, -1))                          # over b: (q, a, C*T)
    windows = _wino_matmul(xp, b, by_column.reshape(t, t, -1)).reshape((t, t, c, n) + tiles)   # over a: (q, p)
    dx = xp.empty(input_shape, dy.dtype)
    if _jit_folded_case(xp, dx.dtype):
        (top, _), (left, _) = pads
        host_threads.each(lambda part: _wino_col2im_float32(windows, algo.m, top, left, part.start, part.stop, dx),
                          c, work=host_threads.compiled_work(windows.size))
        return dx
    images = dx.transpose(1, 0, 2, 3)                               # (C, N, H, W) view of dx
    positions = list(_folded_positions((h, wd), (t, t), (algo.m,) * 2, (1, 1), pads, tiles))

    def scatter(channels):                     # col2im of the t x t windows; each position's += is exact
        images[channels] = 0
        for p, q, tile_index, in_index in positions:
            if tile_index is not None:
                images[(channels, slice(None)) + in_index] += windows[(q, p, channels, slice(None)) + tile_index]

    host_threads.each(scatter, c, work=windows.size)
    return dx


@jit.kernel
def _wino_col2im_float32(windows, m, top, left, c0, c1, dx):
    """The col2im of ``_winograd_input_grad`` for channels ``c0:c1``, compiled: ``windows`` (t, t, C, N, th, tw), its
    ``[q, p]`` the window's row ``p``, column ``q``, added into NCHW ``dx`` where tile ``(i, j)``'s window reads
    (rows ``m i + p - top``, columns ``m j + q - left``; padding skipped). One (image, channel) plane of ``dx`` stays
    in cache for all its t*t positions, where NumPy made t*t strided passes over the whole gradient (ResNet-50,
    one thread: 34 -> 4 ms a step); the additions come in the NumPy kernel's order (rows ``p``, then columns ``q``),
    so the sums are the same."""
    t, n, th, tw = windows.shape[0], windows.shape[3], windows.shape[4], windows.shape[5]
    h, w = dx.shape[2], dx.shape[3]
    for c in range(c0, c1):
        for b in range(n):
            dx[b, c] = 0
            for p in range(t):
                for i in range(th):
                    row = i * m + p - top
                    if row < 0 or row >= h:
                        continue
                    for q in range(t):
                        first, stop = _inside_columns(q - left, m, w, tw)
                        for j in range(first, stop):
                            dx[b, c, row, j * m + q - left] += windows[q, p, c, b, i, j]


def _winograd_filter_grad(xp, x, dy, filter_shape, pads, out_hw, algo=F43):
    o, c = filter_shape[:2]
    tiles = _wino_tiles(out_hw, algo.m)
    du = _wino_matmul(xp, _wino_output_grad(xp, dy, tiles, algo),
                      _wino_input(xp, x, pads, tiles, algo).transpose(0, 2, 1))   # (t*t, O, C)
    # G^T dU G of each filter: the filter map's transpose, as (O*C, 9) = dU^T @ map: the taps come out in place
    taps = _wino_matmul(xp, du.reshape(algo.t ** 2, -1).T, xp.asarray(algo.filter_map(x.dtype)))
    return taps.reshape(filter_shape)


# --------------------------------------------------------------------------------------------- depthwise convolution
# groups == in_channels == out_channels (MobileNet's depthwise layers): each channel is filtered by its own kernel, so
# the grouped im2col product degenerates into C tiny matrix products (13x slower than PyTorch on a MobileNetV2
# layer). Instead, one multiply-add of the whole output per kernel position, in the input's own layout (no
# transposes), over blocks of images that stay in cache on NumPy.

_DEPTHWISE_BLOCK = 1 << 18      # elements of output a block of images holds (NumPy): about an image of a MobileNet


def _is_depthwise(x_shape, w_shape, groups, data_format):
    channels = _nchw_shape(x_shape, data_format)[1]
    out_channels, per_group = _nchw_shape(w_shape, data_format)[:2]
    return groups > 1 and groups == channels == out_channels and per_group == 1


def _taps(xp, w, data_format):
    """A depthwise filter as ``(kh*kw, 1, C, 1, 1)`` (NCHW) or ``(kh*kw, C)`` (NHWC): one row per kernel position,
    ready to broadcast over a window slice. Both filter layouts keep ``kh, kw`` after the channel axis."""
    taps = w.reshape(w.shape[0], -1).T
    return taps.reshape(taps.shape + (1, 1))[:, None] if data_format == "NCHW" else taps


def _image_blocks(xp, n, per_image):
    rows = n if xp is not np else max(1, _DEPTHWISE_BLOCK // max(per_image, 1))
    return [slice(start, min(start + rows, n)) for start in range(0, n, rows)]


def _depthwise_forward(xp, x, w, kernel, strides, dilations, pads, out_hw, data_format):
    padded, taps = _pad(xp, x, pads, data_format), _taps(xp, w, data_format)
    n, c = _nchw_shape(x.shape, data_format)[:2]
    y = xp.empty(_layout_shape((n, c) + tuple(out_hw), data_format), x.dtype)
    positions = list(_positions(kernel, strides, dilations, out_hw))
    for block in _image_blocks(xp, n, y[0].size):
        y_block, x_block = y[block], padded[block]
        scratch = xp.empty_like(y_block)
        for index, rows, cols in positions:
            part = x_block[_window_slice(data_format, rows, cols)]
            if index == 0:
                xp.multiply(part, taps[index], out=y_block)
            else:
                y_block += xp.multiply(part, taps[index], out=scratch)
    return y


def _depthwise_input_grad(xp, dy, w, input_shape, kernel, strides, dilations, pads, out_hw, data_format):
    taps = _taps(xp, w, data_format)
    h, wd = _hw_axes(data_format)
    padded_shape = list(input_shape)
    padded_shape[h] += sum(pads[0])
    padded_shape[wd] += sum(pads[1])
    dx = xp.zeros(padded_shape, dy.dtype)
    positions = list(_positions(kernel, strides, dilations, out_hw))
    for block in _image_blocks(xp, dy.shape[0], dy[0].size):
        dx_block, dy_block = dx[block], dy[block]
        scratch = xp.empty_like(dy_block)
        for index, rows, cols in positions:      # one position never reads an element twice: += is exact
            dx_block[_window_slice(data_format, rows, cols)] += xp.multiply(dy_block, taps[index], out=scratch)
    return xp.ascontiguousarray(dx[_crop(data_format, pads, input_shape)])


def _depthwise_filter_grad(xp, x, dy, filter_shape, kernel, strides, dilations, pads, out_hw, data_format):
    padded = _pad(xp, x, pads, data_format)
    subscripts = "nchw,nchw->c" if data_format == "NCHW" else "nhwc,nhwc->c"
    positions = list(_positions(kernel, strides, dilations, out_hw))
    taps = xp.zeros((len(positions), filter_shape[0]), dy.dtype)
    for block in _image_blocks(xp, dy.shape[0], dy[0].size):    # a block of dy stays in cache for every position
        x_block, dy_block = padded[block], dy[block]
        for index, rows, cols in positions:
            taps[index] += xp.einsum(subscripts, x_block[_window_slice(data_format, rows, cols)], dy_block)
    return xp.ascontiguousarray(taps.T).reshape(filter_shape)


# ----------------------------------------------------------------------------------------------------------- pooling

class _Pool(Op):
    @staticmethod
    def infer(x, ksize, strides, padding, data_format):
        if x.ndim != 4:
            raise ShapeError(f"input must be a 4-D {data_format} tensor, got shape {x.shape}")
        if x.dtype.kind != "f":
            raise ShapeError(f"input must be floating point, got dtype {x.dtype}")
        if not isinstance(padding, str) and any(p >= k for pair, k in zip(padding, ksize) for p in pair):
            raise ShapeError(f"padding {padding} must be smaller than ksize {ksize} on each side, so that every "
                             "window holds an input element")
        n, c, h, w = _nchw_shape(x.shape, data_format)
        ho, wo = _check_fits(x, (h, w), ksize, strides, (1, 1), padding, "ksize")
        return spec(_layout_shape((n, c, ho, wo), data_format), x.dtype)


def _pool_geometry(in_shape, ksize, strides, padding, data_format):
    nhwc = _nhwc_shape(in_shape, data_format)
    pads, out_hw = _geometry(nhwc[1:3], ksize, strides, (1, 1), padding)
    return nhwc, pads, out_hw


def _window_slice(data_format, rows, cols):
    """The index of one kernel position's elements (``rows``, ``cols`` of ``_positions``) in ``data_format``."""
    everything = slice(None)
    return (everything, everything, rows, cols) if data_format == "NCHW" else (everything, rows, cols, everything)


def _crop(data_format, pads, shape):
    """The index that takes the unpadded ``shape`` back out of a padded array."""
    (top, _), (left, _) = pads
    h, w = _hw_axes(data_format)
    index = [slice(None)] * 4
    index[h], index[w] = slice(top, top + shape[h]), slice(left, left + shape[w])
    return tuple(index)


def _max_windows(xp, x, ksize, strides, padding, data_format):
    """``(padded x, one index per kernel position, window maxima)`` of a max pool over ``x`` in its own layout: a
    running maximum over the kernel positions, each a strided slice (a reduction over the small window axes of a
    6-D view is ~5x slower)."""
    _, pads, out_hw = _pool_geometry(x.shape, ksize, strides, padding, data_format)
    x = _pad(xp, x, pads, data_format, -np.inf)     # pooling reads windows of one channel: no NHWC needed
    windows = [_window_slice(data_format, rows, cols) for _, rows, cols in _positions(ksize, strides, (1, 1), out_hw)]
    y = None
    for where in windows:
        y = x[where].copy() if y is None else xp.maximum(y, x[where], out=y)     # NaN propagates, as max does
    return x, windows, y


class MaxPool2D(_Pool):
    prefix, api = "MaxPool2D_", "flow.nn.max_pool2d"

    @staticmethod
    def forward(xp, x, ksize, strides, padding, data_format):
        if _jit_pool_case(xp, x, data_format):
            return _jit_max_pool(_max_pool_float32, x, None, ksize, strides, padding)
        if xp is not np or host_threads.width() == 1:
            return _max_windows(xp, x, ksize, strides, padding, data_format)[2]
        # host threads take blocks of channels (NCHW: each channel pools alone) or images
        x4 = x.reshape((-1, 1) + x.shape[2:]) if data_format == "NCHW" else x
        n, c = _nchw_shape(x4.shape, data_format)[:2]
        y = np.empty(_layout_shape((n, c) + _pool_geometry(x4.shape, ksize, strides, padding, data_format)[2],
                                   data_format), x.dtype)

        def pool(part):
            y[part] = _max_windows(xp, x4[part], ksize, strides, padding, data_format)[2]

        host_threads.each(pool, n, work=x.size)
        return y.reshape(x.shape[:2] + y.shape[2:]) if data_format == "NCHW" else y

    @staticmethod
    def vjp(node, dy):
        return (apply(MaxPoolGrad, (node.inputs[0], dy), **node.attrs),)


class MaxPoolGrad(Op):
    """Each window's gradient goes to its maximum, the first in row-major order on ties; a window whose maximum is
    NaN passes none."""
    prefix, api = "MaxPool2DGrad_", "max_pool2d_grad"

    @staticmethod
    def infer(x, dy, **pool):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, dy, ksize, strides, padding, data_format):
        if _jit_pool_case(xp, x, data_format) and dy.dtype == x.dtype:
            return _jit_max_pool(_max_pool_grad_float32, x, dy, ksize, strides, padding)
        if xp is not np:
            return _max_pool_grad(xp, x, dy, ksize, strides, padding, data_format)
        # NumPy: in blocks of channels (NCHW: every channel pools alone) or images, so that the ~45 passes over each
        # block's windows hit cache: 2.5x faster on ResNet-50's pool1 (4 x 64 x 112 x 112)
        shape = x.shape
        if data_format == "NCHW":
            x, dy = x.reshape((-1, 1) + shape[2:]), dy.reshape((-1, 1) + dy.shape[2:])
        dx = np.empty(x.shape, dy.dtype)
        rows = max(1, _POOL_BLOCK // max(1, dy[0].size))

        def blocks(part):                   # a host thread's share of the blocks
            for start in range(part.start, part.stop, rows):
                block = slice(start, min(start + rows, part.stop))
                dx[block] = _max_pool_grad(xp, x[block], dy[block], ksize, strides, padding, data_format)

        host_threads.each(blocks, x.shape[0], rows, work=x.size)
        return dx.reshape(shape)


_POOL_BLOCK = 1 << 16       # elements of output per block of a max pool's gradient (NumPy)


def _max_pool_grad(xp, x, dy, ksize, strides, padding, data_format):
    shape = x.shape
    pads = _pool_geometry(shape, ksize, strides, padding, data_format)[1]
    x, windows, y = _max_windows(xp, x, ksize, strides, padding, data_format)
    dx = xp.zeros(x.shape, dy.dtype)
    free = xp.ones(y.shape, bool)           # windows whose maximum is not found yet (ties: the first takes it)
    for where in windows:                   # masks and products, not where(): ~10x faster on NumPy
        take = xp.logical_and(x[where] == y, free)
        dx[where] += dy * take              # one position never reads an element twice
        free ^= take
    return xp.ascontiguousarray(dx[_crop(data_format, pads, shape)])


# Compiled max pooling (float32 NCHW on NumPy, ``runtime.jit``): host threads take ranges of planes (one channel of
# one image). Per output row, a running maximum over the window's rows for every input column (contiguous), then over
# the window's columns; the gradient then looks for each window's first maximum in row-major order, as the NumPy
# kernels' rule is (ties: the first; NaN: none; padding counts as -inf and, if first, takes the gradient away).
# ResNet-50's pool1 (4 x 64 x 112 x 112, 3x3 stride 2), one thread: forward 15 -> 2.4 ms, gradient 25 -> 13 ms.


def _jit_pool_case(xp, x, data_format):
    return xp is np and x.dtype == np.float32 and data_format == "NCHW" and jit.enabled()


@jit.kernel(inline=True)
def _window_row_maxima(plane, a0, kh, kw, sw, left, column, out):
    """The maxima of one output row's windows of ``plane`` (H, W), whose rows start at input row ``a0``, into
    ``out`` (Wo): a running maximum over the window's rows for every input column (into ``column``, W), then over
    the window's columns. NaN stays, as in ``np.maximum``; padding counts as -inf."""
    h, w, wo = plane.shape[0], plane.shape[1], out.size
    low = np.float32(-np.inf)
    for b in range(w):
        column[b] = low
    for i in range(kh):
        a = a0 + i
        if a >= 0 and a < h:
            for b in range(w):
                v = plane[a, b]
                c = column[b]
                column[b] = v if (v > c or v != v) else c
    for q in range(wo):
        out[q] = low
    for j in range(kw):
        off = j - left
        q0, q1 = _inside_columns(off, sw, w, wo)
        for q in range(q0, q1):
            v = column[q * sw + off]
            c = out[q]
            out[q] = v if (v > c or v != v) else c


@jit.kernel
def _max_pool_float32(x, dy, kh, kw, sh, sw, top, left, p0, p1, y):
    """Max pool of planes ``p0:p1`` of ``x`` (planes, H, W) into ``y`` (planes, Ho, Wo); ``dy`` is not read."""
    column = np.empty(x.shape[2], np.float32)
    for p in range(p0, p1):
        for r in range(y.shape[1]):
            _window_row_maxima(x[p], r * sh - top, kh, kw, sw, left, column, y[p, r])


@jit.kernel
def _max_pool_grad_float32(x, dy, kh, kw, sh, sw, top, left, p0, p1, dx):
    """Gradient of the max pool of planes ``p0:p1`` of ``x`` (planes, H, W), ``dy`` (planes, Ho, Wo), into
    ``dx``: the window maxima as in ``_max_pool_float32``, then each window's first position holding its maximum."""
    h, w = x.shape[1], x.shape[2]
    ho, wo = dy.shape[1], dy.shape[2]
    low = np.float32(-np.inf)
    column = np.empty(w, np.float32)
    m = np.empty(wo, np.float32)
    for p in range(p0, p1):
        for a in range(h):
            for b in range(w):
                dx[p, a, b] = 0
        for r in range(ho):
            a0 = r * sh - top
            _window_row_maxima(x[p], a0, kh, kw, sw, left, column, m)
            for q in range(wo):
                b0 = q * sw - left
                found = False
                for i in range(kh):             # the first position in row-major order holding the maximum
                    a = a0 + i
                    for j in range(kw):
                        b = b0 + j
                        inside = a >= 0 and a < h and b >= 0 and b < w
                        if (x[p, a, b] if inside else low) == m[q]:
                            if inside:
                                dx[p, a, b] += dy[p, r, q]
                            found = True
                            break
                    if found:
                        break


def _jit_max_pool(kernel, x, dy, ksize, strides, padding):
    """``kernel`` (the compiled max pool or its gradient) over the planes of NCHW ``x``, on host threads."""
    pads, out_hw = _pool_geometry(x.shape, ksize, strides, padding, "NCHW")[1:]
    n, c, h, w = x.shape
    x3 = np.ascontiguousarray(x).reshape(n * c, h, w)
    if dy is None:
        dy3, out = x3, np.empty((n * c,) + tuple(out_hw), x.dtype)
    else:
        dy3, out = np.ascontiguousarray(dy).reshape((n * c,) + tuple(out_hw)), np.empty_like(x3)
    args = tuple(ksize) + tuple(strides) + (pads[0][0], pads[1][0])
    host_threads.each(lambda part: kernel(x3, dy3, *args, part.start, part.stop, out), n * c,
                      work=host_threads.compiled_work(x3.size))
    return out.reshape((n, c) + out.shape[1:])


def _valid_counts(xp, in_hw, ksize, strides, pads, out_hw, dtype):
    """Input (non-padded) elements in each window, the avg-pool divisor as in TensorFlow: ``(Ho, Wo, 1)``."""
    per_axis = []
    for n, k, s, (before, _), o in zip(in_hw, ksize, strides, pads, out_hw):
        start = np.arange(o) * s - before
        per_axis.append(np.minimum(start + k, n) - np.maximum(start, 0))
    return xp.asarray(np.outer(*per_axis)[:, :, None].astype(dtype))


class AvgPool2D(_Pool):
    prefix, api = "AvgPool2D_", "flow.nn.avg_pool2d"

    @staticmethod
    def forward(xp, x, ksize, strides, padding, data_format):
        nhwc, pads, out_hw = _pool_geometry(x.shape, ksize, strides, padding, data_format)
        if _is_global(nhwc, ksize, pads, out_hw):      # one window over each whole image: a mean in place
            return xp.mean(x, axis=_hw_axes(data_format), keepdims=True)
        win = _windows(xp, _nhwc(xp, x, data_format), ksize, strides, (1, 1), pads, out_hw)
        y = win.sum(axis=(3, 4)) / _valid_counts(xp, nhwc[1:3], ksize, strides, pads, out_hw, x.dtype)
        return _out(xp, y, data_format)

    @staticmethod
    def vjp(node, dy):
        return (apply(AvgPoolGrad, (dy,), input_shape=node.inputs[0].shape, **node.attrs),)


class AvgPoolGrad(Op):
    """Each window spreads ``dy / count`` over its input elements."""
    prefix, api = "AvgPool2DGrad_", "avg_pool2d_grad"

    @staticmethod
    def infer(dy, input_shape, **pool):
        return spec(input_shape, dy.dtype)

    @staticmethod
    def forward(xp, dy, input_shape, ksize, strides, padding, data_format):
        nhwc, pads, out_hw = _pool_geometry(input_shape, ksize, strides, padding, data_format)
        if _is_global(nhwc, ksize, pads, out_hw):      # each input element gets its image's dy / (H*W)
            dx = xp.empty(input_shape, dy.dtype)
            xp.divide(dy, dy.dtype.type(nhwc[1] * nhwc[2]), out=dx)       # broadcast over H and W
            return dx
        share = _nhwc(xp, dy, data_format) / _valid_counts(xp, nhwc[1:3], ksize, strides, pads, out_hw, dy.dtype)
        dx = _scatter(xp, lambda index: share, dy.dtype, nhwc, ksize, strides, (1, 1), pads, out_hw)
        return _out(xp, dx, data_format)


def _is_global(nhwc, ksize, pads, out_hw):
    """Whether an average pool is one unpadded window per image (ResNet's last pool): the NHWC windows, transposes and
    scatter of the general route then cost ~2 ms a step for what is a mean and a broadcast."""
    return tuple(out_hw) == (1, 1) and tuple(ksize) == tuple(nhwc[1:3]) and not any(p for pair in pads for p in pair)


def _pool(op, input, ksize, strides, padding, data_format, name):  # noqa: A002
    fmt = _data_format(data_format, op.api)
    return apply(op, (as_tensor(input, argument="input"),), name, ksize=_pair(ksize, "ksize", op.api),
                 strides=_pair(strides, "strides", op.api), padding=_padding(padding, fmt, op.api), data_format=fmt)


def max_pool2d(input, ksize, strides, padding, data_format="NCHW", name=None):  # noqa: A002 - OneFlow's name
    """``flow.nn.max_pool2d``: the maximum of each ``ksize`` window (padding never wins)."""
    return _pool(MaxPool2D, input, ksize, strides, padding, data_format, name)


def avg_pool2d(input, ksize, strides, padding, data_format="NCHW", name=None):  # noqa: A002 - OneFlow's name
    """``flow.nn.avg_pool2d``: the mean of each window over its input elements only (padding is not counted)."""
    return _pool(AvgPool2D, input, ksize, strides, padding, data_format, name)
