"""Scatter-adds of indexed slices ``(ids, rows)``, on the host or the device: ``sum_rows`` (a dense table whose row
``i`` sums the rows of id ``i``: ``gather``'s gradient) and ``unique_rows`` (each id once with its summed rows: a
sparse update's gradient, and what health takes the norm of). NumPy and CuPy only, so that ops, optimizers and
statistics can all use them without importing one another."""
from __future__ import annotations

import numpy as np

from ..runtime import jit


# A small table's scatter-add on NumPy is one product ``one_hot(ids) @ rows`` (a BERT word table's gradient, 100
# rows from 256 ids of 128 values: ~65 us, against ~110 us sorted and ~230 us through add.at) while the product has
# at most this many multiply-adds and the table at most ONE_HOT_ROWS rows.
ONE_HOT_ROWS, ONE_HOT_MACS = 128, 1 << 23


@jit.kernel
def _scatter_add_float32(ids, rows, out):
    """``out[ids[k]] += rows[k]`` for each ``k`` whose id is in ``[0, len(out))`` (others dropped), over int64 ids
    and C-contiguous float32 ``(ids, m)`` rows and ``(n_rows, m)`` out, in the ids' order (vectorised along a row).
    A NaN or infinity reaches only the row of its own id."""
    n_rows = out.shape[0]
    for k in range(ids.size):
        i = ids[k]
        if 0 <= i < n_rows:
            for j in range(rows.shape[1]):
                out[i, j] += rows[k, j]


def sum_rows(xp, ids, rows, n_rows):
    """The ``(n_rows, ...)`` array whose row ``i`` sums the ``rows`` whose id is ``i`` (ids outside ``[0, n_rows)``
    are dropped): a scatter-add. On NumPy a small table with finite float rows is a one-hot product (one BLAS call,
    ``ONE_HOT_ROWS``); else, ids sorted: each id once is an assignment; when ids repeat a lot (many more ids than
    rows) ``add.reduceat`` over the sorted rows beats ``add.at``; otherwise ``add.at`` does (NumPy >= 1.25's fast
    path). NumPy float32 with compiled kernels (``runtime.jit``): one pass adding each row onto its id's
    (``_scatter_add_float32``; a 100-row table from 256 ids of 128 values: 68 -> ~6 us)."""
    if xp is np and rows.dtype == np.float32 and jit.enabled():
        flat_ids = np.ascontiguousarray(ids.reshape(-1), dtype=np.int64)
        out = np.zeros((n_rows,) + rows.shape[1:], np.float32)
        if out.size and flat_ids.size:
            _scatter_add_float32(flat_ids, np.ascontiguousarray(rows).reshape(flat_ids.size, -1),
                                 out.reshape(n_rows, -1))
        return out
    ids, rows = _in_table(ids, rows, n_rows)
    if xp is np and ids.size and _one_hot_pays(rows, n_rows):
        one_hot = np.zeros((n_rows, ids.size), rows.dtype)
        one_hot[ids, np.arange(ids.size)] = 1
        return np.matmul(one_hot, rows.reshape(ids.size, -1)).reshape((n_rows,) + rows.shape[1:])
    out = xp.zeros((n_rows,) + rows.shape[1:], rows.dtype)
    if ids.size == 0:
        return out
    if xp is np:
        order, ordered, firsts = _sorted_runs(ids)
        if firsts.all():            # each id once (BERT's batch gather): an assignment, not add.at's ~1 us a row
            out[ids] = rows
        elif ids.size >= 4 * n_rows:
            out[ordered[firsts]] = _summed_runs(rows, order, firsts)
        else:
            np.add.at(out, ids, rows)
        return out
    import cupyx   # CuPy's atomic scatter-add (float16 is not among its dtypes: add in float32)
    if rows.dtype == np.float16:
        wide = xp.zeros(out.shape, np.float32)
        cupyx.scatter_add(wide, ids, rows.astype(np.float32))
        return wide.astype(np.float16)
    cupyx.scatter_add(out, ids, rows)
    return out


def _one_hot_pays(rows, n_rows):
    """A small table, a product within ``ONE_HOT_MACS``, and finite float rows (in the product a row's NaN or Inf,
    times the zeros of the other ids, would reach every row of the table)."""
    if rows.dtype.char not in "fd" or n_rows > ONE_HOT_ROWS or n_rows * rows.size > ONE_HOT_MACS:
        return False
    flat = rows.reshape(-1)
    total = float(np.dot(flat, flat))            # one pass: finite unless some value is NaN or Inf (or overflows)
    return total - total == 0 or bool(np.isfinite(flat).all())


def unique_rows(xp, ids, rows, n_rows):
    """``(unique ids, summed rows)`` of indexed slices: each id in ``[0, n_rows)`` once, sorted, with the sum of its
    rows (repeated ids add up; ids outside the table, which gathered zeros, are dropped). O(ids), never O(table)."""
    ids, rows = _in_table(ids, rows, n_rows)
    if ids.size == 0:
        return ids, rows[:0]
    if xp is np:         # sort once, then one reduceat over the runs of equal ids
        order, ordered, firsts = _sorted_runs(ids)
        return ordered[firsts], _summed_runs(rows, order, firsts)
    import cupyx        # CuPy: unique ids and an atomic scatter-add of the rows onto them
    unique, inverse = xp.unique(ids, return_inverse=True)
    summed = xp.zeros((unique.size,) + rows.shape[1:], np.float32 if rows.dtype == np.float16 else rows.dtype)
    cupyx.scatter_add(summed, inverse.reshape(-1), rows.astype(summed.dtype, copy=False))
    return unique, summed.astype(rows.dtype, copy=False)


def _in_table(ids, rows, n_rows):
    """``ids`` flat as int64 and ``rows`` one per id, without the ids outside ``[0, n_rows)`` (they gathered zeros)."""
    ids = ids.reshape(-1).astype(np.int64, copy=False)
    rows = rows.reshape((ids.size,) + rows.shape[1:])
    keep = (ids >= 0) & (ids < n_rows)
    if ids.size and not bool(keep.all()):
        ids, rows = ids[keep], rows[keep]
    return ids, rows


def _sorted_runs(ids):
    """(host, ``ids`` not empty) ``(order, ordered, firsts)``: a stable sort of ``ids``, the sorted ids, and where
    each run of equal ids begins in them."""
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    return order, ordered, np.r_[True, ordered[1:] != ordered[:-1]]


def _summed_runs(rows, order, firsts):
    """The rows of each run of equal ids (``_sorted_runs``) summed: one ``add.reduceat`` over the sorted rows."""
    return np.add.reduceat(rows[order], np.flatnonzero(firsts), axis=0)
