"""Network health, drawn the same way in the notebook (``widgets.HealthPanel``) and the dashboard (Health tab).

Data: ``HealthGrid`` keeps a run's reports (``flow.watch_health``: a ``layers × statistics`` matrix a step) over the
whole run in ``StepBuckets``: each bucket folds, per cell, its steps' smallest and largest finite value, their sum and
count, and per layer how many NaN/Inf its tensors held (the ``*_nan``/``*_inf`` statistics). A million steps cost
what a few hundred do, and a spike or a NaN at one step stays visible.

Figures, each fed from a ``HealthGrid``:
- ``HealthHeatmap``: layers (forward order, top to bottom) × steps for one statistic. A cell is coloured by the
  largest value its steps saw (a spike is never averaged away), on a log scale for norms and magnitudes and a linear
  one for fractions and counts; a cell whose layer held NaN/Inf in those steps is outlined in red; a cell with no
  value (a layer without that statistic) is grey. Hover reads the layer, steps and min/mean/max. A tap selects a
  cell (``source.selected.indices``); ``HealthHeatmap.layer_at`` maps it back to its layer.
- ``trend_columns(grid, layer, statistic)``: one layer's statistic over steps as ``Trend`` columns, drawn by
  ``figures.trend_figure`` (min…max envelope, mean line, red bands over NaN/Inf).
- ``alert_columns``: the alert table's columns, newest first.
"""
from __future__ import annotations

import numpy as np
from bokeh.models import (BasicTickFormatter, BasicTicker, ColorBar, ColumnDataSource, CustomJSTickFormatter, FixedTicker,
                          HoverTool, LinearColorMapper, LogColorMapper, LogTicker, Quad, Range1d, TapTool)
from bokeh.palettes import Viridis256

from .data import StepBuckets, Trend
from .figures import ALARM, _figure

# Statistics whose values are fractions or counts get a linear colour scale; norms and magnitudes span decades (log).
LINEAR = frozenset({"act_zero_fraction", "dead_fraction", "act_nan", "act_inf", "weight_nan", "weight_inf",
                    "grad_nan", "grad_inf"})
NONFINITE = frozenset({"act_nan", "act_inf", "weight_nan", "weight_inf", "grad_nan", "grad_inf"})
NO_VALUE = "#d9d9d9"
ROW_HEIGHT = 18                 # pixels a layer's row takes in a heatmap
HEATMAP_COLUMNS = ("left", "right", "bottom", "top", "value", "lo", "mean", "hi", "layer", "first", "last",
                   "nonfinite", "outline")


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
        finite = pick("finite")
        with np.errstate(invalid="ignore", divide="ignore"):
            none = np.where(finite > 0, 0.0, np.nan)
            return {"lo": pick("lo") + none, "hi": pick("hi") + none, "mean": pick("sum") / finite + none,
                    "nonfinite": b.fields["bad"][rows].T.copy(), "first": b.first[rows].copy(),
                    "last": b.last[rows].copy()}

    def trend_columns(self, layer, statistic):
        """One layer's statistic over steps as ``Trend.COLUMNS`` (plus ``mark``) for ``figures.trend_figure``."""
        i = self.layers.index(layer)
        c = self.cells(statistic)
        mean = c["mean"][i]
        return {"step": c["first"].astype(np.float64), "end": c["last"].astype(np.float64) + 1.0, "mean": mean,
                "lower": mean, "upper": mean, "min": c["lo"][i], "max": c["hi"][i], "nonfinite": c["nonfinite"][i],
                "mark": np.where(c["nonfinite"][i] > 0, 1.0, np.nan)}


def trend_source():
    return ColumnDataSource({c: [] for c in Trend.COLUMNS + ("mark",)})


class HealthHeatmap:
    """A layers × steps heatmap of one statistic (see the module docstring). ``update(grid, statistic)`` refills it
    (the caller runs it where it may touch the document); ``figure`` is the Bokeh figure."""

    def __init__(self, layers, width=None, title=""):
        self.layers = tuple(layers)
        self.source = ColumnDataSource({c: [] for c in HEATMAP_COLUMNS})
        sizing = {"sizing_mode": "stretch_width", "min_width": 300} if width is None else {"width": width}
        n = len(self.layers)
        fig = _figure(title, height=ROW_HEIGHT * n + 70, x_axis_label="step", **sizing)
        fig.min_border_left = 90
        fig.y_range = Range1d(n, 0)                      # the first layer on top
        fig.yaxis.ticker = FixedTicker(ticks=[i + 0.5 for i in range(n)])
        # layer names come from logs: a formatter returns text, which the canvas draws as text (never HTML)
        fig.yaxis.formatter = CustomJSTickFormatter(args={"names": list(self.layers)},
                                                    code="return names[Math.floor(tick)] || ''")
        fig.ygrid.visible = False
        fig.xgrid.visible = False
        self.linear = LinearColorMapper(palette=Viridis256, nan_color=NO_VALUE)
        self.log = LogColorMapper(palette=Viridis256, nan_color=NO_VALUE)
        self.glyph = Quad(left="left", right="right", bottom="bottom", top="top", line_color="outline",
                          line_width=1.5, fill_color={"field": "value", "transform": self.log})
        renderer = fig.add_glyph(self.source, self.glyph)
        self.bar = ColorBar(color_mapper=self.log, width=8, padding=2, label_standoff=4, major_label_text_font_size="7pt",
                            ticker=LogTicker(), formatter=BasicTickFormatter(precision=1, power_limit_low=-2,
                                                                              power_limit_high=3))
        fig.add_layout(self.bar, "right")
        fig.add_tools(HoverTool(renderers=[renderer], tooltips=[
            ("layer", "@layer"), ("steps", "@first{0,0} … @last{0,0}"), ("min … max", "@lo{0.000e} … @hi{0.000e}"),
            ("mean", "@mean{0.000e}"), ("NaN/Inf", "@nonfinite{0,0}")]), TapTool(renderers=[renderer]))
        self.figure = fig
        self.statistic = None

    def update(self, grid, statistic):
        """Show ``statistic`` of ``grid``."""
        c = grid.cells(statistic)
        n_layers, n_buckets = c["hi"].shape
        rows = np.repeat(np.arange(n_layers), n_buckets)
        first = np.tile(c["first"], n_layers).astype(np.float64)
        last = np.tile(c["last"], n_layers).astype(np.float64)
        bad = c["nonfinite"].reshape(-1)
        hi = c["hi"].reshape(-1)
        linear = statistic in LINEAR
        value = hi if linear else np.where(hi > 0, hi, np.nan)       # log: zero has no colour of its own
        self.source.data = {
            "left": first, "right": last + 1, "bottom": rows.astype(np.float64), "top": rows + 1.0, "value": value,
            "lo": c["lo"].reshape(-1), "mean": c["mean"].reshape(-1), "hi": hi,
            "layer": [grid.layers[i] for i in rows], "first": first, "last": last, "nonfinite": bad,
            "outline": np.where(bad > 0, ALARM, None).tolist()}
        if statistic != self.statistic:
            mapper = self.linear if linear else self.log
            self.glyph.fill_color = {"field": "value", "transform": mapper}
            self.bar.color_mapper = mapper
            self.bar.ticker = BasicTicker() if linear else LogTicker()
            self.figure.title.text = statistic
            self.statistic = statistic

    def layer_at(self, index):
        """The layer of the cell at ``index`` of ``source`` (a tap's ``selected.indices[0]``)."""
        return self.source.data["layer"][index]


def alert_columns(alerts):
    """Columns ``step``, ``kind``, ``layer``, ``message`` of ``alerts`` (``HealthAlert``s, or any ``(kind, layer,
    step, message)`` rows), newest first."""
    rows = sorted(alerts, key=lambda a: -int(a[2]))
    return {"step": [int(a[2]) for a in rows], "kind": [str(a[0]) for a in rows],
            "layer": [str(a[1] or "") for a in rows], "message": [str(a[3]) for a in rows]}
