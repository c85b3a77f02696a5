"""Histograms tab: one card per run × tag, the buckets of each logged step drawn as an outline.

Two modes, as in TensorBoard: "offset" stacks the outlines as a ridge plot (oldest at the top and back, newest at
the bottom and in front), "overlay" draws them over one another, coloured by step. At most ``MAX_OUTLINES`` steps
are drawn, spread evenly over the run by a ``Sampler``, plus the latest step (highlighted), so a long run costs the
browser no more than a short one. Outlines are exact step curves of the logged buckets (``histogram_outline``).

Only what a session has not seen is read from the store; new sampled steps are streamed. The source is replaced
only when the sampler thins (the stride doubles: a handful of times per run) or when a count outgrows the ridge's
height scale.
"""
from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource, FixedTicker, LinearColorMapper, RadioButtonGroup, Range1d
from bokeh.palettes import Viridis256

from flowlab.plots.data import Sampler, histogram_outline
from flowlab.plots.figures import card, plain_figure

from .base import CardsView

MAX_OUTLINES = 50
RIDGE_HEIGHT = 5.0      # the tallest outline spans this many rows, so neighbours overlap as in TensorBoard
HEADROOM = 1.25         # the scale leaves room for counts this much taller before it must be redone
MODES = ("offset", "overlay")
LATEST = "#d62728"


def _columns(items, first_rank, scale):
    """Source columns for ``items`` of ``(step, buckets)``: ``ys`` the counts (overlay) and ``ridge`` the outline
    lifted above its row ``rank`` (offset; the axis is flipped, so up is minus)."""
    cols = {"step": [], "rank": [], "xs": [], "ys": [], "ridge": []}
    for rank, (step, buckets) in enumerate(items, first_rank):
        x, y = histogram_outline(buckets)
        for name, value in zip(cols, (step, rank, x, y, rank - y * scale)):
            cols[name].append(value)
    return cols


class _Card:
    """One run × tag: the sampled outlines and the latest one, in both modes' figures."""

    def __init__(self, series, mode):
        self.sampler = Sampler(MAX_OUTLINES)
        self.peak = 0.0                                     # largest count the ridge scale was made for
        self.source = ColumnDataSource(_columns([], 0, 0.0))
        self.tail = ColumnDataSource(_columns([], 0, 0.0))  # the latest step, when the sampler did not keep it
        self.colors = LinearColorMapper(palette=Viridis256, low=0, high=1)
        color = {"field": "step", "transform": self.colors}

        self.offset = plain_figure(y_axis_label="step", y_range=Range1d(1, -RIDGE_HEIGHT),    # flipped: newest low
                                   height=320)
        self.ticker = self.offset.yaxis.ticker = FixedTicker(ticks=[])
        self.offset.patches("xs", "ridge", source=self.source, fill_color="white", fill_alpha=0.85, line_color=color)
        self.offset.patches("xs", "ridge", source=self.tail, fill_color="white", fill_alpha=0.85, line_color=LATEST,
                            line_width=2)
        self.overlay = plain_figure(y_axis_label="count")
        self.overlay.multi_line("xs", "ys", source=self.source, line_color=color, line_alpha=0.7)
        self.overlay.multi_line("xs", "ys", source=self.tail, line_color=LATEST, line_width=2)
        self.overlay.y_range.start = 0
        self.set_mode(mode)
        self.layout = card(series.tag, series.run, self.offset, self.overlay)

    def set_mode(self, mode):
        self.offset.visible, self.overlay.visible = mode == "offset", mode == "overlay"

    def reset(self):
        self.sampler, self.peak = Sampler(MAX_OUTLINES), 0.0

    def add(self, steps, values, replace=False):
        for item in zip(steps, values):
            self.sampler.offer(item)
        peak = max((float(v[:, 2].max(initial=0.0)) for v in values), default=0.0)
        if peak > self.peak:
            self.peak, replace = peak * HEADROOM, True
        scale = RIDGE_HEIGHT / self.peak if self.peak else 0.0
        change = self.sampler.take()
        items = self.sampler.items
        if replace or (change and change[0] == "replace"):
            self.source.data = _columns(items, 0, scale)
        elif change:
            self.source.stream(_columns(change[1], len(items) - len(change[1]), scale))
        latest = self.sampler.latest
        shown = [] if not items or latest is items[-1] else [latest]
        self.tail.data = _columns(shown, len(items), scale)
        self._axes(items + shown)

    def _axes(self, drawn):
        steps = [step for step, _ in drawn]
        self.colors.low, self.colors.high = (steps[0], steps[-1]) if steps else (0, 1)
        # Rows are ranks; the axis names them by step. The range is set, not automatic, so it stays flipped.
        self.offset.y_range.start, self.offset.y_range.end = len(drawn) - 0.5, -RIDGE_HEIGHT - 0.5
        ticks = sorted({round(r) for r in np.linspace(0, len(steps) - 1, min(len(steps), 6))})
        self.ticker.ticks = ticks
        self.offset.yaxis.major_label_overrides = {rank: str(steps[rank]) for rank in ticks}


class HistogramsView(CardsView):
    title = "Histograms"
    kind = "histogram"
    empty_text = "No histograms in this logdir yet."

    def __init__(self, store):
        self.mode = RadioButtonGroup(labels=list(MODES), active=0)
        self.mode.on_change("active", lambda attr, old, new: [c.set_mode(MODES[new]) for c in self._cards.values()])
        super().__init__(store)

    def controls(self):
        return (self.mode,)

    def new_card(self, series):
        return _Card(series, MODES[self.mode.active])

    def show(self, card, delta):
        if delta.reset:
            card.reset()
        card.add(delta.steps, delta.values, replace=delta.reset)
