"""Health tab: ``flow.watch_health`` reports (``SummaryWriter.add_health``) of two runs side by side, live.

Run A and run B are picked from the checked runs of the run list that have health reports (B may be "none"), with a
statistic and, when the runs log several, a health tag. The tab draws, all with ``flowlab.plots.health``:

- run A's and run B's layers × steps heatmaps (``HealthHeatmap``) and a **divergence** heatmap between them
  (``Divergence``: per layer and step span, decades apart for norms and magnitudes, the difference for fractions and
  counts), all three over one shared step range;
- each run's alerts (the ``<tag>/alerts`` text series) grouped by kind and layer, the latest group first, with its
  steps, count and newest message, and a count of each kind;
- for a transformer (a report with ``HealthReport.attention``: the ``<tag>/attention`` and ``<tag>/residual`` records of
  ``summary.health_log``), under each run's heatmap: its heads' attention entropy (one row per head of each attention
  block, 0 collapsed … 1 uniform, on a linear scale) and its residual sums' growth of the stream, over the same steps;
- for one layer (tap a heatmap cell, or pick it): its trend in both runs overlaid (``trend_overlay_figure``), and its
  activation, weight and gradient histograms at one step in both runs' colours, overlaid (``histogram_bars``), the
  step chosen on a slider over the steps both runs logged histograms at (snapped to the nearest one).

Data: the store folds every report of a run into its health series' ``HealthGrid`` as it reads the log (the poll
thread), so a whole run, however long, is a few hundred step buckets with no spike or NaN hidden. This view reads a
grid under the store's lock; a heatmap already drawn gets only its changed buckets (``HealthHeatmap.update``), and
the divergence and the trend (each a few hundred rows) are redrawn at most every ``REDRAW_EVERY`` seconds while only
new reports arrive (at once when a choice changes). Alerts and histograms follow their series with ``delta``.

In the page's URL (``url_state``): ``run`` (run A), ``runb``, ``stat``, ``layer`` and ``htag``; a value that names
nothing the shown runs have is ignored. ``?tab=health&run=<run>&layer=<layer>`` opens run A with that layer's trend.
Everything from logs (run, layer and tag names, alert messages) is shown as text: table cells and canvas text, or
escaped HTML.
"""
from __future__ import annotations

import html
import math
import time

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import (ColumnDataSource, DataRange1d, DataTable, Div, HTMLTemplateFormatter, Select, Slider,
                          StringFormatter, TableColumn)

from flowlab.health import STATISTICS, TRANSFORMER_STATISTICS
from flowlab.plots.data import equal_width_buckets
from flowlab.plots.figures import histogram_bars, histogram_columns, plain_figure, trend_source
from flowlab.plots.health import LINEAR, AlertGroups, Divergence, HealthHeatmap, trend_overlay_figure
from flowlab.summary.health_log import ATTENTION, ATTENTION_STATISTIC, HISTOGRAM_KINDS, PARTS, RESIDUAL

from ..runs import run_colour
from .base import View

NONE = "none"
DEFAULT_STATISTIC = "grad_norm"
REDRAW_EVERY = 1.0          # seconds between redraws of the divergence and the trend while only reports arrive
HOW_TO = ("No health reports in the shown runs: call flow.watch_health(writer=SummaryWriter(logdir)) inside a job "
          "function to log them.")
ALERT_COLUMNS = (("steps", 90), ("count", 55), ("kind", 120), ("layer", 100), ("message", 740))
ROW_HEIGHT = 46                 # px: three lines of a wrapped message
TABLE_ROWS = 6                  # alert groups shown before the table scrolls (a group is one kind on one layer)
# an alert's message wraps in its cell; ``<%- %>`` escapes what came from the log
WRAPPED = '<div style="white-space:normal;line-height:1.25;font-size:11px"><%- value %></div>'


# a transformer's records beside a report's tag, each drawn as a heatmap of one statistic, with its title
PART_SHOWN = {ATTENTION: (ATTENTION_STATISTIC, "attention entropy per head (0 collapsed, 1 uniform)"),
              RESIDUAL: ("growth", "residual stream growth per sum (output RMS / stream RMS)")}
ALERT_FIELDS = [field for field, _ in ALERT_COLUMNS]
LAYER_COLUMN_MAX = 300          # px the layer column may grow to, for long layer names


def layer_column_px(layers):
    """Pixels the alert table's layer column takes: its default, or room for the longest of ``layers`` (13px text:
    ~7 px a character, plus the cell's padding)."""
    longest = max(map(len, layers), default=0)
    return int(min(LAYER_COLUMN_MAX, max(dict(ALERT_COLUMNS)["layer"], 7 * longest + 16)))


def table_height(rows):
    """The alert table's height for ``rows`` groups: all of them up to ``TABLE_ROWS``, plus the header."""
    return max(1, min(rows, TABLE_ROWS)) * ROW_HEIGHT + 30


def _set_options(select, options):
    if list(select.options) != options:
        select.options = options


class _Side:
    """What one run (A or B) shows: its heatmap, its alert table, and what was drawn of them."""

    def __init__(self, name):
        self.name = name
        self.holder = column(Div(text=""), sizing_mode="stretch_width")
        self.heatmap = None
        self.layers = None              # the layers the heatmap was built for
        self.series = None              # the health series shown
        self.drawn = None               # (series key, epoch, grid, last step, statistic) of the heatmap
        self.alerts_key = None
        self.alert_groups = AlertGroups()   # the alerts series' rows, one a kind on a layer
        self.alert_source = ColumnDataSource(self.alert_groups.columns(), name=f"health-alerts:{name}")
        columns = [TableColumn(field=f, title=f, width=w, formatter=HTMLTemplateFormatter(template=WRAPPED)
                               if f == "message" else StringFormatter()) for f, w in ALERT_COLUMNS]
        self.table = DataTable(source=self.alert_source, columns=columns, index_position=None, height=table_height(1),
                               row_height=ROW_HEIGHT,
                               width=sum(w for _, w in ALERT_COLUMNS) + 20, autosize_mode="none", reorderable=False,
                               visible=False, name=f"health-alert-table:{name}")
        self.counts = Div(text="", disable_math=True, name=f"health-alert-counts:{name}",
                          styles={"font-size": "12px"})
        self.box = column(self.counts, self.table)
        # a transformer's attention and residual heatmaps (``PART_SHOWN``), made when its run has them
        self.parts = row(Div(text=""), sizing_mode="stretch_width", visible=False, name=f"health-parts:{name}")
        self.part_maps = {}             # part -> HealthHeatmap
        self.part_drawn = {}            # part -> (series key, epoch, grid, last step) drawn


class HealthView(View):
    """See the module doc."""
    title = "Health"
    fill_before_shown = True        # its figures (three heatmaps, a trend, histograms) reach the page in one message

    def __init__(self, store):
        super().__init__(store)
        self.run_a = Select(title="Run A", options=[], value="", width=220, name="health-run-a")
        self.run_b = Select(title="Run B", options=[NONE], value="", width=220, name="health-run-b")
        self.statistic = Select(title="Statistic", options=[], value="", width=170, name="health-statistic")
        self.layer = Select(title="Layer (or tap a heatmap)", options=[], value="", width=170, name="health-layer")
        self.tag = Select(title="Health tag", options=[], value="", width=130, visible=False, name="health-tag")
        self.message = Div(text="", disable_math=True, visible=False, name="health-message")
        self.meaning = Div(text="", disable_math=True, styles={"font-size": "12px", "color": "#666"})
        self.steps = DataRange1d(range_padding=0)       # the step axis every heatmap and the trend share
        self.sides = {"A": _Side("A"), "B": _Side("B")}
        # (figures join the page with data: BokehJS warns about a plot with nothing to range over, even a hidden one)
        self.divergence = None
        self.divergence_holder = column(Div(text=""), sizing_mode="stretch_width")
        self.detail = Div(text="", disable_math=True, name="health-detail")
        self.trend_sources = {name: self._trend_source(name) for name in self.sides}
        self.trend, self._trend_colours = None, None
        self.trend_holder = column(Div(text=""), sizing_mode="stretch_width")
        # A slider whose start equals its end is invalid in Bokeh: one step hides it (with end 1)
        self.step = Slider(title="histogram step", start=0, end=1, value=0, step=1, width=360, visible=False,
                           name="health-step")
        self.step_note = Div(text="", disable_math=True, styles={"font-size": "12px"}, name="health-step-note")
        self.hist_sources = {(what, name): ColumnDataSource({"left": [], "right": [], "top": [], "top_log": [],
                                                            "run": []}, name=f"health-hist:{what}:{name}")
                             for what in HISTOGRAM_KINDS for name in self.sides}
        self.hist_figures, self.hist_renderers = {}, {}     # made when some run first has histograms of a kind
        self.hist_row = row(Div(text=""), sizing_mode="stretch_width")
        self._histograms: dict[tuple, dict] = {}     # histogram series key -> {step: buckets}
        self._hist_drawn, self._follow_newest = None, True
        self._busy, self._again, self._b_defaulted = False, False, False
        self._trend_drawn, self._divergence_drawn, self._redrawn_at = None, None, 0.0
        self.body = column(row(self.sides["A"].holder, self.sides["B"].holder, self.divergence_holder,
                               sizing_mode="stretch_width"),
                           self.sides["A"].parts, self.sides["B"].parts,
                           self.sides["A"].box, self.sides["B"].box,
                           self.detail, self.trend_holder, row(self.step, self.step_note), self.hist_row,
                           sizing_mode="stretch_width", visible=False)
        self._root = column(row(self.run_a, self.run_b, self.tag, self.statistic, self.layer), self.meaning,
                            self.message, self.body, sizing_mode="stretch_width", name="health")
        for select in (self.run_a, self.run_b, self.tag, self.statistic, self.layer):
            select.on_change("value", lambda attr, old, new: self.update())
        self.step.on_change("value", lambda attr, old, new: self._snap_step())

    def layout(self):
        return self._root

    def url_state(self):
        """What the page's URL keeps of this tab (see ``dashboard.url_state``; values are checked in ``update``)."""
        return [("run", self.run_a, "value"), ("runb", self.run_b, "value"), ("stat", self.statistic, "value"),
                ("layer", self.layer, "value"), ("htag", self.tag, "value")]

    def _trend_source(self, name):
        source = trend_source()
        source.data = dict(source.data, run=[])
        source.name = f"health-trend:{name}"
        return source

    def _tapped(self, heatmap):
        def tapped(attr, old, new):
            if new:
                layer = heatmap.layer_at(new[0])
                heatmap.source.selected.indices = []        # (a selection would dim every other cell)
                if layer in self.layer.options:
                    self.layer.value = layer
        return tapped

    # ---------------------------------------------------------------------------------------------- choosing
    def _choose(self, shown):
        """Fit the selects to the health series of the shown runs; returns ``(series A, series B or None)``."""
        tags = sorted({s.tag for s in shown})
        _set_options(self.tag, tags)
        self.tag.visible = len(tags) > 1
        if self.tag.value not in tags:
            self.tag.value = "health" if "health" in tags else tags[0]
        by_run = {s.run: s for s in shown if s.tag == self.tag.value}
        runs = sorted(by_run)
        _set_options(self.run_a, runs)
        if self.run_a.value not in by_run:
            self.run_a.value = runs[0]
        _set_options(self.run_b, [NONE] + runs)
        if self.run_b.value not in by_run and self.run_b.value != NONE:
            others = [run for run in runs if run != self.run_a.value]     # B defaults once to another run
            self.run_b.value = others[0] if others and not self._b_defaulted else NONE
        self._b_defaulted = True
        a = by_run[self.run_a.value]
        b = by_run.get(self.run_b.value)
        with self.store.lock:
            grids = [s.grid for s in (a, b) if s is not None and s.grid is not None]
            statistics = list(dict.fromkeys(st for g in grids for st in g.statistics))
            layers = list(dict.fromkeys(layer for g in grids for layer in g.layers))
        _set_options(self.statistic, statistics)
        if self.statistic.value not in statistics:
            self.statistic.value = DEFAULT_STATISTIC if DEFAULT_STATISTIC in statistics else statistics[0]
        _set_options(self.layer, layers)
        if self.layer.value not in layers:
            self.layer.value = layers[0]
        meaning = STATISTICS.get(self.statistic.value) or TRANSFORMER_STATISTICS.get(self.statistic.value, "")
        self.meaning.text = html.escape(f"{self.statistic.value}: {meaning}" if meaning else self.statistic.value)
        return a, b

    # ---------------------------------------------------------------------------------------------- updating
    def update(self):
        """Bring the tab up to date (also what a changed choice calls: a change made while updating, such as a
        select fitted to the runs, makes one more round rather than a nested one)."""
        if self._busy:
            self._again = True
            return
        self._busy = True
        try:
            for _ in range(4):
                self._again = False
                self._update()
                if not self._again:
                    break
        finally:
            self._busy = False

    def _update(self):
        shown = [s for s in self.store.series("health") if self.runs.shows(s.run) and s.grid is not None]
        # a report's transformer records (<tag>/attention, <tag>/residual) are drawn with it, not chosen as tags
        tags = {(s.run, s.tag) for s in shown}
        shown = [s for s in shown if not any(s.tag.endswith(f"/{part}") and (s.run, s.tag[:-len(part) - 1]) in tags
                                             for part in PARTS)]
        if not shown:
            self.body.visible = False
            self.message.visible = True
            text = HOW_TO if not self.store.series("health") else \
                "None of the checked runs has health reports: check more runs in the run list."
            self.message.text = html.escape(text)
            return
        self.message.visible = False
        self.body.visible = True
        a, b = self._choose(shown)
        stat = self.statistic.value
        now = time.monotonic()
        due = now - self._redrawn_at >= REDRAW_EVERY
        changed = False
        for name, series in (("A", a), ("B", b)):
            changed |= self._draw_side(self.sides[name], series, stat)
            self._draw_parts(self.sides[name], series)
        choice = (a.key, b.key if b else None, stat)
        if choice != self._divergence_drawn or (changed and due):
            self._draw_divergence(a, b, stat)
            self._divergence_drawn = choice
        if self._draw_trend(a, b, stat, force=changed and due):
            self._redrawn_at = now
        if changed and due:
            self._redrawn_at = now
        for name, series in (("A", a), ("B", b)):
            self._follow_alerts(self.sides[name], series)
        self._draw_histograms(a, b)

    def _draw_side(self, side, series, stat):
        """Draw one run's heatmap; True when its grid has new reports."""
        side.holder.visible = series is not None
        side.box.visible = series is not None
        if series is None:
            side.series, side.drawn = None, None
            return False
        with self.store.lock:
            grid = series.grid
            if side.heatmap is None or side.layers != grid.layers:
                side.heatmap = HealthHeatmap(grid.layers)
                side.heatmap.source.name = f"health-heatmap:{side.name}"
                side.heatmap.figure.name = f"health-heatmap-figure:{side.name}"
                side.heatmap.figure.x_range = self.steps
                side.heatmap.source.selected.on_change("indices", self._tapped(side.heatmap))
                side.layers, side.drawn = grid.layers, None
                side.holder.children = [side.heatmap.figure]
            drawn = (series.key, series.epoch, grid, grid.last_step, stat)
            if drawn == side.drawn:
                return False
            side.heatmap.update(grid, stat, title=f"{side.name}: {series.run} · {stat}")
        new_reports = side.drawn is not None and side.drawn[:3] == drawn[:3]
        side.series, side.drawn = series, drawn
        return new_reports

    def _draw_parts(self, side, series):
        """Draw one run's transformer heatmaps (``PART_SHOWN``) when its reports have them."""
        shown = []
        for part, (stat, title) in PART_SHOWN.items():
            s = None if series is None else self._series_of((series.run, f"{series.tag}/{part}", "health"))
            with self.store.lock:
                grid = None if s is None else s.grid
                if grid is None or stat not in grid.statistics:
                    side.part_maps.pop(part, None)
                    side.part_drawn.pop(part, None)
                    continue
                heatmap = side.part_maps.get(part)
                if heatmap is None or heatmap.layers != grid.layers:
                    heatmap = side.part_maps[part] = HealthHeatmap(grid.layers)
                    heatmap.source.name = f"health-{part}:{side.name}"
                    heatmap.figure.name = f"health-{part}-figure:{side.name}"
                    heatmap.figure.x_range = self.steps
                    side.part_drawn.pop(part, None)
                drawn = (s.key, s.epoch, grid, grid.last_step)
                if drawn != side.part_drawn.get(part):
                    heatmap.update(grid, stat, title=f"{side.name}: {series.run} · {title}")
                    side.part_drawn[part] = drawn
            shown.append(heatmap.figure)
        if [id(f) for f in shown] != [id(f) for f in side.parts.children]:
            side.parts.children = shown or [Div(text="")]
        side.parts.visible = bool(shown)

    def _draw_divergence(self, a, b, stat):
        if b is None:
            self.divergence, self.divergence_holder.children = None, [Div(text="")]
            return
        with self.store.lock:
            divergence = Divergence(a.grid, b.grid, stat)
        if self.divergence is None or divergence.layers != self.divergence.layers:
            self.divergence = HealthHeatmap(divergence.layers)
            self.divergence.source.name = "health-divergence"
            self.divergence.figure.name = "health-divergence-figure"
            self.divergence.figure.x_range = self.steps
            self.divergence.source.selected.on_change("indices", self._tapped(self.divergence))
            self.divergence_holder.children = [self.divergence.figure]
        unit = "|A − B|" if stat in LINEAR else "decades apart"
        self.divergence.update(divergence, stat, linear=True, title=f"A vs B · {stat} ({unit})")

    def _draw_trend(self, a, b, stat, force):
        layer = self.layer.value
        wanted = (a.key, b.key if b else None, stat, layer)
        if wanted == self._trend_drawn and not force:
            return False
        self._trend_drawn = wanted
        any_value = False
        for name, series in (("A", a), ("B", b)):
            source = self.trend_sources[name]
            columns = None
            with self.store.lock:
                grid = series.grid if series is not None else None
                if grid is not None and layer in grid.layers and stat in grid.statistics:
                    columns = grid.trend_columns(layer, stat)
            if columns is None:
                source.data = {k: [] for k in source.data}
                continue
            any_value |= bool(np.isfinite(columns["max"]).any())
            source.data = dict(columns, run=[series.run] * len(columns["step"]))
        colours = tuple(run_colour(self.store, s.run) if s is not None else "#777777" for s in (a, b))
        if colours != self._trend_colours:          # each run's trend in its colour
            self.trend = trend_overlay_figure([(self.trend_sources[n], c) for n, c in zip(self.sides, colours)],
                                              y_label=stat)
            self.trend.name = "health-trend"
            self.trend.x_range = self.steps
            self._trend_colours = colours
        self.trend.yaxis.axis_label = stat
        runs = " ".join(f'<span style="color:{run_colour(self.store, s.run)}">&#9632;</span> {html.escape(s.run)}'
                        for s in (a, b) if s is not None)
        self.detail.text = f"<b>{html.escape(layer)}</b> · {html.escape(stat)} &nbsp; {runs}"
        # a plot with nothing to range over makes BokehJS warn: the trend joins the page when it has a value
        self.trend_holder.children = [self.trend] if any_value else [
            Div(text=html.escape(f"No value of {stat} for layer {layer} in these runs."), disable_math=True)]
        return True

    def _follow_alerts(self, side, series):
        if series is None:
            return
        key = (series.run, f"{series.tag}/alerts", "text")
        if key != side.alerts_key:
            side.alerts_key, side.alert_groups = key, AlertGroups()
            self._seen.pop(key, None)
            side.alert_source.data = side.alert_groups.columns()
            side.counts.text = f"<b>{html.escape(series.run)}</b>: no alerts."
            side.table.visible = False
        text = self._series_of(key)
        if text is None:
            return
        d = self.delta(text)
        if not (d.reset or d.steps):
            return
        if d.reset:
            side.alert_groups = AlertGroups()
        for step, value in zip(d.steps, d.values):      # only the delta's rows join their groups
            rows = np.asarray(value, dtype=object).reshape(-1, 3) if np.size(value) % 3 == 0 else np.zeros((0, 3))
            side.alert_groups.add((str(kind), str(layer), int(step), str(message)) for kind, layer, message in rows)
        groups = side.alert_groups.columns()
        side.alert_source.data = groups
        height = table_height(len(groups["kind"]))
        if side.table.height != height:
            side.table.height = height
        # The layer column fits the longest layer named (ResNet-50's "Resnet-res5_2_branch2b" was cut at 100 px);
        # the message column gives up what it takes, so the table keeps its width.
        layer_px = layer_column_px(groups["layer"])
        layer_column, message_column = side.table.columns[ALERT_FIELDS.index("layer")], side.table.columns[-1]
        if layer_column.width != layer_px:
            message_column.width = dict(ALERT_COLUMNS)["message"] - (layer_px - dict(ALERT_COLUMNS)["layer"])
            layer_column.width = layer_px
        counts = side.alert_groups.kind_counts()
        sampled = text.offered - len(text)         # the store keeps an even sample of a long run's alert steps
        side.counts.text = f"<b>{html.escape(series.run)}</b>: " + (", ".join(
            f"{html.escape(kind)} × {n:,}" for kind, n in sorted(counts.items())) if counts else "no alerts.") + (
            f" (in the {len(text):,} of {text.offered:,} steps with alerts kept: an even sample)" if sampled > 0 else "")
        side.table.visible = len(side.alert_groups) > 0

    def _series_of(self, key):
        for s in self.store.series(key[2]):
            if s.key == key:
                return s
        return None

    # ---------------------------------------------------------------------------------------------- histograms
    def _histogram_steps(self, series, layer):
        """``{what: {step: buckets}}`` of one run's histograms of ``layer`` (followed with ``delta``)."""
        out = {}
        for what in HISTOGRAM_KINDS:
            key = (series.run, f"{series.tag}/{layer}/{what}", "histogram")
            s = self._series_of(key)
            if s is None:
                continue
            d = self.delta(s)
            kept = self._histograms.setdefault(key, {})
            if d.reset:
                kept.clear()
            kept.update((int(step), buckets) for step, buckets in zip(d.steps, d.values))
            out[what] = kept
        return out

    def _draw_histograms(self, a, b):
        layer = self.layer.value
        runs = [(name, s) for name, s in (("A", a), ("B", b)) if s is not None]
        by_run = {name: self._histogram_steps(s, layer) for name, s in runs}
        steps = [sorted({step for kept in by_run[name].values() for step in kept}) for name, _ in runs]
        common = sorted(set(steps[0]).intersection(*steps[1:])) or sorted(set().union(*steps))
        if not common:
            self.step.visible = False
            self.step_note.text = html.escape(f"No histograms of layer {layer} yet (watch_health logs them every "
                                              f"histogram_every-th report).")
            self.hist_row.children = [Div(text="")]
            self._hist_drawn = None
            return
        gap = math.gcd(*np.diff(common).tolist()) if len(common) > 1 else 1
        if len(common) > 1:
            self.step.update(start=common[0], end=common[-1], step=gap, visible=True)
        else:
            self.step.update(start=0, end=1, visible=False)
        chosen = common[-1] if self._follow_newest else self._nearest(common, self.step.value)
        if len(common) > 1 and self.step.value != chosen:
            self.step.value = chosen
        wanted = (tuple(s.key for _, s in runs), layer, chosen,
                  tuple(len(k) for r in by_run.values() for k in r.values()))
        if wanted == self._hist_drawn:
            return
        self._hist_drawn = wanted
        shown, notes = [], []
        for what in HISTOGRAM_KINDS:
            drawn = False
            for name, series in runs:
                kept = by_run[name].get(what, {})
                source = self.hist_sources[what, name]
                if not kept:
                    source.data = {k: [] for k in source.data}
                    continue
                self._hist_figure(what)
                at = self._nearest(sorted(kept), chosen)
                buckets = equal_width_buckets(kept[at])      # (a health log's are; another writer's may not be)
                columns = histogram_columns({"left": buckets[:, 0], "right": buckets[:, 1], "top": buckets[:, 2]})
                source.data = dict(columns, run=[f"{series.run} (step {at:,})"] * len(buckets))
                colour = run_colour(self.store, series.run)
                glyph = self.hist_renderers[what, name].glyph
                glyph.fill_color = glyph.line_color = colour
                drawn = drawn or len(buckets) > 0
                if at != chosen:
                    notes.append(f"{series.run}: {what} at step {at:,}")
            for name in self.sides:
                if name not in by_run:
                    self.hist_sources[what, name].data = {k: [] for k in self.hist_sources[what, name].data}
            if drawn:
                shown.append(self.hist_figures[what])
        self.hist_row.children = shown or [Div(text="")]
        # the slider shows the step; say it where there is no slider, and where a run shows another step
        self.step_note.text = html.escape("; ".join(([f"histograms at step {chosen:,}"] if len(common) < 2 else [])
                                                    + [f"nearest for {note}" for note in notes]))

    def _hist_figure(self, what):
        """The figure of ``what`` histograms, both runs' bars on it (made once: a tab opened on a log without
        histograms does not pay for three figures)."""
        if what not in self.hist_figures:
            fig = plain_figure(what, height=190, sizing_mode="stretch_width", min_width=220, x_axis_label="value",
                               y_axis_label="count")
            fig.name = f"health-hist-figure:{what}"
            for name in self.sides:
                self.hist_renderers[what, name] = histogram_bars(fig, self.hist_sources[what, name], alpha=0.45,
                                                                 tooltips=[("run", "@run")])
            fig.y_range.start = 0
            self.hist_figures[what] = fig
        return self.hist_figures[what]

    @staticmethod
    def _nearest(steps, step):
        return min(steps, key=lambda s: (abs(s - step), s))

    def _snap_step(self):
        """The slider moved: show the nearest step with histograms (and follow new steps when at the end)."""
        if self._busy:                  # (moved by update itself)
            return
        self._follow_newest = self.step.value >= self.step.end
        self.update()
