"""Histograms tab: one card per run × tag, every drawn step's exact buckets, one glyph per mode.

Two modes, as in TensorBoard: "offset" stacks the steps as filled ridges on a step axis (oldest at the top and back,
newest at the bottom and in front), "overlay" draws the bucket tops of every step over one another, coloured by
step. A card is one figure (``HistogramCard``: titles are canvas text, no Div to lay out) over one
``ColumnDataSource`` of flat float columns, one row per bucket that counted something: a step's histogram is exact
(its buckets as logged). On the wire that is a few typed arrays however many steps (a renderer or a ragged array per
step, and a Div per card, are what made this tab take minutes); the page turns the rows into one outline per step for
the offset ridges (one path a step draws far faster than a quad a bucket). The y range (``DataRange1d``) and the step
colours (a colour mapper without low/high) follow the data in the browser, so a new step is one ``stream`` and nothing
else; switching modes only flips renderer visibility.

At most ``MAX_STEPS`` steps are drawn per card: while a series has more, consecutive steps are grouped (groups double
in size, a handful of times per run) and each group is drawn by its widest histogram, the one reaching furthest out,
so a spike is never the step left out. The newest step is always drawn: by its group, or on its own (``tail``) while
its group is still filling. The source is replaced only when groups double, when a count outgrows the ridge height's
headroom or when the store resets the series.
"""
from __future__ import annotations

import numpy as np
from bokeh.models import LinearColorMapper, RadioButtonGroup
from bokeh.palettes import Viridis256

from flowlab.plots.figures import HISTOGRAM_MODES as MODES
from flowlab.plots.figures import HistogramCard, nudge_next_turn

from .base import CardsView

MAX_STEPS = 100
RIDGE_ROWS = 4.0        # the tallest ridge spans this many step intervals, so neighbours overlap as in TensorBoard
HEADROOM = 1.25         # the height scale leaves room for counts this much taller before it must be redone
COLUMNS = ("step", "left", "right", "count", "top")


def _width(buckets):
    return float(buckets[-1, 1] - buckets[0, 0]) if len(buckets) else -np.inf


def _drawn(buckets):
    """The buckets worth a row: those that counted something (an empty one draws nothing), or all of them when none
    did, so a step that had no finite value still shows, as a flat line at its step."""
    counted = buckets[:, 2] != 0
    return buckets[counted] if counted.any() else buckets


def ridge_columns(items, scale):
    """Flat columns for ``items`` of ``(step, buckets)``: a row per bucket (see ``_drawn``); ``top`` is the ridge's top
    in offset mode, ``count`` × ``scale`` step intervals above the step (up is towards smaller steps: the axis is
    flipped)."""
    if not items:
        return {name: np.zeros(0) for name in COLUMNS}
    kept = [_drawn(np.asarray(b, np.float64).reshape(-1, 3)) for _, b in items]
    buckets = np.concatenate(kept)
    steps = np.repeat(np.array([s for s, _ in items], np.float64), [len(b) for b in kept])
    return {"step": steps, "left": buckets[:, 0], "right": buckets[:, 1], "count": buckets[:, 2],
            "top": steps - buckets[:, 2] * scale}


class Groups:
    """At most ``max_items`` of the ``(step, buckets)`` offered, one per group of ``stride`` consecutive ones: the
    widest of the group. ``items``: closed groups; ``latest``: the newest offered; ``open``: the widest of the group
    still filling (``None`` when it is empty). ``take()`` is what a view must send since the last call, as for
    ``Sampler``: ``("stream", new items)``, ``("replace", items)`` after groups doubled, or ``None``."""

    def __init__(self, max_items=MAX_STEPS):
        self.max_items = max(2, int(max_items))
        self.items, self.stride, self.latest = [], 1, None
        self.open, self._filled = None, 0
        self._new, self._doubled = 0, False

    def offer(self, item):
        self.latest = item
        if self.open is None or _width(item[1]) > _width(self.open[1]):
            self.open = item
        self._filled += 1
        if self._filled < self.stride:
            return
        self.items.append(self.open)
        self.open, self._filled, self._new = None, 0, self._new + 1
        if len(self.items) > self.max_items:
            if len(self.items) % 2:             # an odd last group becomes the first half of the open group
                self.open, self._filled = self.items.pop(), self.stride
            self.items = [max(pair, key=lambda it: _width(it[1])) for pair in zip(self.items[::2], self.items[1::2])]
            self.stride *= 2
            self._doubled = True

    def take(self):
        change = (("replace", list(self.items)) if self._doubled else
                  ("stream", self.items[-self._new:]) if self._new else None)
        self._new, self._doubled = 0, False
        return change


class _Card:
    """One run × tag: ``source`` the closed groups, ``tail`` the newest step while its group is open."""

    def __init__(self, series, mode, name, colors, parts):
        self.groups = Groups()
        self.peak = 0.0                                     # the count the ridge scale was made for
        self.interval = 0.0                                 # the step interval it was made for
        self.scale = 0.0
        self.parts = parts
        self.source = parts.source(ridge_columns([], 0.0))
        self.tail = None                                    # made (and drawn) when a group first stays open
        self.drawing = HistogramCard(series.tag, series.run, self.source, colors, parts, mode, name=name)
        self.layout = self.drawing.figure

    @property
    def expanded_sources(self):
        return self.drawing.sources

    def set_mode(self, mode):
        self.drawing.show(mode)

    def reset(self):
        self.groups, self.peak, self.interval = Groups(), 0.0, 0.0

    def add(self, steps, values, replace=False):
        for item in zip(steps, values):
            self.groups.offer(item)
        change = self.groups.take()
        shown = self.groups.items + ([self.groups.latest] if self.groups.open is not None else [])
        if self._rescale(shown, values):
            replace = True
        if replace or (change and change[0] == "replace"):
            self.source.data = ridge_columns(self.groups.items, self.scale)
        elif change:
            self.source.stream(ridge_columns(change[1], self.scale))
        if self.groups.open is not None and self.tail is None:
            self.tail = self.parts.source(ridge_columns([], 0.0))
            self.drawing.highlight(self.tail)
            nudge_next_turn(self.source.document, self.tail)
        if self.tail is not None and (self.groups.open is not None or len(self.tail.data["step"])):
            tail = [self.groups.latest] if self.groups.open is not None else []
            self.tail.data = ridge_columns(tail, self.scale)

    def _rescale(self, shown, values):
        """Whether the ridge height scale must be redone: a count past the headroom, or steps spaced far otherwise."""
        peak = max((float(np.max(np.asarray(v)[:, 2], initial=0.0)) for v in values), default=0.0)
        steps = [s for s, _ in shown]
        interval = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else 1.0
        if peak <= self.peak and self.interval and 0.5 <= interval / self.interval <= 2:
            return False
        self.peak = max(peak, self.peak) * HEADROOM
        self.interval = interval or 1.0
        self.scale = RIDGE_ROWS * self.interval / self.peak if self.peak else 0.0
        return True


class HistogramsView(CardsView):
    title = "Histograms"
    kind = "histogram"
    empty_text = "No histograms in this logdir yet."

    def __init__(self, store):
        # one mapper for every card (building one takes milliseconds: it checks each of the palette's 256 colours);
        # without low/high it maps each source by that source's own step range, in the browser
        self.colors = LinearColorMapper(palette=Viridis256)
        self.mode = RadioButtonGroup(labels=list(MODES), active=0)
        self.mode.on_change("active", lambda attr, old, new: [c.set_mode(MODES[new]) for c in self._cards.values()])
        super().__init__(store)

    def controls(self):
        return (self.mode,)

    def new_card(self, series):
        return _Card(series, MODES[self.mode.active], self.kind_name, self.colors, self.parts)

    def show(self, card, delta):
        if delta.reset:
            card.reset()
        card.add(delta.steps, delta.values, replace=delta.reset)
