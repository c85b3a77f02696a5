"""The HParams tab: one row per session (a run holding hparams data), its hparams and the last value of each metric.

Sessions are assembled exactly as ``flowlab.summary.read_hparams`` does (``hparams_sessions``), from the store's
``hparams`` series and the last point of the metric scalar series, so flowlab logs (hparams and metrics in the run
itself) and tensorboardX / torch logs (``add_hparams`` folders ``<run>/<timestamp>``, which the store folds into
their run) both work. Only sessions of runs the run
list shows are listed, filtered further by one regex (RE2; searched in the run name and in ``name=value`` of every
hparam).

Shown:
  * a sortable ``DataTable`` as tall as its rows (scrolling past ``MAX_TABLE_HEIGHT``); cells use ``StringFormatter``
    (text); column titles are HTML in SlickGrid's header, so they are escaped here,
  * parallel coordinates: one polyline per session across the hparam and metric axes, each axis normalised to [0, 1]
    (``Axis``: numbers linearly, or logarithmically when their positive values span more than ``LOG_RATIO``; categories
    at evenly spaced positions), labelled at several values, coloured by the chosen metric with a colour bar,
  * a scatter of a chosen hparam (log x for a log-ranged one) against the chosen metric, coloured the same way.

Brushing: drag a box over one or more axes of the parallel coordinates (the box-select tool): each axis it covers
keeps the sessions whose value lies in the box's height there (brushes on several axes combine with AND); the table
and the scatter list only those, the other lines are dimmed. Brushes are kept as value ranges (or sets of
categories), so they stay put when new sessions stretch an axis. "Clear brushes" removes them.

Selecting sessions: select rows of the table (click, shift/ctrl-click) and press "Show only these runs": the run list
then checks exactly those sessions' runs (with the parent run of a tensorboardX-style child session, which holds the
training scalars), so every tab shows only them.
"""
from __future__ import annotations

import html
import math

from bokeh.events import SelectionGeometry
from bokeh.layouts import column, row
from bokeh.models import (BasicTicker, BoxSelectTool, Button, ColorBar, ColumnDataSource, DataTable, Div, FixedTicker,
                          HoverTool, LabelSet, LinearColorMapper, PlainText, Range1d, Select, StringFormatter,
                          TableColumn, TextInput)
from bokeh.palettes import Viridis256
from bokeh.plotting import figure
from bokeh.transform import transform

from flowlab.plots.figures import LIGHT_CANVAS
from flowlab.summary.reader import hparams_sessions

from ..filters import MAX_PATTERN_CHARS, FilterError, compile_filter
from .base import View

MISSING_COLOR = "#bbbbbb"
LOG_RATIO = 20                      # positive numbers spanning more than this factor get a log axis
ROW_HEIGHT, MAX_TABLE_HEIGHT = 25, 330
DIMMED_ALPHA, LINE_ALPHA = 0.12, 0.85
MAX_DISTINCT_TICKS = 6              # an axis with at most this many well-spaced values labels each of them


# ------------------------------------------------------------------------------------------------------ pure data

def columns_of(sessions: dict) -> tuple[list, list]:
    """(hparam names, metric names): the experiment's order first, then names only some sessions have."""
    hparams, metrics = {}, {}
    for run in sorted(sessions):
        s = sessions[run]
        experiment = s.get("experiment") or {}
        for info in experiment.get("hparam_infos", []):
            hparams.setdefault(info.get("name", ""), None)
        for info in experiment.get("metric_infos", []):
            metrics.setdefault(info.get("name", {}).get("tag", ""), None)
        for name in s["hparams"]:
            hparams.setdefault(name, None)
        for name in s["metrics"]:
            metrics.setdefault(name, None)
    return list(hparams), list(metrics)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def compact(v: float) -> str:
    """A tick label: 0.001, 0.03, 128, 1.5e6, 1e-5."""
    text = f"{v:.4g}"
    return text.replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")


def nice_step(span: float, count: int = 4) -> float:
    """A 1-2-5 step giving about ``count`` intervals over ``span``."""
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * 0.999)


class Axis:
    """One axis of the parallel coordinates: where each value sits in [0, 1] (``place``), the labelled ``ticks``
    ``[(position, text)]`` with their ``tick_values``, and brushes on it.

    Numbers: from min to max (all equal: 0.5), on a log scale when all are positive and span more than
    ``LOG_RATIO``; ticks at each value when there are few (``MAX_DISTINCT_TICKS``), else at 1-2-5 steps (log: 1 and
    3 times powers of ten) plus min and max. Anything else
    (strings, booleans, a mix) is categorical: the sorted distinct values at evenly spaced positions.
    """

    def __init__(self, values):
        present = [v for v in values if v is not None]
        self.numeric = bool(present) and all(_is_number(v) for v in present)
        self.categories = [] if self.numeric else sorted({str(v) for v in present})
        finite = [float(v) for v in present if self.numeric and math.isfinite(v)]
        self.lo, self.hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
        self.log = self.lo > 0 and self.hi > LOG_RATIO * self.lo
        self.distinct = sorted({float(v) for v in finite})
        self.tick_values = self._tick_values() if self.numeric else list(self.categories)
        self.ticks = [(self.place(v), compact(v) if self.numeric else v) for v in self.tick_values]

    def _t(self, v):
        return math.log10(v) if self.log else v

    def place(self, v):
        """``v``'s position in [0, 1] (None for a missing value or NaN)."""
        if v is None:
            return None
        if not self.numeric:
            i = self.categories.index(str(v))
            return i / (len(self.categories) - 1) if len(self.categories) > 1 else 0.5
        if math.isnan(v):
            return None
        if math.isinf(v):
            return 1.0 if v > 0 else 0.0
        if self.hi == self.lo:
            return 0.5
        return (self._t(v) - self._t(self.lo)) / (self._t(self.hi) - self._t(self.lo))

    def value_at(self, p):
        """The number at position ``p`` (numeric axes)."""
        t = self._t(self.lo) + p * (self._t(self.hi) - self._t(self.lo))
        return 10 ** t if self.log else t

    def _tick_values(self):
        lo, hi = self.lo, self.hi
        if hi == lo:
            return [lo]
        places = [self.place(v) for v in self.distinct]
        if len(places) <= MAX_DISTINCT_TICKS and min(b - a for a, b in zip(places, places[1:])) >= 0.08:
            return self.distinct                            # few values (64, 128): label each one
        if self.log:
            first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
            multiples = (1, 3) if last - first <= 3 else (1,)
            stride = max(1, (last - first) // 6)             # at most about six decades labelled
            inside = [m * 10.0 ** e for e in range(first, last + 1, stride) for m in multiples]
        else:
            step = nice_step(hi - lo)
            inside = [k * step for k in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]
        inside = [float(compact(v)) for v in inside]        # 0.30000000000000004 -> 0.3
        # min and max always; the round values between, unless one would sit on top of them
        keep = [v for v in inside if lo < v < hi and min(self.place(v), 1 - self.place(v)) >= 0.08]
        return [lo] + keep + [hi]

    def brush(self, y0, y1):
        """A brush from the positions ``y0..y1``: ``("range", low, high)`` values, or ``("in", categories)``."""
        if self.numeric:
            if self.hi == self.lo:
                inside = y0 <= 0.5 <= y1
                return ("range", self.lo, self.lo) if inside else ("range", math.inf, -math.inf)
            # past an end of the axis: open-ended, so sessions that later stretch the axis there are kept
            return ("range", -math.inf if y0 <= 0 else self.value_at(y0), math.inf if y1 >= 1 else self.value_at(y1))
        return "in", frozenset(c for c in self.categories if y0 <= self.place(c) <= y1)

    def span(self, brush):
        """Where ``brush`` lies on this axis now: (bottom, top) positions, or None when it covers nothing."""
        if brush[0] == "range":
            if not self.numeric or brush[1] > brush[2]:
                return None
            clip = lambda v: min(1.02, max(-0.02, self.place(v)))      # noqa: E731
            return clip(brush[1]), clip(brush[2])
        places = [self.place(c) for c in self.categories if c in brush[1]]
        return (min(places) - 0.03, max(places) + 0.03) if places else None


def in_brush(brush, v) -> bool:
    """Whether the value ``v`` passes ``brush`` (a missing value never does)."""
    if v is None:
        return False
    if brush[0] == "range":
        if not _is_number(v):
            return False
        slack = 1e-9 * max([abs(b) for b in brush[1:] if math.isfinite(b)] + [1e-300])   # (10 ** log10 is inexact)
        return brush[1] - slack <= v <= brush[2] + slack
    return str(v) in brush[1]


def describe(name, brush) -> str:
    if brush[0] == "range":
        low, high = brush[1:]
        if low > high:
            return f"{name} (none)"
        if math.isinf(low) or math.isinf(high):
            return f"{name} any" if low == -high else (f"{name} ≤ {compact(high)}" if math.isinf(low)
                                                       else f"{name} ≥ {compact(low)}")
        return f"{name} {compact(low)}…{compact(high)}"
    return f"{name} in {{{', '.join(sorted(brush[1]))}}}"


def axis(values: list) -> tuple[list, list]:
    """Positions in [0, 1] for one axis (``None`` stays ``None``) and its tick labels ``[(position, text)]``."""
    a = Axis(values)
    return [a.place(v) for v in values], a.ticks


def parallel_coordinates(sessions: dict, runs: list, names: list) -> tuple[list, list, list]:
    """(xs, ys, axes) for ``multi_line``: one polyline per run over the axes ``names`` (("hparams"|"metrics",
    name) pairs); a missing value is NaN, which breaks the line there. ``axes[i]`` is axis i's ``Axis``."""
    ys = [[] for _ in runs]
    axes = []
    for section, name in names:
        values = [sessions[r][section].get(name) for r in runs]
        a = Axis(values)
        axes.append(a)
        for line, v in zip(ys, values):
            p = a.place(v)
            line.append(math.nan if p is None else p)
    return [list(range(len(names))) for _ in runs], ys, axes


def matches(pattern: str, run: str, hparams: dict) -> bool:
    """Whether ``pattern`` (a regex, or plain text when it is no valid regex) occurs in the run name or in one
    ``name=value`` of its hparams, case-insensitively."""
    if not pattern:
        return True
    try:                                    # RE2 (linear time): a typed pattern cannot stall the IO loop
        regex = compile_filter(pattern, ignore_case=True)
    except FilterError:
        if len(pattern) > MAX_PATTERN_CHARS:
            return False                    # over the cap even as plain text: nothing can match it
        regex = compile_filter(pattern, ignore_case=True, literal=True)
    return any(regex.search(text) for text in [run] + [f"{k}={v}" for k, v in hparams.items()])


def _cell(v):
    """Table cell: numbers stay numbers (so the column sorts numerically); the rest is text."""
    if v is None:
        return None
    if _is_number(v):
        return float(f"{v:.7g}")            # metrics are float32: show 0.9, not 0.8999999761581421
    return str(v)


def table_data(sessions: dict, runs: list, hparams: list, metrics: list) -> dict:
    """Columns ``run``, ``h<i>``, ``m<i>`` (field names never come from logs); a column holding only numbers and
    gaps is numeric with NaN gaps, any other column is text with empty gaps."""
    data = {"run": list(runs)}
    for prefix, section, names in (("h", "hparams", hparams), ("m", "metrics", metrics)):
        for i, name in enumerate(names):
            cells = [_cell(sessions[r][section].get(name)) for r in runs]
            if all(c is None or isinstance(c, float) for c in cells):
                data[f"{prefix}{i}"] = [math.nan if c is None else c for c in cells]
            else:
                data[f"{prefix}{i}"] = ["" if c is None else str(c) for c in cells]
    return data


def _number(v):
    return float(v) if _is_number(v) else math.nan


# ------------------------------------------------------------------------------------------------------ the view

class HParamsView(View):
    title = "HParams"

    def __init__(self, store):
        super().__init__(store)
        self._plugin: dict[str, dict] = {}      # run -> merged HParamsPluginData dicts (first value of a key wins)
        self._last: dict[tuple, tuple] = {}     # series key (run, tag, "scalar") -> (step, value) of its last point
        self._version = None
        self._shown = None                      # the run list's choice the table was made for
        self.sessions: dict[str, dict] = {}
        self.hparams: list[str] = []
        self.metrics: list[str] = []
        self.brushes: dict[tuple, tuple] = {}   # axis ("hparams"|"metrics", name) -> brush (see Axis.brush)
        self._axes: dict[tuple, Axis] = {}      # the parallel coordinates' axes as drawn
        self._syncing = False                   # set while the Selects' options are rewritten: no nested refresh

        self.filter = TextInput(title="Filter sessions (regex over run and name=value)", width=300,
                                name="hparams-filter")
        self.x_select = Select(title="Scatter x (hparam)", options=[], width=200)
        self.y_select = Select(title="Metric (scatter y, colour)", options=[], width=200)
        for widget in (self.filter, self.x_select, self.y_select):
            widget.on_change("value", lambda attr, old, new: None if self._syncing else self._refresh())
        self.show_only = Button(label="Show only these runs", disabled=True, width=190, name="hparams-show-only",
                                align="end")
        self.clear = Button(label="Clear brushes", disabled=True, width=120, name="hparams-clear", align="end")
        self.show_only.on_click(self._show_only)
        self.clear.on_click(self.clear_brushes)

        self.table_source = ColumnDataSource({"run": []}, name="hparams-table-source")
        self.table_source.selected.on_change("indices", lambda attr, old, new: self._selection_changed())
        self.table = DataTable(source=self.table_source, columns=[], sortable=True, height=2 * ROW_HEIGHT,
                               row_height=ROW_HEIGHT, index_position=None, reorderable=False,
                               sizing_mode="stretch_width", name="hparams-table")

        self.mapper = LinearColorMapper(palette=Viridis256, low=0, high=1, nan_color=MISSING_COLOR)
        self.lines_source = ColumnDataSource({"xs": [], "ys": [], "run": [], "value": [], "alpha": []},
                                             name="hparams-lines")
        self.ticks_source = ColumnDataSource({"x": [], "y": [], "text": []}, name="hparams-ticks")
        self.axes_source = ColumnDataSource({"x": [], "y0": [], "y1": []})
        self.points_source = ColumnDataSource({"x": [], "y": []})
        self.brush_source = ColumnDataSource({"left": [], "right": [], "bottom": [], "top": []},
                                             name="hparams-brushes")
        self.parallel = figure(title="Parallel coordinates (drag a box over an axis to brush)", height=340,
                               x_range=Range1d(-0.2, 1.5), y_range=Range1d(-0.06, 1.06), tools="reset",
                               toolbar_location="above", output_backend="canvas", sizing_mode="stretch_width",
                               min_width=500, name="hparams-parallel", styles=dict(LIGHT_CANVAS))
        self.parallel.quad(left="left", right="right", bottom="bottom", top="top", source=self.brush_source,
                           fill_color="#ffb000", fill_alpha=0.25, line_color="#d08000")
        self.parallel.segment(x0="x", x1="x", y0="y0", y1="y1", source=self.axes_source, line_color="#444444")
        lines = self.parallel.multi_line(xs="xs", ys="ys", source=self.lines_source,
                                         line_color=transform("value", self.mapper), line_width=2,
                                         line_alpha="alpha", hover_line_width=4, hover_line_alpha=1.0)
        # Brushing reads the box's geometry (SelectionGeometry); the tool selects these vertices, which support
        # rectangle hit tests (lines do not), and are drawn faintly.
        points = self.parallel.scatter(x="x", y="y", source=self.points_source, size=4, color="#444444", alpha=0.5,
                                       nonselection_alpha=0.5)
        self.box = BoxSelectTool(renderers=[points], dimensions="both")
        self.parallel.add_tools(self.box, HoverTool(renderers=[lines], tooltips=[("run", "@run")]))
        self.parallel.toolbar.active_drag = self.box
        self.parallel.on_event(SelectionGeometry, self._brushed)
        self.parallel.add_layout(LabelSet(x="x", y="y", text="text", source=self.ticks_source, x_offset=5,
                                          text_font_size="8pt", text_baseline="middle", text_color="#333333",
                                          background_fill_color="white", background_fill_alpha=0.75))
        self.color_bar = ColorBar(color_mapper=self.mapper, title="", width=12, title_text_font_size="9pt",
                                  major_label_text_font_size="8pt", name="hparams-colorbar")
        self.parallel.add_layout(self.color_bar, "right")
        self.parallel.yaxis.visible = False
        self.parallel.xgrid.visible = self.parallel.ygrid.visible = False

        self.scatter_source = ColumnDataSource({"x": [], "y": [], "run": [], "xtext": [], "ytext": []},
                                               name="hparams-scatter")
        # Ranges set from the data here: a DataRange1d over no points warns in the page ("could not set initial
        # ranges"), even in a hidden plot.
        self.scatter = figure(title="HParam vs metric", height=340, width=380, tools="pan,wheel_zoom,box_zoom,reset",
                              toolbar_location="above", output_backend="canvas", name="hparams-scatter-figure",
                              x_range=Range1d(0, 1), y_range=Range1d(0, 1), styles=dict(LIGHT_CANVAS))
        points = self.scatter.scatter(x="x", y="y", source=self.scatter_source, size=10, fill_alpha=0.85,
                                      fill_color=transform("y", self.mapper), line_color="#333333")
        self.scatter.add_tools(HoverTool(renderers=[points],
                                         tooltips=[("run", "@run"), ("x", "@xtext"), ("y", "@ytext")]))

        self.note = Div(text="No hparams in this logdir yet.", name="hparams-note")
        self.controls = row(self.filter, self.x_select, self.y_select, self.show_only, self.clear, visible=False)
        self.plots = row(self.parallel, self.scatter, sizing_mode="stretch_width", visible=False)
        self.table.visible = False
        self._layout = column(self.controls, self.note, self.table, self.plots, sizing_mode="stretch_width")

    def layout(self):
        return self._layout

    # ---------------------------------------------------------------------------------------------- store → sessions
    def update(self):
        shown = self.runs.shown()
        if shown != self._shown:                 # the run list's choice: its sessions only
            self._shown = shown
            self._refresh()
        if self.store.version == self._version:
            return
        self._version = self.store.version
        for series in self.store.series("hparams"):
            for value in self.delta(series).values:
                for key, item in value.items():
                    self._plugin.setdefault(series.run, {}).setdefault(key, item)
        for series in self.store.series("scalar"):
            if self._metric_run(series.run):     # only scalars a session may use: the run itself or a child run
                d = self.delta(series)
                best = None if d.reset else self._last.get(series.key)
                for step, value in zip(d.steps, d.values):
                    if best is None or step >= best[0]:      # the last value at the highest step, as read_hparams
                        best = (step, value)
                if best is not None:
                    self._last[series.key] = best
        sessions = hparams_sessions(self._plugin, self._scalar_tags, self._value)
        if sessions != self.sessions:
            self.sessions = sessions
            self._refresh()

    def _metric_run(self, run):
        return run in self._plugin or any(r == "." or run.startswith(r + "/") for r in self._plugin)

    def _scalar_tags(self, run):
        return [tag for (r, tag, kind) in self._last if r == run and kind == "scalar"]

    def _value(self, run, tag):
        found = self._last.get((run, tag, "scalar"))
        return None if found is None else float(found[1])

    # ---------------------------------------------------------------------------------------------- user actions
    def _brushed(self, event):
        """A box dragged on the parallel coordinates: brush every axis it covers (the nearest one if none)."""
        g = event.geometry or {}
        if not event.final or g.get("type") != "rect":
            return
        self.points_source.selected.indices = []     # the brush rectangles show the choice, not the vertices
        x0, x1 = sorted((g["x0"], g["x1"]))
        y0, y1 = sorted((g["y0"], g["y1"]))
        keys = list(self._axes)
        covered = [k for i, k in enumerate(keys) if x0 <= i <= x1]
        if not covered and keys:
            i = min(range(len(keys)), key=lambda i: abs(i - (x0 + x1) / 2))
            covered = [keys[i]] if abs(i - (x0 + x1) / 2) < 0.5 else []
        self.brush({k: (y0, y1) for k in covered})

    def brush(self, ranges):
        """Brush axes: ``{(section, name): (y0, y1)}`` in the axes' [0, 1] positions (what a dragged box does)."""
        for key, (y0, y1) in ranges.items():
            if key in self._axes:
                self.brushes[key] = self._axes[key].brush(min(y0, y1), max(y0, y1))
        self._refresh()

    def clear_brushes(self):
        self.brushes = {}
        self._refresh()

    def selected_runs(self):
        rows = self.table_source.data["run"]
        return [rows[i] for i in sorted(self.table_source.selected.indices) if i < len(rows)]

    def _selection_changed(self):
        n = len(self.selected_runs())
        self.show_only.disabled = n == 0
        self.show_only.label = f"Show only these {n} runs" if n > 1 else "Show only these runs"

    def _show_only(self):
        """Check exactly the selected sessions' runs in the run list (and the runs holding them: a tensorboardX
        session ``<run>/<time>`` keeps its training scalars in ``<run>``)."""
        sessions = self.selected_runs()
        if not sessions:
            return
        known = set(self.store.runs())
        runs = set(sessions)
        for session in sessions:
            parts = session.split("/")
            runs.update(p for p in ("/".join(parts[:i]) for i in range(1, len(parts))) if p in known)
        self.runs.check_only(sorted(runs))

    # ---------------------------------------------------------------------------------------------- sessions → models
    def _refresh(self):
        sessions = self.sessions
        self.hparams, self.metrics = columns_of(sessions)
        self._sync_selects()
        runs = [r for r in sorted(sessions) if matches(self.filter.value, r, sessions[r]["hparams"]) and
                self.runs.shows(r)]
        keys = [("hparams", n) for n in self.hparams] + [("metrics", n) for n in self.metrics]
        self.brushes = {k: b for k, b in self.brushes.items() if k in keys}
        xs, ys, axes = parallel_coordinates(sessions, runs, keys)
        self._axes = dict(zip(keys, axes))
        kept = [r for r in runs if all(in_brush(b, sessions[r][k[0]].get(k[1])) for k, b in self.brushes.items())]

        note = f"{len(kept)} of {len(sessions)} sessions" if sessions else "No hparams in this logdir yet."
        if self.brushes:
            note += "; brushed: " + ", ".join(describe(k[1], b) for k, b in self.brushes.items())
        self.note.text = html.escape(note)
        self.controls.visible = self.table.visible = bool(sessions)
        self.plots.visible = bool(runs)            # (plots with nothing to draw only warn in the page)
        self.clear.disabled = not self.brushes

        self._table(sessions, kept)
        metric = self._chosen(self.y_select, self.metrics)
        values = [_number(sessions[r]["metrics"].get(metric)) if metric else math.nan for r in runs]
        finite = [v for v in values if math.isfinite(v)]
        low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
        if high == low:
            low, high = low - 0.5, high + 0.5
        if (self.mapper.low, self.mapper.high) != (low, high):
            self.mapper.update(low=low, high=high)
        self.color_bar.title = metric or ""          # canvas text
        chosen = set(kept)
        _set(self.lines_source, {"xs": xs, "ys": ys, "run": runs, "value": values,
                                 "alpha": [LINE_ALPHA if r in chosen else DIMMED_ALPHA for r in runs]})
        _set(self.points_source, {"x": [x for line in xs for x in line], "y": [y for line in ys for y in line]})
        _set(self.ticks_source, {"x": [i for i, a in enumerate(axes) for _ in a.ticks],
                                 "y": [p for a in axes for p, _ in a.ticks],
                                 "text": [s for a in axes for _, s in a.ticks]})
        _set(self.axes_source, {"x": list(range(len(keys))), "y0": [0.0] * len(keys), "y1": [1.0] * len(keys)})
        spans = [(keys.index(k), self._axes[k].span(b)) for k, b in self.brushes.items()]
        spans = [(i, s) for i, s in spans if s is not None]
        _set(self.brush_source, {"left": [i - 0.1 for i, _ in spans], "right": [i + 0.1 for i, _ in spans],
                                 "bottom": [s[0] for _, s in spans], "top": [s[1] for _, s in spans]})
        end = max(len(keys) - 0.4, 0.6)
        if (self.parallel.x_range.start, self.parallel.x_range.end) != (-0.2, end):
            self.parallel.x_range.update(start=-0.2, end=end)
        _ticks(self.parallel.xaxis, list(range(len(keys))),
               {i: name + (" (log)" if a.log else "") for i, ((_, name), a) in enumerate(zip(keys, axes))})

        hparam = self._chosen(self.x_select, self.hparams)
        self._scatter(kept, hparam, metric, self._axes.get(("hparams", hparam)))

    def _table(self, sessions, runs):
        data = table_data(sessions, runs, self.hparams, self.metrics)
        fields = [("run", "run")] + [(f"h{i}", n) for i, n in enumerate(self.hparams)] + \
                 [(f"m{i}", n) for i, n in enumerate(self.metrics)]
        titles = [html.escape(name) for _, name in fields]      # SlickGrid writes header titles as HTML
        if [c.field for c in self.table.columns] != [f for f, _ in fields] or \
                [c.title for c in self.table.columns] != titles:
            formatter = StringFormatter(nan_format="", null_format="")
            self.table.columns = [TableColumn(field=f, title=t, formatter=formatter, sortable=True)
                                  for (f, _), t in zip(fields, titles)]
        if self.table_source.data.get("run") != data["run"]:
            self.table_source.selected.indices = []        # row indices of other rows: start again
        _set(self.table_source, data)
        height = min(MAX_TABLE_HEIGHT, ROW_HEIGHT * (max(len(runs), 1) + 1) + 20)   # (20: a horizontal scrollbar)
        if self.table.height != height:
            self.table.height = height

    def _sync_selects(self):
        self._syncing = True
        try:
            for select, names in ((self.x_select, self.hparams), (self.y_select, self.metrics)):
                if select.options != names:         # option labels are text in the browser (DOM text nodes)
                    select.options = list(names)
                if names and select.value not in names:
                    select.value = names[0]
        finally:
            self._syncing = False

    @staticmethod
    def _chosen(select, names):
        return select.value if select.value in names else None

    def _scatter(self, runs, hparam, metric, scale):
        """The chosen metric against ``hparam`` for ``runs``; x on a log scale when the hparam's parallel axis
        (``scale``, over every listed session, so brushing does not switch it) is."""
        keep = [r for r in runs if hparam is not None and metric is not None
                and self.sessions[r]["hparams"].get(hparam) is not None
                and self.sessions[r]["metrics"].get(metric) is not None]
        xvalues = [self.sessions[r]["hparams"][hparam] for r in keep]
        yvalues = [self.sessions[r]["metrics"][metric] for r in keep]
        self.scatter.visible = bool(keep)
        log, categories = False, []
        if all(_is_number(v) for v in xvalues):
            log = scale is not None and scale.log
            if log:     # log10 of the values on a linear scale, ticked at the parallel axis' values
                x = [math.log10(v) for v in xvalues]
                ticks = [math.log10(v) for v in scale.tick_values]
                _ticks(self.scatter.xaxis, ticks, {t: text for t, (_, text) in zip(ticks, scale.ticks)})
            else:
                x = [float(v) for v in xvalues]
                _ticks(self.scatter.xaxis, None, {})
        else:                       # categories at 0, 1, 2, ... labelled with their values
            categories = sorted({str(v) for v in xvalues})
            x = [float(categories.index(str(v))) for v in xvalues]
            _ticks(self.scatter.xaxis, list(range(len(categories))), dict(enumerate(categories)))
        if keep:                    # (an empty scatter is hidden: its ranges stay)
            if categories:
                _fit(self.scatter.x_range, [-0.5, len(categories) - 0.5], margin=0.0)
            else:
                _fit(self.scatter.x_range, x)
            _fit(self.scatter.y_range, [float(v) for v in yvalues])
        _label(self.scatter.xaxis[0], (hparam or "") + (" (log scale)" if log else ""))
        _label(self.scatter.yaxis[0], metric or "")
        _set(self.scatter_source, {"x": x, "y": [float(v) for v in yvalues], "run": keep,
                                   "xtext": [str(v) for v in xvalues], "ytext": [f"{v:.6g}" for v in yvalues]})


def _fit(span, values, margin=None):
    """Set a Range1d (and what Reset returns to) around ``values`` with a margin (default: 8% of their span)."""
    finite = [v for v in values if math.isfinite(v)] or [0.0]
    lo, hi = min(finite), max(finite)
    if margin is None:
        margin = 0.08 * (hi - lo) if hi > lo else max(abs(lo) * 0.1, 0.5)
    lo, hi = lo - margin, hi + margin
    if (span.start, span.end) != (lo, hi):
        span.update(start=lo, end=hi, reset_start=lo, reset_end=hi)


def _label(ax, text):
    """An axis title from logs, as plain text (a string would be parsed for $$…$$ TeX)."""
    if not isinstance(ax.axis_label, PlainText) or ax.axis_label.text != text:
        ax.axis_label = PlainText(text=text)


def label_texts(ax) -> dict:
    """An axis' tick label overrides as ``{tick: text}``."""
    return {k: v.text if isinstance(v, PlainText) else v for k, v in ax.major_label_overrides.items()}


def _ticks(axes, ticks, labels):
    """Fixed ticks with labels as plain text (``ticks`` None: Bokeh's automatic ticks); models are replaced only
    on change."""
    for ax in axes:
        if ticks is None and type(ax.ticker) is not BasicTicker:
            ax.ticker = BasicTicker()
        elif ticks is not None and (not isinstance(ax.ticker, FixedTicker) or list(ax.ticker.ticks) != ticks):
            ax.ticker = FixedTicker(ticks=ticks)
        if label_texts(ax) != labels:
            ax.major_label_overrides = {k: PlainText(text=v) for k, v in labels.items()}


def _set(source, data):
    """Send ``data`` only when it differs; cells that changed in a table of the same shape go as a patch."""
    old = source.data
    if set(old) == set(data) and all(len(old[k]) == len(data[k]) for k in data):
        patches = {}
        for key, values in data.items():
            changed = [(i, v) for i, (u, v) in enumerate(zip(old[key], values)) if not _same(u, v)]
            if changed:
                patches[key] = changed
        if patches:
            source.patch(patches)
        return
    source.data = data


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b
