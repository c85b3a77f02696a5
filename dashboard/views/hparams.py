"""The HParams tab: one row per session (a run holding hparams data), its hparams and the last value of each metric.

Sessions are assembled exactly as ``flowlab.summary.read_hparams`` does (``hparams_sessions``), from the store's
``hparams`` series and the last point of the metric scalar series, so flowlab logs (hparams and metrics in the run
itself) and tensorboardX / torch logs (a child run ``<run>/<timestamp>``) both work.

Shown, all filtered by one regex (searched in the run name and in ``name=value`` of every hparam):
  * a sortable ``DataTable`` (cells use ``StringFormatter``, which renders text; column titles are HTML in SlickGrid's
    header, so they are escaped here),
  * parallel coordinates: one polyline per session across the hparam and metric axes, each axis normalised to [0, 1]
    (numbers by min/max, categories at evenly spaced positions), coloured by the chosen metric,
  * a scatter of a chosen hparam against a chosen metric.
"""
from __future__ import annotations

import html
import math

from bokeh.layouts import column, row
from bokeh.models import (BasicTicker, ColumnDataSource, DataTable, Div, FixedTicker, HoverTool, LabelSet, Select,
                          StringFormatter, TableColumn, TextInput)
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from flowlab.summary.reader import hparams_sessions

from ..filters import MAX_PATTERN_CHARS, FilterError, compile_filter
from .base import View

MISSING_COLOR = "#bbbbbb"


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


def axis(values: list) -> tuple[list, list]:
    """Positions in [0, 1] for one axis (``None`` stays ``None``) and its tick labels ``[(position, text)]``.

    Numbers: linear from min to max (all equal: 0.5). Anything else (strings, booleans, a mix) is categorical:
    the sorted distinct values at evenly spaced positions.
    """
    present = [v for v in values if v is not None]
    if not present:
        return [None] * len(values), []
    if all(_is_number(v) for v in present):
        finite = [v for v in present if math.isfinite(v)]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)

        def place(v):
            if v is None or math.isnan(v):
                return None
            if hi == lo or not math.isfinite(v):
                return 0.5 if hi == lo and math.isfinite(v) else (1.0 if v > 0 else 0.0)
            return (v - lo) / (hi - lo)
        ticks = [(0.5, f"{lo:.4g}")] if hi == lo else [(0.0, f"{lo:.4g}"), (1.0, f"{hi:.4g}")]
        return [place(v) for v in values], ticks
    categories = sorted({str(v) for v in present})
    step = 1 / (len(categories) - 1) if len(categories) > 1 else 0
    where = {c: (i * step if len(categories) > 1 else 0.5) for i, c in enumerate(categories)}
    return [None if v is None else where[str(v)] for v in values], [(where[c], c) for c in categories]


def parallel_coordinates(sessions: dict, runs: list, names: list) -> tuple[list, list, list]:
    """(xs, ys, ticks) for ``multi_line``: one polyline per run over the axes ``names`` (("hparams"|"metrics",
    name) pairs); a missing value is NaN, which breaks the line there. ``ticks[i]`` are axis i's tick labels."""
    ys = [[] for _ in runs]
    ticks = []
    for section, name in names:
        positions, labels = axis([sessions[r][section].get(name) for r in runs])
        ticks.append(labels)
        for line, p in zip(ys, positions):
            line.append(math.nan if p is None else p)
    return [list(range(len(names))) for _ in runs], ys, ticks


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


def _color(position):
    if position is None or math.isnan(position):
        return MISSING_COLOR
    return Viridis256[min(255, max(0, int(position * 255)))]


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
        self._syncing = False                   # set while the Selects' options are rewritten: no nested refresh

        self.filter = TextInput(title="Filter sessions (regex over run and name=value)", width=320)
        self.x_select = Select(title="Scatter x (hparam)", options=[], width=220)
        self.y_select = Select(title="Metric (scatter y, line colour)", options=[], width=220)
        for widget in (self.filter, self.x_select, self.y_select):
            widget.on_change("value", lambda attr, old, new: None if self._syncing else self._refresh())

        self.table_source = ColumnDataSource({"run": []})
        self.table = DataTable(source=self.table_source, columns=[], sortable=True, width=900, height=260,
                               index_position=None)

        self.lines_source = ColumnDataSource({"xs": [], "ys": [], "run": [], "color": []})
        self.ticks_source = ColumnDataSource({"x": [], "y": [], "text": []})
        self.parallel = figure(title="Parallel coordinates", height=320, width=900, y_range=(-0.1, 1.1),
                               tools="pan,wheel_zoom,reset", toolbar_location="right", output_backend="canvas")
        lines = self.parallel.multi_line(xs="xs", ys="ys", source=self.lines_source, line_color="color",
                                         line_width=2, line_alpha=0.8, hover_line_width=4, hover_line_alpha=1.0)
        self.parallel.add_tools(HoverTool(renderers=[lines], tooltips=[("run", "@run")]))
        self.parallel.add_layout(LabelSet(x="x", y="y", text="text", source=self.ticks_source, x_offset=4,
                                          text_font_size="8pt", text_baseline="middle"))
        self.axes_source = ColumnDataSource({"x": [], "y0": [], "y1": []})
        self.parallel.segment(x0="x", x1="x", y0="y0", y1="y1", source=self.axes_source, line_color="#444444")
        self.parallel.yaxis.visible = False
        self.parallel.xgrid.visible = self.parallel.ygrid.visible = False

        self.scatter_source = ColumnDataSource({"x": [], "y": [], "run": [], "xtext": [], "ytext": []})
        self.scatter = figure(title="HParam vs metric", height=320, width=440, tools="pan,wheel_zoom,box_zoom,reset",
                              output_backend="canvas")
        points = self.scatter.scatter(x="x", y="y", source=self.scatter_source, size=9, fill_alpha=0.7)
        self.scatter.add_tools(HoverTool(renderers=[points],
                                         tooltips=[("run", "@run"), ("x", "@xtext"), ("y", "@ytext")]))

        self.note = Div(text="No hparams in this logdir yet.")
        self._layout = column(row(self.filter, self.x_select, self.y_select), self.note, self.table, self.parallel,
                              self.scatter)

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

    # ---------------------------------------------------------------------------------------------- sessions → models
    def _refresh(self):
        sessions = self.sessions
        self.hparams, self.metrics = columns_of(sessions)
        self._sync_selects()
        runs = [r for r in sorted(sessions) if matches(self.filter.value, r, sessions[r]["hparams"]) and
                self.runs.shows(r)]
        self.note.text = html.escape(f"{len(runs)} of {len(sessions)} sessions"
                                     if sessions else "No hparams in this logdir yet.")

        data = table_data(sessions, runs, self.hparams, self.metrics)
        fields = [("run", "run")] + [(f"h{i}", n) for i, n in enumerate(self.hparams)] + \
                 [(f"m{i}", n) for i, n in enumerate(self.metrics)]
        titles = [html.escape(name) for _, name in fields]      # SlickGrid writes header titles as HTML
        if [c.field for c in self.table.columns] != [f for f, _ in fields] or \
                [c.title for c in self.table.columns] != titles:
            formatter = StringFormatter(nan_format="", null_format="")
            self.table.columns = [TableColumn(field=f, title=t, formatter=formatter, sortable=True)
                                  for (f, _), t in zip(fields, titles)]
        _set(self.table_source, data)

        axes = [("hparams", n) for n in self.hparams] + [("metrics", n) for n in self.metrics]
        xs, ys, ticks = parallel_coordinates(sessions, runs, axes)
        metric = self._chosen(self.y_select, self.metrics)
        colors = [MISSING_COLOR] * len(runs)
        if metric is not None:
            positions, _ = axis([sessions[r]["metrics"].get(metric) for r in runs])
            colors = [_color(p) for p in positions]
        _set(self.lines_source, {"xs": xs, "ys": ys, "run": runs, "color": colors})
        _set(self.ticks_source, {"x": [i for i, t in enumerate(ticks) for _ in t],
                                 "y": [p for t in ticks for p, _ in t], "text": [s for t in ticks for _, s in t]})
        _set(self.axes_source, {"x": list(range(len(axes))), "y0": [0.0] * len(axes), "y1": [1.0] * len(axes)})
        _ticks(self.parallel.xaxis, list(range(len(axes))), {i: name for i, (_, name) in enumerate(axes)})

        self._scatter(runs, self._chosen(self.x_select, self.hparams), metric)

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

    def _scatter(self, runs, hparam, metric):
        self.scatter.xaxis.axis_label = hparam or ""
        self.scatter.yaxis.axis_label = metric or ""
        keep = [r for r in runs if hparam is not None and metric is not None
                and self.sessions[r]["hparams"].get(hparam) is not None
                and self.sessions[r]["metrics"].get(metric) is not None]
        xvalues = [self.sessions[r]["hparams"][hparam] for r in keep]
        yvalues = [self.sessions[r]["metrics"][metric] for r in keep]
        if all(_is_number(v) for v in xvalues):
            x = [float(v) for v in xvalues]
            _ticks(self.scatter.xaxis, None, {})
        else:                       # categories at 0, 1, 2, ... labelled with their values
            categories = sorted({str(v) for v in xvalues})
            x = [float(categories.index(str(v))) for v in xvalues]
            _ticks(self.scatter.xaxis, list(range(len(categories))), dict(enumerate(categories)))
        _set(self.scatter_source, {"x": x, "y": [float(v) for v in yvalues], "run": keep,
                                   "xtext": [str(v) for v in xvalues], "ytext": [f"{v:.6g}" for v in yvalues]})


def _ticks(axes, ticks, labels):
    """Fixed ticks with labels (``ticks`` None: Bokeh's automatic ticks); models are replaced only on change."""
    for ax in axes:
        if ticks is None and type(ax.ticker) is not BasicTicker:
            ax.ticker = BasicTicker()
        elif ticks is not None and (not isinstance(ax.ticker, FixedTicker) or list(ax.ticker.ticks) != ticks):
            ax.ticker = FixedTicker(ticks=ticks)
        if ax.major_label_overrides != labels:
            ax.major_label_overrides = labels


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
