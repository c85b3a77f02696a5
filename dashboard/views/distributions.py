"""Distributions tab: per run × tag, how a histogram's spread moves over the steps.

Each step's buckets are compressed to TensorBoard's nine basis points (``compress_histogram``: min, where a normal
distribution would be at ±1.5σ, ±1σ and ±0.5σ, median, max), drawn as four nested bands (the range, then bands 3σ,
2σ and 1σ wide) and a median line: the view TensorBoard calls "distributions" (and OneFlow's Tianshu planned but
never built). A step whose histogram holds no finite value leaves a gap in the bands and a red mark over the plot.
Hovering over a card reads the step under the pointer and its nine values, max first. Runs grouped in the run list
(``dashboard.run_groups``) are drawn as one card per group and tag: the distribution of all their values.

At most ``MAX_ROWS`` rows per card. Up to that many steps, a row is a step, exact. Past it, consecutive steps are merged
into groups (``Bands`` over ``plots.data.StepBuckets``: groups double in size, a handful of times per run) whose row keeps the smallest min and the
largest max of its steps, the mean of their inner basis points, and the red mark if any of its steps had nothing finite:
merging never hides a spike or an empty step. A row stands at its group's first step, except the last, which stands at
its newest step while it fills, so the bands reach the present: new rows are streamed, a changed last row is patched,
and the source is replaced only when groups double or the store resets the series.
"""
from __future__ import annotations

import math

import numpy as np

from flowlab.plots.data import NORMAL_HISTOGRAM_BPS, StepBuckets, compress_histogram, merge_histograms
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
    """The rows of one card: at most ``max_rows`` buckets of consecutive steps (``StepBuckets``).

    A bucket keeps how many of its steps had finite values, the min of their mins, the max of their maxes, the sum
    of each inner basis point and whether a step had nothing finite, so two buckets merge exactly. ``take()`` says
    what to send since the last call: ``("replace", columns)``, or ``("append", patches, columns)`` with ``patches``
    ``{column: [(row, value)]}`` for rows already sent that changed and ``columns`` to stream.
    """

    def __init__(self, max_rows=MAX_ROWS):
        self.buckets = StepBuckets(max(2, int(max_rows)), {"finite": "sum", "lo": "min", "hi": "max",
                                                           "inner": ("sum", len(BPS) - 2), "empty": "any"})
        self._sent, self._stride = 0, 1

    @property
    def stride(self):
        """Steps a bucket holds once full."""
        return self.buckets.stride

    def add(self, steps, histograms):
        """Add steps' histograms (``[k, 3]`` buckets each), in one block."""
        qs = []
        for buckets in histograms:
            b = np.asarray(buckets, np.float64).reshape(-1, 3)
            qs.append(compress_histogram(b, BPS) if b[:, 2].sum() else None)
        self.add_percentiles(steps, qs)

    def add_percentiles(self, steps, qs):
        """Add steps' nine basis-point values (``qs``: an array each, or None for a step with nothing finite), in one
        block (``StepBuckets.extend``)."""
        some = np.array([q is not None for q in qs], bool)
        q = np.array([np.zeros(len(BPS)) if v is None else v for v in qs], np.float64).reshape(len(qs), len(BPS))
        self.buckets.extend(steps, {"finite": some.astype(np.float64), "lo": np.where(some, q[:, 0], np.inf),
                                    "hi": np.where(some, q[:, -1], -np.inf), "inner": q[:, 1:-1], "empty": ~some})

    def columns(self, start=0, stop=None):
        """Source columns of buckets ``start:stop``: a bucket at its first step, the last one at its newest."""
        b = self.buckets
        stop = b.count if stop is None else stop
        s = slice(start, stop)
        filling = np.arange(start, stop) == b.count - 1
        finite = b.fields["finite"][s]
        with np.errstate(invalid="ignore", divide="ignore"):
            inner = b.fields["inner"][s] / finite[:, None]
        values = np.column_stack([b.fields["lo"][s], inner, b.fields["hi"][s]])
        values[finite == 0] = np.nan                  # nothing finite in the bucket: a gap
        cols = {"step": np.where(filling, b.last[s], b.first[s]).astype(np.float64),
                "empty": np.where(b.fields["empty"][s], 1.0, np.nan)}
        cols.update({c: values[:, i] for i, c in enumerate(COLUMNS)})
        return cols

    def take(self):
        at = self.buckets.take()
        if at is None:
            change = None
        elif self.buckets.stride != self._stride:       # buckets merged: every row moved
            change = ("replace", self.columns())
        else:
            cols = self.columns(at)
            patched = max(0, self._sent - at)             # rows already in the source (only ever its last one)
            patches = {c: [(at + i, v[i].item()) for i in range(patched)] for c, v in cols.items()}
            change = ("append", patches if patched else {}, {c: v[patched:] for c, v in cols.items()})
        self._sent, self._stride = self.buckets.count, self.buckets.stride
        return change


class _Card:
    def __init__(self, series, name, parts):
        self.bands = Bands()
        self.source = parts.source(Bands(2).columns(), name=f"cards-source:{name}")
        self.layout = distribution_card(series.tag, series.run, self.source, COLUMNS, parts, labels=LABELS)

    def add(self, steps, values, replace):
        if replace:
            self.bands = Bands()
        self.bands.add(steps, values)
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
        steps = sorted(self._rows)
        bands.add_percentiles(steps, [self._rows[step] for step in steps])
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
