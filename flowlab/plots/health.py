"""Network health, drawn the same way in the notebook (``widgets.HealthPanel``) and the dashboard (Health tab).

Data: ``HealthGrid`` (in ``flowlab.summary.thinning``, with the rest of the reading side's data code) keeps a run's
reports (``flow.watch_health``: a ``layers × statistics`` matrix a step) over the whole run in ``StepBuckets``: each
bucket folds, per cell, its steps' smallest and largest finite value, their sum and count, and per layer how many
NaN/Inf its tensors held (the ``*_nan``/``*_inf`` statistics). A million steps cost what a few hundred do, and a
spike or a NaN at one step stays visible.

Figures, each fed from a ``HealthGrid``:
- ``HealthHeatmap``: layers (forward order, top to bottom) × steps for one statistic. A cell is coloured by the
  largest value its steps saw (a spike is never averaged away), on a log scale for norms and magnitudes and a linear
  one for fractions and counts; a cell whose layer held NaN/Inf in those steps is outlined in red; a cell with no
  value (a layer without that statistic) is grey. Hover reads the layer, steps and min/mean/max. A tap selects a
  cell (``source.selected.indices``); ``HealthHeatmap.layer_at`` maps it back to its layer. A cell reaches to where
  the next bucket starts (reports every ``n`` steps leave no gaps). Updated again, only the buckets that changed
  are sent (see ``update``).
- ``Divergence``: two runs' statistic compared per layer and step span, drawn by a ``HealthHeatmap`` (the
  dashboard's side-by-side runs).
- ``trend_overlay_figure``: one layer's trend of several runs on one figure, each in its colour.
- ``trend_columns(grid, layer, statistic)``: one layer's statistic over steps as ``Trend`` columns, drawn by
  ``figures.trend_figure`` (min…max envelope, mean line, red bands over NaN/Inf).
- ``AlertGroups``: alerts grouped by kind and layer (one row each, the newest group first) and counted by kind.
- ``heatmap_svg``: a heatmap as static SVG, for a saved notebook's copy of ``widgets.HealthPanel``.
"""
from __future__ import annotations

import html
import math

import numpy as np
from bokeh.models import (ColorBar, ColumnDataSource, CustomJSHover, CustomJSTickFormatter, DataRange1d, FixedTicker,
                          HoverTool, LinearColorMapper, LogColorMapper, Quad, Range1d, TapTool)
from bokeh.palettes import Viridis256

from ..health import COUNT_STATISTICS, ROW_STATISTICS
from .figures import ALARM, _figure, _live_figure, compact_ticks, draw_bands, scale_ticker, value_labels
from .static import Scale, axis_ticks, linear_ticks, tick_texts

# Statistics whose values are fractions or counts get a linear colour scale; norms and magnitudes span decades (log).
LINEAR = frozenset({"act_zero_fraction", "dead_fraction", "attention_entropy", *COUNT_STATISTICS, *ROW_STATISTICS})
NO_VALUE = "#d9d9d9"
ZERO = "#e377c2"                # a zero on a log scale (below every colour of the palette)
ROW_HEIGHT = 18                 # pixels a layer's row takes in a heatmap
# ... and past DENSE_FROM layers (ResNet-50 has 54): still above an 8 pt label's ~11 px, 216 px shorter at 54 layers
DENSE_ROW_HEIGHT, DENSE_FROM = 14, 33
MIN_ROWS_HEIGHT = 96            # pixels the rows take at least: room for a readable colour bar beside few layers


def row_px(n_layers):
    """Pixels a layer's row takes in a heatmap of ``n_layers`` rows."""
    return ROW_HEIGHT if n_layers < DENSE_FROM else DENSE_ROW_HEIGHT


def label_px(layers):
    """Pixels left of the cells for the layer names (~6 px a character at 8 pt), within reason."""
    return min(220, max(50, 6 * max(map(len, layers), default=0) + 14))


# Numbers only (sent as binary buffers): a cell's layer is its row, ``bottom``, whose name hover and taps look up.
# ``right`` is a cell's own edge (what hover and taps hit); it is painted out to ``right_fill``, its right
# neighbour's far edge, and that neighbour, drawn after it, paints over the overlap: its antialiased left edge then
# blends with the cell's colour, where cells a pixel or two wide would otherwise let the background through seams
# between them, a grid of lines over the heatmap (stroking every cell in its own colour also hides them, at ~0.2 s a
# redraw of three 24-layer heatmaps in the page). Rows keep their faint seams: they part the layers.
HEATMAP_COLUMNS = ("left", "right", "right_fill", "bottom", "top", "value", "lo", "mean", "hi", "first", "last",
                   "nonfinite", "linear_value")
ALARM_COLUMNS = ("left", "right", "bottom", "top")     # the red outlines: the cells that held NaN/Inf, only
# ``value`` is what the log colour mapper reads and is never <= 0 (NaN instead); the linear mapper reads
# ``linear_value``. BokehJS clones a renderer's selection/nonselection/decimated glyphs once, with the mapper it
# first had, and they keep mapping ``value`` after a switch: a log mapper must never see a zero there.


class HealthHeatmap:
    """A layers × steps heatmap of one statistic (see the module docstring). ``update(grid, statistic)`` refills it
    (the caller runs it where it may touch the document); ``figure`` is the Bokeh figure."""

    def __init__(self, layers, width=None, title=""):
        self.layers = tuple(layers)
        self.source = ColumnDataSource({c: [] for c in HEATMAP_COLUMNS})
        sizing = {"sizing_mode": "stretch_width", "min_width": 300} if width is None else {"width": width}
        n = len(self.layers)
        # the cells reach the plot's edges (no padding: blank steps before 0 read as missing data)
        fig = _figure(title, height=max(row_px(n) * n, MIN_ROWS_HEIGHT) + 70, x_axis_label="step",
                      x_range=DataRange1d(range_padding=0), **sizing)
        # room for the longest layer name at 8pt (~6 px a character), within reason
        fig.min_border_left = label_px(self.layers)
        fig.y_range = Range1d(n, 0)                      # the first layer on top
        fig.yaxis.ticker = FixedTicker(ticks=[i + 0.5 for i in range(n)])
        # layer names come from logs: a formatter returns text, which the canvas draws as text (never HTML)
        fig.yaxis.formatter = CustomJSTickFormatter(args={"names": list(self.layers)},
                                                    code="return names[Math.floor(tick)] || ''")
        fig.ygrid.visible = False
        fig.xgrid.visible = False
        fig.xaxis.formatter = compact_ticks()
        # ranges set from the data on every update (``value_range``); on the log scale a zero is drawn below the
        # range, in ZERO (a dead layer's zero gradient is not "no value")
        (self.linear, linear_ticker), (self.log, log_ticker) = color_scale(True), color_scale(False)
        # painted cells (see HEATMAP_COLUMNS), and the same cells unpainted at their own edges for hover and taps
        self.glyph = Quad(left="left", right="right_fill", bottom="bottom", top="top", line_color=None,
                          fill_color={"field": "value", "transform": self.log})
        fig.add_glyph(self.source, self.glyph)
        renderer = fig.add_glyph(self.source, Quad(left="left", right="right", bottom="bottom", top="top",
                                                   fill_alpha=0, line_alpha=0))
        # NaN/Inf outlines drawn from a source of their own: few cells, and no stroke for all the others
        self.alarms = ColumnDataSource({c: [] for c in ALARM_COLUMNS})
        fig.add_glyph(self.alarms, Quad(left="left", right="right", bottom="bottom", top="top", fill_color=None,
                                        line_color=ALARM, line_width=1.5))
        # one colour bar per scale, shown in turn (BokehJS keeps a bar's first scale when its mapper is replaced)
        # labels in one style a bar (compact_ticks on the linear one, as the static copy's): not "1T" beside "1e+16"
        self.bars = {linear: ColorBar(color_mapper=mapper, width=8, padding=2, label_standoff=4,
                                      major_label_text_font_size="8pt", visible=not linear, ticker=ticker,
                                      formatter=compact_ticks() if linear else value_labels())
                     for linear, mapper, ticker in ((False, self.log, log_ticker), (True, self.linear, linear_ticker))}
        for bar in self.bars.values():
            fig.add_layout(bar, "right")
        # (hover escapes what a formatter returns: a layer name is text)
        layer_name = CustomJSHover(args={"names": list(self.layers)}, code="return names[Math.round(value)] ?? ''")
        fig.add_tools(HoverTool(renderers=[renderer], formatters={"@bottom": layer_name}, tooltips=[
            ("layer", "@bottom{custom}"), ("steps", "@first{0,0} … @last{0,0}"),
            ("min … max", "@lo{0.000e} … @hi{0.000e}"), ("mean", "@mean{0.000e}"), ("NaN/Inf", "@nonfinite{0,0}")]),
            TapTool(renderers=[renderer]))
        self.figure = fig
        self.statistic = None
        self._drawn, self._count = None, 0      # what the source holds: (grid, statistic, scale, stride), buckets
        self._linear = None

    def update(self, grid, statistic, linear=None, title=None):
        """Show ``statistic`` of ``grid`` (``linear``: its colour scale; by default linear for fractions and counts,
        log otherwise). Rows go bucket by bucket, so when the same statistic of the same grid is shown again and its
        buckets have not merged since, only its newest drawn bucket (which may have taken more steps) and the new
        ones are sent, patched and streamed: a live run costs a few rows an update. ``grid`` may be anything with
        ``layers`` and ``cells`` (a ``Divergence``); without ``buckets`` it is sent whole. ``title``: the figure's
        (default the statistic), to which "(pink: 0)" is added when a log scale draws zeros."""
        linear = statistic in LINEAR if linear is None else bool(linear)
        c = grid.cells(statistic)
        n_buckets = c["hi"].shape[1]
        buckets = getattr(grid, "buckets", None)
        drawn = (grid, statistic, linear, None if buckets is None else buckets.stride)
        if buckets is not None and drawn == self._drawn and n_buckets >= self._count > 0:
            start, sent = self._count - 1, self._count
            columns = self._columns(grid.layers, c, linear, start)
            n = len(grid.layers) * (sent - start)
            self.source.patch({k: [(slice(start * len(grid.layers), sent * len(grid.layers)), v[:n])]
                               for k, v in columns.items()})
            if n_buckets > sent:
                self.source.stream({k: v[n:] for k, v in columns.items()})
        else:
            self.source.data = self._columns(grid.layers, c, linear, 0)
        self._drawn, self._count = drawn, n_buckets
        alarms = self._alarm_columns(c)
        if any(not np.array_equal(alarms[k], self.alarms.data[k]) for k in ALARM_COLUMNS):
            self.alarms.data = alarms
        if (statistic, linear) != (self.statistic, self._linear):
            mapper = self.linear if linear else self.log
            self.glyph.fill_color = {"field": "linear_value" if linear else "value", "transform": mapper}
            for scale, bar in self.bars.items():
                bar.visible = scale == linear
            self.statistic, self._linear = statistic, linear
        self._set_range(c["hi"], linear, title or statistic)

    def _set_range(self, hi, linear, title):
        """Fit the shown scale to the values (``value_range``); say when zeros are drawn."""
        zeros = not linear and bool((hi == 0).any())
        low, high = value_range(hi, linear)
        mapper = self.linear if linear else self.log
        if (mapper.low, mapper.high) != (low, high):
            mapper.update(low=low, high=high)
        title += "  (pink: 0)" if zeros else ""
        if self.figure.title.text != title:
            self.figure.title.text = title

    @staticmethod
    def _columns(layers, c, linear, start):
        """Source columns of buckets ``start:``, bucket by bucket (each bucket's layers top to bottom)."""
        n_layers = len(layers)
        hi = c["hi"][:, start:].T.reshape(-1)
        n = hi.size // n_layers
        rows = np.tile(np.arange(n_layers), n)
        steps = c["first"][start:].astype(np.float64)
        ends = _bucket_ends(c)[start:]
        first = np.repeat(steps, n_layers)
        bad = c["nonfinite"][:, start:].T.reshape(-1)
        fill_ends = np.append(ends[1:], ends[-1:])              # the next bucket's end (the last: its own)
        return {"left": first, "right": np.repeat(ends, n_layers), "right_fill": np.repeat(fill_ends, n_layers),
                "bottom": rows.astype(np.float64), "top": rows + 1.0, "value": _log_values(hi), "linear_value": hi,
                "lo": c["lo"][:, start:].T.reshape(-1), "mean": c["mean"][:, start:].T.reshape(-1), "hi": hi,
                "first": first, "last": np.repeat(c["last"][start:].astype(np.float64), n_layers), "nonfinite": bad}

    @staticmethod
    def _alarm_columns(c):
        """``ALARM_COLUMNS`` of the cells whose layer held NaN/Inf (a cell spans its bucket, as in ``_columns``)."""
        layer, bucket = np.nonzero(c["nonfinite"] > 0)
        return {"left": c["first"][bucket].astype(np.float64), "right": _bucket_ends(c)[bucket],
                "bottom": layer.astype(np.float64), "top": layer + 1.0}

    def layer_at(self, index):
        """The layer of the cell at ``index`` of ``source`` (a tap's ``selected.indices[0]``)."""
        return self.layers[int(self.source.data["bottom"][index])]


STEPS_RIGHT_PX = 64
"""Pixels right of a heatmap's cells (its colour bar and labels such as "1.5e+16"), and of figures aligned with it."""


def share_steps(heatmap_figure, *figures):
    """Put ``figures`` (a trend over steps, another heatmap) on ``heatmap_figure``'s step axis: the same x range and
    the same left and right borders, so that in a column of them (the ``HealthPanel``) a step lies at the same
    pixel in each. The left border is the widest any of them asks for (a heatmap's layer names, a trend's values)."""
    everyone = (heatmap_figure, *figures)
    left = max(f.min_border_left or 0 for f in everyone)
    for f in everyone:
        f.x_range = heatmap_figure.x_range
        f.min_border_left, f.min_border_right = left, STEPS_RIGHT_PX


def _bucket_ends(c):
    """Where each bucket's cells end: the next bucket's first step (no gaps between reports every n steps), the
    last one a step after its last."""
    return np.append(c["first"][1:], c["last"][-1] + 1 if len(c["last"]) else []).astype(np.float64)


def color_scale(linear):
    """``(colour mapper, ticker)`` of the health colours: Viridis on a linear scale (fractions and counts: ``LINEAR``)
    or a log one (norms and magnitudes), NaN drawn as no value, a value below the range (``_log_values``' zero) in
    ZERO. Its range starts as a placeholder: set it from the data with ``value_range`` (a mapper left to scan an
    empty source warns in BokehJS). A colour bar of it takes the ticker and ``figures.value_labels()`` (log) or
    ``figures.compact_ticks()`` (linear)."""
    ticker = scale_ticker(log=not linear)
    if linear:
        return LinearColorMapper(palette=Viridis256, nan_color=NO_VALUE, low=0, high=1), ticker
    return LogColorMapper(palette=Viridis256, nan_color=NO_VALUE, low=1e-3, high=1, low_color=ZERO), ticker


def value_range(values, linear):
    """``(low, high)`` of a colour scale over ``values``' finite ones (positive ones on a log scale): never empty,
    a span around a single value, a placeholder when there is none."""
    values = np.asarray(values, np.float64)
    keep = np.isfinite(values) if linear else np.isfinite(values) & (values > _ZERO_STAND_IN)
    values = values[keep]
    if not values.size:
        return (0.0, 1.0) if linear else (1e-3, 1.0)
    low, high = float(values.min()), float(values.max())
    if high <= low:
        if linear and low >= 0:         # counts and fractions all alike: 0 the darkest colour, a value the brightest
            return 0.0, (high or 1.0)
        return (low - 0.5, high + 0.5) if linear else (low / 2, high * 2)
    return low, high


_ZERO_STAND_IN = 1e-300          # a zero on a log scale: below any range, so drawn in the mapper's low colour


def _log_values(values):
    """``values`` for a log mapper: zero as ``_ZERO_STAND_IN``, other values <= 0 as NaN (no value)."""
    return np.where(values > 0, values, np.where(values == 0, _ZERO_STAND_IN, np.nan))


def scale_values(statistic, values):
    """``values`` of ``statistic`` as its ``color_scale`` takes them: on a log scale zero has no colour of its own
    (NaN: drawn as no value)."""
    values = np.asarray(values, np.float64)
    return values if statistic in LINEAR else np.where(values > 0, values, np.nan)


class Divergence:
    """How far two runs' ``statistic`` lie apart, per layer and step span: drawn by a ``HealthHeatmap`` like a grid
    (``update(divergence, statistic, linear=True)``).

    A cell is |log10 a − log10 b| (decades) for a statistic on a log scale, |a − b| for fractions and counts, of the
    two runs' largest values there (what their heatmaps colour: a spike in one run shows), outlined when either run
    held NaN/Inf. Values at or below ``floor`` count as ``floor`` on a log scale, so a dead layer's zero gradient
    against a live one shows as far apart, not as no value. Layers: ``a``'s, then those only ``b`` has; a layer or
    a statistic only one run has, or steps only one run reached, have no value. Columns are the spans between
    consecutive bucket starts of either grid: each lies in one bucket of each run (a bucket reaching to where its
    next one starts), so two runs' buckets need not line up and nothing is interpolated. Read the grids under
    whatever lock guards them: this copies what it needs."""

    def __init__(self, a, b, statistic, floor=1e-12):
        self.layers = tuple(a.layers) + tuple(layer for layer in b.layers if layer not in a.layers)
        self.statistics = (statistic,)
        ca, cb = (g.cells(statistic) if statistic in g.statistics and len(g) else None for g in (a, b))
        starts = np.union1d(*(c["first"] if c is not None else np.zeros(0, np.int64) for c in (ca, cb)))
        log = statistic not in LINEAR
        per_run = [self._spread(g, c, starts, log, floor) for g, c in ((a, ca), (b, cb))]
        with np.errstate(invalid="ignore"):
            value = np.abs(per_run[0][0] - per_run[1][0])
        ends = [c["last"][-1] for c in (ca, cb) if c is not None]
        self._cells = {"lo": value, "hi": value, "mean": value, "nonfinite": per_run[0][1] + per_run[1][1],
                       "first": starts,
                       "last": np.append(starts[1:] - 1, max(ends)) if len(starts) else starts.copy()}

    def _spread(self, grid, c, starts, log, floor):
        """A run's largest value and NaN/Inf count at each span starting at ``starts``, on ``self.layers`` rows."""
        value = np.full((len(self.layers), len(starts)), np.nan)
        bad = np.zeros_like(value)
        if c is None or not len(starts):
            return value, bad
        index = np.searchsorted(c["first"], starts, side="right") - 1       # the bucket each span lies in
        inside = (index >= 0) & (starts <= c["last"][-1])
        rows = [self.layers.index(layer) for layer in grid.layers]
        hi = c["hi"][:, np.maximum(index, 0)]
        if log:
            hi = np.log10(np.maximum(hi, floor))
        value[rows] = np.where(inside, hi, np.nan)
        bad[rows] = np.where(inside, c["nonfinite"][:, np.maximum(index, 0)], 0.0)
        return value, bad

    def __len__(self):
        return len(self._cells["first"])

    def cells(self, statistic=None):
        """As ``HealthGrid.cells``: ``lo``, ``mean`` and ``hi`` are all the divergence."""
        return self._cells


def trend_overlay_figure(sources, y_label="value"):
    """One layer's trend (``HealthGrid.trend_columns``) of several runs on one figure, each in its colour: its
    min…max envelope faint behind its mean line, and red bands the plot's height over steps that held NaN/Inf
    (``draw_bands``). ``sources``: ``(source, colour)`` pairs; each source has the ``trend_source`` columns and a
    ``run`` column, which the hover names."""
    fig = _live_figure(x_axis_label="step", y_axis_label=y_label)
    fig.xaxis.formatter = compact_ticks()
    fig.min_border_right = 16           # the last step's tick label is centred on the right edge: room for its half
    drawn = []
    for source, colour in sources:
        draw_bands(fig, source, [("min", "max", colour, 0.18)], ("mean", colour), ("step", "end", "mark"), tooltips=[
            ("run", "@run"), ("step", "@step{0,0}"), ("mean", "@mean{%0.4g}"), ("min … max", "@min{%0.4g} … @max{%0.4g}"),
            ("NaN/Inf", "@nonfinite{0,0}")])
        drawn += fig.y_range.renderers          # (draw_bands sets the range to follow its own renderers)
    fig.y_range.renderers = drawn
    return fig


class AlertGroups:
    """Alerts grouped by kind and layer as they arrive: a group's first and last step, its count and its newest
    message. It holds one entry a (kind, layer) however long the run, so a broken net that raises the same alerts
    every step stays a few rows. ``columns()``: the groups, the one seen last first: ``first`` and ``step`` (its first
    and newest step),
    ``steps`` ("first … last"), ``count``, ``kind``, ``layer`` (empty for the whole network) and ``message``."""

    def __init__(self, alerts=()):
        self._groups = {}               # (kind, layer) -> [first, last, count, newest message]
        self.add(alerts)

    def add(self, alerts):
        """Take ``alerts`` (``HealthAlert``s, or any ``(kind, layer, step, message)`` rows) into their groups;
        returns those that started a group (a kind on a layer not seen before)."""
        first, groups = [], self._groups
        for alert in alerts:             # a converged net's update ratio: one a call, so kept lean
            kind, layer, step, message = alert
            step = int(step)
            key = (str(kind), str(layer or ""))
            group = groups.get(key)
            if group is None:
                first.append(alert)
                groups[key] = [step, step, 1, message]
                continue
            if step >= group[1]:
                group[1], group[3] = step, message
            elif step < group[0]:
                group[0] = step
            group[2] += 1
        return first

    def __len__(self):
        return len(self._groups)

    def layers(self):
        """The layers some alert named."""
        return {layer for _, layer in self._groups}

    def kind_counts(self):
        """``{kind: how many alerts of it}``, over every layer."""
        counts = {}
        for (kind, _), group in self._groups.items():
            counts[kind] = counts.get(kind, 0) + group[2]
        return counts

    def columns(self):
        rows = sorted(self._groups.items(), key=lambda item: -item[1][1])
        return {"first": [g[0] for _, g in rows], "step": [g[1] for _, g in rows],
                "steps": [f"{g[0]:,}" if g[0] == g[1] else f"{g[0]:,} … {g[1]:,}" for _, g in rows],
                "count": [g[2] for _, g in rows], "kind": [k for (k, _), _ in rows], "layer": [ly for (_, ly), _ in rows],
                "message": [str(g[3]) for _, g in rows]}


def heatmap_svg(grid, statistic, width=900):
    """``HealthHeatmap`` of ``statistic`` as one self-contained ``<svg>`` (no script; names escaped), for what a saved
    notebook shows without a kernel (``plots.static`` has no colour mappers): the same cells, scale (``value_range``)
    and colours (Viridis, log or linear as ``LINEAR`` says; pink for a zero on a log scale, grey for no value, red
    outlines over NaN/Inf), step ticks and a colour bar labelled by ``plots.static``'s rules, which the live figure's
    BokehJS code follows. A row's neighbouring cells of one colour are drawn as one rectangle, which keeps long runs
    small."""
    c = grid.cells(statistic)
    hi, bad = c["hi"], c["nonfinite"]
    n_layers, n_buckets = hi.shape
    linear = statistic in LINEAR
    low, high = value_range(hi, linear)
    unit = Scale(low, high, not linear, 0.0, 1.0)(hi)                # where in the palette; NaN: no value
    zero = (hi == 0) if not linear else np.zeros(hi.shape, bool)     # below every colour of the log scale
    shade = np.where(np.isfinite(unit), np.clip(unit * 255, 0, 255), np.where(zero, -2, -1))
    shade = np.round(shade).astype(int)
    rows_height = max(row_px(n_layers) * n_layers, MIN_ROWS_HEIGHT)
    row_height = rows_height / max(n_layers, 1)
    # the names fit left of the cells (ResNet-50's "Resnet-res2_0_branch2a" ran past a fixed 100 px, cut)
    left, top, right = float(max(100, label_px(grid.layers))), 20.0, 56.0
    bottom = top + rows_height
    height = bottom + 34
    ends = _bucket_ends(c)          # a cell reaches the next bucket's first step, as the live one does
    x0 = float(c["first"][0]) if n_buckets else 0.0
    x1 = float(ends[-1]) if n_buckets else 1.0
    px = (width - left - right) / max(x1 - x0, 1.0)
    x = lambda step: f"{left + (step - x0) * px:.1f}"        # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height:.0f}" width="100%" '
             f'style="max-width:{width}px;height:auto;display:block" font-family="helvetica,arial,sans-serif" '
             'font-size="10">',
             f'<text x="{left}" y="13" font-size="12" font-weight="bold">{html.escape(statistic)}</text>']
    for i, layer in enumerate(grid.layers):
        y = top + i * row_height
        parts.append(f'<text x="{left - 4}" y="{y + row_height / 2 + 3.5:.1f}" text-anchor="end">'
                     f'{html.escape(layer)}</text>')
        start = 0
        for j in range(1, n_buckets + 1):                    # one rectangle per run of equal shades
            if j < n_buckets and shade[i, j] == shade[i, start]:
                continue
            color = {-1: NO_VALUE, -2: ZERO}.get(shade[i, start]) or Viridis256[shade[i, start]]
            parts.append(f'<rect x="{x(c["first"][start])}" y="{y:.1f}" height="{row_height:.1f}" '
                         f'width="{(ends[j - 1] - c["first"][start]) * px + 0.5:.1f}" fill="{color}" '
                         'shape-rendering="crispEdges"/>')          # under the next one: no hairline seams
            start = j
        for j in np.flatnonzero(bad[i] > 0):
            parts.append(f'<rect x="{x(c["first"][j])}" y="{y + 0.75:.1f}" height="{row_height - 1.5:.1f}" '
                         f'width="{(ends[j] - c["first"][j]) * px:.1f}" fill="none" stroke="{ALARM}" '
                         'stroke-width="1.5"/>')
    # step ticks (compact labels, as the live axis's) and the colour bar (a column of Viridis cells, no gradient: a
    # gradient's id is looked up in the whole page, where another output may hide it)
    ticks, step = linear_ticks(x0, x1 - 1, max(2, int((width - left - right) // 90)))
    if step < 1:
        ticks, step = np.arange(math.ceil(x0), math.floor(x1 - 1) + 1, dtype=np.float64), 1.0
    for tick, label in zip(ticks, tick_texts(ticks, step)):
        parts += [f'<rect x="{x(tick)}" y="{bottom:.1f}" width="1" height="4" fill="#444"/>',
                  f'<text x="{x(tick)}" y="{bottom + 14:.1f}" text-anchor="middle">{label}</text>']
    bar = width - right + 8
    cells = 16
    for k in range(cells):
        parts.append(f'<rect x="{bar:.0f}" y="{bottom - (k + 1) * rows_height / cells:.1f}" width="8" '
                     f'height="{rows_height / cells + 0.5:.1f}" fill="{Viridis256[round(k * 255 / (cells - 1))]}"/>')
    _, ys, labels = axis_ticks(Scale(low, high, not linear, bottom, top), 10, False)
    for y, label in zip(ys, labels):
        parts += [f'<rect x="{bar + 8:.0f}" y="{y - 0.5:.1f}" width="3" height="1" fill="#444"/>',
                  f'<text x="{bar + 13:.0f}" y="{y + 3.5:.1f}">{label}</text>']
    scale = "linear" if linear else "log"
    parts += [f'<text x="{(left + width - right) / 2:.0f}" y="{bottom + 27:.0f}" text-anchor="middle" '
              'font-style="italic">step</text>',
              f'<text x="{width - right}" y="13" text-anchor="end" fill="#555">{scale} scale;'
              f'{" pink: 0;" if zero.any() else ""} grey: no value</text>', "</svg>"]
    return "".join(parts)
