"""Sources (placeholders, constants) and shape ops: ``reshape``, ``transpose``, ``concat``, ``slice`` / ``slice_v2``,
``squeeze`` / ``expand_dims``, ``cast``."""
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
    """``x`` unchanged, as an op of its own (a name to watch, or a point the graph keeps)."""
    return apply(Identity, (as_tensor(x, argument="x"),), name)


class Reshape(Op):
    """``batch_leading`` (only in a replica's graph under the consistent view of several devices): the shape
    was written with the batch in front (-1, the logical batch size, or this device's leading axes merged), so the
    devices' pieces still lie one after another along axis 0."""
    prefix, api = "Reshape_", "flow.reshape"
    is_view = True

    @staticmethod
    def infer(x, shape, batch_leading=False):
        return spec(shape, x.dtype)

    @staticmethod
    def forward(xp, x, shape, batch_leading=False):
        return x.reshape(shape)

    @staticmethod
    def split_join(node, kinds):
        if "batch_leading" in node.attrs:
            return "split" if node.attrs["batch_leading"] else None
        return Op.split_join(node, kinds)       # squeeze, expand_dims: while axis 0 stays the batch's

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
    graph = g.current_graph("flow.reshape")
    split = graph.split_batches
    batch_leading = bool(shape) and x.ndim > 0 and (
        shape[0] == -1 or shape[0] in split and x.shape[0] == split[shape[0]] or
        shape[0] in np.cumprod(x.shape).tolist())
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
    if shape == x.shape and name is None:
        return x
    attrs = {"batch_leading": batch_leading} if graph.splits_batches else {}
    return apply(Reshape, (x,), name, shape=shape, **attrs)


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


def concat(inputs=None, axis=0, max_dim_size=None, name=None, values=None):
    """``flow.concat(inputs, axis=0, max_dim_size=None, name=None, values=None)``: ``values`` is OneFlow's older name
    of ``inputs``; ``max_dim_size`` (a bound for dynamic shapes, which flowlab does not have) must hold the result."""
    if inputs is not None and values is not None:
        raise ValueError("flow.concat: give the tensors as inputs or as values (its older name), not both")
    inputs = values if inputs is None else inputs
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(f"flow.concat: inputs must be a list of tensors, got {type(inputs).__name__}")
    inputs = [as_tensor(t, argument="inputs") for t in inputs]
    if not inputs:
        raise ValueError("flow.concat: inputs must hold at least one tensor, got none")
    try:
        axis = normalize_axis(axis, inputs[0].ndim)
    except ShapeError as e:
        raise shape_error("flow.concat", e) from None
    if max_dim_size is not None:
        total = sum(t.shape[axis] for t in inputs if t.ndim == inputs[0].ndim)
        if isinstance(max_dim_size, bool) or not isinstance(max_dim_size, (int, np.integer)) or max_dim_size < total:
            raise ValueError(f"flow.concat: max_dim_size must be an int >= {total}, the size of the result along "
                             f"axis {axis}, got {max_dim_size!r}")
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


def _index(slices):
    """The index of resolved ``(start, stop, step)`` triples; a resolved stop of -1 (a negative step running to the
    axis' first element) must become ``None``, as -1 itself would mean the last element."""
    return tuple(slice(start, None if stop < 0 else stop, step) for start, stop, step in slices)


class Slice(Op):
    """``x[start:stop:step, ...]`` with one ``(start, stop, step)`` per axis, already resolved against the axis sizes
    (Python's ``slice.indices``): a view."""
    prefix, api = "Slice_", "flow.slice"
    is_view = True

    @staticmethod
    def infer(x, slices):
        return spec([len(range(*s)) for s in slices], x.dtype)

    @staticmethod
    def forward(xp, x, slices):
        return x[_index(slices)]

    @staticmethod
    def vjp(node, dy):
        return (apply(SliceGrad, (dy,), slices=node.attrs["slices"], shape=node.inputs[0].shape),)


class SliceGrad(Op):
    """Zeros of the sliced tensor's shape with ``dy`` written where the slice came from: the gradient of ``Slice``."""
    prefix, api = "SliceGrad_", "slice_grad"

    @staticmethod
    def infer(dy, slices, shape):
        return spec(shape, dy.dtype)

    @staticmethod
    def forward(xp, dy, slices, shape):
        out = xp.zeros(shape, dy.dtype)
        out[_index(slices)] = dy
        return out

    @staticmethod
    def vjp(node, dy):
        return (apply(Slice, (dy,), slices=node.attrs["slices"]),)


def _is_index(value):
    return value is None or (isinstance(value, (int, np.integer)) and not isinstance(value, bool))


def slice_v2(x, slice_tup_list, name=None):
    """``flow.slice_v2(x, slice_tup_list)``: one ``(start, stop, step)`` per leading axis of ``x`` (missing axes are
    taken whole), each entry an int or ``None`` with Python's meaning, negative values counting from the end.
    As in OneFlow, ``start`` must lie in ``[-size, size)``, ``stop`` in ``[-size - 1, size]`` and ``step`` must not
    be 0; a slice that selects nothing is refused (flowlab has no empty tensors)."""
    api = "flow.slice_v2"
    x = as_tensor(x, argument="x")
    if not isinstance(slice_tup_list, (list, tuple)) or len(slice_tup_list) > x.ndim:
        raise ValueError(f"{api}: slice_tup_list must be a list of at most {x.ndim} (start, stop, step) tuples, one "
                         f"per axis of x {x.shape}, got {slice_tup_list!r}")
    slices = []
    for axis, size in enumerate(x.shape):
        entry = slice_tup_list[axis] if axis < len(slice_tup_list) else (None, None, None)
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(_is_index(v) for v in entry):
            raise ValueError(f"{api}: entry {axis} of slice_tup_list must be a (start, stop, step) tuple of ints or "
                             f"None, got {entry!r}")
        start, stop, step = entry
        if step == 0:
            raise ValueError(f"{api}: the step of axis {axis} must not be 0")
        if start is not None and not -size <= start < size:
            raise ValueError(f"{api}: the start of axis {axis} must be in [{-size}, {size}), got {start}")
        if stop is not None and not -size - 1 <= stop <= size:
            raise ValueError(f"{api}: the stop of axis {axis} must be in [{-size - 1}, {size}], got {stop}")
        resolved = slice(start, stop, step).indices(size)
        if not len(range(*resolved)):
            raise ValueError(f"{api}: slice ({start}, {stop}, {step}) of axis {axis} (size {size}) selects nothing")
        slices.append(tuple(int(v) for v in resolved))
    slices = tuple(slices)
    if all(s == (0, size, 1) for s, size in zip(slices, x.shape)) and name is None:
        return x
    return apply(Slice, (x,), name, slices=slices)


def slice_(x, begin, size, name=None):
    """``flow.slice(x, begin, size)``: ``begin`` and ``size`` hold one entry per axis of ``x``. ``begin[i]`` is the
    first index (negative counts from the end; ``None`` means 0), ``size[i]`` the number of elements (``-1`` or
    ``None``: to the end of the axis; a size reaching past the end stops there, as in OneFlow). BERT's
    ``flow.slice(position_table, begin=[None, 0, 0], size=[None, seq_length, -1])`` keeps the first ``seq_length``
    positions."""
    api = "flow.slice"
    x = as_tensor(x, argument="x")
    for argument, value in (("begin", begin), ("size", size)):
        if not isinstance(value, (list, tuple)) or len(value) != x.ndim:
            raise ValueError(f"{api}: {argument} must be a list with one entry per axis of x {x.shape} "
                             f"({x.ndim}), got {value!r}")
        if not all(_is_index(v) for v in value):
            raise ValueError(f"{api}: the entries of {argument} must be ints or None, got {value!r}")
    tuples = []
    for axis, (b, s, dim) in enumerate(zip(begin, size, x.shape)):
        if b is not None and not -dim <= b < dim:
            raise ValueError(f"{api}: begin[{axis}] must be in [{-dim}, {dim}) for axis {axis} of size {dim}, got {b}")
        start = 0 if b is None else b % dim
        if s is None or s == -1:
            stop = dim
        elif 0 < s <= dim:
            stop = min(start + s, dim)
        else:
            raise ValueError(f"{api}: size[{axis}] must be -1, None or in [1, {dim}] for axis {axis} of size {dim}, "
                             f"got {s}")
        tuples.append((start, stop, 1))
    return slice_v2(x, tuples, name=name)


class Squeeze(Reshape):
    prefix, api = "Squeeze_", "flow.squeeze"


class ExpandDims(Reshape):
    prefix, api = "ExpandDims_", "flow.expand_dims"


def squeeze(input, axis=None, name=None):  # noqa: A002 - OneFlow's name
    """``flow.squeeze(input, axis=None)``: without the given axes of size 1 (``None``: every axis of size 1)."""
    api = Squeeze.api
    x = as_tensor(input, argument="input")
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
            axis = [axis]
        if not isinstance(axis, (list, tuple)) or not all(isinstance(a, (int, np.integer)) and
                                                          not isinstance(a, bool) for a in axis):
            raise TypeError(f"{api}: axis must be an int, a list of ints or None, got {axis!r}")
        try:
            axes = tuple(sorted({normalize_axis(a, x.ndim) for a in axis}))
        except ShapeError as e:
            raise shape_error(api, e) from None
        wide = [a for a in axes if x.shape[a] != 1]
        if wide:
            raise shape_error(api, f"axis {wide[0]} of {x.logical_blob_name} {x.shape} has size "
                                   f"{x.shape[wide[0]]}, not 1")
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return x if shape == x.shape and name is None else apply(Squeeze, (x,), name, shape=shape)


def expand_dims(input, axis, name=None):  # noqa: A002 - OneFlow's name
    """``flow.expand_dims(input, axis)``: a new axis of size 1 at ``axis`` (in ``[-ndim - 1, ndim]``)."""
    api = ExpandDims.api
    x = as_tensor(input, argument="input")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -x.ndim - 1 <= axis <= x.ndim:
        raise ValueError(f"{api}: axis must be an int in [{-x.ndim - 1}, {x.ndim}] for {x.logical_blob_name} "
                         f"{x.shape}, got {axis!r}")
    axis = int(axis) % (x.ndim + 1)
    return apply(ExpandDims, (x,), name, shape=x.shape[:axis] + (1,) + x.shape[axis:])


class Cast(Op):
    prefix, api = "Cast_", "flow.cast"
    partial_join = keeps_partials("sum", "mean", "max", "min")
    supports_out = True     # the casts auto mixed precision inserts (compiler.amp) reuse buffers every call

    @staticmethod
    def infer(x, dtype):
        return spec(x.shape, dtype)

    @staticmethod
    def forward(xp, x, dtype, out=None):
        if out is None:
            return x.astype(dtype)
        out[...] = x            # the unsafe casting astype does
        return out

    @staticmethod
    def vjp(node, dy):
        x = node.inputs[0]
        return (cast(dy, x.dtype) if x.dtype.kind == "f" else None,)


def cast(x, dtype, name=None):
    """``x`` converted to ``dtype`` (a flowlab dtype, NumPy dtype or name); the same tensor when it already has it.
    The gradient flows back to a floating ``x`` in its own dtype.
    """
    from ..dtypes import as_dtype
    x = as_tensor(x, argument="x")
    dtype = as_dtype(dtype)
    return x if dtype == x.dtype else apply(Cast, (x,), name, dtype=dtype)


# ------------------------------------------------------------------------------------------- pad, one_hot, *_like

class Pad(Op):
    """``x`` with ``before[i]`` / ``after[i]`` elements of ``value`` added on each side of axis ``i``."""
    prefix, api = "Pad_", "flow.pad"

    @staticmethod
    def infer(x, paddings, value):
        return spec([d + b + a for d, (b, a) in zip(x.shape, paddings)], x.dtype)

    @staticmethod
    def forward(xp, x, paddings, value):
        return xp.pad(x, paddings, constant_values=x.dtype.type(value))

    @staticmethod
    def vjp(node, dy):
        return (apply(Crop, (dy,), paddings=node.attrs["paddings"]),)


class Crop(Op):
    """The gradient of ``Pad``: the inner part of ``dy`` (a view)."""
    prefix, api = "Crop_", "pad_grad"
    is_view = True

    @staticmethod
    def infer(dy, paddings):
        return spec([d - b - a for d, (b, a) in zip(dy.shape, paddings)], dy.dtype)

    @staticmethod
    def forward(xp, dy, paddings):
        return dy[tuple(slice(b, d - a) for d, (b, a) in zip(dy.shape, paddings))]

    @staticmethod
    def vjp(node, dy):
        return (apply(Pad, (dy,), paddings=node.attrs["paddings"], value=0),)


def pad(x, paddings, constant_value=0, name=None):
    """``flow.pad(x, paddings, constant_value=0)``: ``paddings`` holds a ``(before, after)`` pair per axis of ``x``."""
    x = as_tensor(x, argument="x")
    pairs = tuple(paddings) if isinstance(paddings, (list, tuple)) else None
    ok = pairs is not None and len(pairs) == x.ndim and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and
        all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in p) for p in pairs)
    if not ok:
        raise ValueError(f"flow.pad: paddings must be a list of {x.ndim} (before, after) pairs of non-negative ints, "
                         f"one per axis of x {x.shape}, got {paddings!r}")
    if isinstance(constant_value, bool) or not isinstance(constant_value, (int, float, np.number)):
        raise TypeError(f"flow.pad: constant_value must be a number, got {constant_value!r}")
    # OneFlow keeps an integral constant for integer tensors: int(constant_value)
    value = float(constant_value) if x.dtype.kind == "f" else int(constant_value)
    return apply(Pad, (x,), name, paddings=tuple((int(b), int(a)) for b, a in pairs), value=value)


class OneHot(Op):
    """``on_value`` where the last axis equals the index, else ``off_value``; an index outside ``[0, depth)`` gives a
    row of ``off_value`` (TensorFlow's rule; OneFlow's kernel aborts)."""
    prefix, api = "OneHot_", "flow.one_hot"

    @staticmethod
    def infer(indices, depth, on_value, off_value, dtype):
        if indices.dtype.kind not in "iu":
            raise ShapeError(f"indices must be integers, got {indices.logical_blob_name} of dtype {indices.dtype}")
        if indices.ndim == 0:
            raise ShapeError("indices must have at least one axis, got a scalar")
        return spec(indices.shape + (depth,), dtype)

    @staticmethod
    def forward(xp, indices, depth, on_value, off_value, dtype):
        hot = indices[..., None] == xp.arange(depth, dtype=indices.dtype)
        return xp.where(hot, dtype.type(on_value), dtype.type(off_value))


def one_hot(indices, depth, on_value=1, off_value=0, axis=-1, dtype=None, name=None):
    """``flow.one_hot``: a new axis ``axis`` of size ``depth`` marks each index; ``dtype`` defaults to float32."""
    from ..dtypes import as_dtype
    from . import normalize_axis
    indices = as_tensor(indices, argument="indices")
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth <= 0:
        raise ValueError(f"flow.one_hot: depth must be a positive int, got {depth!r}")
    for argument, value in (("on_value", on_value), ("off_value", off_value)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise TypeError(f"flow.one_hot: {argument} must be a number, got {value!r}")
    dtype = np.dtype(np.float32) if dtype is None else as_dtype(dtype)
    try:
        axis = normalize_axis(axis, indices.ndim + 1)
    except ShapeError as e:
        raise ValueError(f"flow.one_hot: {e} for the {indices.ndim + 1}-D output") from None
    if dtype.kind != "f":      # OneFlow's integral attributes: int(value)
        on_value, off_value = int(on_value), int(off_value)
    out = apply(OneHot, (indices,), name, depth=int(depth), on_value=on_value, off_value=off_value, dtype=dtype)
    if axis == indices.ndim:
        return out
    perm = list(range(indices.ndim))
    perm.insert(axis, indices.ndim)
    return transpose(out, perm)


class ConstantLike(Op):
    """A tensor of ``like``'s shape filled with ``value``; it depends on ``like``'s shape only (zero gradient)."""
    prefix, api = "ConstantLike_", "flow.ones_like"

    @staticmethod
    def infer(like, value, dtype):
        return spec(like.shape, dtype)

    @staticmethod
    def forward(xp, like, value, dtype):
        return xp.full(like.shape, value, dtype=dtype)

    @staticmethod
    def vjp(node, dy):
        return (None,)


def _constant_like(like, value, dtype, name):
    from ..dtypes import as_dtype
    like = as_tensor(like, argument="like")
    return apply(ConstantLike, (like,), name, value=value, dtype=like.dtype if dtype is None else as_dtype(dtype))


def ones_like(like, dtype=None, name=None):
    """``flow.ones_like(like, dtype=None)``: ones of ``like``'s shape (and dtype, unless given)."""
    return _constant_like(like, 1, dtype, name)


def zeros_like(like, dtype=None, name=None):
    """``flow.zeros_like(like, dtype=None)``: zeros of ``like``'s shape (and dtype, unless given)."""
    return _constant_like(like, 0, dtype, name)


def identity_n(inputs, name=None):
    """``flow.identity_n(inputs)``: a list holding an identity of each input."""
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise ValueError(f"flow.identity_n: inputs must be a non-empty list of tensors, got {inputs!r}")
    if name is None:
        return [identity(t) for t in inputs]
    return [identity(t, name=f"{name}_{i}") for i, t in enumerate(inputs)]
