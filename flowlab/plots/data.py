"""Data shaping for the plots: plain NumPy in, plain columns out, no Bokeh and no threads, so it is easy to test and
cheap enough to run on the watch dispatcher thread."""
from __future__ import annotations

import math

import numpy as np

from ..watching import TensorStats

SUMMARY_KEYS = ("shape", "min", "max", "mean", "std", "nan", "inf")


def histogram_data(values, bins=30):
    """Columns ``left``, ``right``, ``top`` for a Bokeh ``quad`` glyph: a histogram of the finite elements.

    NaN and Inf are left out (the stats table counts them). A constant tensor gets one bin of width 1 centred on its
    value (NumPy would spread 30 empty bins around it); a tensor with no finite element gets empty columns.
    """
    x = np.asarray(values)
    if x.dtype.kind not in "fiub":
        raise TypeError(f"histogram_data: expects a real-valued array, got dtype {x.dtype}")
    x = x.astype(np.float64, copy=False).ravel()
    finite = x[np.isfinite(x)]
    if finite.size == 0:
        empty = np.zeros(0, np.float64)
        return {"left": empty, "right": empty.copy(), "top": np.zeros(0, np.int64)}
    lo, hi = finite.min(), finite.max()
    if lo == hi:
        return {"left": np.array([lo - 0.5]), "right": np.array([hi + 0.5]), "top": np.array([finite.size])}
    counts, edges = np.histogram(finite, bins=bins, range=(lo, hi))
    return {"left": edges[:-1], "right": edges[1:], "top": counts.astype(np.int64)}


def tensor_summary(value):
    """``{"shape", "min", "max", "mean", "std", "nan", "inf"}`` of an array (min/max/mean/std over its finite
    elements, NaN when there are none, as ``watch(..., stats=True)`` computes them), or of a ``TensorStats``."""
    if isinstance(value, TensorStats):
        return {"shape": tuple(value.shape), "min": value.min, "max": value.max, "mean": value.mean,
                "std": value.std, "nan": value.nan_count, "inf": value.inf_count}
    x = np.asarray(value)
    if x.dtype.kind not in "fiub":
        raise TypeError(f"tensor_summary: expects a real-valued array or TensorStats, got dtype {x.dtype}")
    x64 = x.astype(np.float64, copy=False)
    finite_mask = np.isfinite(x64)
    nan = int(np.isnan(x64).sum())
    inf = int(x64.size - finite_mask.sum() - nan)
    finite = x64[finite_mask] if nan or inf else x64.ravel()
    if finite.size == 0:
        lo = hi = mean = std = math.nan
    else:
        lo, hi, mean, std = float(finite.min()), float(finite.max()), float(finite.mean()), float(finite.std())
    return {"shape": tuple(x.shape), "min": lo, "max": hi, "mean": mean, "std": std, "nan": nan, "inf": inf}


class Trend:
    """A series of ``(step, mean, std)`` points kept to at most ``max_points``.

    When it fills up, every other point is dropped and from then on only every ``stride``-th new point is kept, so
    the whole run stays visible at a coarser resolution (a rolling window would forget the start of training).
    ``take()`` tells a view what changed since the last call: new points to stream, or everything when thinned.
    """

    COLUMNS = ("step", "mean", "std", "lower", "upper")

    def __init__(self, max_points=1000):
        if max_points < 2:
            raise ValueError(f"Trend: max_points must be at least 2, got {max_points!r}")
        self.max_points = int(max_points)
        self.columns = {c: [] for c in self.COLUMNS}
        self.stride = 1
        self._seen = 0
        self._new = 0          # points appended since the last take()
        self._thinned = False  # points were dropped since the last take(): views must reload

    def __len__(self):
        return len(self.columns["step"])

    def append(self, step, mean, std):
        keep = self._seen % self.stride == 0
        self._seen += 1
        if not keep:
            return
        for name, v in zip(self.COLUMNS, (step, mean, std, mean - std, mean + std)):
            self.columns[name].append(v)
        self._new += 1
        if len(self) >= self.max_points:
            for name in self.COLUMNS:
                self.columns[name] = self.columns[name][::2]
            self.stride *= 2
            self._thinned = True

    def take(self):
        """``("replace", columns)``, ``("stream", new columns)`` or ``None`` when nothing changed; copies."""
        if self._thinned:
            change = ("replace", {c: list(v) for c, v in self.columns.items()})
        elif self._new:
            change = ("stream", {c: v[-self._new:] for c, v in self.columns.items()})
        else:
            change = None
        self._new, self._thinned = 0, False
        return change


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


class Sampler:
    """At most ``max_items`` of the items offered, evenly spread over all of them.

    Every ``stride``-th offered item is kept; when more than ``max_items`` are kept, every other one is dropped and the
    stride doubles (as ``Trend`` does), so a long run costs no more than a short one and its start stays visible.
    ``take()`` says what a view must send since the last call: ``("stream", new items)``, ``("replace", all
    items)`` after a thinning, or ``None``. ``latest`` is the last item offered, kept or not.
    """

    def __init__(self, max_items):
        if max_items < 2:
            raise ValueError(f"Sampler: max_items must be at least 2, got {max_items!r}")
        self.max_items = int(max_items)
        self.items = []
        self.stride = 1
        self.latest = None
        self._offered = 0
        self._new = 0
        self._thinned = False

    def offer(self, item):
        self.latest = item
        keep = self._offered % self.stride == 0
        self._offered += 1
        if keep:
            self.items.append(item)
            self._new += 1
            if len(self.items) > self.max_items:
                self.items = self.items[::2]
                self.stride *= 2
                self._thinned = True
        return keep

    def take(self):
        if self._thinned:
            change = ("replace", list(self.items))
        elif self._new:
            change = ("stream", self.items[-self._new:])
        else:
            change = None
        self._new, self._thinned = 0, False
        return change
