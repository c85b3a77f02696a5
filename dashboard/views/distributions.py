"""Distributions tab: per run × tag, how a histogram's spread moves over the steps.

Each step's buckets are compressed to TensorBoard's nine basis points (``compress_histogram``: min, where a normal
distribution would be at ±1.5σ, ±1σ and ±0.5σ, median, max), drawn as four nested bands (the range, then bands 3σ,
2σ and 1σ wide) and a median line: the view TensorBoard calls "distributions" (and OneFlow's Tianshu planned but
never built). A step whose histogram holds no finite value leaves a gap in the bands and a red mark over the plot.
Hovering over a card reads the step under the pointer and its nine values, max first. Runs grouped in the run list
(``dashboard.run_groups``) are drawn as one card per group and tag: the distribution of all their values.

At most ``MAX_ROWS`` rows per card. Up to that many steps, a row is a step, exact. Past it, consecutive steps are merged
into groups (``Bands``: groups double in size, a handful of times per run) whose row keeps the smallest min and the
largest max of its steps, the mean of their inner basis points, and the red mark if any of its steps had nothing finite:
merging never hides a spike or an empty step. A row stands at its group's first step, except the last, which stands at
its newest step while it fills, so the bands reach the present: new rows are streamed, a changed last row is patched,
and the source is replaced only when groups double or the store resets the series.
"""
from __future__ import annotations

import math

import numpy as np

from flowlab.plots.data import NORMAL_HISTOGRAM_BPS, compress_histogram, merge_histograms
from flowlab.plots.figures import distribution_card

from .base import CardsView

MAX_ROWS = 500
BPS = NORMAL_HISTOGRAM_BPS
COLUMNS = [f"bp{bp}" for bp in BPS]
# What a hover calls each column: the share of values below it (TensorBoard's points: ±1.5σ, ±1σ, ±0.5σ of a normal)
LABELS = ["min"] + [f"{bp / 100:.0f}%" for bp in BPS[1:4]] + ["median"] + [f"{bp / 100:.0f}%" for bp in BPS[5:8]] + \
    ["max"]


def percentile_row(buckets):
    """``{"bp0": min, ..., "bp10000": max}`` of one step; NaN everywhere when the histogram counted nothing."""
    if not buckets[:, 2].sum():
        return dict.fromkeys(COLUMNS, math.nan)
    return dict(zip(COLUMNS, compress_histogram(buckets, BPS).tolist()))


class Bands:
    """The rows of one card: groups of ``stride`` consecutive steps, at most ``max_rows`` of them.

    A group keeps its first and newest step, how many of its steps had finite values, the min of their mins, the max
    of their maxes, the sum of each inner basis point and whether a step had nothing finite, so two groups merge
    exactly. ``take()`` says what to send since the last call: ``("replace", columns)``, or ``("append", patches,
    columns)`` with ``patches`` ``{column: [(row, value)]}`` for the source's last row and ``columns`` to stream.
    """

    def __init__(self, max_rows=MAX_ROWS):
        self.max_rows = max(2, int(max_rows))
        cap = self.max_rows + 1
        self.first, self.last = np.zeros(cap), np.zeros(cap)
        self.n, self.finite = np.zeros(cap, np.int64), np.zeros(cap, np.int64)
        self.lo, self.hi = np.full(cap, np.inf), np.full(cap, -np.inf)
        self.inner = np.zeros((cap, len(BPS) - 2))
        self.empty = np.zeros(cap, bool)
        self.groups, self.stride = 0, 1
        self._sent, self._dirty, self._doubled = 0, None, False

    def offer(self, step, buckets):
        """Add a step's histogram (``[k, 3]`` buckets)."""
        b = np.asarray(buckets, np.float64).reshape(-1, 3)
        self.offer_percentiles(step, compress_histogram(b, BPS) if b[:, 2].sum() else None)

    def offer_percentiles(self, step, q):
        """Add a step's nine basis-point values ``q``, or None for a step with nothing finite."""
        g = self.groups - 1
        if g < 0 or self.n[g] >= self.stride:
            if g >= 0:                                # no longer the last row: it moves back to its first step
                self._dirty = g if self._dirty is None else min(self._dirty, g)
            g = self.groups
            self.groups += 1
            self.first[g], self.n[g], self.finite[g] = step, 0, 0
            self.lo[g], self.hi[g], self.inner[g], self.empty[g] = np.inf, -np.inf, 0.0, False
        self.last[g] = step
        self.n[g] += 1
        if q is not None:
            self.finite[g] += 1
            self.lo[g], self.hi[g] = min(self.lo[g], q[0]), max(self.hi[g], q[-1])
            self.inner[g] += q[1:-1]
        else:
            self.empty[g] = True
        self._dirty = g if self._dirty is None else min(self._dirty, g)
        if self.groups > self.max_rows:
            self._merge_pairs()

    def _merge_pairs(self):
        """Halve the rows: groups 2i and 2i+1 become one (an odd last group stays alone, still filling)."""
        k, odd = self.groups // 2, self.groups % 2
        a, b = slice(0, 2 * k, 2), slice(1, 2 * k, 2)
        end = k + odd
        last = self.groups - 1
        tail = (self.first[last], self.last[last], self.n[last], self.finite[last], self.lo[last], self.hi[last],
                self.inner[last].copy(), self.empty[last])
        self.first[:k], self.last[:k] = self.first[a], self.last[b]
        self.n[:k], self.finite[:k] = self.n[a] + self.n[b], self.finite[a] + self.finite[b]
        self.lo[:k], self.hi[:k] = np.minimum(self.lo[a], self.lo[b]), np.maximum(self.hi[a], self.hi[b])
        self.inner[:k], self.empty[:k] = self.inner[a] + self.inner[b], self.empty[a] | self.empty[b]
        if odd:
            (self.first[k], self.last[k], self.n[k], self.finite[k], self.lo[k], self.hi[k], self.inner[k],
             self.empty[k]) = tail
        self.groups, self.stride, self._doubled = end, self.stride * 2, True

    def columns(self, start=0, stop=None):
        """Source columns of groups ``start:stop``: a group at its first step, the last one at its newest."""
        stop = self.groups if stop is None else stop
        s = slice(start, stop)
        filling = np.arange(start, stop) == self.groups - 1
        finite = self.finite[s]
        with np.errstate(invalid="ignore", divide="ignore"):
            inner = self.inner[s] / finite[:, None]
        values = np.column_stack([self.lo[s], inner, self.hi[s]])
        values[finite == 0] = np.nan                  # nothing finite in the group: a gap
        cols = {"step": np.where(filling, self.last[s], self.first[s]),
                "empty": np.where(self.empty[s], 1.0, np.nan)}
        cols.update({c: values[:, i] for i, c in enumerate(COLUMNS)})
        return cols

    def take(self):
        if self._doubled:
            change = ("replace", self.columns())
        elif self._dirty is None:
            change = None
        else:
            start = self._dirty
            cols = self.columns(start)
            patched = max(0, self._sent - start)      # rows already in the source (only ever its last one)
            patches = {c: [(start + i, v[i].item()) for i in range(patched)] for c, v in cols.items()}
            change = ("append", patches if patched else {}, {c: v[patched:] for c, v in cols.items()})
        self._sent, self._dirty, self._doubled = self.groups, None, False
        return change


class _Card:
    def __init__(self, series, name, parts):
        self.bands = Bands()
        self.source = parts.source(Bands(2).columns(), name=f"cards-source:{name}")
        self.layout = distribution_card(series.tag, series.run, self.source, COLUMNS, parts, labels=LABELS)

    def add(self, steps, values, replace):
        if replace:
            self.bands = Bands()
        for step, buckets in zip(steps, values):
            self.bands.offer(step, buckets)
        change = self.bands.take()
        if replace or (change and change[0] == "replace"):
            self.source.data = self.bands.columns()
        elif change:
            _, patches, new = change
            if patches:
                self.source.patch(patches)
            if len(new["step"]):
                self.source.stream(new)


class GroupSeries:
    """A tag of a run group (the run list's grouping): ``members`` are the series of its runs."""

    def __init__(self, label, tag, members):
        self.label, self.tag, self.members = label, tag, members
        self.key = (label, tag, "group")
        self.runs = tuple(s.run for s in members)


class _GroupCard:
    """A run group's distribution of one tag: at each step, that of the values of every member run that logged the
    step (their histograms merged: ``merge_histograms``), so a group of seeds shows what the seeds share and how far
    they spread. A step is merged again only when a member's histogram of it arrives or changes."""

    def __init__(self, series, name, parts):
        self.members, self.runs = series.members, series.runs
        self._read: dict[tuple, tuple] = {}             # member series key -> (epoch, length) read
        self._histograms: dict[int, dict] = {}          # step -> {run: buckets}
        self._rows: dict[int, object] = {}              # step -> its nine values (None: nothing finite)
        self.source = parts.source(Bands(2).columns(), name=f"cards-source:{name}")
        n = len(self.runs)
        self.layout = distribution_card(series.tag, f"group {series.label} ({n} run{'s' if n != 1 else ''})",
                                        self.source, COLUMNS, parts, labels=LABELS)

    def follow(self, store):
        changed = set()
        for member in self.members:
            epoch, length = self._read.get(member.key, (None, 0))
            d = store.read(member, epoch, length)
            self._read[member.key] = (d.epoch, (0 if d.reset else length) + len(d.steps))
            if d.reset:                                  # its histograms start over: drop what it gave
                for step, by_run in self._histograms.items():
                    if by_run.pop(member.run, None) is not None:
                        changed.add(step)
            for step, buckets in zip(d.steps, d.values):
                self._histograms.setdefault(int(step), {})[member.run] = buckets
                changed.add(int(step))
        if not changed:
            return
        for step in changed:
            merged = merge_histograms(self._histograms[step].values())
            self._rows[step] = compress_histogram(merged, BPS) if merged[:, 2].sum() else None
        bands = Bands()
        for step in sorted(self._rows):
            bands.offer_percentiles(step, self._rows[step])
        self.source.data = bands.columns()


class DistributionsView(CardsView):
    """See the module doc. With runs grouped in the run list, a group's runs give one card per tag, before the
    cards of runs in no group."""
    title = "Distributions"
    kind = "histogram"
    empty_text = "No histograms in this logdir yet."

    def new_card(self, series):
        if isinstance(series, GroupSeries):
            return _GroupCard(series, self.kind_name, self.parts)
        return _Card(series, self.kind_name, self.parts)

    def update(self):
        shown = [s for s in self.store.series(self.kind) if self.runs.shows(s.run)]
        groups = self.runs.grouping.groups(sorted({s.run for s in shown}))
        grouped = {run: label for label, runs in groups.items() for run in runs}
        by_group: dict[tuple, list] = {}
        for s in shown:
            if s.run in grouped:
                by_group.setdefault((grouped[s.run], s.tag), []).append(s)
        series = {}
        for (label, tag), members in sorted(by_group.items()):
            g = GroupSeries(label, tag, members)
            series[g.key] = g
        series.update((s.key, s) for s in shown if s.run not in grouped)
        remade = False
        for key, card in list(self._cards.items()):      # a group whose runs changed is drawn anew
            if isinstance(card, _GroupCard) and (key not in series or series[key].runs != card.runs):
                del self._cards[key]
                remade = True
        self._series = series
        self.refresh(keys_changed=self.pager.set_keys(series) or remade)

    def _send(self, key, card):
        if isinstance(card, _GroupCard):
            card.follow(self.store)
        else:
            super()._send(key, card)
