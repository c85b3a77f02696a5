"""``flow.gather``, whose gradient is a scatter-add that also offers itself as *indexed slices* to sparse updates, and
``flow.where``.

The gradient of ``gather`` is ``GatherGrad``, a dense op (the table's shape, zeros outside the gathered rows) so that
every optimizer, watch and health statistic works on it unchanged. For an embedding lookup (``axis=0``,
``batch_dims=0``) its ``indexed_slices`` trait also returns the same gradient as ``(ids, rows)`` tensors of the graph:
a sparse update (LazyAdam, ``indexed_slices_optimizer_conf``) reads those and touches only the gathered rows, and the
dense node is then never computed (nothing else reads it). ``scatter.sum_rows`` adds up repeated ids on the host or
device.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from . import Op, apply, as_tensor, shape_error, spec
from .scatter import sum_rows


def _layout(params_shape, indices_shape, axis, batch_dims):
    """The sizes a gather flattens to: batch ``nb``, before the axis ``npre``, the axis ``a``, after ``npost``,
    and the indices per batch entry ``ni``."""
    prod = math.prod        # (Python ints: np.prod costs ~2 us a call, four a gather)
    return (prod(params_shape[:batch_dims]), prod(params_shape[batch_dims:axis]), int(params_shape[axis]),
            prod(params_shape[axis + 1:]), prod(indices_shape[batch_dims:]))


def _flat_ids(xp, indices, nb, a, ni):
    """Row numbers into ``params`` seen as ``(nb * a, ...)`` rows, and a mask of the ids inside ``[0, a)`` (``None``
    when all are: the usual case costs two reductions, no mask)."""
    ids = indices.reshape(nb, ni).astype(np.int64, copy=False)
    valid = None
    if ids.size and (bool(ids.min() < 0) or bool(ids.max() >= a)):
        valid = (ids >= 0) & (ids < a)
        ids = xp.where(valid, ids, 0)
    if nb > 1:
        ids = ids + (xp.arange(nb, dtype=np.int64) * a)[:, None]
    return ids.reshape(-1), None if valid is None else valid.reshape(-1)


class Gather(Op):
    """``out[b…, p…, i…, q…] = params[b…, p…, indices[b…, i…], q…]``: ``b`` the ``batch_dims`` axes both share,
    ``p`` the axes of ``params`` before ``axis``, ``q`` those after it. An index outside ``[0, params.shape[axis])``
    gives zeros (OneFlow's CPU kernel does the same for too large indices; NumPy would wrap a negative one)."""
    prefix, api = "Gather_", "flow.gather"

    @staticmethod
    def infer(params, indices, axis, batch_dims):
        if indices.dtype.kind not in "iu":
            raise ShapeError(f"indices must be integers, got {indices.logical_blob_name} of dtype {indices.dtype}")
        if params.shape[:batch_dims] != indices.shape[:batch_dims]:
            raise ShapeError(f"the first {batch_dims} (batch) axes of params {params.shape} and indices "
                             f"{indices.shape} must be equal")
        return spec(params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis + 1:], params.dtype)

    @staticmethod
    def forward(xp, params, indices, axis, batch_dims):
        nb, npre, a, npost, ni = _layout(params.shape, indices.shape, axis, batch_dims)
        out_shape = params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis + 1:]
        ids, valid = _flat_ids(xp, indices, nb, a, ni)
        # rows of params: (nb * a, npre, npost); a view when npre == 1 (embeddings, BERT's batch gather)
        rows = params.reshape(nb, npre, a, npost).transpose(0, 2, 1, 3).reshape(nb * a, npre, npost)
        picked = xp.take(rows, ids, axis=0)                                   # (nb * ni, npre, npost)
        if valid is not None:
            picked *= valid.astype(picked.dtype)[:, None, None]
        return picked.reshape(nb, ni, npre, npost).transpose(0, 2, 1, 3).reshape(out_shape)

    @staticmethod
    def vjp(node, dy):
        params, indices = node.inputs
        return apply(GatherGrad, (indices, dy), **node.attrs, shape=params.shape), None


class GatherGrad(Op):
    """The gradient of ``Gather`` w.r.t. ``params``: zeros of ``params``' shape, to which each gathered slice of
    ``dy`` is added at its index (repeated indices add up; out-of-range indices add nothing)."""
    prefix, api = "GatherGrad_", "gather_grad"

    @staticmethod
    def infer(indices, dy, axis, batch_dims, shape):
        return spec(shape, dy.dtype)

    @staticmethod
    def forward(xp, indices, dy, axis, batch_dims, shape):
        nb, npre, a, npost, ni = _layout(shape, indices.shape, axis, batch_dims)
        ids = indices.reshape(nb, ni).astype(np.int64, copy=False)
        if nb > 1:   # out-of-range ids must stay out of range after the offset: send them past the end
            ids = xp.where((ids >= 0) & (ids < a), ids + (xp.arange(nb, dtype=np.int64) * a)[:, None], -1)
        rows = dy.reshape(nb, npre, ni, npost).transpose(0, 2, 1, 3).reshape(nb * ni, npre * npost)
        table = sum_rows(xp, ids, rows, nb * a)                               # (nb * a, npre * npost)
        return table.reshape(nb, a, npre, npost).transpose(0, 2, 1, 3).reshape(shape)

    @staticmethod
    def indexed_slices(node):
        """This gradient as ``(ids, rows)`` graph tensors when it is an embedding's (``axis=0``, no batch axes):
        ``ids`` 1-D (the gathered ids, repeats and out-of-range ids included, as the job fed them), ``rows``
        ``(ids.size,) + table.shape[1:]``, their gradients; the dense gradient is ``sum_rows(xp, ids, rows,
        table.shape[0])``. ``None`` for other gathers."""
        if node.attrs["axis"] != 0 or node.attrs["batch_dims"] != 0:
            return None
        from .array import Reshape
        indices, dy = node.inputs
        shape = node.attrs["shape"]
        # Reshape itself, not flow.reshape: on several devices flow.reshape reads a leading size equal to the
        # logical batch as the user's and would make it this device's share. Both flatten the indices' axes into
        # axis 0, so the batch stays in front: under the consistent view the devices' ids and rows, one after
        # another, are the logical ones (``batch_leading``; without it they could not be joined or watched)
        leading = {"batch_leading": True} if indices.graph.splits_batches else {}
        return (apply(Reshape, (indices,), shape=(indices.size,), **leading),
                apply(Reshape, (dy,), shape=(indices.size,) + tuple(shape[1:]), **leading))


def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """``flow.gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None)``.

    With ``batch_dims=0``: slices of ``params`` along ``axis`` (default 0) picked by ``indices`` of any shape;
    the output's shape is ``params.shape[:axis] + indices.shape + params.shape[axis+1:]``.

    With ``batch_dims > 0`` and ``axis`` equal to it (or ``None``), as OneFlow 0.3.4's ``batch_gather``: the first
    ``indices.ndim - 1`` axes of ``indices`` are batch axes, equal to those of ``params``, and each batch entry picks
    along ``params`` axis ``indices.ndim - 1`` (BERT's ``gather(sequence, positions, axis=2, batch_dims=2)`` on a
    ``(batch, seq, hidden)`` sequence and ``(batch, predictions)`` positions gives ``(batch, predictions, hidden)``).
    With ``axis > batch_dims`` (OneFlow raised NotImplementedError) it follows TensorFlow: the output's shape is
    ``params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis+1:]``.

    An index outside the axis gives zeros. The gradient w.r.t. ``params`` is a scatter-add (``GatherGrad``), which
    a sparse optimizer can take as indexed slices; ``indices`` get none. ``validate_indices`` is accepted for
    OneFlow's signature and ignored, as OneFlow does.
    """
    api = Gather.api
    params, indices = as_tensor(params, argument="params"), as_tensor(indices, argument="indices")
    if params.ndim == 0:
        raise shape_error(api, f"params must have at least one axis, got the scalar {params.logical_blob_name}")
    if isinstance(batch_dims, bool) or not isinstance(batch_dims, (int, np.integer)) or batch_dims < 0:
        raise ValueError(f"{api}: batch_dims must be a non-negative int, got {batch_dims!r}")
    if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))):
        raise TypeError(f"{api}: axis must be an int or None, got {axis!r}")
    batch_dims = int(batch_dims)
    if axis is None:
        axis = batch_dims
    elif not -params.ndim <= axis < params.ndim:
        raise ValueError(f"{api}: axis must be in [{-params.ndim}, {params.ndim}) for params {params.shape}, "
                         f"got {axis}")
    axis = int(axis) % params.ndim
    if batch_dims > 0:
        if axis < batch_dims:
            raise ValueError(f"{api}: axis ({axis}) must not be less than batch_dims ({batch_dims})")
        if axis == batch_dims:     # OneFlow's batch_gather: indices' own rank says where the batch axes end
            if indices.ndim == 0 or indices.ndim > params.ndim:
                raise shape_error(api, f"a batch gather needs indices of rank 1 to {params.ndim} (that of params "
                                       f"{params.shape}), got {indices.shape}")
            batch_dims = axis = indices.ndim - 1
        elif batch_dims > indices.ndim:
            raise shape_error(api, f"batch_dims ({batch_dims}) exceeds the rank of indices {indices.shape}")
    return apply(Gather, (params, indices), name, axis=axis, batch_dims=batch_dims)


# ---------------------------------------------------------------------------------------------------------------- where

class Where(Op):
    """``x`` where ``condition`` is non-zero, else ``y``; the three broadcast together (NumPy's rule)."""
    prefix, api = "Where_", "flow.where"

    @staticmethod
    def infer(condition, x, y):
        if x.dtype != y.dtype:
            raise ShapeError(f"x and y must share one dtype, got {x.logical_blob_name}: {x.dtype} and "
                             f"{y.logical_blob_name}: {y.dtype}")
        try:
            shape = np.broadcast_shapes(condition.shape, x.shape, y.shape)
        except ValueError:
            raise ShapeError(f"condition {condition.shape}, x {x.shape} and y {y.shape} do not broadcast") from None
        return spec(shape, x.dtype)

    @staticmethod
    def forward(xp, condition, x, y):
        return xp.where(condition != 0, x, y)

    @staticmethod
    def vjp(node, dy):
        from .math import sum_to_shape
        condition, x, y = node.inputs
        return (None, sum_to_shape(apply(WhereGrad, (condition, dy), pick_x=True), x.shape),
                sum_to_shape(apply(WhereGrad, (condition, dy), pick_x=False), y.shape))


class WhereGrad(Op):
    """``dy`` where the condition picked this side (``pick_x``: non-zero; else zero), 0 elsewhere."""
    prefix, api = "WhereGrad_", "where_grad"

    @staticmethod
    def infer(condition, dy, pick_x):
        return spec(dy.shape, dy.dtype)

    @staticmethod
    def forward(xp, condition, dy, pick_x):
        chosen = (condition != 0) if pick_x else (condition == 0)
        return xp.where(chosen, dy, dy.dtype.type(0))


def where(condition, x=None, y=None, name=None):
    """``flow.where(condition, x, y)``: elementwise ``x if condition else y`` (``condition`` of any numeric dtype,
    non-zero meaning true), broadcasting the three; ``x`` or ``y`` may be a number. OneFlow's one-argument form
    (``argwhere``: the coordinates of the non-zero entries) has a data-dependent shape, which flowlab's static
    graphs cannot hold: it is refused."""
    api = Where.api
    if x is None and y is None:
        raise ValueError(f"{api}: the one-argument form (argwhere) has a data-dependent shape, which flowlab does not "
                         "support; give x and y")
    if x is None or y is None:
        raise ValueError(f"{api}: give both x and y, or neither (got only {'x' if y is None else 'y'})")
    condition = as_tensor(condition, argument="condition")
    tensor = x if hasattr(x, "graph") else y if hasattr(y, "graph") else None
    if tensor is None:
        raise TypeError(f"{api}: x or y must be a tensor, got {type(x).__name__} and {type(y).__name__}")
    x, y = as_tensor(x, like=tensor, argument="x"), as_tensor(y, like=tensor, argument="y")
    return apply(Where, (condition, x, y), name)
