"""Histograms tab: one card per run × tag, every drawn step's exact buckets, one glyph per mode; or one card per tag
comparing the runs.

Three modes: two as in TensorBoard, "offset" stacks the steps as filled ridges on a step axis (oldest at the top and
back, newest at the bottom and in front), "overlay" draws the bucket tops of every step over one another, coloured
by step; and "runs" overlays, per tag, each shown run's histogram at one step as bars filled in the run's colour
(the run list's: ``dashboard.runs``), translucent so that every run shows through. The step slider picks the step
(each run shows its logged step nearest to it); at its right end each run shows its latest step and keeps following
new ones. Hovering over a ridge, a bucket top or a bar reads its step, bucket range and count (and its run in "runs"
mode); where ridges or tops overlap, the front one (the newest step). A card is one figure (``HistogramCard``:
titles are canvas text, no Div to lay out) over one ``ColumnDataSource`` of flat float columns, one row per bucket
that counted something: a step's histogram is exact (its buckets as logged) when its buckets are of equal width;
tensorboardX's and TensorFlow's exponential buckets are first rebinned into equal ones, conserving counts
(``drawable``), as TensorBoard draws them: drawn raw, a normal sample's hundreds of tiny buckets near 0 made a false
dip there, in every mode. On the wire that is a few typed arrays
however many steps (a renderer or a ragged array per step, and a Div per card, are what made this tab take minutes);
the page turns the rows into one outline per step for the offset ridges (one path a step draws far faster than a
quad a bucket). The y range (``DataRange1d``) and the step colours (a colour mapper without low/high) follow the
data in the browser, so a new step is one ``stream`` and nothing else; switching between offset and overlay only
flips renderer visibility (to or from "runs", the page's cards are built anew: they are other cards).

At most ``MAX_STEPS`` steps are drawn per card: while a series has more, consecutive steps are grouped (groups double
in size, a handful of times per run) and each group is drawn by its widest histogram, the one reaching furthest out,
so a spike is never the step left out. The newest step is always drawn: by its group, or on its own (``tail``) while
its group is still filling. The source is replaced only when groups double, when a count outgrows the ridge height's
headroom or when the store resets the series.
"""
from __future__ import annotations

import numpy as np
from bokeh.layouts import row
from bokeh.models import DataRange1d, LinearColorMapper, RadioButtonGroup, Slider, Title
from bokeh.palettes import Viridis256

from flowlab.plots.data import StepBuckets, equal_width_buckets
from flowlab.plots.figures import HISTOGRAM_MODES, HistogramCard, card_figure, histogram_bars, nudge_next_turn

from ..runs import run_colour
from .base import CardsView

MODES = HISTOGRAM_MODES + ("runs",)

MAX_STEPS = 100
RIDGE_ROWS = 4.0        # the tallest ridge spans this many step intervals, so neighbours overlap as in TensorBoard
HEADROOM = 1.25         # the height scale leaves room for counts this much taller before it must be redone
COLUMNS = ("step", "left", "right", "count", "top")


def drawable(histograms):
    """``histograms`` (``[k, 3]`` buckets each) as every mode draws them: in equal-width buckets
    (``plots.data.equal_width_buckets``: tensorboardX's and TensorFlow's exponential buckets drawn raw show a false
    dip at 0)."""
    return [equal_width_buckets(h) for h in histograms]


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
    widest of the group (``plots.data.StepBuckets`` with an argmax field). ``items``: closed groups; ``latest``: the
    newest offered; ``open``: the widest of the group still filling (``None`` when none is). ``take()`` is what a view
    must send since the last call: ``("stream", new items)``, ``("replace", items)`` after groups doubled, or
    ``None``."""

    def __init__(self, max_items=MAX_STEPS):
        self.buckets = StepBuckets(max(2, int(max_items)) + 1, {"width": "max", "item": ("argmax", "width")})
        self.latest = None
        self._items: dict[int, tuple] = {}          # offer number -> item, for the groups' representatives
        self._offers = 0
        self._sent, self._stride = 0, 1

    @property
    def stride(self):
        return self.buckets.stride

    @property
    def _closed(self):
        b = self.buckets
        return b.count if b.count and b.n[b.count - 1] >= b.stride else max(0, b.count - 1)

    @property
    def items(self):
        return [self._items[int(i)] for i in self.buckets.fields["item"][:self._closed]]

    @property
    def open(self):
        b = self.buckets
        return self._items[int(b.fields["item"][b.count - 1])] if self._closed < b.count else None

    def offer(self, item):
        self.latest = item
        self._items[self._offers] = item
        self.buckets.extend([item[0]], {"width": [_width(item[1])], "item": [self._offers]})
        self._offers += 1
        if len(self._items) > 2 * self.buckets.max_buckets:        # forget the items no group holds any more
            kept = set(self.buckets.fields["item"][:self.buckets.count].tolist())
            self._items = {i: it for i, it in self._items.items() if i in kept}

    def take(self):
        closed = self._closed
        if self.buckets.stride != self._stride:
            change = ("replace", self.items)
        elif closed > self._sent:
            change = ("stream", self.items[self._sent:closed])
        else:
            change = None
        self._sent, self._stride = closed, self.buckets.stride
        self.buckets.take()
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


LATEST = "Step (each run's latest)"         # the slider's title at its right end
PICKED = "Step (each run's nearest)"


def run_columns(items):
    """Source columns of a "runs" card for ``items`` of ``(run, colour, step, buckets)``: a row per bucket worth one
    (see ``_drawn``), with its run's name and colour."""
    kept = [_drawn(np.asarray(buckets, np.float64).reshape(-1, 3)) for _, _, _, buckets in items]
    sizes = [len(b) for b in kept]
    buckets = np.concatenate(kept) if kept else np.zeros((0, 3))
    return {"run": [run for (run, _, _, _), n in zip(items, sizes) for _ in range(n)],
            "colour": [colour for (_, colour, _, _), n in zip(items, sizes) for _ in range(n)],
            "step": np.repeat(np.array([float(step) for _, _, step, _ in items]), sizes),
            "left": buckets[:, 0], "right": buckets[:, 1], "count": buckets[:, 2]}


def nearest(steps, step):
    """The index of the step of ``steps`` (increasing) nearest to ``step``, the earlier one on a tie."""
    i = int(np.searchsorted(steps, step))
    if i == len(steps) or (i > 0 and step - steps[i - 1] <= steps[i] - step):
        i -= 1
    return i


class _RunsCard:
    """One tag in "runs" mode: the histograms of the runs shown, each at the step chosen (``draw``), as bars in its
    run's colour. It follows each run's series itself (``follow``): what it was sent goes when it leaves the page."""

    def __init__(self, tag, store, parts, name):
        self.store = store
        self.runs: dict[str, list] = {}                 # run -> [epoch, steps, values, colour]
        self.source = parts.source(run_columns([]), name=f"cards-source:{name}")
        self.figure = card_figure(tag, "", parts, x_axis_label="value", y_axis_label="count",
                                  y_range=DataRange1d(start=0))
        histogram_bars(self.figure, self.source, color={"field": "colour"}, alpha=0.3, top="count",
                       tooltips=[("run", "@run"), ("step", "@step{0,0}")], add_glyph=parts.add_glyph)
        self.subtitle = next(t for t in self.figure.above if isinstance(t, Title) and t is not self.figure.title)
        self.layout = self.figure
        self.drawn_at = ()                              # the step choice the source was filled for

    def follow(self, series):
        """Take what is new in ``series`` (those of the shown runs); returns whether the card must be drawn again."""
        shown = {s.run: s for s in series}
        changed = set(shown) != set(self.runs)
        self.runs = {run: self.runs[run] for run in shown if run in self.runs}
        for run, s in shown.items():
            state = self.runs.get(run)
            epoch, length = (state[0], len(state[1])) if state else (None, 0)
            d = self.store.read(s, epoch, length)
            if d.reset:
                self.runs[run] = [d.epoch, list(d.steps), drawable(d.values), run_colour(self.store, run)]
                changed = True
            elif d.steps:
                state[1].extend(d.steps)
                state[2].extend(drawable(d.values))
                changed = True
        self.runs = dict(sorted(self.runs.items()))
        return changed

    def span(self):
        """``(first, last)`` step of any run, or None."""
        steps = [state[1] for state in self.runs.values() if state[1]]
        return (min(s[0] for s in steps), max(s[-1] for s in steps)) if steps else None

    def draw(self, step):
        """Fill the source: each run's histogram at its step nearest to ``step`` (None: its latest)."""
        items = []
        for run, (_, steps, values, colour) in self.runs.items():
            if steps:
                i = len(steps) - 1 if step is None else nearest(np.asarray(steps), step)
                items.append((run, colour, steps[i], values[i]))
        self.source.data = run_columns(items)
        where = "latest step" if step is None else f"steps nearest {step:,}"
        text = f"{len(items)} run{'s' if len(items) != 1 else ''} · {where}"
        if self.subtitle.text != text:
            self.subtitle.text = text
        self.drawn_at = (step,)


class HistogramsView(CardsView):
    title = "Histograms"
    kind = "histogram"
    empty_text = "No histograms in this logdir yet."

    def __init__(self, store):
        # one mapper for every card (building one takes milliseconds: it checks each of the palette's 256 colours);
        # without low/high it maps each source by that source's own step range, in the browser
        self.colors = LinearColorMapper(palette=Viridis256)
        self.mode = RadioButtonGroup(labels=list(MODES), active=0, name="histogram-mode")
        self.step = Slider(start=0, end=1, value=1, step=1, width=320, visible=False, disabled=True,
                           title=LATEST, name="histogram-step")
        self._regrid = False                            # the cards' kind changed: rebuild the page's cards
        self.mode.on_change("active", lambda attr, old, new: self._mode_changed(MODES[old], MODES[new]))
        self.step.on_change("value_throttled", lambda attr, old, new: self._step_changed())
        super().__init__(store)

    def controls(self):
        return (row(self.mode, self.step),)

    def url_state(self):
        """What the page's URL keeps of this tab (see ``dashboard.url_state``): the mode."""
        return [("histmode", self.mode, "active")]

    @property
    def comparing(self):
        return MODES[self.mode.active] == "runs"

    def new_card(self, series):
        if self.comparing:
            return _RunsCard(series[0].tag, self.store, self.parts, self.kind_name)
        return _Card(series, MODES[self.mode.active], self.kind_name, self.colors, self.parts)

    def update(self):
        if not self.comparing:
            self._series = {s.key: s for s in self.store.series(self.kind) if self.runs.shows(s.run)}
            changed = self.pager.set_keys(self._series)
            self.refresh(keys_changed=changed or self._regrid)
        else:
            tags: dict[tuple, list] = {}
            for s in self.store.series(self.kind):
                if self.runs.shows(s.run):
                    tags.setdefault(("", s.tag, "runs"), []).append(s)
            self._series = dict(sorted(tags.items()))
            changed = self.pager.set_keys(self._series)
            self.refresh(keys_changed=changed or self._regrid)
        self._regrid = False

    def show(self, card, delta):
        if delta.reset:
            card.reset()
        card.add(delta.steps, drawable(delta.values), replace=delta.reset)

    def _send(self, key, card):
        if not isinstance(card, _RunsCard):
            return super()._send(key, card)
        if card.follow(self._series[key]) or card.drawn_at != (self._chosen_step(),):
            card.draw(self._chosen_step())
        self._fit_slider()

    # -- runs mode ---------------------------------------------------------------------------------------------------
    def _mode_changed(self, old, new):
        self.step.visible = new == "runs"
        if "runs" not in (old, new):
            for card in self._cards.values():
                card.set_mode(new)
            return
        # another kind of card: drop the page's cards (and what they were sent) and build the new kind
        self._cards.clear()
        self._seen.clear()
        self._regrid = True
        if self._root.document is not None:
            self.update()

    def _chosen_step(self):
        """The step the slider picks, or None at its right end: each run's latest."""
        return None if self.step.value >= self.step.end else int(self.step.value)

    def _fit_slider(self):
        """Stretch the slider over the steps of the page's cards; at its right end it stays there (following)."""
        spans = [card.span() for card in self._cards.values() if isinstance(card, _RunsCard)]
        spans = [s for s in spans if s is not None]
        if not spans:
            return
        following = self._chosen_step() is None
        start, end = min(s[0] for s in spans), max(s[1] for s in spans)
        single = end <= start           # one step: nothing to choose (and BokehJS's slider needs start < end)
        wanted = {"start": start, "end": start + 1 if single else end, "disabled": single}
        self.step.update(**{k: v for k, v in wanted.items() if getattr(self.step, k) != v})
        if (following or single or self.step.value > self.step.end) and self.step.value != self.step.end:
            self.step.value = self.step.end
        self.step.title = LATEST if self._chosen_step() is None else PICKED

    def _step_changed(self):
        step = self._chosen_step()
        self.step.title = LATEST if step is None else PICKED
        for card in self._cards.values():
            if isinstance(card, _RunsCard) and card.drawn_at != (step,):
                card.draw(step)
