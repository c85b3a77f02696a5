"""Keeping a long run's data within bounds without losing what matters: the one downsampler, step buckets and
sampler of flowlab's reading side (the dashboard's store, its views and the notebook widgets all use these).

- ``downsample``: about ``budget`` points of a scalar series that draw like all of them (every spike and NaN kept);
  ``downsample_many``: the same of many series at once.
- ``StepBuckets``: per-step rows over a whole run in a bounded number of buckets of consecutive steps, folding each
  field by a rule (sum, min, max, any, argmax), so no extreme is lost; ``HealthGrid`` keeps health reports in them.
- ``EvenSample``: a bounded, even sample of a series' items (histograms, images, text...) plus the newest of each
  poll, as TensorBoard's reservoir keeps ``--samples_per_plugin`` of them.

Plain NumPy, no Bokeh and no threads.
"""
from __future__ import annotations

import numpy as np

from ..health import COUNT_STATISTICS

NONFINITE = frozenset(COUNT_STATISTICS)     # health statistics that count NaN/Inf values


# ------------------------------------------------------------------------------------------------------ downsampling

def downsample(x, values, budget):
    """Indices (sorted, unique) of about ``budget`` points of a series that draw like all of them: the one
    downsampler of the dashboard and the store.

    The x range is cut into ``budget // 4`` equal-width buckets (pixel columns, not equal counts, so a dense stretch
    cannot crowd out a sparse one); each keeps its first and last point, its smallest and largest finite value and
    its first NaN, +Inf and -Inf, so no spike and no non-finite value is ever dropped (a bucket full of extremes
    keeps up to 7 points). ``x`` need not be sorted. ``len(values) <= budget``: every index. (``downsample_many``
    for one series.)
    """
    v = np.asarray(values, np.float64)
    if len(v) <= budget:
        return np.arange(len(v))
    return downsample_many([x], [v], budget)[0]


def downsample_many(xs, values, budgets):
    """``downsample(xs[i], values[i], budgets[i])`` of every series at once (``budgets``: one int for all, or one
    per series): a list of index arrays. The series are bucketed together, so a thousand short series cost a few
    NumPy passes over their points, not a thousand calls (what a card of many runs chooses its points with)."""
    k = len(values)
    lengths = np.fromiter((len(v) for v in values), np.int64, k)
    budgets = np.broadcast_to(np.asarray(budgets, np.int64), (k,))
    small = budgets < 4
    if np.any(small & (lengths > budgets)):
        raise ValueError(f"downsample: budget must be at least 4, got {int(budgets[small][0])!r}")
    total = int(lengths.sum())
    if not total:
        return [np.zeros(0, np.int64) for _ in range(k)]
    v = np.concatenate([np.asarray(a, np.float64) for a in values])
    x = np.concatenate([np.asarray(a, np.float64) for a in xs])
    starts_of = np.cumsum(lengths) - lengths
    series = np.repeat(np.arange(k), lengths)
    at = np.arange(total) - starts_of[series]                # each point's index in its series
    order = None
    back = np.flatnonzero(x[1:] < x[:-1]) + 1                # a step back in x, within a series (not at its start)
    if np.any(at[back] > 0):
        order = np.lexsort((x, series))                      # (stable: as ``argsort(kind="stable")`` per series)
        x, v = x[order], v[order]
    # a series within its budget: every point its own bucket (all kept); else ``budget // 4`` buckets over its range
    thin = lengths > budgets
    buckets = np.where(thin, budgets // 4, lengths)
    ends_of = starts_of + lengths - 1
    some = lengths > 0
    lo, hi = np.zeros(k), np.zeros(k)
    lo[some], hi[some] = x[starts_of[some]], x[ends_of[some]]
    bucket = at.copy()
    spread = thin & (hi > lo)
    flat = thin & ~spread
    if np.any(spread):
        on = spread[series]
        s = series[on]
        scale = buckets / np.where(spread, hi - lo, 1.0)
        b = ((x[on] - lo[s]) * scale[s]).astype(np.int64)
        np.minimum(b, buckets[s] - 1, out=b)
        bucket[on] = b
    if np.any(flat):
        bucket[flat[series]] = 0
    group_base = np.cumsum(buckets) - buckets                # buckets of earlier series
    bucket += group_base[series]
    keep = _bucket_picks(v, bucket)
    if order is not None:
        keep = order[keep]
        cut = np.searchsorted(series[keep], np.arange(k + 1))   # (``order`` keeps each series' points together)
        return [np.sort(keep[cut[i]:cut[i + 1]]) - starts_of[i] for i in range(k)]
    cut = np.searchsorted(keep, np.append(starts_of, total))
    return [keep[cut[i]:cut[i + 1]] - starts_of[i] for i in range(k)]


def _bucket_picks(v, bucket):
    """Indices (sorted, unique) of the points of ``v`` each bucket keeps: its first and last, its smallest and largest
    finite value and its first NaN, +Inf and -Inf. ``bucket``: each point's bucket, non-decreasing."""
    n = len(v)
    starts = np.flatnonzero(np.concatenate([[True], bucket[1:] != bucket[:-1]]))
    ends = np.concatenate([starts[1:], [n]]) - 1
    sizes = ends - starts + 1
    group = np.repeat(np.arange(len(starts)), sizes)
    finite = np.isfinite(v)
    low = np.where(finite, v, np.inf)
    high = np.where(finite, v, -np.inf)
    picks = [starts, ends]
    for extreme, reduce in ((low, np.minimum), (high, np.maximum)):
        hits = np.flatnonzero(finite & (extreme == reduce.reduceat(extreme, starts)[group]))
        picks.append(_first_per_group(hits, group))
    for special in (np.isnan(v), v == np.inf, v == -np.inf):
        picks.append(_first_per_group(np.flatnonzero(special), group))
    return np.unique(np.concatenate(picks))


def _first_per_group(hits, group):
    """The first of ``hits`` (sorted indices) in each group they touch."""
    if not len(hits):
        return hits
    g = group[hits]
    return hits[np.concatenate([[True], g[1:] != g[:-1]])]


# ------------------------------------------------------------------------------------------------------ step buckets

class StepBuckets:
    """Per-step rows over a whole run in at most ``max_buckets`` buckets of consecutive steps, losing no extreme: the
    one thinning of per-step summaries (a live widget's trend, a Distributions card).

    Each field of a row folds into its bucket by a rule: ``"sum"``, ``"min"``, ``"max"`` or ``"any"`` (a field may be
    a vector: shape ``(k, width)``), or ``("argmax", key)``: the field's value in the row whose ``key`` field is
    largest (the earliest such row: a bucket's representative, e.g. the index of its widest histogram). A bucket holds ``stride`` steps once full; when a new bucket would pass
    ``max_buckets``, neighbours merge pairwise by the same rules and each bucket holds twice as many steps from then on
    (a run of a million steps costs what a short one does, and its start stays visible). ``first``/``last`` are a
    bucket's first and newest step, ``n`` its steps. ``extend`` takes many rows at once, in NumPy (a bucket's rows
    are reduced with ``reduceat``); ``take()`` gives the first bucket changed since the last call (a doubling
    changes them all) or None.
    """

    _REDUCE = {"sum": np.add, "min": np.minimum, "max": np.maximum, "any": np.logical_or}
    _EMPTY = {"sum": 0, "min": np.inf, "max": -np.inf, "any": False}

    def __init__(self, max_buckets, fields):
        if not isinstance(max_buckets, int) or isinstance(max_buckets, bool) or max_buckets < 2:
            raise ValueError(f"StepBuckets: max_buckets must be an int of at least 2, got {max_buckets!r}")
        self.max_buckets = max_buckets
        self.rules, self.argmax = {}, {}
        for name, rule in fields.items():
            if isinstance(rule, tuple) and rule[0] == "argmax":
                if fields.get(rule[1]) != "max":
                    raise ValueError(f"StepBuckets: field {name!r} follows the largest {rule[1]!r}, which must be a "
                                     f"field with rule 'max'")
                self.argmax[name] = rule[1]
                continue
            rule, width = (rule, None) if isinstance(rule, str) else rule
            if rule not in self._REDUCE:
                raise ValueError(f"StepBuckets: field {name!r} has rule {rule!r}; expected one of {sorted(self._REDUCE)}")
            self.rules[name] = (rule, width)
        cap = max_buckets + 1
        self.first, self.last = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
        self.n = np.zeros(cap, np.int64)
        self.fields = {name: np.full((cap,) if width is None else (cap, width), self._EMPTY[rule],
                                     bool if rule == "any" else np.float64)
                       for name, (rule, width) in self.rules.items()}
        self.fields.update({name: np.full(cap, -1, np.int64) for name in self.argmax})
        self.count, self.stride = 0, 1
        self._changed = 0

    def __len__(self):
        return self.count

    def extend(self, steps, values):
        """Fold rows ``steps`` (increasing) with ``values`` ``{field: array of len(steps) rows}`` into the buckets."""
        steps = np.asarray(steps, np.int64)
        values = {name: np.asarray(values[name]) for name in (*self.rules, *self.argmax)}
        at = 0
        while at < len(steps):
            b = self.count - 1
            if b >= 0 and self.n[b] < self.stride:          # the newest bucket has room: fill it first
                take = min(self.stride - int(self.n[b]), len(steps) - at)
                self._fold(b, slice(at, at + take), steps, values)
                at += take
                continue
            if self.count == self.max_buckets:
                self._merge_pairs()
                continue
            # new buckets of ``stride`` rows each, as many as fit
            room = self.max_buckets - self.count
            take = min(len(steps) - at, room * self.stride)
            starts = np.arange(at, at + take, self.stride)
            new = slice(self.count, self.count + len(starts))
            self.first[new], self.last[new] = steps[starts], steps[np.minimum(starts + self.stride, at + take) - 1]
            self.n[new] = np.diff(np.append(starts, at + take))
            for name, key in self.argmax.items():            # the earliest row holding its bucket's largest key
                rows = values[key][at:at + take]
                largest = np.maximum.reduceat(rows, starts - at)
                is_max = rows == np.repeat(largest, self.n[new])
                index = np.where(is_max, np.arange(take), take)
                self.fields[name][new] = values[name][at:at + take][np.minimum.reduceat(index, starts - at)]
            for name, (rule, _) in self.rules.items():
                self.fields[name][new] = self._REDUCE[rule].reduceat(values[name][at:at + take], starts - at, axis=0)
            self._changed = min(self._changed, self.count)
            self.count += len(starts)
            at += take

    def _fold(self, b, rows, steps, values):
        self.last[b] = steps[rows.stop - 1]
        self.n[b] += rows.stop - rows.start
        for name, key in self.argmax.items():                # before the key itself moves on
            new = values[key][rows]
            i = int(np.argmax(new))
            if new[i] > self.fields[key][b]:
                self.fields[name][b] = values[name][rows][i]
        for name, (rule, _) in self.rules.items():
            reduce = self._REDUCE[rule]
            self.fields[name][b] = reduce(self.fields[name][b], reduce.reduce(values[name][rows], axis=0))
        self._changed = min(self._changed, b)

    def _merge_pairs(self):
        """Halve the buckets: each even bucket absorbs the next one (an odd last one stays alone, still filling)."""
        k, odd = self.count // 2, self.count % 2
        a, b = slice(0, 2 * k, 2), slice(1, 2 * k, 2)
        last = self.count - 1
        tail = (self.first[last], self.last[last], self.n[last], {f: v[last].copy() for f, v in self.fields.items()})
        self.first[:k], self.last[:k], self.n[:k] = self.first[a], self.last[b], self.n[a] + self.n[b]
        for name, key in self.argmax.items():                # before the keys merge
            v, keys = self.fields[name], self.fields[key]
            v[:k] = np.where(keys[b] > keys[a], v[b], v[a])
        for name, (rule, _) in self.rules.items():
            v = self.fields[name]
            v[:k] = self._REDUCE[rule](v[a], v[b])
        if odd:
            self.first[k], self.last[k], self.n[k] = tail[:3]
            for name, v in self.fields.items():
                v[k] = tail[3][name]
        self.count = k + odd
        for name, (rule, _) in self.rules.items():      # the freed slots are empty again
            self.fields[name][self.count:] = self._EMPTY[rule]
        for name in self.argmax:
            self.fields[name][self.count:] = -1
        self.stride *= 2
        self._changed = 0

    def take(self):
        """The first bucket changed or added since the last call, or None when nothing changed."""
        at = self._changed
        if at >= self.count:
            return None
        self._changed = self.count
        return at


def _cell_values(pick):
    """``{"lo", "hi", "mean"}`` of health buckets from ``pick(field)`` (their ``lo``, ``hi``, ``sum`` and ``finite``
    fields, in any one layout), NaN where a cell saw no finite value."""
    finite = pick("finite")
    with np.errstate(invalid="ignore", divide="ignore"):
        none = np.where(finite > 0, 0.0, np.nan)
        return {"lo": pick("lo") + none, "hi": pick("hi") + none, "mean": pick("sum") / finite + none}


class HealthGrid:
    """A run's health reports over steps in at most ``max_buckets`` step buckets, losing no extreme.

    ``extend(steps, matrices)`` takes reports in step order (``matrices``: ``(n, layers, statistics)``; a step at or
    before the last one taken is ignored, as a restarted run re-logs steps); ``take()`` is True when something
    changed since the last call; ``cells`` and ``trend_columns`` read it."""

    def __init__(self, layers, statistics, max_buckets=400):
        self.layers, self.statistics = tuple(layers), tuple(statistics)
        width = len(self.layers) * len(self.statistics)
        self.buckets = StepBuckets(max_buckets, {"lo": ("min", width), "hi": ("max", width), "sum": ("sum", width),
                                                 "finite": ("sum", width), "bad": ("sum", len(self.layers))})
        self._counts = [j for j, s in enumerate(self.statistics) if s in NONFINITE]
        self.last_step = None

    def __len__(self):
        return len(self.buckets)

    def extend(self, steps, matrices):
        steps = np.asarray(steps, np.int64).reshape(-1)
        m = np.asarray(matrices, np.float64).reshape(len(steps), len(self.layers), len(self.statistics))
        if self.last_step is not None:
            keep = steps > self.last_step
            steps, m = steps[keep], m[keep]
        if not len(steps):
            return
        finite = np.isfinite(m)
        bad = np.nansum(m[:, :, self._counts], axis=2) if self._counts else np.zeros(m.shape[:2])
        flat = lambda a: a.reshape(len(steps), -1)      # noqa: E731
        self.buckets.extend(steps, {"lo": flat(np.where(finite, m, np.inf)), "hi": flat(np.where(finite, m, -np.inf)),
                                    "sum": flat(np.where(finite, m, 0.0)), "finite": flat(finite.astype(np.float64)),
                                    "bad": bad})
        self.last_step = int(steps[-1])

    def take(self):
        return self.buckets.take() is not None

    def cells(self, statistic):
        """``{"lo", "hi", "mean", "nonfinite"}`` as ``(layers, buckets)`` arrays for one statistic (NaN where a cell
        saw no finite value; ``nonfinite``: NaN/Inf its layer's tensors held), and the buckets' ``first`` and
        ``last`` steps."""
        j = self.statistics.index(statistic)
        b, n = self.buckets, len(self.statistics)
        rows = slice(0, b.count)
        pick = lambda name: b.fields[name][rows][:, j::n].T       # noqa: E731 - (layers, buckets)
        return dict(_cell_values(pick), nonfinite=b.fields["bad"][rows].T.copy(), first=b.first[rows].copy(),
                    last=b.last[rows].copy())

    def cells_from(self, start=0):
        """Buckets ``start…`` of every statistic at once: ``{"lo", "hi", "mean"}`` as ``(buckets, layers,
        statistics)`` arrays (what ``cells`` gives one statistic of, NaN where a cell saw no finite value),
        ``nonfinite`` ``(buckets, layers)``, and the buckets' ``first`` and ``last`` steps."""
        b = self.buckets
        rows = slice(start, b.count)
        shape = (-1, len(self.layers), len(self.statistics))
        pick = lambda name: b.fields[name][rows].reshape(shape)   # noqa: E731
        return dict(_cell_values(pick), nonfinite=b.fields["bad"][rows].copy(), first=b.first[rows].copy(),
                    last=b.last[rows].copy())

    def trend_columns(self, layer, statistic):
        """One layer's statistic over steps as ``Trend.COLUMNS`` (plus ``mark``) for ``figures.trend_figure``."""
        i = self.layers.index(layer)
        c = self.cells(statistic)
        mean = c["mean"][i]
        return {"step": c["first"].astype(np.float64), "end": c["last"].astype(np.float64) + 1.0, "mean": mean,
                "lower": mean, "upper": mean, "min": c["lo"][i], "max": c["hi"][i], "nonfinite": c["nonfinite"][i],
                "mark": np.where(c["nonfinite"][i] > 0, 1.0, np.nan)}


# ------------------------------------------------------------------------------------------------------ sampling

class EvenSample:
    """A bounded sample of a stream of items: every ``stride``-th item offered, the stride doubling when more than
    ``limit`` are kept (an even spread over the whole stream), plus the newest item of every poll (``end_poll``), so
    the latest value is always there; those extras have a budget of ``limit`` more before they are dropped.

    ``items`` are ``(offered index, step, wall_time, value)`` tuples in the order offered; ``add`` and ``end_poll``
    say whether the kept items changed in a way that is not an append (a thinning), which readers take as a reset."""

    __slots__ = ("limit", "items", "offered", "_stride", "_pending", "_extras")

    def __init__(self, limit):
        self.limit = limit
        self.items: list[tuple] = []
        self.offered = 0                    # items offered so far, kept or not
        self._stride = 1
        self._pending = None                # the newest item of this poll when it fell between strides
        self._extras = 0                    # items kept off the stride (earlier polls' newest)

    def __len__(self):
        return len(self.items)

    def add(self, step, wall_time, value) -> bool:
        """Offer one item; True when the sample was thinned (not just appended to)."""
        index = self.offered
        self.offered += 1
        item = (index, int(step), float(wall_time), value)
        if index % self._stride:
            self._pending = item
            return False
        self._pending = None
        self.items.append(item)
        return self._thin()

    def end_poll(self) -> tuple[bool, bool]:
        """Keep this poll's newest item even when it fell between strides. ``(kept, thinned)``."""
        if self._pending is None:
            return False, False
        self.items.append(self._pending)
        self._pending = None
        self._extras += 1
        return True, self._thin()

    def _thin(self) -> bool:
        """Past ``limit`` items on the stride, double it; past ``2 * limit`` in all, drop the earlier polls' newest
        items kept off the stride (the last item always stays). Either is a reset for readers, so extras get a
        budget of their own rather than forcing one every few polls."""
        on_stride = len(self.items) - self._extras      # counted, not scanned: this runs for every item added
        if on_stride <= self.limit and len(self.items) <= 2 * self.limit:
            return False
        while on_stride > self.limit:
            self._stride *= 2
            on_stride = sum(1 for item in self.items if item[0] % self._stride == 0)
        newest = self.items[-1]
        self.items = [item for item in self.items if item[0] % self._stride == 0 or item is newest]
        self._extras = len(self.items) - on_stride
        return True

    def drop_steps(self, first, last=None) -> bool:
        """Drop items with ``first <= step <= last`` (``last`` None: no upper bound); True when any went."""
        kept = [item for item in self.items if item[1] < first or last is not None and item[1] > last]
        if len(kept) == len(self.items):
            return False
        self._pending = None
        self.items = kept
        self._extras = sum(1 for item in kept if item[0] % self._stride)
        return True
