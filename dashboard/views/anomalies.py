"""Anomalies tab: where NaN or Inf turned up, and what the finite values around them looked like.

One card per subject:
  exception   samples logged with ``Projector.exception_projector`` (projector entries of kind "exception", exact
              tensors with NaN/Inf kept), as the store read them (``Store.projectors``, again when a config changes)
  tensor      a tensor summary some step of which holds NaN/Inf (the whole series is shown once one does)
  histogram   a histogram whose writer logged ``<tag>/nan_count`` and ``<tag>/inf_count`` (``SummaryWriter`` does
              from the first step a histogram met NaN/Inf); its box comes from the buckets
  scalar      a scalar series that logged NaN or ±Inf (the loss went NaN)
A card shows box plots per step of the finite values (quartiles, whiskers at the last values within 1.5 × IQR,
outliers beyond), the NaN and Inf counts per step as stacked bars, and for tensors a heat map of one selected step
with NaN, +Inf and -Inf cells in colours of their own. Statistics are computed here, on the server; the browser
gets a handful of numbers per step, and a heat map reduced to at most ``HEAT_CELLS`` cells a side.

Bars and boxes are drawn as thick segments (widths in screen pixels), so they stay visible however far apart
the logged steps are.
"""
from __future__ import annotations

import warnings

import numpy as np
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, Div, FixedTicker, LinearColorMapper, Range1d, Select
from bokeh.palettes import Greys256

from flowlab.plots.data import BOX_KEYS, box_stats, compress_histogram
from flowlab.plots.figures import card, card_grid, plain_figure, text_div
from flowlab.ops.stats import stats_vector
from flowlab.summary.summary_writer import COUNT_SUFFIXES, counted_histogram

from .base import View

HEAT_CELLS = 200
NAN_COLOR, POS_INF_COLOR, NEG_INF_COLOR = "#e6007e", "#ff3b00", "#0072ff"
_LEGEND = ("".join(f'<span style="background:{c};display:inline-block;width:10px;height:10px"></span> {name} '
                   for c, name in ((NAN_COLOR, "NaN"), (POS_INF_COLOR, "+Inf"), (NEG_INF_COLOR, "-Inf")))
           + "&nbsp; finite values in grey, dark = low")


# ------------------------------------------------------------------------------------------------ statistics

def tensor_stats(array):
    """``(box statistics, outliers, nan count, inf count)`` of a numeric array; ``None`` for any other (a string
    tensor has no anomalies of this kind)."""
    a = np.asarray(array)
    if a.dtype.kind not in "biuf":
        return None
    stats, outliers = box_stats(a)
    nan, inf = stats_vector(np, a)[4:]
    return stats, outliers, int(nan), int(inf)


def histogram_box(buckets):
    """The box of a ``[k, 3]`` histogram: quartiles interpolated in the buckets (``compress_histogram``), whiskers at
    the 1.5 × IQR fences or the histogram's ends, whichever is nearer; its ends are the outliers when beyond them
    (they are the only single values a histogram knows)."""
    if not buckets[:, 2].sum():
        return dict.fromkeys(BOX_KEYS, float("nan")), np.zeros(0)
    lowest, highest = float(buckets[0, 0]), float(buckets[-1, 1])
    q1, median, q3 = compress_histogram(buckets, (0, 2500, 5000, 7500, 10000))[1:4].tolist()
    reach = 1.5 * (q3 - q1)
    lower, upper = max(lowest, q1 - reach), min(highest, q3 + reach)
    outliers = np.array([v for v in (lowest, highest) if v < lower or v > upper])
    return dict(zip(BOX_KEYS, (q1, median, q3, lower, upper))), outliers


def heat_cells(matrix, max_cells=HEAT_CELLS):
    """``matrix`` reduced to at most ``max_cells`` a side by blocks, keeping anomalies visible: a block holding a NaN
    is NaN, else one holding +Inf is +Inf, else -Inf, else the mean of its values."""
    h, w = matrix.shape
    rb, cb = -(-h // max_cells), -(-w // max_cells)
    if rb == cb == 1:
        return matrix
    padded = np.pad(matrix, ((0, -h % rb), (0, -w % cb)), mode="edge")
    blocks = padded.reshape(padded.shape[0] // rb, rb, padded.shape[1] // cb, cb).swapaxes(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)              # all-infinite blocks: overwritten below
        out = np.nanmean(np.where(np.isfinite(blocks), blocks, np.nan), axis=(2, 3))
    for value, mask in ((-np.inf, blocks == -np.inf), (np.inf, blocks == np.inf), (np.nan, np.isnan(blocks))):
        out[mask.any(axis=(2, 3))] = value                            # later masks win: NaN over +Inf over -Inf
    return out


def _as_matrix(array):
    a = np.asarray(array, np.float64)
    return a.reshape(1, -1) if a.ndim < 2 else a.reshape(a.shape[0], -1)


# ------------------------------------------------------------------------------------------------ cards

class _Card:
    """One subject: box plots (not for scalars), NaN/Inf counts, and a heat map (tensors only)."""

    def __init__(self, kind, run, tag):
        self.kind = kind
        self.fed = False                            # has been sent data (a store reset must then clear it)
        self.box = ColumnDataSource({"step": [], **{k: [] for k in BOX_KEYS}})
        self.outliers = ColumnDataSource({"step": [], "value": []})
        self.counts = ColumnDataSource({"step": [], "nan": [], "inf": [], "total": []})
        self.tensors: dict[int, np.ndarray] = {}
        children = [text_div(f"{kind}: {'NaN/Inf values' if kind == 'scalar' else 'NaN/Inf and finite values'}",
                             styles={"color": "#777", "font-size": "9pt"})]
        if kind != "scalar":
            fig = plain_figure("finite values: box, 1.5×IQR whiskers", x_axis_label="step")
            fig.segment("step", "lower", "step", "upper", source=self.box, line_color="#666")
            fig.segment("step", "q1", "step", "q3", source=self.box, line_color="#4c78a8", line_width=9)
            fig.scatter("step", "median", source=self.box, marker="dash", size=9, line_color="white", line_width=2)
            fig.scatter("step", "value", source=self.outliers, size=4, color="#555", fill_alpha=0.4)
            # joins the card when a step has finite values: BokehJS warns about a plot with nothing to range over,
            # even a hidden one (a histogram that is NaN from its first step never gets a box)
            self.box_figure = fig
        fig = plain_figure("count of NaN (magenta) and Inf (orange)", x_axis_label="step")
        fig.segment("step", 0, "step", "nan", source=self.counts, line_color=NAN_COLOR, line_width=6)
        fig.segment("step", "nan", "step", "total", source=self.counts, line_color=POS_INF_COLOR, line_width=6)
        fig.y_range.start = 0
        if kind == "scalar":                # a scalar is one value: its count is 0 or 1
            fig.yaxis.ticker = FixedTicker(ticks=[0, 1])
        fig.visible = False                 # until a count arrives (a histogram's twin counts may come later)
        self.counts_figure = fig
        children.append(fig)
        for plot in children[1:] + ([self.box_figure] if kind != "scalar" else []):
            plot.xaxis.ticker.min_interval = 1          # steps: no ticks between them
        if kind in ("exception", "tensor"):
            self.select = Select(title="heat map of step", options=[], value="", width=160)
            self.select.on_change("value", lambda attr, old, new: self.show(new))
            self.mapper = LinearColorMapper(palette=Greys256, low=0, high=1, nan_color=NAN_COLOR,
                                            high_color=POS_INF_COLOR, low_color=NEG_INF_COLOR)
            self.heat_source = ColumnDataSource({"image": [], "dw": [], "dh": []})
            self.heat = plain_figure(x_range=Range1d(0, 1), y_range=Range1d(0, 1), x_axis_label="element",
                                     y_axis_label="sample")
            # origin top_left: row 0 of the tensor at the top, as it is printed.
            self.heat.image(image="image", x=0, y=0, dw="dw", dh="dh", source=self.heat_source,
                            color_mapper=self.mapper, origin="top_left")
            self.heat.grid.visible = False
            self.xticks = self.heat.xaxis.ticker = FixedTicker(ticks=[])
            self.yticks = self.heat.yaxis.ticker = FixedTicker(ticks=[])
            children += [self.select, self.heat, Div(text=_LEGEND, styles={"font-size": "8pt"}, disable_math=True)]
        self.layout = card(tag, run, *children)

    def clear(self):
        for source in (self.box, self.outliers, self.counts):
            source.data = {name: [] for name in source.data}
        self.counts_figure.visible = False
        if self.kind != "scalar" and self.box_figure in self.layout.children:
            self.layout.children = [c for c in self.layout.children if c is not self.box_figure]
        self.tensors, self.fed = {}, False
        if self.kind in ("exception", "tensor"):
            self.select.options, self.select.value = [], ""
            self.heat_source.data = {"image": [], "dw": [], "dh": []}

    def add_boxes(self, steps, boxes):
        """``boxes``: ``(stats, outliers)`` per step (steps without a finite value have no box)."""
        self.fed = True
        kept = [(step, box) for step, box in zip(steps, boxes) if np.isfinite(box[0]["median"])]
        if not kept:
            return
        steps, boxes = zip(*kept)
        if self.box_figure not in self.layout.children:
            self.layout.children = self.layout.children[:2] + [self.box_figure] + self.layout.children[2:]
        self.box.stream({"step": list(steps), **{k: [b[0][k] for b in boxes] for k in BOX_KEYS}})
        pairs = [(step, v) for step, (_, outliers) in zip(steps, boxes) for v in outliers.tolist()]
        if pairs:
            self.outliers.stream({"step": [s for s, _ in pairs], "value": [v for _, v in pairs]})

    def add_counts(self, steps, nans, infs):
        self.fed = True
        if not steps:
            return
        self.counts_figure.visible = True
        self.counts.stream({"step": list(steps), "nan": list(nans), "inf": list(infs),
                            "total": [n + i for n, i in zip(nans, infs)]})

    def add_tensors(self, steps, arrays):
        """Box, counts and heat-map candidates of tensor steps (non-numeric ones are skipped)."""
        rows = [(step, array, tensor_stats(array)) for step, array in zip(steps, arrays)]
        rows = [r for r in rows if r[2] is not None]
        if not rows:
            return
        self.add_boxes([s for s, _, _ in rows], [(st[0], st[1]) for _, _, st in rows])
        self.add_counts([s for s, _, _ in rows], [st[2] for _, _, st in rows], [st[3] for _, _, st in rows])
        following = self.select.value in ("", self.select.options[-1] if self.select.options else "")
        for step, array, _ in rows:
            self.tensors[int(step)] = array
        self.select.options = [str(s) for s in sorted(self.tensors)]
        if following:
            self.select.value = self.select.options[-1]                 # calls show() when it changed

    def show(self, value):
        """Send the heat map of step ``value`` (a ``Select`` value)."""
        if not value or int(value) not in self.tensors:
            return
        matrix = _as_matrix(self.tensors[int(value)])
        cells = heat_cells(matrix)
        finite = cells[np.isfinite(cells)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        self.mapper.low, self.mapper.high = low, high if high > low else low + 1.0
        rows, cols = matrix.shape
        self.heat_source.data = {"image": [cells], "dw": [cols], "dh": [rows]}
        self.heat.x_range.end, self.heat.y_range.end = cols, rows
        # Ticks name original indices at cell centres; the y axis counts down from the top row.
        xs = sorted({int(c) for c in np.linspace(0, cols - 1, min(cols, 6))})
        ys = sorted({int(r) for r in np.linspace(0, rows - 1, min(rows, 6))})
        self.xticks.ticks = [c + 0.5 for c in xs]
        self.yticks.ticks = [rows - r - 0.5 for r in ys]
        self.heat.xaxis.major_label_overrides = {c + 0.5: str(c) for c in xs}
        self.heat.yaxis.major_label_overrides = {rows - r - 0.5: str(r) for r in ys}


# ------------------------------------------------------------------------------------------------ the view

class AnomaliesView(View):
    title = "Anomalies"

    def __init__(self, store):
        super().__init__(store)
        self.empty = text_div("No anomalies found: no NaN or Inf in this logdir's histograms, tensors, scalars or "
                              "exception projector samples.")
        self.grid = card_grid()
        self._cards: dict[tuple, _Card] = {}
        self._sources: dict[tuple, list] = {}       # card key -> store series keys feeding it
        self._pending: dict[tuple, dict] = {}       # histogram card key -> {step: [nan, inf]} awaiting its pair
        self._sent_exceptions: dict[tuple, dict] = {}   # exception card key -> {step: tensor sent}
        self._store_version = None
        self._unplaced: list[_Card] = []            # made in this update, not yet in the grid (see _card)
        self._root = column(self.empty, self.grid)

    def layout(self):
        return self._root

    def _card(self, key):
        """The card of ``key``, made when first asked for. A new card joins the page at the end of ``update``, with
        its first data: a plot that reaches the page empty and is filled by a later message makes BokehJS warn that
        it "could not set initial ranges"."""
        card = self._cards.get(key)
        if card is None:
            card = self._cards[key] = _Card(*key)
            self._unplaced.append(card)
        return card

    def _delta(self, key, series):
        """``delta(series)`` for card ``key``; after a store reset of a series the card already showed, the card
        is cleared and all of its series are read again from their start."""
        first = series.key not in self._seen            # a first read comes flagged reset too: nothing to undo
        d = self.delta(series)
        card = self._cards.get(key)
        if d.reset and not first and card is not None and card.fed:
            card.clear()
            self._pending.pop(key, None)
            for source in self._sources.get(key, ()):
                self._seen.pop(source, None)
            d = self.delta(series)
        return d

    def update(self):
        self._update_exceptions()
        if self.store.version != self._store_version:
            self._store_version = self.store.version
            cards = len(self._cards)
            self._update_series()
            if len(self._cards) != cards:       # a new card rereads its sources from their start: those already
                self._update_series()           # passed in this round are read now, not at the store's next change
        if self._unplaced:
            self.grid.children = self.grid.children + [card.layout for card in self._unplaced]
            self._unplaced = []
        for (_, run, _), card in self._cards.items():       # the run list's choice
            shown = self.runs.shows(run)
            if card.layout.visible != shown:
                card.layout.visible = shown
        self.empty.visible = not any(card.layout.visible for card in self._cards.values())

    def _update_series(self):
        by_key = {s.key: s for s in self.store.series()}
        for series in by_key.values():
            if series.kind == "scalar":
                self._update_scalar(series)
            elif series.kind == "tensor":
                self._update_tensor(series)
        for kind, run, tag in list(self._sources):
            if kind == "histogram" and (run, tag, "histogram") in by_key:
                self._update_histogram(by_key[(run, tag, "histogram")], (kind, run, tag))

    def _update_scalar(self, series):
        base = counted_histogram(series.tag)
        if base is not None:
            self._update_counts(series, base)
            return
        key = ("scalar", series.run, series.tag)
        d = self._delta(key, series)
        values = np.asarray(d.values, np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            card = self._card(key)
            self._sources[key] = [series.key]
            steps = np.asarray(d.steps)[bad].tolist()
            card.add_counts(steps, np.isnan(values[bad]).astype(int).tolist(),
                            np.isinf(values[bad]).astype(int).tolist())

    def _update_counts(self, series, base):
        """A histogram's ``<base>/nan_count`` or ``<base>/inf_count``: a card from the first count above 0 on, with
        the histogram's whole history; counts are shown per step once both of the step's counts have arrived."""
        key = ("histogram", series.run, base)
        if key not in self._cards:
            if not any(v > 0 for v in self.delta(series).values):
                return
            self._card(key)
            self._sources[key] = [(series.run, base + t, "scalar") for t in COUNT_SUFFIXES] + \
                                 [(series.run, base, "histogram")]
            for source in self._sources[key]:      # all from their start (the twin: on its turn or next update)
                self._seen.pop(source, None)
        d = self._delta(key, series)
        pending = self._pending.setdefault(key, {})
        which = COUNT_SUFFIXES.index(series.tag[len(base):])
        done = []
        for step, value in zip(d.steps, d.values):
            pair = pending.setdefault(step, [None, None])
            pair[which] = int(value)
            if None not in pair:
                done.append((step, *pending.pop(step)))
        if done:
            self._cards[key].add_counts(*zip(*done))

    def _update_tensor(self, series):
        key = ("tensor", series.run, series.tag)
        d = self._delta(key, series)
        if key not in self._cards:
            if not any(a.dtype.kind == "f" and not np.isfinite(a).all() for a in map(np.asarray, d.values)):
                return
            self._card(key)                         # the first anomaly: show the whole series, from its start
            self._sources[key] = [series.key]
            self._seen.pop(series.key, None)
            d = self.delta(series)
        self._cards[key].add_tensors(d.steps, d.values)

    def _update_histogram(self, series, key):
        d = self._delta(key, series)
        if d.steps:
            self._cards[key].add_boxes(d.steps, [histogram_box(b) for b in d.values])

    def _update_exceptions(self):
        for run, asset in sorted(self.store.projectors().items()):
            by_tag: dict[str, list] = {}
            for e in asset.value or ():             # a projector not read yet, or unreadable: nothing yet
                if e.kind == "exception":
                    by_tag.setdefault(e.tag, []).append(e)
            for tag, entries in by_tag.items():
                key = ("exception", run, tag)
                card = self._card(key)
                sent = self._sent_exceptions.setdefault(key, {})
                if any(e.step in sent and not np.array_equal(sent[e.step], e.tensor, equal_nan=True)
                       for e in entries):                 # a step was logged again: start over
                    card.clear()
                    sent.clear()
                new = sorted((e for e in entries if e.step not in sent), key=lambda e: e.step)
                if new:
                    card.add_tensors([e.step for e in new], [e.tensor for e in new])
                    sent.update((e.step, e.tensor) for e in new)
