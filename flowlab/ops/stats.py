"""Tensor statistics computed where the tensor lives: the one implementation behind ``watch(..., stats=True)``, the
live widgets' summaries and the plot layer's tables, so a watch ships a few numbers instead of the whole tensor.

``stats_vector`` gives ``[min, max, mean, std, nan_count, inf_count]`` (min/max/mean/std over the finite elements,
NaN when there are none); ``histogram_vector`` gives ``[lo, hi, count_0 … count_{bins-1}]``, equal-width bins over
the finite range. Both run on NumPy or CuPy arrays (``xp``). On the host the common all-finite case takes a fast path
(min, max, sum and one dot product: ~13 µs for 12,800 float32 on a 2-core VM, against ~150 µs with masks);
on a GPU the masked form runs without any device-to-host synchronisation, so a CUDA graph can capture it. With
compiled kernels (``runtime.jit``) a float32 host tensor takes one compiled pass instead (``compiled_stats``,
``activation_vector``, ``SquaresStats``: see "compiled one-pass kernels" below; ~2x faster at the README MLP's
sizes), the NumPy code staying their twin.

``watch_health``'s statistics live here too (``activation_vector``, ``square_vector``, ``mean_vector``,
``batch_norm_vector`` and their graph ops ``ActivationStats``, ``SquareStats``, ``MeanStat``, ``BatchNormStats``): on a
GPU each float32 tensor takes one kernel (a batch norm's few per-channel vectors a handful of small ones). A sparsely
updated embedding table's rows are tracked by ``RowTouches`` (every call, O(ids)) and counted by ``RowCoverage``
(``row_coverage_vector``, on reporting calls, O(rows)) through their shared ``RowTracker``.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from ..runtime import host_threads, jit
from . import Op, apply, as_tensor, cupy_elementwise, spec
from .scatter import unique_rows

def _floating(xp, x):
    """``x`` flattened, in a float type wide enough to sum without overflow (float16 and integers widen)."""
    x = x.ravel()
    if x.dtype.kind != "f" or x.dtype.itemsize < 4:
        x = x.astype(xp.float64 if x.dtype.kind != "f" else xp.float32)
    return x


_HOST_FLOATS = "fd"        # float32, float64: the host fast path's types (``dtype.char``)
_ONES_UP_TO = 1 << 16       # sums of up to this many elements run as a dot product with ones (see below)
_ones = {}                  # (size, dtype char) -> read-only ones, one per watched size
_min, _max, _dot = np.minimum.reduce, np.maximum.reduce, np.dot     # bound once: these run every watched step


def host_sum(x):
    """``x``'s sum in its own type. For the small tensors where per-call cost is everything, a dot product with a
    cached vector of ones (BLAS, ~2 µs for 12,800 float32) is ~2.5x faster than ``np.add.reduce``'s pairwise sum
    of the same accuracy class; larger tensors use the reduction and no cache."""
    n = x.size
    if n > _ONES_UP_TO:
        return np.add.reduce(x)
    return _dot(x, ones_of(n, x.dtype.char))


def host_unit_sums(x, unit_axis):
    """Per-unit sums of a C-contiguous float host array ``x`` (units along ``unit_axis``: features last, or the
    channels of NCHW) as products with ones, which BLAS runs at memory speed where ``np.add.reduce`` over the other
    axes walks them with strides (a 32x16x28x28 batch: ~35 us against ~53 us for the per-unit maxima); None for
    another layout. Sums in ``x``'s own type."""
    axis = unit_axis % x.ndim
    if x.ndim == 1 or not x.flags.c_contiguous:
        return None
    char, units = x.dtype.char, x.shape[axis]
    if axis == x.ndim - 1:
        rows = x.reshape(-1, units)
        return _dot(ones_of(rows.shape[0], char), rows)
    if axis == 1:
        per_example = np.matmul(x.reshape(x.shape[0], units, -1), ones_of(x[0, 0].size, char))
        return _dot(ones_of(x.shape[0], char), per_example)
    return None


def ones_of(n, char):
    """A read-only vector of ``n`` ones of dtype ``char``, cached: sums as BLAS products (``ones @ rows``, ``rows @
    ones``) read memory once, with no temporary."""
    key = (n, char)
    ones = _ones.get(key)
    if ones is None:
        if len(_ones) > 256:
            _ones.clear()
        ones = _ones[key] = np.ones(n, char)
        ones.flags.writeable = False
    return ones


# ------------------------------------------------------------------------ compiled one-pass kernels (float32, host)
# The NumPy fast paths below take one pass per reduction (min, max, sum, sum of squares, |x|, ...), each a call of
# its own; a watched step runs them beside the step's own work, where every pass reads the tensor from L2 again
# (hidden layer statistics of the README's MLP: ~8 us alone, ~12-16 us inside a step). These do it in one pass,
# summing in float64 (no sum or square of float32 values can overflow there, and E[x²] - mean² keeps ~9 more
# digits), and write the finished vector themselves (each Python step around a call costs ~0.1-0.5 us). Minima and
# maxima are taken on the bits (an int32 key that orders as the float does, ``b ^ ((b >> 31) & 0x7fffffff)``, its
# own inverse), which vectorise where a float minimum without fast-math's no-NaN flag does not (a scalar loop, ~6x
# slower). The keys are cast back to int32: numba widens ``int32 ^ int32`` to int64, which halves the lanes (the
# statistics of 12,800 floats took 2.6 us with int64 keys, 1.8 with int32, on AVX-512 as on AVX2). NaN and Inf: the
# sum of squares is then NaN or Inf (never by overflow), the kernel writes nothing and the caller takes the NumPy
# twin's masked path, so counts and finite moments are the twin's.

CANCELLING_SPREAD = 1e-6
"""The compiled paths take the variance as E[x²] - mean² from float64 sums unless it is below this times mean²
(then a second, centred pass): float64 sums keep ~1e-16 of mean², so the spread keeps ~10 digits."""


@jit.kernel(reduce=True)
def _summary_float32(x, out, at, copy):
    """``stats_vector`` of a flat float32 array written into ``out[at:at + 6]`` (float64) when ``at >= 0`` and
    every element is finite, in one pass (two when the spread cancels: ``CANCELLING_SPREAD``); ``copy`` (empty, or
    ``x``'s size) gets a copy of ``x`` right after (still in cache). Returns ``(min, max, sum, sum of squares)``;
    min and max are meaningless when the sum of squares is not finite (NaN/Inf: nothing is written)."""
    bits = x.view(np.int32)
    lo, hi = np.int32(0x7fffffff), np.int32(-0x80000000)
    total, squares = 0.0, 0.0
    for i in range(x.size):
        b = bits[i]
        key = np.int32(b ^ ((b >> np.int32(31)) & np.int32(0x7fffffff)))
        lo = min(lo, key)
        hi = max(hi, key)
        v = np.float64(x[i])
        total += v
        squares += v * v
    if copy.size:
        copy[:] = x
    low = jit.float32_from_bits(lo ^ ((lo >> np.int32(31)) & np.int32(0x7fffffff)))
    high = jit.float32_from_bits(hi ^ ((hi >> np.int32(31)) & np.int32(0x7fffffff)))
    if at < 0 or squares - squares != 0:
        return low, high, total, squares
    n = x.size
    mean = total / n
    var = squares / n - mean * mean
    if var < CANCELLING_SPREAD * mean * mean:
        var = 0.0
        if low != high:
            for i in range(n):
                d = np.float64(x[i]) - mean
                var += d * d
            var /= n
    out[at] = low
    out[at + 1] = high
    out[at + 2] = mean
    out[at + 3] = math.sqrt(var) if var > 0 else 0.0
    out[at + 4] = 0.0
    out[at + 5] = 0.0
    return low, high, total, squares


@jit.kernel(reduce=True)
def _centred_squares_float32(x, mean):
    """``sum (x - mean)²`` of a flat float32 array in float64 (the second pass of a cancelling spread, by pieces)."""
    squares = 0.0
    for i in range(x.size):
        d = np.float64(x[i]) - mean
        squares += d * d
    return squares


@jit.kernel(reduce=True, inline=True)
def unit_row_sums(row, row_bits, unit_abs, top, nonzero, total, squares):
    """One row of a dense layer's float32 output (``row_bits``: its int32 view) added into the activation sums:
    each unit's ``|x|`` into ``unit_abs`` (float64); returns ``top`` (the bits of max ``|x|``: non-negative floats
    order as their bits do), ``nonzero``, ``total`` and ``squares`` with the row's."""
    for u in range(row.size):
        magnitude = np.int32(row_bits[u] & np.int32(0x7fffffff))
        top = max(top, magnitude)
        nonzero += magnitude != 0
        v = np.float64(row[u])
        unit_abs[u] += abs(v)
        total += v
        squares += v * v
    return top, nonzero, total, squares


@jit.kernel(reduce=True)
def _activation_float32(x, unit_abs, out):
    """One pass over a C-contiguous float32 array of shape ``(outer, units, inner)``: each unit's sum of ``|x|``
    added into ``unit_abs`` (float64, ``units`` long), and ``(max |x|, non-zeros, sum x, sum x²)`` returned. With
    ``out`` (float64, 7 long; empty: a piece of a split tensor, whose caller finishes) and every element finite,
    ``activation_vector`` is written there: a unit is dead when its sum of ``|x|`` is 0 (``|x|`` cannot cancel)."""
    outer, units, inner = x.shape
    top = np.int32(0)               # |x|'s bits: non-negative floats order as their bits do
    nonzero = 0
    total, squares = 0.0, 0.0
    if inner == 1:                  # units last (a dense layer): the unit loop vectorises
        rows = x.reshape(outer, units)
        bits = rows.view(np.int32)
        for o in range(outer):
            top, nonzero, total, squares = unit_row_sums(rows[o], bits[o], unit_abs, top, nonzero, total, squares)
    else:                           # units then positions (NCHW): the position loop vectorises
        bits = x.view(np.int32)
        for o in range(outer):
            for u in range(units):
                row, row_bits = x[o, u], bits[o, u]
                unit = 0.0
                for i in range(inner):
                    magnitude = np.int32(row_bits[i] & np.int32(0x7fffffff))
                    top = max(top, magnitude)
                    nonzero += magnitude != 0
                    v = np.float64(row[i])
                    unit += abs(v)
                    total += v
                    squares += v * v
                unit_abs[u] += unit
    biggest = jit.float32_from_bits(top)
    if out.size == 0 or squares - squares != 0:
        return biggest, nonzero, total, squares
    activation_vector_from_sums(x.reshape(outer, units * inner), unit_abs, biggest, nonzero, total, squares, out)
    return biggest, nonzero, total, squares


@jit.kernel
def _activation_rows_float32(rows, unit_abs, out, bad):
    """``_activation_float32`` of each ``rows[i]`` (a C-contiguous float32 array ``(n, outer, units, inner)``) into
    ``out[i]`` (``(n, 7)`` float64; ``unit_abs``: scratch of ``units``); ``bad[i]`` is set, and ``out[i]`` left
    unwritten, where the row holds NaN or Inf."""
    for i in range(rows.shape[0]):
        unit_abs[:] = 0.0
        squares = _activation_float32(rows[i], unit_abs, out[i])[3]
        bad[i] = squares - squares != 0


@jit.kernel(reduce=True, inline=True)
def activation_vector_from_sums(rows, unit_abs, biggest, nonzero, total, squares, out):
    """``activation_vector`` of the float32 ``rows`` (2-D) written into ``out`` (float64, 7 long) from one pass's finite
    sums: a unit is dead when its sum of ``|x|`` (``unit_abs``) is 0 (``|x|`` cannot cancel); the variance from the
    sums unless it cancels (``CANCELLING_SPREAD``), then from a second, centred pass."""
    n, units = rows.size, unit_abs.size
    dead, total_abs = 0, 0.0
    for u in range(units):
        dead += unit_abs[u] == 0
        total_abs += unit_abs[u]
    mean = total / n
    var = squares / n - mean * mean
    if var < CANCELLING_SPREAD * mean * mean:
        var = 0.0
        for o in range(rows.shape[0]):
            for i in range(rows.shape[1]):
                d = np.float64(rows[o, i]) - mean
                var += d * d
        var /= n
    out[0] = total_abs / n
    out[1] = math.sqrt(var) if var > 0 else 0.0
    out[2] = (n - nonzero) / n
    out[3] = biggest
    out[4] = dead / units
    out[5] = 0.0
    out[6] = 0.0


_NO_COPY = np.empty(0, np.float32)
_NO_OUT = np.empty(0)


COMPILED_SPLIT_ELEMENTS = 1 << 20
"""A compiled pass over at least this many elements runs in pieces on ``host_threads`` (inside a host plan's call;
the kernels release the GIL). One pass takes ~0.2 ns an element, so below this a piece is shorter than a pool
thread's wake-up (~20-50 us, far more when another process holds the other core: a 131k tensor's statistics took
24 us on one thread, 34 split in two, at load 3)."""


def _split(size):
    return size >= COMPILED_SPLIT_ELEMENTS and host_threads.width() > 1


def compiled_stats(x, out, at=0, copy=_NO_COPY):
    """Write ``stats_vector`` of float32 host array ``x`` into ``out[at:at + 6]`` (float64) in one compiled pass (two
    when the spread is small next to the mean: ``CANCELLING_SPREAD``) and return True; False, with nothing written,
    when ``x`` holds NaN or Inf (the NumPy path's masked form counts them) or is empty. ``copy``: an array of
    ``x``'s size that gets a copy of it (``StatsFeed``'s last tensor) while it is in cache."""
    flat = x.ravel()                         # a view when contiguous, else a contiguous copy
    if not flat.size:
        return False
    if not _split(flat.size):
        # the dispatcher itself (``ready``): this runs every watched step
        squares = _summary_float32.ready()(flat, out, at, copy)[3]
        return squares - squares == 0
    if copy.size:
        copy[...] = flat
    parts = host_threads.each(lambda part: _summary_float32(flat[part], _NO_OUT, -1, _NO_COPY), flat.size,
                              work=flat.size)
    los, his, totals, squares = zip(*parts)
    squares = sum(squares)
    if squares - squares != 0:
        return False
    lo, hi = min(los), max(his)
    mean, std = _split_moments(flat, sum(totals), squares, lo == hi)
    out[at:at + 6] = (lo, hi, mean, std, 0.0, 0.0)
    return True


# ``StatsFeed``'s blocks of statistics rows (``stats_block``): one float64 array a block, so that a put reads it in
# a single attribute load, and a kernel holding the interpreter lock (``atomic``) updates it as one step for every
# other Python thread: no lock a put, and a block closed while a put was on its way is never written after its rows
# were counted. Layout: a header (rows written, closed, wake the consumer at the next put, the step of the last
# copy kept, the rows it takes: its owner's limit), the rows' steps, then the rows (6 a row).
BLOCK_HEADER = 5
WRITTEN, CLOSED, WAKE, COPIED, TAKES = range(BLOCK_HEADER)
# a put's result: 0 (written), else bits: PUT_WAKE (written; the first since the consumer took: wake it), PUT_FULL
# (written; the block is full now), PUT_NONFINITE (not written: NaN/Inf or empty; the copy was taken), PUT_RETRY
# (not written: the block was closed or full, or the copy is of another size)
PUT_WAKE, PUT_FULL, PUT_NONFINITE, PUT_RETRY = 1, 2, 4, 8


def stats_block(rows, takes=None):
    """A new, empty block of ``rows`` statistics rows (see above) that takes ``takes`` of them (all: None)."""
    block = np.empty(BLOCK_HEADER + 7 * rows)
    block[:BLOCK_HEADER] = (0.0, 0.0, 0.0, -1.0, rows if takes is None else min(rows, takes))
    return block


def stats_block_rows(block, n):
    """``(steps, rows)`` of a closed block's first ``n`` rows: an int64 array and an ``(n, 6)`` view."""
    start = _row_offset(block, 0)
    return block[BLOCK_HEADER:BLOCK_HEADER + n].astype(np.int64), block[start:start + 6 * n].reshape(-1, 6)


@jit.kernel(inline=True)
def _row_offset(block, at):
    """Where row ``at`` of ``block`` starts: after the header and the block's steps (one a row it can hold)."""
    return BLOCK_HEADER + (block.size - BLOCK_HEADER) // 7 + 6 * at


@jit.kernel(reduce=True, atomic=True)
def _put_summary_float32(x, block, step, copy):
    """``_summary_float32`` of flat ``x`` as the next row of ``block``, ``step`` as its step; ``x`` into ``copy``
    (empty, or ``x``'s size) and ``step`` as the copy's. Returns a put's result (above)."""
    at = np.int64(block[WRITTEN])
    if block[CLOSED] != 0.0 or at >= block[TAKES] or (copy.size != 0 and copy.size != x.size):
        return PUT_RETRY
    squares = _summary_float32(x, block, _row_offset(block, at), copy)[3]
    if copy.size != 0:
        block[COPIED] = step
    if squares - squares != 0:
        return PUT_NONFINITE
    return _commit_row(block, at, step)


@jit.kernel(atomic=True)
def put_stats_row(block, step, vector):
    """``vector`` (6 float64) as the next row of ``block``, ``step`` as its step. Returns a put's result."""
    at = np.int64(block[WRITTEN])
    if block[CLOSED] != 0.0 or at >= block[TAKES]:
        return PUT_RETRY
    start = _row_offset(block, at)
    block[start:start + 6] = vector
    return _commit_row(block, at, step)


@jit.kernel(inline=True)
def _commit_row(block, at, step):
    """Count row ``at`` of ``block`` (written), with ``step``; returns the put's result."""
    block[BLOCK_HEADER + at] = step
    block[WRITTEN] = at + 1
    result = 0
    if block[WAKE] != 0.0:
        block[WAKE] = 0.0
        result = PUT_WAKE
    if at + 1 >= block[TAKES]:
        result |= PUT_FULL
    return result


@jit.kernel(atomic=True)
def close_stats_block(block, fresh, wake):
    """Close ``block`` (puts holding it get ``PUT_RETRY``) and return how many rows it holds; ``fresh``, its
    successor, takes its last copy's step, and its wake flag (set, with ``wake``)."""
    block[CLOSED] = 1.0
    fresh[COPIED] = block[COPIED]
    fresh[WAKE] = 1.0 if wake else block[WAKE]
    return np.int64(block[WRITTEN])


def stats_row_writer(size):
    """The function that puts the statistics of a flat float32 host array of ``size`` elements into a block
    (``StatsFeed.put_summary``, a watched step's hot path): ``write(flat, block, step, copy)``, returning a put's
    result. Below the split size it is the kernel's dispatcher itself, one call a step; above, ``compiled_stats``'
    pieces on host threads, then ``put_stats_row``; an empty tensor is ``PUT_NONFINITE`` (the NumPy path describes
    it)."""
    if size and not _split(size):
        return _put_summary_float32.ready()

    def write(flat, block, step, copy):
        vector = np.empty(6)
        finite = compiled_stats(flat, vector, 0, copy)
        if copy.size:
            block[COPIED] = step
        return put_stats_row.ready()(block, step, vector) if finite else PUT_NONFINITE
    return write


def _split_moments(flat, total, squares, constant):
    """``(mean, std)`` of the flat float32 host array ``flat`` from its pieces' finite float64 sums, taken on host
    threads: the spread as ``E[x²] - mean²`` unless it cancels (``CANCELLING_SPREAD``; then 0 for a ``constant``
    array, else a second, centred pass in pieces), as the one-pass kernels take it."""
    n = flat.size
    mean = total / n
    var = squares / n - mean * mean
    if var < CANCELLING_SPREAD * mean * mean:
        var = 0.0 if constant else sum(host_threads.each(
            lambda part: _centred_squares_float32(flat[part], mean), n, work=n)) / n
    return mean, math.sqrt(var) if var > 0 else 0.0


@jit.kernel(reduce=True)
def _squares_each_float32(tensors, out):
    """``out[3k:3k + 3] = [sum of squares, 0, 0]`` of each flat float32 array of the tuple ``tensors`` (float64
    sums); returns how many hold NaN or Inf (their sums are then not finite)."""
    bad = 0
    for k in range(len(tensors)):
        x = tensors[k]
        squares = 0.0
        for i in range(x.size):
            v = np.float64(x[i])
            squares += v * v
        out[3 * k] = squares
        out[3 * k + 1] = 0.0
        out[3 * k + 2] = 0.0
        bad += squares - squares != 0
    return bad


class FlatViews:
    """``SquaresStats``' memo (one a graph node): its last inputs and their flat views. A plan hands the op the same
    arrays every call (its variables and buffers), so the checks and the views are made once (~1 us of 8 tensors'
    ``ravel`` and dtype and size reads a call)."""
    inputs = ()
    flats = None


def _compiled_squares_of(tensors, keeps, memo=None):
    """``SquaresStats`` of float32 host tensors: one compiled call for all of them (each call costs ~0.5 us beside
    a few thousand elements' work); a tensor holding NaN/Inf gets ``square_vector``'s masked NumPy form
    (``_masked_squares``). A tuple of ``n`` arrays compiles once per ``n``. None (nothing kept yet) when a tensor is
    not a non-empty float32 one or is large (``COMPILED_SPLIT_ELEMENTS``): a BLAS dot product each is as fast there
    (one tensor: ~2 us either way). ``memo``: a ``FlatViews`` holding the views of the last inputs."""
    if memo is not None and len(memo.inputs) == len(tensors) and all(map(operator.is_, tensors, memo.inputs)):
        flats = memo.flats
    else:
        flats = []
        for x in tensors:
            if x.dtype.char != "f" or not 0 < x.size < COMPILED_SPLIT_ELEMENTS:
                return None
            flats.append(x.ravel())
        flats = tuple(flats)
        if memo is not None:
            memo.inputs, memo.flats = tensors, flats
    if any(keeps):
        for x, keep in zip(tensors, keeps):
            if keep is not None:
                keep.save(np, x)
    out = np.empty(3 * len(flats))
    if _squares_each_float32.ready()(flats, out):
        for k, flat in enumerate(flats):
            if not math.isfinite(out[3 * k]):
                out[3 * k:3 * k + 3] = _masked_squares(np, flat)
    return out


def _compiled_activation(x, unit_axis):
    """``activation_vector`` of a float32 host array ``x`` in one compiled pass (two when its spread is small next
    to its mean: ``CANCELLING_SPREAD``), or None when it holds NaN or Inf."""
    shape = x.shape
    axis = unit_axis % len(shape)
    units = shape[axis]
    inner = 1 if axis == len(shape) - 1 else math.prod(shape[axis + 1:])
    blocks = (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(-1, units, inner)
    out = np.empty(7)
    if not _split(blocks.size):
        squares = _activation_float32.ready()(blocks, np.zeros(units), out)[3]
        return out if squares - squares == 0 else None

    def run(part):
        unit_abs = np.zeros(units)
        return (*_activation_float32(blocks[part], unit_abs, _NO_OUT), unit_abs)
    tops, nonzeros, totals, squares, unit_sums = zip(*host_threads.each(run, blocks.shape[0], work=blocks.size))
    squares = sum(squares)
    if squares - squares != 0:
        return None
    n, unit_abs = blocks.size, np.add.reduce(unit_sums)
    _, std = _split_moments(blocks.reshape(-1), sum(totals), squares, False)
    out[:] = (float(np.add.reduce(unit_abs)) / n, std, (n - sum(nonzeros)) / n, max(tops),
              np.count_nonzero(unit_abs == 0) / units, 0.0, 0.0)
    return out


def _host_finite_stats(x):
    """The all-finite fast path on NumPy (a flat float array), or None when ``x`` holds NaN/Inf.

    On small tensors the per-call overheads are the whole cost, so: min and max first (NaN propagates through both,
    an Inf shows in one), then the sum and the sum of squares in ``x``'s own type unless the largest magnitude says
    they could overflow (no ``np.errstate`` needed), and the variance as E[x²] - mean² unless that would cancel.
    """
    n = x.size
    lo, hi = float(_min(x)), float(_max(x))
    if lo - lo != 0 or hi - hi != 0:
        return None             # a NaN or an Inf: the masked path counts them
    biggest = -lo if -lo > hi else hi
    limit = 1e37 if x.dtype.itemsize == 4 else 1e306
    scale = 1.0
    if biggest * biggest * n < limit:
        mean, square = float(host_sum(x)) / n, float(_dot(x, x)) / n
    else:                                   # squares could overflow: sum x / biggest in float64
        scale = biggest
        x = x.astype(np.float64) / scale
        mean, square = float(np.add.reduce(x)) / n, float(_dot(x, x)) / n
    var = square - mean * mean
    if var < 1e-2 * mean * mean:           # the spread is small next to the mean: E[x²] - mean² would lose it
        x = x.astype(np.float64)            # (and a mean summed in float32 would be off by more than the spread)
        mean = float(np.add.reduce(x)) / n
        centred = x - mean
        var = float(_dot(centred, centred)) / n
    return np.array([lo, hi, mean * scale, math.sqrt(var) * scale if var > 0 else 0.0, 0.0, 0.0])


# Row-wise sums of squares: np.vecdot (NumPy 2) runs a dot product per row, ~3x faster than einsum.
row_dots = getattr(np, "vecdot", None) or (lambda a, b: np.einsum("ij,ij->i", a, b))


def stats_rows(rows):
    """``stats_vector`` of each row of a 2-D float32/float64 host array, as an ``(n, 6)`` float64 array.

    Many small tensors at once (a live view's copies of one watched tensor over several calls): four reductions
    over the block instead of four calls per tensor, which on tensors of a few thousand elements is most of their
    cost. Rows the all-finite fast path would not take (NaN/Inf, a possible overflow, a cancelling variance) go
    through ``stats_vector`` one by one, so every row gets exactly its rules.
    """
    n = rows.shape[1]
    limit = 1e37 if rows.dtype.itemsize == 4 else 1e306
    with np.errstate(all="ignore"):      # rows that overflow or hold NaN/Inf fail ``fast`` and are redone below
        lo = _min(rows, axis=1).astype(np.float64)
        hi = _max(rows, axis=1).astype(np.float64)
        mean = _dot(rows, ones_of(n, rows.dtype.char)) / n
        var = row_dots(rows, rows) / n - mean * mean
        fast = (np.maximum(-lo, hi) < math.sqrt(limit / n)) & (var >= 1e-2 * mean * mean)
    out = np.stack([lo, hi, mean, np.sqrt(np.maximum(var, 0.0)), np.zeros_like(lo), np.zeros_like(lo)], axis=1)
    for i in np.flatnonzero(~fast):
        out[i] = stats_vector(np, rows[i])
    return out


def stats_vector(xp, x):
    """``[min, max, mean, std, nan_count, inf_count]`` of array ``x`` as a float64 vector of 6 (see module doc)."""
    if xp is np and x.dtype.char in _HOST_FLOATS and x.size:   # the common case, first
        if x.dtype.char == "f" and jit.enabled():
            out = np.empty(6)
            if compiled_stats(x, out):
                return out
        fast = _host_finite_stats(x.reshape(-1))
        if fast is not None:
            return fast
    x = _floating(xp, x)
    if x.size == 0:
        return xp.asarray([np.nan, np.nan, np.nan, np.nan, 0.0, 0.0])
    finite = xp.isfinite(x)
    count = finite.sum(dtype=xp.float64)
    nan = xp.isnan(x).sum(dtype=xp.float64)
    inf = x.size - count - nan
    some = count > 0
    n = xp.maximum(count, 1.0)
    x64 = x.astype(xp.float64)
    lo = xp.where(finite, x64, xp.inf).min()
    hi = xp.where(finite, x64, -xp.inf).max()
    # deviations are measured in units of the largest magnitude when their squares could overflow (a 1e307 spike)
    biggest = xp.maximum(-lo, hi)
    scale = xp.where(some & (biggest > 1e150), biggest, 1.0)
    mean = (xp.where(finite, x64 / scale, 0.0).sum() / n) * scale
    var = xp.square(xp.where(finite, (x64 - mean) / scale, 0.0)).sum() / n
    values = [xp.where(some, v, xp.nan) for v in (lo, hi, mean, xp.sqrt(var) * scale)]
    return xp.stack(values + [nan, inf])


def _host_histogram(x, bins):
    finite = np.isfinite(x)
    if not finite.all():
        x = x[finite]
    if x.size == 0:
        return np.concatenate([[np.nan, np.nan], np.zeros(bins)])
    lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        counts = np.zeros(bins)
        counts[0] = x.size
        return np.concatenate([[lo, hi], counts])
    # bincount of the bin index: ~2.5x faster than np.histogram for the same equal-width bins
    index = ((x - x.dtype.type(lo)) * x.dtype.type(bins / (hi - lo))).astype(np.intp)
    np.minimum(index, bins - 1, out=index)
    return np.concatenate([[lo, hi], np.bincount(index, minlength=bins).astype(np.float64)])


def histogram_vector(xp, x, bins):
    """``[lo, hi, counts…]`` (float64, length ``2 + bins``): the finite elements of ``x`` counted in ``bins``
    equal-width bins over ``[lo, hi]`` (the last bin closed). No finite element: ``lo = hi = NaN``, zero counts; all
    equal: ``lo == hi`` and everything in bin 0."""
    x = _floating(xp, x)
    if xp is np:
        return _host_histogram(x, bins)
    # CuPy: masked, without boolean indexing; non-finite elements go to an overflow bin that is dropped.
    finite = xp.isfinite(x)
    x64 = x.astype(xp.float64)
    lo = xp.where(finite, x64, xp.inf).min()
    hi = xp.where(finite, x64, -xp.inf).max()
    width = xp.where(hi > lo, hi - lo, 1.0)
    index = xp.clip(((xp.where(finite, x64, lo) - lo) * (bins / width)).astype(xp.int64), 0, bins - 1)
    index = xp.where(finite, index, bins)
    # a kernel of atomic adds, not bincount: bincount reads the largest index on the host, which a CUDA graph
    # capture forbids
    counts = xp.zeros(bins + 1, xp.float64)
    cupy_elementwise(xp, "count", "int64 bucket", "raw float64 counts", "atomicAdd(&counts[bucket], 1.0)",
                     no_return=True)(index, counts)
    counts = counts[:bins]
    some = finite.any()
    edges = xp.stack([xp.where(some, lo, xp.nan), xp.where(some, hi, xp.nan)])
    return xp.concatenate([edges, counts])


# ------------------------------------------------------------------------------------ a network's health (watch_health)

def activation_vector(xp, x, unit_axis=1, nonnegative=False, scratch=None, out=None):
    """``[mean_abs, std, zero_fraction, max_abs, dead_fraction, nan, inf]`` of a layer output ``x`` (its units
    along ``unit_axis``); NaN/Inf are left out of the moments. A float64 vector on ``x``'s device. ``nonnegative``:
    ``x`` comes from an op whose outputs are >= 0 (ReLU), so ``|x|`` is ``x`` and its minimum is not needed.
    ``scratch``: a ``Scratch`` the GPU kernel may keep its accumulators in from call to call; ``out``: a float64
    device vector of 7 for the GPU kernel to write into."""
    n = x.size
    if xp is np and n and x.dtype.char in "fd":      # the common case (every watched step), first
        fast = _compiled_activation(x, unit_axis) if x.dtype.char == "f" and x.ndim and jit.enabled() else None
        if fast is not None:
            return fast
        fast = _host_activation(x, unit_axis, nonnegative)
        if fast is not None:
            return fast
    if xp is not np and x.dtype == np.float32 and n:
        return _cupy_activation(xp, x, unit_axis, scratch, out)
    axes = _other_axes(x, unit_axis)
    x = x if x.dtype.kind == "f" else x.astype(xp.float64)
    if n == 0:
        return xp.asarray([np.nan, np.nan, np.nan, np.nan, np.nan, 0.0, 0.0])
    v = stats_vector(xp, x)
    finite = xp.isfinite(x)
    a = xp.where(finite, xp.abs(x), 0).astype(xp.float64)
    count = xp.maximum(finite.sum(dtype=xp.float64), 1.0)
    unit_max = xp.abs(x).max(axis=axes)          # NaN stays NaN: a unit holding NaN is not dead
    dead = (unit_max == 0).sum(dtype=xp.float64) / unit_max.size
    zeros = (x == 0).sum(dtype=xp.float64) / n
    return xp.stack([a.sum() / count, v[3], zeros, a.max(), dead, v[4], v[5]])


def _other_axes(x, unit_axis):
    return tuple(a for a in range(x.ndim) if a != unit_axis % x.ndim)


def _host_activation(x, unit_axis, nonnegative):
    """The NumPy path when every element is finite (else None), in as few passes as it can: the largest ``|x|``
    (NaN propagates through it, an Inf shows), the count of non-zeros, per-unit sums of ``|x|``
    (``ops.stats.host_unit_sums``; a unit is dead exactly when its sum is 0, as ``|x|`` cannot cancel, and they add
    up to the total) and the sum of squares (a dot product); the minimum only when the sign is not known. A 100 x
    512 ReLU output: ~35 us (45 us with per-unit maxima); a 32 x 16 x 28 x 28 one: ~190 us (235 us)."""
    flat = x.reshape(-1)
    n = flat.size
    if not nonnegative:
        lo = float(np.minimum.reduce(flat))
        if lo - lo != 0:
            return None
        nonnegative = lo >= 0
    a = x if nonnegative else np.abs(x)
    a_flat = a.reshape(-1)
    hi = float(np.maximum.reduce(a_flat))
    if hi - hi != 0:
        return None
    nonzero = np.count_nonzero(a_flat > 0)
    if hi * hi * n < (1e37 if x.dtype.itemsize == 4 else 1e306):      # no sum or square can overflow
        units = host_unit_sums(a, unit_axis)
        if units is None:                        # a layout without the product: per-unit maxima
            axes = _other_axes(x, unit_axis)
            units = np.maximum.reduce(a, axis=axes) if axes else a
            total_abs = float(host_sum(a_flat))
        else:
            total_abs = float(host_sum(units))
        total = total_abs if nonnegative else float(host_sum(flat))
        mean = total / n
        var = float(np.dot(flat, flat)) / n - mean * mean
        if var < 1e-2 * mean * mean:             # E[x²] - mean² would lose the spread: the careful statistic
            std = float(stats_vector(np, flat)[3])
        else:
            std = math.sqrt(max(var, 0.0))
    else:                                        # squares could overflow: the scaled statistic (its square too:
        std = float(stats_vector(np, flat)[3])   # a float64 std above 1e154 has none)
        total_abs = float(np.add.reduce(a_flat, dtype=np.float64))
        axes = _other_axes(x, unit_axis)
        units = np.maximum.reduce(a, axis=axes) if axes else a
    dead = np.count_nonzero(units == 0) / units.size
    return np.array([total_abs / n, std, (n - nonzero) / n, hi, dead, 0.0, 0.0])


def activation_rows(rows, unit_axis=1, nonnegative=False):
    """``activation_vector`` of each ``rows[i]`` (a float32/float64 host array ``(n, *shape)``: one layer output a
    call), as an ``(n, 7)`` float64 array. The all-finite rows take one vectorised pass over a few rows at a time
    (``ROWS_AT_ONCE``: they stay in cache through the passes): the largest ``|x|``, the non-zeros, per-unit sums of
    ``|x|`` as products with ones (a unit is dead when its sum is 0), the sum and the sum of squares. Rows holding
    NaN/Inf, whose squares could overflow or whose variance would cancel go through ``activation_vector`` one by
    one, so every row gets its rules; the moments may differ from it in the last bits (another order of
    summation), the counts do not. With compiled kernels, C-contiguous float32 rows each take the compiled pass
    ``activation_vector`` takes (``_activation_float32``: 0.8 us a row of 100 x 10, against 1.25 for the
    vectorised pass), and their numbers are its to the bit."""
    n, shape = rows.shape[0], rows.shape[1:]
    out = np.empty((n, 7))
    size = math.prod(shape)
    if not n:
        return out
    if not size or rows.dtype.char not in "fd" or not shape:
        for i in range(n):
            out[i] = activation_vector(np, rows[i], unit_axis, nonnegative)
        return out
    axis = unit_axis % len(shape)
    units = shape[axis]
    before, after = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    if rows.dtype.char == "f" and rows.flags.c_contiguous and jit.enabled():
        bad = np.zeros(n, np.bool_)
        _activation_rows_float32.ready()(rows.reshape(n, before, units, after), np.zeros(units), out, bad)
        for i in np.flatnonzero(bad):
            out[i] = activation_vector(np, rows[i], unit_axis, nonnegative)
        return out
    char = rows.dtype.char
    limit = 1e37 if rows.dtype.itemsize == 4 else 1e306
    at_once = max(1, ROWS_AT_ONCE // (size * rows.dtype.itemsize))
    for first in range(0, n, at_once):
        part = rows[first:first + at_once]
        k = len(part)
        flat = part.reshape(k, size)
        with np.errstate(all="ignore"):      # rows that overflow or hold NaN/Inf fail ``fast`` and are redone
            a = flat if nonnegative else np.abs(flat)
            hi = _max(a, axis=1).astype(np.float64)
            nonzero = np.add.reduce(a > 0, axis=1, dtype=np.int64)
            per_unit = a.reshape(k, before, units, after)
            per_unit = np.add.reduce(per_unit, axis=3) if after > 1 else per_unit.reshape(k, before, units)
            per_unit = np.matmul(ones_of(before, char), per_unit)              # (k, units)
            dead = np.add.reduce(per_unit == 0, axis=1, dtype=np.int64) / units
            total_abs = np.matmul(per_unit, ones_of(units, char)).astype(np.float64)
            total = total_abs if nonnegative else np.matmul(flat, ones_of(size, char)).astype(np.float64)
            mean = total / size
            var = row_dots(flat, flat).astype(np.float64) / size - mean * mean
            fast = (hi * hi * size < limit) & (var >= 1e-2 * mean * mean)
            out[first:first + k] = np.stack([total_abs / size, np.sqrt(np.maximum(var, 0.0)),
                                             (size - nonzero) / size, hi, dead, np.zeros(k), np.zeros(k)], axis=1)
        for i in np.flatnonzero(~fast):
            out[first + i] = activation_vector(np, part[i], unit_axis, nonnegative)
    return out


ROWS_AT_ONCE = 512 << 10
"""Bytes of rows ``activation_rows`` takes in one pass (a few hundred KiB: they stay in the core's cache)."""


def square_vector(xp, x, scratch=None, out=None):
    """``[sum of squares of the finite elements, nan, inf]`` of ``x``, float64 on ``x``'s device: one dot product
    when everything is finite (``scratch``, ``out``: as ``activation_vector``'s). With compiled kernels a float32
    host ``x`` is summed as ``SquaresStats`` sums it (in float64, in the same kernel: ``watch_health``'s block path
    and its report a call give the same norms); as fast as the dot product."""
    flat = x.reshape(-1)
    if xp is not np and x.dtype == np.float32 and x.size:
        return _cupy_squares(xp, flat, scratch, out)
    if xp is np and x.dtype.char == "f" and 0 < flat.size < COMPILED_SPLIT_ELEMENTS and jit.enabled():
        vector = np.empty(3)
        if not _squares_each_float32.ready()((flat.ravel(),), vector):
            return vector
        return _masked_squares(np, flat)
    if xp is np and x.dtype.char in "fd":
        total = float(np.dot(flat, flat))
        if total - total == 0:
            return np.array([total, 0.0, 0.0])
    return _masked_squares(xp, flat)


def _masked_squares(xp, flat):
    """``square_vector`` of a flat array holding NaN/Inf (or whose dot product overflowed), in float64."""
    x64 = flat.astype(xp.float64)
    finite = xp.isfinite(x64)
    nan = xp.isnan(x64).sum(dtype=xp.float64)
    inf = x64.size - finite.sum(dtype=xp.float64) - nan
    kept = xp.where(finite, x64, 0.0)
    biggest = xp.abs(kept).max() if kept.size else 0.0
    scale = xp.where(biggest > 1e150, biggest, 1.0)     # squares of 1e200 overflow float64 too
    return xp.stack([xp.vdot(kept / scale, kept / scale) * scale * scale, nan, inf])


def mean_vector(xp, x, out=None):
    """``[mean]`` of all of ``x`` (NaN and Inf included: a NaN loss must show), float64 on ``x``'s device (on the
    GPU into ``out`` when given)."""
    if xp is np:
        return np.array([float(np.add.reduce(x.reshape(-1), dtype=np.float64)) / max(x.size, 1)])
    if out is not None:
        x.mean(dtype=xp.float64, out=out.reshape(()))
        return out
    return x.mean(dtype=xp.float64).reshape(1)


# One pass over a float32 tensor on the GPU, in one kernel (the masked NumPy-style form above is ~15 kernels): every
# thread sums its elements in float64, blocks combine with atomics in ``acc``, and the last block to finish turns the
# totals into the statistics and zeroes ``acc`` again. So with a ``Scratch`` kept from call to call a CUDA graph
# replays one kernel a tensor, and no memset.
# acc (uint64): [0] sum |x|, [1] sum x, [2] sum x^2 (float64 bits), [3] max |x| (float64 bits: ordered as integers
# for x >= 0), [4] zeros, [5] NaN, [6] Inf, [7] blocks done; then one uint32 a unit: set when the unit holds a
# non-zero (NaN and Inf count as non-zero: such a unit is not dead).
_STATS_KERNELS = r"""
#define BLOCK 256
__device__ double nan_v() { return __longlong_as_double(0x7ff8000000000000LL); }
__device__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ double warp_max(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
// v[k] over the block into thread 0's v[k] (k < K); kinds: 0 sum, 1 max
template <int K> __device__ void block_reduce(double* v, const int* kinds) {
    __shared__ double shared[K][BLOCK / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int k = 0; k < K; k++) {
        v[k] = kinds[k] ? warp_max(v[k]) : warp_sum(v[k]);
        if (lane == 0) shared[k][warp] = v[k];
    }
    __syncthreads();
    if (warp == 0) {
        for (int k = 0; k < K; k++) {
            double w = lane < BLOCK / 32 ? shared[k][lane] : 0.0;
            v[k] = kinds[k] ? warp_max(w) : warp_sum(w);
        }
    }
    __syncthreads();
}
__device__ bool last_block(unsigned long long* done) {
    __shared__ bool last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(done, 1ULL) == gridDim.x - 1;
    }
    __syncthreads();
    return last;
}
__device__ double total(unsigned long long* acc, int k) {   // another block's atomics, read through L2
    return __longlong_as_double((long long)atomicAdd(acc + k, 0ULL));
}

extern "C" __global__ void flowlab_activation_stats(const float* x, long long n, long long inner, long long units,
                                                    unsigned long long* acc, double* out) {
    unsigned int* seen = (unsigned int*)(acc + 8);
    double v[7] = {0, 0, 0, 0, 0, 0, 0};      // sum |x|, sum x, sum x^2, max |x|, zeros, NaN, Inf
    for (long long i = blockIdx.x * (long long)BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK) {
        double e = (double)x[i];
        if (e != 0) {
            unsigned int* unit = seen + (i / inner) % units;
            if (!*unit) *unit = 1;
        }
        if (isnan(e)) { v[5] += 1; continue; }
        if (isinf(e)) { v[6] += 1; continue; }
        double a = fabs(e);
        v[0] += a; v[1] += e; v[2] += e * e; v[3] = fmax(v[3], a); v[4] += (e == 0);
    }
    const int kinds[7] = {0, 0, 0, 1, 0, 0, 0};
    block_reduce<7>(v, kinds);
    if (threadIdx.x == 0) {
        for (int k = 0; k < 3; k++) atomicAdd((double*)(acc + k), v[k]);
        atomicMax(acc + 3, (unsigned long long)__double_as_longlong(v[3]));
        for (int k = 4; k < 7; k++) atomicAdd(acc + k, (unsigned long long)v[k]);
    }
    if (!last_block(acc + 7)) return;
    double dead[1] = {0};
    for (long long u = threadIdx.x; u < units; u += BLOCK) {
        dead[0] += atomicAdd(seen + u, 0u) == 0;
        seen[u] = 0;
    }
    const int sum[1] = {0};
    block_reduce<1>(dead, sum);
    if (threadIdx.x != 0) return;
    double nans = (double)atomicAdd(acc + 5, 0ULL), infs = (double)atomicAdd(acc + 6, 0ULL);
    double count = (double)n - nans - infs, c = count > 0 ? count : 1.0;
    double mean = total(acc, 1) / c, var = total(acc, 2) / c - mean * mean;
    out[0] = total(acc, 0) / c;
    out[1] = count > 0 ? sqrt(var > 0 ? var : 0.0) : nan_v();
    out[2] = (double)atomicAdd(acc + 4, 0ULL) / (double)n;
    out[3] = total(acc, 3);
    out[4] = dead[0] / (double)units;
    out[5] = nans;
    out[6] = infs;
    for (int k = 0; k < 8; k++) acc[k] = 0;
}

extern "C" __global__ void flowlab_square_stats(const float* x, long long n, unsigned long long* acc, double* out) {
    double v[3] = {0, 0, 0};                 // sum x^2 of the finite elements, NaN, Inf
    for (long long i = blockIdx.x * (long long)BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK) {
        double e = (double)x[i];
        if (isnan(e)) v[1] += 1;
        else if (isinf(e)) v[2] += 1;
        else v[0] += e * e;
    }
    const int kinds[3] = {0, 0, 0};
    block_reduce<3>(v, kinds);
    if (threadIdx.x == 0) {
        atomicAdd((double*)acc, v[0]);
        atomicAdd(acc + 1, (unsigned long long)v[1]);
        atomicAdd(acc + 2, (unsigned long long)v[2]);
    }
    if (!last_block(acc + 7)) return;
    if (threadIdx.x == 0) {
        out[0] = total(acc, 0);
        out[1] = (double)atomicAdd(acc + 1, 0ULL);
        out[2] = (double)atomicAdd(acc + 2, 0ULL);
        for (int k = 0; k < 8; k++) acc[k] = 0;
    }
}
"""
_stats_kernels = {}


def _stats_kernel(cupy, name):
    """A kernel of ``_STATS_KERNELS``, compiled on first use."""
    kernel = _stats_kernels.get(name)
    if kernel is None:
        module = _stats_kernels.get("module") or _stats_kernels.setdefault("module",
                                                                           cupy.RawModule(code=_STATS_KERNELS))
        kernel = _stats_kernels[name] = module.get_function(name)
    return kernel


def _grid(n):
    """Blocks for ``n`` elements: ~4 elements a thread, at most 1,024 blocks (a few per SM)."""
    return max(1, min(1024, -(-n // (256 * 4))))


class Scratch:
    """Where a statistics op's GPU kernel keeps its accumulators between calls (one a graph node): the kernel leaves
    them zeroed, so no call needs a memset."""
    array = None

    def zeros(self, cupy, size):
        """``size`` uint64 zeros: the kept ones, else new ones (kept unless a CUDA graph is being captured: memory
        allocated then belongs to the graph)."""
        if self.array is not None and self.array.size == size:
            return self.array
        array = cupy.zeros(size, cupy.uint64)
        if not cupy.cuda.get_current_stream().is_capturing():
            self.array = array
        return array


def _accumulators(cupy, scratch, size):
    return cupy.zeros(size, cupy.uint64) if scratch is None else scratch.zeros(cupy, size)


class Results:
    """One device buffer that the statistics ops of a ``watch_health`` write their vectors into, each at an offset
    reserved when the job is traced, so that a CUDA graph copies them all to the host with one copy
    (``runtime.cuda_graph``'s ``stage_small``)."""

    def __init__(self):
        self.size, self.array = 0, None

    def reserve(self, n):
        offset, self.size = self.size, self.size + n
        return (self, offset)

    def view(self, cupy, offset, n):
        """The slice of an op's vector; None (the op makes a vector of its own) while a CUDA graph is captured
        before the buffer was made: memory allocated then belongs to the graph."""
        if self.array is None:
            if cupy.cuda.get_current_stream().is_capturing():
                return None
            self.array = cupy.empty(self.size, cupy.float64)
        return self.array[offset:offset + n]


def _slot(cupy, into, n):
    return None if into is None else into[0].view(cupy, into[1], n)


def _written(xp, vector, out):
    """``vector`` in ``out`` when ``out`` is given (a path that made its own)."""
    if out is None or vector is out:
        return vector
    out[...] = xp.asarray(vector, dtype=xp.float64)
    return out


def _cupy_activation(cupy, x, unit_axis, scratch, out):
    axis = unit_axis % x.ndim
    x = x if x.flags.c_contiguous else cupy.ascontiguousarray(x)
    units, inner = x.shape[axis], math.prod(x.shape[axis + 1:])
    acc = _accumulators(cupy, scratch, 8 + (units + 1) // 2)
    out = cupy.empty(7, cupy.float64) if out is None else out
    n = x.size
    _stats_kernel(cupy, "flowlab_activation_stats")((_grid(n),), (256,), (
        x, np.int64(n), np.int64(inner), np.int64(units), acc, out))
    return out


def _cupy_squares(cupy, x, scratch, out):
    x = x if x.flags.c_contiguous else cupy.ascontiguousarray(x)
    acc = _accumulators(cupy, scratch, 8)
    out = cupy.empty(3, cupy.float64) if out is None else out
    _stats_kernel(cupy, "flowlab_square_stats")((_grid(x.size),), (256,), (x, np.int64(x.size), acc, out))
    return out


class ActivationStats(Op):
    """``activation_vector`` of a layer's output as a graph op (``watch_health``): 7 numbers on the device."""
    prefix, api = "System-Health-Activation_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(x, unit_axis, nonnegative, scratch, into=None):
        return spec((7,), np.float64)

    @staticmethod
    def forward(xp, x, unit_axis, nonnegative, scratch, into=None):
        if xp is np:
            return activation_vector(np, x, unit_axis, nonnegative)
        out = _slot(xp, into, 7)
        return _written(xp, activation_vector(xp, x, unit_axis, nonnegative, scratch, out), out)


class SquareStats(Op):
    """``square_vector`` of a weight or gradient (``watch_health``). With ``keep`` (an object with ``save(xp,
    array)``), the array is also saved there before an optimizer update changes it, to measure the update after."""
    prefix, api = "System-Health-Squares_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(x, scratch, keep=None, into=None):
        return spec((3,), np.float64)

    @staticmethod
    def forward(xp, x, scratch, keep=None, into=None):
        if keep is not None:
            keep.save(xp, x)
        return _squares_into(xp, x, scratch, into)


class SlicesSquareStats(Op):
    """``square_vector`` of a sparsely updated table's gradient as its update applies it: the gradient ``rows`` summed
    by ``ids`` first (``unique_rows``: a repeated id's rows add up, ids outside the table's ``n_rows`` drop out), so
    the squares are those of the dense gradient's nonzero rows. Squaring the rows as they came would count a
    repeated id's rows apart (``|a|² + |b|²`` instead of ``|a + b|²``). O(ids), never O(table)."""
    prefix, api = "System-Health-Squares_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(rows, ids, n_rows, scratch, into=None):
        return spec((3,), np.float64)

    @staticmethod
    def forward(xp, rows, ids, n_rows, scratch, into=None):
        _, summed = unique_rows(xp, ids, rows, n_rows)
        return _squares_into(xp, summed, scratch, into)


class SlicesHistogram(Op):
    """``histogram_vector`` (``bins`` equal-width bins) of a sparsely updated table's gradient as its update applies
    it, the gradient ``rows`` summed by ``ids`` first (``unique_rows``), as ``SlicesSquareStats`` takes its norm: a
    repeated id counts once with its summed row, not once per gathered row, and ids outside the table drop out."""
    prefix, api = "System-Health-Histogram_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(rows, ids, n_rows, bins):
        return spec((2 + bins,), np.float64)

    @staticmethod
    def forward(xp, rows, ids, n_rows, bins):
        _, summed = unique_rows(xp, ids, rows, n_rows)
        return histogram_vector(xp, summed, bins)


def _squares_into(xp, x, scratch, into):
    """``square_vector`` of ``x``: on the host a new vector; on the device written into ``into``'s slot when given
    (the plan's buffer) with the kernel's ``scratch``."""
    if xp is np:
        return square_vector(np, x)
    out = _slot(xp, into, 3)
    return _written(xp, square_vector(xp, x, scratch, out), out)


class SquaresStats(Op):
    """``square_vector`` of each of several tensors made before it, as one vector of 3 numbers a tensor, in input
    order (``watch_health``'s block path on the host: a network's weights, or its gradients, in one op). ``keeps``:
    ``SquareStats``' ``keep`` for each input (None: not kept); ``memo``: the node's ``FlatViews``."""
    prefix, api = "System-Health-Squares_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(*tensors, keeps, memo=None):
        return spec((3 * len(tensors),), np.float64)

    @staticmethod
    def forward(xp, *tensors, keeps, memo=None):
        compiled = xp is np and jit.enabled()
        if compiled:
            vector = _compiled_squares_of(tensors, keeps, memo)
            if vector is not None:
                return vector
        values = []
        for x, keep in zip(tensors, keeps):
            if keep is not None:
                keep.save(xp, x)
            if xp is np and x.dtype.char in "fd" and not (compiled and x.dtype.char == "f"):
                flat = x.reshape(-1)
                total = float(_dot(flat, flat))
                if total - total == 0:          # all finite: square_vector's fast path, without its array
                    values += (total, 0.0, 0.0)
                    continue
            values += square_vector(xp, x).tolist()
        return np.array(values)


class MeanStat(Op):
    """``mean_vector`` of the loss (``watch_health``)."""
    prefix, api = "System-Health-Mean_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(x, into=None):
        return spec((1,), np.float64)

    @staticmethod
    def forward(xp, x, into=None):
        if xp is np:
            return mean_vector(np, x)
        out = _slot(xp, into, 1)
        return _written(xp, mean_vector(xp, x, out), out)


def batch_norm_vector(xp, moving_mean, moving_variance, batch_mean=None, batch_variance=None, epsilon=1e-5):
    """``[moving_mean_abs, moving_var_mean, moving_var_min, batch_mean_gap, batch_var_ratio, nan, inf]`` of one batch
    normalization's per-channel statistics, float64 on their device: a few reductions of vectors of a few hundred
    channels, with no host copy (a CUDA graph holds them). ``nan``/``inf`` count the moving statistics' non-finite
    values (the averages are then NaN too: a NaN batch poisons the moving statistics for good). The gaps compare
    this call's batch statistics with the moving ones a predict job normalizes with: ``batch_mean_gap`` is the mean
    over channels of ``|batch mean - moving mean| / sqrt(moving variance + epsilon)`` (how far, in moving standard
    deviations, evaluation shifts a channel), ``batch_var_ratio`` the mean of ``(batch variance + epsilon) / (moving
    variance + epsilon)`` (1 when they agree); both NaN without batch statistics."""
    mean, var = moving_mean.astype(xp.float64), moving_variance.astype(xp.float64)
    both = xp.concatenate([mean, var])
    nan = xp.isnan(both).sum(dtype=xp.float64)
    inf = xp.isinf(both).sum(dtype=xp.float64)
    spread = var + epsilon
    if batch_mean is None:
        gap = ratio = xp.full((), np.nan, xp.float64)
    else:
        gap = (xp.abs(batch_mean.astype(xp.float64) - mean) / xp.sqrt(spread)).mean()
        ratio = ((batch_variance.astype(xp.float64) + epsilon) / spread).mean()
    return xp.stack([xp.abs(mean).mean(), var.mean(), var.min(), gap, ratio, nan, inf])


class BatchNormStats(Op):
    """``batch_norm_vector`` of a batch normalization as a graph op (``watch_health``): inputs ``(batch_mean,
    batch_variance, moving_mean, moving_variance)`` in a train job (it runs right after the normalization made the
    batch statistics, before the moving averages are updated in place), ``(moving_mean, moving_variance)``
    otherwise."""
    prefix, api = "System-Health-BatchNorm_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(*statistics, epsilon, into=None):
        return spec((7,), np.float64)

    @staticmethod
    def forward(xp, *statistics, epsilon, into=None):
        batch = statistics[:2] if len(statistics) == 4 else (None, None)
        vector = batch_norm_vector(xp, *statistics[-2:], *batch, epsilon=epsilon)
        if xp is np:
            return vector
        out = _slot(xp, into, 7)
        return _written(xp, vector, out)


def attention_vector(xp, probs):
    """Per head (axis 1 of ``(batch, heads, queries, keys)`` attention probabilities), float64 on their device: the
    mean over the batch and the queries of each row's entropy over the keys divided by the log of the number of keys
    it may attend to (those of non-zero probability: a padding mask's -10000 gives exactly 0). 0: every query
    attends to one key (a collapsed head); 1: to all alike (a uniform head). A row with one key left counts 0."""
    p = probs.astype(xp.float64)
    positive = p > 0
    plogp = p * xp.log(xp.where(positive, p, 1.0))
    entropy = -plogp.sum(axis=-1)                                      # (batch, heads, queries)
    keys = positive.sum(axis=-1)
    scale = xp.log(xp.maximum(keys, 2).astype(xp.float64))
    normalized = xp.where(keys > 1, entropy / scale, 0.0)
    return normalized.mean(axis=(0, 2))


class AttentionStats(Op):
    """``attention_vector`` of attention probabilities (``watch_health``): one value per head."""
    prefix, api = "System-Health-Attention_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(probs, into=None):
        return spec((probs.shape[1],), np.float64)

    @staticmethod
    def forward(xp, probs, into=None):
        vector = attention_vector(xp, probs)
        if xp is np:
            return vector
        out = _slot(xp, into, vector.size)
        return _written(xp, vector, out)


class RowTracker:
    """An embedding table's row history for ``watch_health``: per row the call (counted from 0 by the tracker itself)
    that last updated it, -1 for none, in ``last`` (``rows + 1`` int32 on the table's device: the extra slot takes
    ids outside the table, which update nothing), and ``calls``, the calls seen so far (a 0-d int32 there too: no host
    value, so a CUDA graph may replay the op that counts them). ``marks`` is scratch for counting distinct ids."""
    last = calls = marks = None

    def arrays(self, xp, rows):
        """``(last, calls, marks)``, made (never updated, 0 calls) on first use or when the table's size changed;
        not kept when made while a CUDA graph is being captured (memory allocated then belongs to the graph)."""
        if self.last is not None and self.last.shape[0] == rows + 1:
            return self.last, self.calls, self.marks
        made = xp.full(rows + 1, -1, np.int32), xp.zeros((), np.int32), xp.zeros(rows + 1, np.int32)
        if xp is np or not xp.cuda.get_current_stream().is_capturing():
            self.last, self.calls, self.marks = made
        return made


class RowTouches(Op):
    """Marks the rows of an embedding table that this call's ids touch (``watch_health``'s sparse-update rows):
    ``tracker.last[id] = call`` for each id in ``[0, rows)``, then counts the call; output: ``[distinct ids in the
    table]``, float64. O(ids) work, none O(rows). Kept in every call's plan (``side_effect``: rows touched on calls
    that deliver no report count too) and works on the device only (``replayable``).

    Distinct ids without a sort: each id writes its position into ``tracker.marks[id]`` and an id is counted where its
    own position is the one that stayed (one per distinct id, whichever write wins, on NumPy or CuPy)."""
    prefix, api = "System-Health-RowTouches_", "flow.watch_health"
    side_effect = replayable = True

    @staticmethod
    def infer(ids, rows, tracker):
        return spec((1,), np.float64)

    @staticmethod
    def forward(xp, ids, rows, tracker):
        last, calls, marks = tracker.arrays(xp, rows)
        flat = ids.reshape(-1)
        slots = xp.where((flat >= 0) & (flat < rows), flat, rows).astype(np.int64, copy=False)
        positions = xp.arange(slots.size, dtype=np.int32)
        marks[slots] = positions
        distinct = (marks[slots] == positions) & (slots < rows)
        last[slots] = calls
        calls += 1
        return distinct.sum(dtype=np.float64).reshape(1)


def row_coverage_vector(xp, touched, last, calls, rows, stale_after):
    """``[rows touched this call, rows ever touched, stale rows]`` (float64) of a table's ``RowTracker`` arrays after
    this call's ``RowTouches``: a row is stale when its last update (never: -1) is more than ``stale_after`` calls
    before this one. O(rows): run on the calls that deliver a report only."""
    history = last[:rows]
    this_call = calls - 1
    ever = (history >= 0).sum(dtype=np.float64)
    stale = (history < this_call - stale_after).sum(dtype=np.float64)
    return xp.concatenate([xp.asarray(touched, dtype=np.float64).reshape(1), ever.reshape(1), stale.reshape(1)])


class RowCoverage(Op):
    """``row_coverage_vector`` of a table (``watch_health``), from the vector of its ``RowTouches`` (which it reads, so
    that it runs after this call's ids were marked) and their shared ``tracker``."""
    prefix, api = "System-Health-RowCoverage_", "flow.watch_health"
    observes = True

    @staticmethod
    def infer(touched, rows, tracker, stale_after, into=None):
        return spec((3,), np.float64)

    @staticmethod
    def forward(xp, touched, rows, tracker, stale_after, into=None):
        last, calls, _ = tracker.arrays(xp, rows)
        vector = row_coverage_vector(xp, touched, last, calls, rows, stale_after)
        return vector if xp is np else _written(xp, vector, _slot(xp, into, 3))


class TensorStats(Op):
    """``stats_vector`` of its input as a graph op, so ``watch(..., stats=True)`` summarises on the device."""
    prefix, api = "TensorStats_", "watch stats"
    observes = True

    @staticmethod
    def infer(x):
        return spec((6,), np.float64)

    @staticmethod
    def forward(xp, x):
        return stats_vector(xp, x)


def tensor_stats(x, name=None):
    return apply(TensorStats, (as_tensor(x, argument="x"),), name)
