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
