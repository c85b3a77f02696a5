"""Data shaping for the plots: plain NumPy in, plain columns out, no Bokeh and no threads, so it is easy to test and
cheap enough to run on the watch dispatcher thread. One compiled loop (``runtime.jit``, NumPy twin beside it): the
fold of a live trend's per-step rows, which a widget's refresh runs for every step."""
from __future__ import annotations

import math

import numpy as np

from ..ops.stats import histogram_vector, stats_vector
from ..runtime import jit
from ..summary.thinning import StepBuckets
from ..watching import TensorHistogram, TensorStats

SUMMARY_KEYS = ("shape", "min", "max", "mean", "std", "nan", "inf")


def histogram_data(values, bins=30):
    """Columns ``left``, ``right``, ``top`` for a Bokeh ``quad`` glyph: a histogram of the finite elements of an
    array, or the columns of a ``TensorHistogram`` computed on the device.

    NaN and Inf are left out (the stats table counts them). A constant tensor gets one bin of width 1 centred on its
    value (NumPy would spread 30 empty bins around it); a tensor with no finite element gets empty columns.
    """
    if isinstance(values, TensorHistogram):
        lo, hi, counts = values.lo, values.hi, np.asarray(values.counts, np.float64)
    else:
        x = np.asarray(values)
        if x.dtype.kind not in "fiub":
            raise TypeError(f"histogram_data: expects a real-valued array or TensorHistogram, got dtype {x.dtype}")
        v = histogram_vector(np, x, bins)
        lo, hi, counts = float(v[0]), float(v[1]), v[2:]
    if math.isnan(lo):
        empty = np.zeros(0, np.float64)
        return {"left": empty, "right": empty.copy(), "top": np.zeros(0, np.int64)}
    if lo == hi:
        return {"left": np.array([lo - 0.5]), "right": np.array([hi + 0.5]), "top": np.array([int(counts.sum())])}
    edges = np.linspace(lo, hi, len(counts) + 1)
    return {"left": edges[:-1], "right": edges[1:], "top": counts.astype(np.int64)}


def tensor_summary(value):
    """``{"shape", "min", "max", "mean", "std", "nan", "inf"}`` of an array (min/max/mean/std over its finite
    elements, NaN when there are none: ``flowlab.ops.stats.stats_vector``, as ``watch(..., stats=True)`` computes
    them on the device), or of a ``TensorStats``."""
    if isinstance(value, TensorStats):
        return {"shape": tuple(value.shape), "min": value.min, "max": value.max, "mean": value.mean,
                "std": value.std, "nan": value.nan_count, "inf": value.inf_count}
    x = np.asarray(value)
    if x.dtype.kind not in "fiub":
        raise TypeError(f"tensor_summary: expects a real-valued array or TensorStats, got dtype {x.dtype}")
    return tensor_summary(TensorStats.from_vector(x.shape, stats_vector(np, x)))


def sticky_range(current, lo, hi, *, start=None, pad=0.05, headroom=0.25, fill=0.5):
    """``(start, end)`` of an axis that shows the data extent ``lo…hi``, changed as rarely as that allows.

    ``current`` (``(start, end)`` or None) is kept while it holds the whole extent and the extent fills at least
    ``fill`` of it: a live figure whose range is set with its data repaints once per update and is not laid out
    again, where BokehJS's auto ranges change inside a paint and ask for another (issue 33). When the data outgrows
    a side, that side moves past it by ``pad`` + ``headroom`` of the extent's span and the other side stays (a
    growing series, a histogram whose extremes jitter, moves its range every ~``headroom`` of growth, not every
    update), though headroom never takes it across zero when the data stay on one side (a norm's axis shows no
    negative values it cannot have, past ``pad``); a first fit, or an extent shrunk under ``fill``, gets ``pad`` each
    side. ``start`` pins the start (a count axis from 0). ``lo``/``hi`` must be finite (callers take them over
    finite values, so a spike always shows); an extent of zero span gets a range of a tenth of its value (1 at 0)
    around it."""
    if start is not None:
        lo = min(lo, start)
    span = hi - lo
    if not span > 0:
        span = abs(hi) * 0.1 or 1.0
        lo, hi = lo - 0.5 * span, hi + 0.5 * span
    tight = (lo - pad * span if start is None else start, hi + pad * span)
    if current is None:
        return float(tight[0]), float(tight[1])
    c0, c1 = current
    inside = c0 <= lo and hi <= c1 and (start is None or c0 == start)
    if inside:
        return current if span >= fill * (c1 - c0) else (float(tight[0]), float(tight[1]))
    if lo >= c0 and (start is None or c0 == start):
        new0 = c0
    else:
        new0 = tight[0] - (0.0 if start is not None else headroom * span)
    new1 = c1 if hi <= c1 else tight[1] + headroom * span
    # headroom does not cross zero where the data do not: a non-negative norm that fell to 0 after a spike of 72k
    # drew its axis from -20k
    if lo >= 0 and new0 < 0:
        new0 = max(new0, min(tight[0], 0.0))
    if hi <= 0 and new1 > 0:
        new1 = min(new1, max(tight[1], 0.0))
    if span < fill * (new1 - new0):         # the side kept was wide: fit it again (or the next update would)
        new0 = tight[0] if lo >= c0 else new0
        new1 = tight[1] if hi <= c1 else new1
    return float(new0), float(new1)


def finite_extent(*columns):
    """``(lo, hi)`` over the finite values of ``columns`` (arrays), or None when there are none."""
    lo, hi = math.inf, -math.inf
    for values in columns:
        values = np.asarray(values, np.float64)
        values = values[np.isfinite(values)]
        if values.size:
            lo, hi = min(lo, float(values.min())), max(hi, float(values.max()))
    return (lo, hi) if lo <= hi else None


class Trend:
    """Per-step statistics of a tensor (or a scalar such as the loss) over a whole run, in at most ``max_points``
    buckets of consecutive steps, losing no extreme (``StepBuckets``).

    ``add(step, stats)`` takes a ``TensorStats``, ``extend(steps, vectors)`` many ``stats_vector`` rows. A bucket
    keeps its steps' mean (pooled over the elements of every step), std (pooled likewise), the smallest min and
    largest max, and how many NaN/Inf they held, so a spike or a NaN at one step stays on screen however long the
    run. Columns (``COLUMNS``): first step ``step``, ``end`` (one past its last step), ``mean``, ``lower``/``upper``
    (mean ∓ std), ``min``, ``max``, ``nonfinite``; NaN where a bucket saw no finite element. ``take()`` tells a view
    what changed since the last call, as ``(at, columns of rows at…)``.
    """

    COLUMNS = ("step", "end", "mean", "lower", "upper", "min", "max", "nonfinite")
    _FIELDS = {"finite": "sum", "sum": "sum", "sum2": "sum", "lo": "min", "hi": "max", "bad": "sum"}

    def __init__(self, max_points=500):
        if not isinstance(max_points, int) or isinstance(max_points, bool) or max_points < 2:
            raise ValueError(f"Trend: max_points must be an int of at least 2, got {max_points!r}")
        self.max_points = max_points
        self.buckets = StepBuckets(max_points, self._FIELDS)

    def __len__(self):
        return len(self.buckets)

    @property
    def stride(self):
        """Steps a bucket holds once full."""
        return self.buckets.stride

    def add(self, step, stats):
        """Record one step's ``TensorStats`` (or anything with ``mean, std, min, max, nan_count, inf_count``)."""
        self.extend([step], np.array([[stats.min, stats.max, stats.mean, stats.std, stats.nan_count,
                                        stats.inf_count]], np.float64))

    def extend(self, steps, vectors):
        """Record steps ``steps`` (increasing) from the rows of ``vectors``, each a ``stats_vector``
        ``[min, max, mean, std, nan_count, inf_count]``. With compiled kernels in one pass (``_fold_trend_rows``):
        a live view's refresh folds every step since the last (~1,500 at 6,000 steps/s and 4 Hz) in ~10 µs, where
        the NumPy fold below took ~130 µs and handed the interpreter lock back and forth a dozen times."""
        v = np.asarray(vectors, np.float64).reshape(-1, 6)
        if jit.enabled():
            b, f = self.buckets, self.buckets.fields
            state = np.array([b.count, b.stride, b._changed], np.int64)
            _fold_trend_rows.ready()(np.asarray(steps, np.int64), np.ascontiguousarray(v), b.first, b.last, b.n,
                                     f["finite"], f["sum"], f["sum2"], f["lo"], f["hi"], f["bad"], state)
            b.count, b.stride, b._changed = (int(x) for x in state)
            return
        lo, hi, mean, std = v[:, 0], v[:, 1], v[:, 2], v[:, 3]
        finite = ~np.isnan(mean)
        self.buckets.extend(steps, {
            "finite": finite.astype(np.float64), "sum": np.where(finite, mean, 0.0),
            "sum2": np.where(finite, mean * mean + std * std, 0.0), "lo": np.where(finite, lo, np.inf),
            "hi": np.where(finite, hi, -np.inf), "bad": v[:, 4] + v[:, 5]})

    def columns(self, start=0):
        """The columns of buckets ``start…`` as float64 arrays."""
        b = self.buckets
        rows = slice(start, b.count)
        f = b.fields
        finite = f["finite"][rows]
        some = finite > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = f["sum"][rows] / finite
            std = np.sqrt(np.maximum(f["sum2"][rows] / finite - mean * mean, 0.0))
        nan = np.where(some, 0.0, np.nan)     # NaN where a bucket saw no finite element
        return {"step": b.first[rows].astype(np.float64), "end": b.last[rows].astype(np.float64) + 1.0,
                "mean": mean + nan, "lower": mean - std + nan, "upper": mean + std + nan,
                "min": f["lo"][rows] + nan, "max": f["hi"][rows] + nan, "nonfinite": f["bad"][rows].copy()}

    def take(self):
        """``(at, columns)``: rows from ``at`` on changed or were added since the last call (a view keeps its first
        ``at`` rows and replaces the rest); None when nothing changed."""
        at = self.buckets.take()
        return None if at is None else (at, self.columns(at))


@jit.kernel
def _fold_trend_rows(steps, v, first, last, n, finite, total, total2, lo, hi, bad, state):
    """``Trend.extend`` in one pass: ``StepBuckets``' rules for ``Trend``'s fields, row by row (fill the newest
    bucket; when the buckets are all full, merge neighbours pairwise and double the stride; else open a bucket).
    ``state``: ``[count, stride, changed]`` in and out; the arrays hold ``max_buckets + 1`` slots."""
    count, stride, changed = state[0], state[1], state[2]
    limit = first.shape[0] - 1
    r = 0
    while r < steps.shape[0]:
        b = count - 1
        if b < 0 or n[b] >= stride:
            if count == limit:                  # merge pairs; an odd last bucket stays alone, still filling
                k, odd = count // 2, count % 2
                for i in range(k):
                    a, c = 2 * i, 2 * i + 1
                    first[i], last[i], n[i] = first[a], last[c], n[a] + n[c]
                    finite[i], total[i], total2[i] = finite[a] + finite[c], total[a] + total[c], total2[a] + total2[c]
                    lo[i], hi[i], bad[i] = min(lo[a], lo[c]), max(hi[a], hi[c]), bad[a] + bad[c]
                if odd:                         # the last bucket moves down whole
                    a = count - 1
                    first[k], last[k], n[k], bad[k] = first[a], last[a], n[a], bad[a]
                    finite[k], total[k], total2[k], lo[k], hi[k] = finite[a], total[a], total2[a], lo[a], hi[a]
                count = k + odd
                for i in range(count, limit + 1):   # the freed slots are empty again
                    finite[i], total[i], total2[i], lo[i], hi[i], bad[i] = 0.0, 0.0, 0.0, np.inf, -np.inf, 0.0
                stride *= 2
                changed = 0
                continue
            b = count                           # a new bucket (its slot is empty)
            first[b], n[b] = steps[r], 0
            count += 1
        last[b] = steps[r]
        n[b] += 1
        mean = v[r, 2]
        if mean == mean:                        # a step with a finite element
            finite[b] += 1.0
            total[b] += mean
            total2[b] += mean * mean + v[r, 3] * v[r, 3]
            lo[b] = min(lo[b], v[r, 0])
            hi[b] = max(hi[b], v[r, 1])
        bad[b] += v[r, 4] + v[r, 5]
        changed = min(changed, b)
        r += 1
    state[0], state[1], state[2] = count, stride, changed


# ---------------------------------------------------------------------------------------- histogram shapes and boxes
# Used by the dashboard's histogram, distribution and anomaly views; plain NumPy like the rest of this module.

# TensorBoard's distribution points, in basis points (1/100 of a percent): min, a normal distribution's CDF at -1.5σ,
# -1σ, -0.5σ, the median, +0.5σ, +1σ, +1.5σ, max — nested bands 3σ, 2σ and 1σ wide around the median, and the range.
NORMAL_HISTOGRAM_BPS = (0, 668, 1587, 3085, 5000, 6915, 8413, 9332, 10000)


def compress_histogram(buckets, bps=NORMAL_HISTOGRAM_BPS):
    """The values at basis points ``bps`` of a ``[k, 3]`` (left, right, count) histogram, as a float64 array.

    Interpolates linearly within the bucket where the cumulative count crosses each basis point, with TensorBoard's
    exact rules (``plugins/distribution/compressor.py``): empty buckets are skipped, the first non-empty bucket starts
    at the histogram's left edge, and a basis point past the last bucket (always 10000, and everything for a
    histogram with no counts) is the right edge. An empty array gives zeros, as TensorBoard does. As in TensorBoard,
    the last basis point stands for 100%: end ``bps`` with 10000.
    """
    b = np.asarray(buckets, np.float64).reshape(-1, 3)
    bps = np.asarray(bps, np.float64)
    if not b.size:
        return np.zeros(len(bps))
    lowest, highest = b[0, 0], b[-1, 1]
    counts, right = b[:, 2], b[:, 1]
    weights = (counts * bps[-1] / (counts.sum() or 1.0)).cumsum()
    before = np.concatenate([[0.0], weights[:-1]])
    n = len(weights)
    # The bucket each basis point falls in, moved on past empty buckets (nothing to interpolate in); n: past the end.
    following = np.minimum.accumulate(np.where(weights != before, np.arange(n), n)[::-1])[::-1]
    i = np.append(following, n)[np.searchsorted(weights, bps, side="right")]
    out = np.full(len(bps), highest)
    inside = i < n                                      # the others (always 10000) are the right edge
    i, bp, prev = i[inside], bps[inside], before[i[inside]]
    left = np.where((i == 0) | (prev == 0), lowest, np.maximum(right[i - 1], lowest))
    # Same operation order as TensorBoard's _lerp, so the floats agree bit for bit.
    out[inside] = left + (bp - prev) * (np.minimum(right[i], highest) - left) / (weights[i] - prev)
    return out


def merge_histograms(histograms):
    """One ``[k, 3]`` (left, right, count) histogram of the values of several: buckets on the union of their edges,
    each bucket's count spread evenly over the parts of it the new buckets cover (the within-bucket assumption that
    ``compress_histogram`` makes too), so the merged percentiles are those of the pooled values. A zero-width bucket
    (a constant tensor's) stays a point. Histograms with identical edges merge exactly (counts add)."""
    hs = [np.asarray(h, np.float64).reshape(-1, 3) for h in histograms]
    hs = [h[h[:, 2] > 0] for h in hs]
    if not any(len(h) for h in hs):
        return np.zeros((0, 3))
    wide = [h[h[:, 1] > h[:, 0]] for h in hs]
    points = np.concatenate([h[h[:, 1] <= h[:, 0]] for h in hs])
    edges = np.unique(np.concatenate([h[:, :2].ravel() for h in hs]))
    cumulative = np.zeros(len(edges))
    for h in wide:
        if len(h):      # each bucket's share of its count left of every edge (buckets do not overlap)
            share = np.clip((edges[:, None] - h[:, 0]) / (h[:, 1] - h[:, 0]), 0.0, 1.0)
            cumulative += share @ h[:, 2]
    merged = np.column_stack([edges[:-1], edges[1:], np.diff(cumulative)])
    if len(points):
        merged = np.concatenate([merged, points])
        merged = merged[np.lexsort((merged[:, 1], merged[:, 0]))]     # a point at x sits between ...x] and [x...
    return merged[merged[:, 2] > 0] if len(merged) else merged


# Equal-width buckets a non-uniform histogram is redrawn in: TensorBoard's histogram dashboard draws 30.
EQUAL_BUCKETS = 30
# Widths this close (relative to the widest) count as equal: float32 edges (TensorBoard's tensor form) and linspace
# rounding differ by far less, exponential buckets (a 10 % ratio at least) by far more.
_SAME_WIDTH = 1e-3


def equal_width_buckets(buckets, count=EQUAL_BUCKETS):
    """A ``[k, 3]`` (left, right, count) histogram as the one every histogram plot draws: equal-width buckets.

    Buckets of unequal widths (tensorboardX's and TensorFlow's default ones grow exponentially away from 0, from
    1e-12 wide to a third of the range) are rebinned into ``count`` equal buckets over the same range, each old
    bucket's count spread evenly over its width (the within-bucket assumption ``compress_histogram`` makes too), so
    the counts are conserved and the shape is the density's: drawn raw, a normal sample showed a false dip at 0,
    where hundreds of tiny buckets each held almost nothing. A zero-width bucket (a point mass) adds its count to the
    bucket holding its value. Buckets of equal widths (what flowlab and TensorBoard write, a constant tensor's
    zero-width ones, a histogram of one bucket) and histograms with a non-finite edge come back unchanged (as
    float64 rows). Overlapping input buckets are spread the same way (each one's share of every new bucket)."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"equal_width_buckets: count must be an int >= 1, got {count!r}")
    b = np.asarray(buckets, np.float64).reshape(-1, 3)
    if len(b) < 2:
        return b
    widths = b[:, 1] - b[:, 0]
    widest = widths.max()
    lo, hi = b[:, 0].min(), b[:, 1].max()       # (NaN or ±Inf anywhere among the edges reaches one of these)
    if not (math.isfinite(lo) and math.isfinite(hi)) or widest - widths.min() <= _SAME_WIDTH * widest:
        return b
    edges = np.linspace(lo, hi, count + 1)
    edges[-1] = hi                                          # (exact: the last point mass at hi falls inside)
    wide = b[widths > 0]
    if (wide[1:, 0] < wide[:-1, 0]).any():                  # (logged buckets come in order)
        wide = wide[np.argsort(wide[:, 0], kind="stable")]
    if len(wide) and (wide[1:, 0] < wide[:-1, 1]).any():  # overlapping: each bucket's share left of every edge
        share = np.clip((edges[:, None] - wide[:, 0]) / (wide[:, 1] - wide[:, 0]), 0.0, 1.0)
        below = share @ wide[:, 2]
    elif len(wide):                                         # the cumulative count is linear within each bucket
        after = np.cumsum(wide[:, 2])
        below = np.interp(edges, wide[:, :2].ravel(), np.column_stack([after - wide[:, 2], after]).ravel())
    else:
        below = np.zeros(count + 1)
    counts = np.diff(np.maximum.accumulate(below))
    points = b[widths <= 0]
    if len(points):
        np.add.at(counts, np.clip(np.searchsorted(edges, points[:, 0], side="right") - 1, 0, count - 1),
                  points[:, 2])
    return np.column_stack([edges[:-1], edges[1:], counts])


def histogram_outline(buckets):
    """``(x, y)`` of the step curve outlining a ``[k, 3]`` histogram: up at the first left edge, along the top of each
    bucket, down at the last right edge, so a drawing of it is exact to the buckets. Empty input: empty arrays."""
    b = np.asarray(buckets, np.float64).reshape(-1, 3)
    if not len(b):
        return np.zeros(0), np.zeros(0)
    x = np.concatenate([b[:1, 0], b[:, :2].ravel(), b[-1:, 1]])
    y = np.concatenate([[0.0], np.repeat(b[:, 2], 2), [0.0]])
    return x, y


BOX_KEYS = ("q1", "median", "q3", "lower", "upper")


def box_stats(values, max_outliers=100):
    """Tukey's box of the finite ``values``: ``({q1, median, q3, lower, upper}, outliers)``.

    Quartiles as ``np.percentile`` (linear) gives them; the whiskers ``lower``/``upper`` end at the most extreme values
    within 1.5 × IQR of the box; ``outliers`` are the values beyond them, sorted — at most ``max_outliers``, picked
    evenly so both extremes stay. No finite value: NaN statistics (a plot leaves a gap) and no outliers.
    """
    x = np.asarray(values, np.float64).ravel()
    x = np.sort(x[np.isfinite(x)])
    if not x.size:
        return dict.fromkeys(BOX_KEYS, math.nan), np.zeros(0)
    q1, median, q3 = np.percentile(x, [25, 50, 75])
    reach = 1.5 * (q3 - q1)
    inside = x[(x >= q1 - reach) & (x <= q3 + reach)]
    lower, upper = (inside[0], inside[-1]) if inside.size else (q1, q3)
    outliers = x[(x < lower) | (x > upper)]
    if len(outliers) > max_outliers:
        outliers = outliers[np.linspace(0, len(outliers) - 1, max_outliers).round().astype(int)]
    stats = dict(zip(BOX_KEYS, (q1, median, q3, lower, upper)))
    return {k: float(v) for k, v in stats.items()}, outliers


def group_band(members, budget=None):
    """Mean, standard deviation, min and max of a group of runs, step by step: ``members`` is a list of ``(steps,
    values)`` (one per run; a step a run logged twice counts with its last value); the result is ``(steps, mean,
    std, low, high, count)`` over the union of their steps, each step over the runs that logged a finite value there
    (a step no run has a finite value for is NaN, count 0).

    With a ``budget`` smaller than the longest run, steps are taken in ``budget`` equal spans instead (see
    ``_bucketed_band``): a band on screen has no more points than that, and a million-point group costs little.

    Linear in the points when the runs share their steps (the usual case: one matrix pass), else a merge by
    ``searchsorted``; each run's steps are distinct, so plain indexed updates do what ``ufunc.at`` did 15x slower
    (20 runs x 1M points: 5 s before, which a dashboard session spent on its IOLoop).
    """
    members = [_last_per_step(s, v) for s, v in members]
    if not members:
        empty = np.zeros(0)
        return np.zeros(0, np.int64), empty, empty.copy(), empty.copy(), empty.copy(), np.zeros(0, np.int64)
    if budget is not None and max(len(s) for s, _ in members) > budget:
        return _bucketed_band(members, budget)
    first = members[0][0]
    if all(np.array_equal(s, first) for s, _ in members[1:]):
        steps, places = first, [slice(None)] * len(members)
    else:
        steps = np.unique(np.concatenate([s for s, _ in members]))
        places = [np.searchsorted(steps, s) for s, _ in members]
    total, squares, count = np.zeros(len(steps)), np.zeros(len(steps)), np.zeros(len(steps))
    low, high = np.full(len(steps), np.inf), np.full(len(steps), -np.inf)
    finite = []
    for (_, v), at in zip(members, places):
        ok = np.isfinite(v)
        finite.append(ok)
        total[at] += np.where(ok, v, 0.0)
        count[at] += ok
        low[at] = np.minimum(low[at], np.where(ok, v, np.inf))
        high[at] = np.maximum(high[at], np.where(ok, v, -np.inf))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
        for (_, v), at, ok in zip(members, places, finite):    # deviations from the mean: no cancellation
            squares[at] += np.where(ok, v - mean[at], 0.0) ** 2
        std = np.sqrt(squares / count)
    none = count == 0
    low[none] = high[none] = np.nan
    return steps, mean, std, low, high, count.astype(np.int64)


def _bucketed_band(members, budget):
    """``group_band`` over ``budget`` equal spans of steps: each run's mean, min and max in each span (its steps are
    in order, so a span is a slice: ``reduceat``), then across the runs the mean and std of their span means and
    the extremes of their extremes, so the min–max band still holds every spike. A span's step is its first."""
    first = min(int(s[0]) for s, _ in members if len(s))
    last = max(int(s[-1]) for s, _ in members if len(s))
    width = max(1, -(-(last - first + 1) // budget))                  # steps per span, rounded up
    spans = (last - first) // width + 1
    means = np.full((len(members), spans), np.nan)
    low, high = np.full(spans, np.inf), np.full(spans, -np.inf)
    logged = np.zeros(spans, bool)                  # spans some run logged a step in, finite or not
    for i, (s, v) in enumerate(members):
        if not len(s):
            continue
        ok = np.isfinite(v)
        span = (s - first) // width
        starts = np.flatnonzero(np.diff(span, prepend=-1))
        at = span[starts]
        logged[at] = True
        n = np.add.reduceat(ok.astype(np.float64), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            means[i, at] = np.add.reduceat(np.where(ok, v, 0.0), starts) / n      # NaN where nothing finite
        low[at] = np.minimum(low[at], np.minimum.reduceat(np.where(ok, v, np.inf), starts))
        high[at] = np.maximum(high[at], np.maximum.reduceat(np.where(ok, v, -np.inf), starts))
    count = np.isfinite(means).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(means, axis=0) / count
        std = np.sqrt(np.nansum((means - mean) ** 2, axis=0) / count)
    none = count == 0
    mean[none] = std[none] = low[none] = high[none] = np.nan
    keep = np.flatnonzero(logged)
    steps = first + np.arange(spans, dtype=np.int64) * width
    return steps[keep], mean[keep], std[keep], low[keep], high[keep], count[keep].astype(np.int64)


def _last_per_step(steps, values):
    """``(steps, values)`` as int64 and float64 with each step once (its last value), in step order."""
    steps, values = np.asarray(steps, np.int64), np.asarray(values, np.float64)
    if steps.size < 2 or bool((steps[1:] > steps[:-1]).all()):
        return steps, values
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    last = np.append(steps[1:] != steps[:-1], True)
    return steps[last], values[last]
