"""Distributions tab: per run × tag, how a histogram's spread moves over the steps.

Each step's buckets are compressed to TensorBoard's nine basis points (``compress_histogram``: min, where a normal
distribution would be at ±1.5σ, ±1σ and ±0.5σ, median, max), drawn as four nested bands (the range, then bands 3σ,
2σ and 1σ wide) and a median line: the view TensorBoard calls "distributions" (and OneFlow's Tianshu planned but
never built). A step whose histogram holds no finite value leaves a gap.

At most ``MAX_POINTS`` steps per card, sampled evenly (``Sampler``), plus the latest step as a provisional last row,
so the bands always reach the present: new rows are streamed, and the provisional row is patched into the next one
(a source cannot drop rows).
"""
from __future__ import annotations

import math

from bokeh.models import ColumnDataSource

from flowlab.plots.data import NORMAL_HISTOGRAM_BPS, Sampler, compress_histogram
from flowlab.plots.figures import card, plain_figure

from .base import CardsView

MAX_POINTS = 500
BPS = NORMAL_HISTOGRAM_BPS
COLUMNS = [f"bp{bp}" for bp in BPS]
COLOR = "#e8743b"


def percentile_row(buckets):
    """``{"bp0": min, ..., "bp10000": max}`` of one step; NaN everywhere when the histogram counted nothing."""
    if not buckets[:, 2].sum():
        return dict.fromkeys(COLUMNS, math.nan)
    return dict(zip(COLUMNS, compress_histogram(buckets, BPS).tolist()))


def _columns(items):
    """Columns of sampled ``[step, buckets, row]`` items; rows are computed here, for the items sent only."""
    for item in items:
        if item[2] is None:
            item[2] = percentile_row(item[1])
    return {"step": [item[0] for item in items], **{c: [item[2][c] for item in items] for c in COLUMNS}}


class _Card:
    def __init__(self, series):
        self.sampler = Sampler(MAX_POINTS)
        self.provisional = False                    # the source's last row is the latest step, not a sampled one
        self.source = ColumnDataSource(_columns([]))
        self.figure = plain_figure(x_axis_label="step", width=420)
        # Outermost band (min..max) first and faintest; each inner band is drawn over it, darker.
        for k in range(len(BPS) // 2):
            self.figure.varea("step", COLUMNS[k], COLUMNS[-1 - k], source=self.source, fill_color=COLOR,
                              fill_alpha=0.2)
        self.figure.line("step", COLUMNS[len(BPS) // 2], source=self.source, line_color="#8c2d04", line_width=1.5)
        self.layout = card(series.tag, series.run, self.figure)

    def add(self, steps, values, replace):
        if replace:
            self.sampler = Sampler(MAX_POINTS)
        for step, buckets in zip(steps, values):
            self.sampler.offer([step, buckets, None])
        change = self.sampler.take()
        items, latest = self.sampler.items, self.sampler.latest
        extra = [] if not items or latest is items[-1] else [latest]
        if replace or (change and change[0] == "replace"):
            self.source.data = _columns(items + extra)
        else:
            new = (change[1] if change else []) + extra
            if self.provisional and new:
                last = len(self.source.data["step"]) - 1
                self.source.patch({name: [(last, column[0])] for name, column in _columns(new[:1]).items()})
                new = new[1:]
            if new:
                self.source.stream(_columns(new))
        self.provisional = bool(extra)


class DistributionsView(CardsView):
    title = "Distributions"
    kind = "histogram"
    empty_text = "No histograms in this logdir yet."

    def new_card(self, series):
        return _Card(series)
