"""Sources (placeholders, constants) and shape ops: ``reshape``, ``transpose``, ``concat``, ``slice``, ``cast``."""
from __future__ import annotations

import numpy as np

from .. import graph as g
from ..errors import ShapeError
from . import Op, apply, as_tensor, keeps_partials, normalize_axis, same_dtype, shape_error, spec


class Input(Op):
    """A job argument. The executor feeds it; it has no kernel."""
    prefix, api = "Input_", "placeholder"
    is_placeholder = batch_source = True

    @staticmethod
    def infer(shape, dtype):
        return spec(shape, dtype)


class Constant(Op):
    prefix, api = "Constant_", "flow.constant"
    is_constant = True

    @staticmethod
    def infer(value):
        return spec(value.shape, value.dtype)

    @staticmethod
    def forward(xp, value):
        return value   # the executor moves constants to the device once, at compile time


def constant(value, dtype=None, shape=None, name=None):
    """``flow.constant(value, dtype=None, shape=None)``: a tensor filled with ``value``."""
    from ..dtypes import as_dtype
    array = np.asarray(value, dtype=None if dtype is None else as_dtype(dtype))
    if array.dtype == np.float64 and dtype is None:
        array = array.astype(np.float32)
    if shape is not None:
        array = np.broadcast_to(array, tuple(shape)).copy()
    return apply(Constant, (), name, value=array)


class Identity(Op):
    prefix, api = "Identity_", "flow.identity"
    is_view = True
    partial_join = keeps_partials("sum", "mean", "max", "min")

    @staticmethod
    def infer(x):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x):
        return x

    @staticmethod
    def vjp(node, dy):
        return (dy,)


def identity(x, name=None):
    return apply(Identity, (as_tensor(x, argument="x"),), name)


class Reshape(Op):
    prefix, api = "Reshape_", "flow.reshape"
    is_view = True

    @staticmethod
    def infer(x, shape):
        return spec(shape, x.dtype)

    @staticmethod
    def forward(xp, x, shape):
        return x.reshape(shape)

    @staticmethod
    def vjp(node, dy):
        return (reshape(dy, node.inputs[0].shape),)


def reshape(x, shape, name=None):
    """``flow.reshape(x, shape)``; one entry of ``shape`` may be -1."""
    x = as_tensor(x, argument="x")
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"flow.reshape: shape must be a sequence of ints, got {shape!r}") from None
    # On several devices under the consistent view a program writes the logical batch size; this device has its
    # share of the batch (graph.split_batches)
    split = g.current_graph("flow.reshape").split_batches
    if shape and x.ndim and shape[0] in split and x.shape[0] == split[shape[0]]:
        shape = (split[shape[0]],) + shape[1:]
    known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise shape_error("flow.reshape", f"shape may hold one -1 and no other negative entry, got {shape} "
                                          f"for {x.logical_blob_name} {x.shape}")
    if -1 in shape:
        if known == 0 or x.size % known:
            raise shape_error("flow.reshape", f"cannot reshape {x.shape} ({x.size} elements) to {shape}")
        shape = tuple(x.size // known if d == -1 else d for d in shape)
    elif known != x.size:
        raise shape_error("flow.reshape", f"cannot reshape {x.shape} ({x.size} elements) to {shape} "
                                          f"({known} elements)")
    return x if shape == x.shape and name is None else apply(Reshape, (x,), name, shape=shape)


class Transpose(Op):
    prefix, api = "Transpose_", "flow.transpose"
    is_view = True

    @staticmethod
    def infer(x, perm):
        return spec([x.shape[p] for p in perm], x.dtype)

    @staticmethod
    def forward(xp, x, perm):
        return xp.transpose(x, perm)

    @staticmethod
    def split_join(node, kinds):
        return "split" if node.attrs["perm"][0] == 0 else None

    @staticmethod
    def vjp(node, dy):
        return (transpose(dy, tuple(int(i) for i in np.argsort(node.attrs["perm"]))),)


def transpose(a, perm=None, name=None):
    """``flow.transpose(a, perm)``; ``perm=None`` reverses the axes."""
    a = as_tensor(a, argument="a")
    perm = tuple(range(a.ndim))[::-1] if perm is None else tuple(int(p) for p in perm)
    if sorted(perm) != list(range(a.ndim)):
        raise shape_error("flow.transpose", f"perm must be a permutation of 0..{a.ndim - 1} for "
                                            f"{a.logical_blob_name} {a.shape}, got {perm}")
    return apply(Transpose, (a,), name, perm=perm)


class Concat(Op):
    prefix, api = "Concat_", "flow.concat"
    supports_out = True

    @staticmethod
    def infer(*inputs, axis):
        same_dtype(None, *inputs)
        first = inputs[0].shape
        for t in inputs[1:]:
            if t.ndim != len(first) or any(a != b for i, (a, b) in enumerate(zip(first, t.shape)) if i != axis):
                raise ShapeError(f"all inputs must match except on axis {axis}: {first} vs {t.shape} "
                                 f"({t.logical_blob_name})")
        shape = list(first)
        shape[axis] = sum(t.shape[axis] for t in inputs)
        return spec(shape, inputs[0].dtype)

    @staticmethod
    def forward(xp, *arrays, axis, out=None):
        return xp.concatenate(arrays, axis=axis, out=out)

    @staticmethod
    def vjp(node, dy):
        axis, start, grads = node.attrs["axis"], 0, []
        for t in node.inputs:
            grads.append(slice_axis(dy, axis, start, start + t.shape[axis]))
            start += t.shape[axis]
        return tuple(grads)


def concat(inputs, axis=0, name=None):
    """``flow.concat(inputs, axis=0)``."""
    inputs = [as_tensor(t, argument="inputs") for t in inputs]
    if not inputs:
        raise ValueError("flow.concat: inputs must hold at least one tensor, got none")
    try:
        axis = normalize_axis(axis, inputs[0].ndim)
    except ShapeError as e:
        raise shape_error("flow.concat", e) from None
    return apply(Concat, tuple(inputs), name, axis=axis)


class SliceAxis(Op):
    prefix, api = "Slice_", "slice"
    is_view = True

    @staticmethod
    def infer(x, axis, start, stop):
        shape = list(x.shape)
        shape[axis] = stop - start
        return spec(shape, x.dtype)

    @staticmethod
    def forward(xp, x, axis, start, stop):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        return x[tuple(index)]

    @staticmethod
    def vjp(node, dy):
        return (apply(PadAxis, (dy,), **node.attrs, size=node.inputs[0].shape[node.attrs["axis"]]),)


class PadAxis(Op):
    """Zeros around a slice: the gradient of ``SliceAxis``."""
    prefix, api = "PadAxis_", "slice_grad"

    @staticmethod
    def infer(dy, axis, start, stop, size):
        shape = list(dy.shape)
        shape[axis] = size
        return spec(shape, dy.dtype)

    @staticmethod
    def forward(xp, dy, axis, start, stop, size):
        shape = list(dy.shape)
        shape[axis] = size
        out = xp.zeros(shape, dy.dtype)
        index = [slice(None)] * dy.ndim
        index[axis] = slice(start, stop)
        out[tuple(index)] = dy
        return out


def slice_axis(x, axis, start, stop, name=None):
    x = as_tensor(x, argument="x")
    axis = normalize_axis(axis, x.ndim)
    if not 0 <= start < stop <= x.shape[axis]:
        raise ShapeError(f"slice: [{start}, {stop}) is not inside axis {axis} of size {x.shape[axis]}")
    return apply(SliceAxis, (x,), name, axis=axis, start=int(start), stop=int(stop))


class Cast(Op):
    prefix, api = "Cast_", "flow.cast"
    partial_join = keeps_partials("sum", "mean", "max", "min")

    @staticmethod
    def infer(x, dtype):
        return spec(x.shape, dtype)

    @staticmethod
    def forward(xp, x, dtype):
        return x.astype(dtype)

    @staticmethod
    def vjp(node, dy):
        x = node.inputs[0]
        return (cast(dy, x.dtype) if x.dtype.kind == "f" else None,)


def cast(x, dtype, name=None):
    from ..dtypes import as_dtype
    x = as_tensor(x, argument="x")
    dtype = as_dtype(dtype)
    return x if dtype == x.dtype else apply(Cast, (x,), name, dtype=dtype)
