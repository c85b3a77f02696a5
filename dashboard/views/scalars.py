"""Scalars tab: one card per tag, one line per run, as TensorBoard draws them.

Each line keeps this session's full copy of its series (NumPy arrays) and shows at most ``limit`` points of it: the
min and max of each bucket of consecutive points, so spikes survive downsampling. Zooming (a ``RangesUpdate`` from
the browser) adds the exact points of the visible range when there are fewer than ``limit`` of them. New points are
streamed (``ColumnDataSource.stream``); the data are replaced only on a store reset, a zoom, a smoothing change or
when a line has streamed past twice its budget (it is then downsampled again).

Smoothing is TensorBoard's debiased exponential moving average, computed server-side over the full series (so it
does not depend on what is on display) and carried forward incrementally as points stream in. Changing the x axis
(step / relative / wall) or the log-y toggle rebuilds the figures over the same data sources.

Run names and tags reach the page as Bokeh titles and tooltip fields (plain text) and in two Divs, escaped: the
run key (a colour per run, the same in every session of a server) and the filter error.
"""
from __future__ import annotations

import html
import math
import weakref

import numpy as np
from bokeh.events import RangesUpdate
from bokeh.layouts import column, row
from bokeh.models import (Button, ColumnDataSource, CustomJS, DataRange1d, Div, HoverTool, RadioButtonGroup, Slider,
                          Switch, TextInput)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from ..filters import FilterError, compile_filter
from .base import View

LIMIT = 2000                       # points per line on display
X_AXES = ("step", "relative", "wall")
_X_COLUMN = {"step": "step", "relative": "rel", "wall": "wall"}
_X_LABEL = {"step": "step", "relative": "hours since the run's first point", "wall": "wall time"}


def ema(values, weight, state=(0.0, 0)):
    """TensorBoard's debiased EMA of ``values`` continued from ``state = (last, count)``; returns
    ``(smoothed, state)``. Non-finite values pass through and do not move the average.

    Vectorised in chunks: within a chunk, last_j = w^(j+1) last_0 + (1-w) w^j cumsum(w^-k v_k); chunks are short
    enough that w^-k stays far from overflow.
    """
    values = np.asarray(values, np.float64)
    last, count = float(state[0]), int(state[1])
    out = values.copy()
    finite = np.flatnonzero(np.isfinite(values))
    if finite.size == 0:
        return out, (last, count)
    f = values[finite]
    if weight <= 0:
        out[finite] = f
        return out, (float(f[-1]), count + f.size)
    chunk = max(1, int(100 * math.log(10) / -math.log(weight)))
    lasts = np.empty_like(f)
    for a in range(0, f.size, chunk):
        part = f[a:a + chunk]
        wj = weight ** np.arange(part.size)
        lasts[a:a + chunk] = wj * weight * last + (1 - weight) * wj * np.cumsum(part / wj)
        last = float(lasts[a + part.size - 1])
    counts = count + 1 + np.arange(f.size)
    out[finite] = lasts / (1 - weight ** counts)
    return out, (last, count + f.size)


def smooth(values, weight):
    """TensorBoard's smoothing of a whole series: the debiased EMA, except that a constant series stays as it is."""
    values = np.asarray(values, np.float64)
    if values.size and np.all(values == values[0]):
        return values.copy()
    return ema(values, weight)[0]


def downsample(values, limit=LIMIT):
    """Indices of at most ``limit`` points of ``values``: both ends and the min and max of each bucket of
    consecutive points (NaN is picked only where a bucket holds nothing else)."""
    n = len(values)
    if n <= limit:
        return np.arange(n)
    buckets = max(1, (limit - 2) // 2)
    size = -(-n // buckets)
    rows = np.full(buckets * size, np.nan)
    rows[:n] = values
    rows = rows.reshape(buckets, size)
    nan = np.isnan(rows)
    offsets = np.arange(buckets) * size
    lo = np.where(nan, np.inf, rows).argmin(axis=1) + offsets
    hi = np.where(nan, -np.inf, rows).argmax(axis=1) + offsets
    idx = np.concatenate([lo, hi, [0, n - 1]])
    return np.unique(idx[idx < n])


_colours: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # store -> {run: colour}


def run_colour(store, run):
    """A run's colour, the same in every session of a server: runs take palette colours in order of first sight."""
    colours = _colours.setdefault(store, {})
    if run not in colours:
        colours[run] = Category10_10[len(colours) % len(Category10_10)]
    return colours[run]


# Builds the file in the browser from the card's sources (what is on display: zoom in for every point).
_DOWNLOAD_JS = """
const rows = [];
for (let i = 0; i < sources.length; i++) {
  const d = sources[i].data;
  for (let j = 0; j < d.step.length; j++)
    rows.push({run: runs[i], step: d.step[j], wall_time: d.wall[j] / 1000, value: d.value[j]});
}
let text;
if (format === "csv") {
  const q = (s) => '"' + String(s).replace(/"/g, '""') + '"';
  text = "run,step,wall_time,value\\n" +
         rows.map((r) => [q(r.run), r.step, r.wall_time, r.value].join(",")).join("\\n") + "\\n";
} else {
  text = JSON.stringify(rows);
}
const a = document.createElement("a");
a.href = URL.createObjectURL(new Blob([text], {type: format === "csv" ? "text/csv" : "application/json"}));
a.download = (tag.replace(/[^A-Za-z0-9_.-]+/g, "_") || "scalars") + "." + format;
document.body.appendChild(a);
a.click();
a.remove();
setTimeout(() => URL.revokeObjectURL(a.href), 10000);
"""


class _Line:
    """One run in one card: this session's full series, its smoothing state and the points on display."""

    def __init__(self, run, colour, limit):
        self.run, self.colour, self.limit = run, colour, limit
        self.steps = self.walls = self.values = self.ema = np.zeros(0)
        self.state = (0.0, 0)
        self.constant = True
        self.shown = np.zeros(0, np.int64)        # indices of the points in the source
        self.renderers = []                       # raw line, smoothed line, dot (see _Card.build)
        self.source = ColumnDataSource({c: np.zeros(0) for c in ("step", "rel", "wall", "value", "smooth")})

    def x(self, axis):
        return {"step": self.steps, "relative": self._rel(self.walls), "wall": self.walls * 1000.0}[axis]

    def _rel(self, walls):
        return (walls - self.walls[0]) / 3600.0 if len(self.walls) else walls

    def _smoothed(self, idx):
        return self.values[idx] if self.constant else self.ema[idx]

    def _columns(self, idx):
        return {"step": self.steps[idx].astype(np.float64), "rel": self._rel(self.walls[idx]),
                "wall": self.walls[idx] * 1000.0, "value": self.values[idx], "smooth": self._smoothed(idx)}

    def set(self, steps, walls, values, weight):
        self.steps, self.walls = np.asarray(steps, np.int64), np.asarray(walls, np.float64)
        self.values = np.asarray(values, np.float64)
        self.resmooth(weight)

    def resmooth(self, weight):
        self.ema, self.state = ema(self.values, weight)
        self.constant = bool(len(self.values)) and bool(np.all(self.values == self.values[0]))

    def append(self, steps, walls, values, weight, axis, window):
        """Stream the new points, or redraw when the line changed shape (smoothing of a series no longer constant)
        or has streamed past twice its budget."""
        new = np.asarray(values, np.float64)
        start = len(self.values)
        self.steps = np.concatenate([self.steps, np.asarray(steps, np.int64)])
        self.walls = np.concatenate([self.walls, np.asarray(walls, np.float64)])
        self.values = np.concatenate([self.values, new])
        smoothed, self.state = ema(new, weight, self.state)
        self.ema = np.concatenate([self.ema, smoothed])
        was_constant = self.constant
        self.constant = bool(np.all(self.values == self.values[0]))
        if was_constant != self.constant or len(self.shown) + len(new) > 2 * self.limit:
            self.render(axis, window)
            return
        idx = np.arange(start, len(self.values))
        self.shown = np.concatenate([self.shown, idx])
        self.source.stream(self._columns(idx))

    def render(self, axis, window=None, lazy=False):
        """Replace the source: the downsampled series, plus the exact points of ``window`` (an x range) when the
        window holds part of the series and at most ``limit`` points. ``lazy``: skip when the points are the same
        (a pan that needs no others)."""
        idx = downsample(self.values, self.limit)
        if window is not None and len(self.values):
            x = self.x(axis)
            inside = np.flatnonzero((x >= window[0]) & (x <= window[1]))
            if 0 < inside.size < len(x):
                lo, hi = max(int(inside[0]) - 1, 0), min(int(inside[-1]) + 2, len(x))   # one point beyond each edge
                span = np.arange(lo, hi)
                if span.size > self.limit:
                    span = lo + downsample(self.values[lo:hi], self.limit)
                idx = np.union1d(idx, span)
        if lazy and np.array_equal(idx, self.shown):
            return
        self.shown = idx
        self.source.data = self._columns(idx)

    def restyle(self, weight):
        self.resmooth(weight)
        self.source.data["smooth"] = self._smoothed(self.shown)


class _Card:
    """One tag: a figure with a line per run, and download buttons."""

    def __init__(self, tag):
        self.tag = tag
        self.lines: dict[str, _Line] = {}
        self.window = None                    # the zoomed x range, if any
        self.downloads = [CustomJS(args=dict(sources=[], runs=[], tag=tag, format=fmt), code=_DOWNLOAD_JS)
                          for fmt in ("csv", "json")]
        buttons = [Button(label=f"⤓ {fmt.upper()}", width=70, height=26, button_type="light", name=f"download-{fmt}")
                   for fmt in ("csv", "json")]
        for button, callback in zip(buttons, self.downloads):
            button.js_on_event("button_click", callback)
        self.layout = column(Div(), row(*buttons), name=f"card:{tag}")

    def build(self, axis, log_y, runs, on_zoom):
        """A new figure over the lines' sources (for a new run, another x axis or y scale), showing the lines of runs
        matching ``runs``."""
        fig = figure(title=self.tag, width=400, height=270, x_axis_type="datetime" if axis == "wall" else "linear",
                     y_axis_type="log" if log_y else "linear", x_axis_label=_X_LABEL[axis],
                     x_range=DataRange1d(only_visible=True), y_range=DataRange1d(only_visible=True),
                     tools="pan,wheel_zoom,box_zoom,reset,save", output_backend="canvas")
        fig.title.text_font_size = "10pt"
        x = _X_COLUMN[axis]
        for line in self.lines.values():
            line.renderers = [
                fig.line(x, "value", source=line.source, line_color=line.colour, line_alpha=0.25, name=line.run),
                fig.line(x, "smooth", source=line.source, line_color=line.colour, line_width=2, name=line.run),
                fig.scatter(x, "smooth", source=line.source, color=line.colour, size=5, name=line.run)]
        fig.add_tools(HoverTool(mode="vline", renderers=[ln.renderers[1] for ln in self.lines.values()], tooltips=[
            ("run", "$name"), ("step", "@step{0,0}"), ("smoothed", "@smooth{%0.5g}"), ("value", "@value{%0.5g}"),
            ("time", "@wall{%F %T}")], formatters={"@smooth": "printf", "@value": "printf", "@wall": "datetime"}))
        fig.on_event(RangesUpdate, lambda event: on_zoom(self, event))
        self.show_runs(runs)                      # before the figure joins the document: no flash of hidden lines
        self.layout.children[0] = fig
        for callback in self.downloads:
            callback.args = dict(callback.args, sources=[ln.source for ln in self.lines.values()],
                                 runs=list(self.lines))
        return fig

    def show_runs(self, pattern):
        """Show the lines of runs matching ``pattern``; a series of one point shows as a dot (a line needs two)."""
        for line in self.lines.values():
            shown = pattern.search(line.run) is not None
            raw, smoothed, dot = line.renderers
            raw.visible = smoothed.visible = shown
            dot.visible = shown and len(line.values) == 1


class ScalarsView(View):
    title = "Scalars"

    def __init__(self, store, limit=LIMIT):
        super().__init__(store)
        self.limit = limit
        self.cards: dict[str, _Card] = {}
        self.run_filter = TextInput(title="Runs (regex)", placeholder="all runs", width=200, name="run-filter")
        self.tag_filter = TextInput(title="Tags (regex)", placeholder="all tags", width=200, name="tag-filter")
        self.smoothing = Slider(title="Smoothing", start=0, end=0.999, step=0.001, value=0.6, width=200,
                                name="smoothing")
        self.x_axis = RadioButtonGroup(labels=["Step", "Relative", "Wall"], active=0, name="x-axis")
        self.log_y = Switch(active=False, name="log-y")
        self.message = Div(text="", name="scalars-message")
        self.key = Div(text="", name="run-key", styles={"font-size": "12px"})
        # a wrapping row of cards; a blank Div until the first one (Bokeh warns about empty layouts)
        self.grid = row(children=[Div()], sizing_mode="stretch_width", styles={"flex-wrap": "wrap"}, spacing=12)
        self._runs_re = self._tags_re = compile_filter("")
        self._filter_error = ""
        self.run_filter.on_change("value", lambda attr, old, new: self._filter())
        self.tag_filter.on_change("value", lambda attr, old, new: self._filter())
        self.smoothing.on_change("value_throttled", lambda attr, old, new: self._resmooth())
        self.x_axis.on_change("active", lambda attr, old, new: self._rebuild())
        self.log_y.on_change("active", lambda attr, old, new: self._rebuild())

    @property
    def axis(self):
        return X_AXES[self.x_axis.active]

    def layout(self):
        controls = row(self.run_filter, self.tag_filter, self.smoothing,
                       column(Div(text="X axis"), self.x_axis), column(Div(text="Log y"), self.log_y))
        return column(controls, self.message, self.key, self.grid, sizing_mode="stretch_width")

    def update(self):
        weight = self.smoothing.value
        rebuilt = set()
        for series in self.store.series("scalar"):
            card = self.cards.get(series.tag)
            if card is None:
                card = self.cards[series.tag] = _Card(series.tag)
                self.grid.children = [self.cards[t].layout for t in sorted(self.cards)]
                card.layout.visible = self._tags_re.search(series.tag) is not None
            line = card.lines.get(series.run)
            d = self.delta(series)
            if line is None:
                line = card.lines[series.run] = _Line(series.run, run_colour(self.store, series.run), self.limit)
                rebuilt.add(card)
            if d.reset:
                line.set(d.steps, d.wall_times, d.values, weight)
                line.render(self.axis, card.window)
            elif d.steps:
                line.append(d.steps, d.wall_times, d.values, weight, self.axis, card.window)
        for card in self.cards.values():
            if card in rebuilt:
                card.build(self.axis, self.log_y.active, self._runs_re, self._zoomed)
            else:
                card.show_runs(self._runs_re)     # a series that grew past one point loses its dot
        self._show_key()
        self._show_empty()

    def _show_key(self):
        runs = sorted({run for card in self.cards.values() for run in card.lines})
        text = " ".join(
            f'<span style="white-space:nowrap;margin-right:14px;opacity:{1 if self._runs_re.search(run) else 0.35}">'
            f'<span style="color:{run_colour(self.store, run)};font-weight:bold">&#9473;&#9473;</span> '
            f'{html.escape(run)}</span>' for run in runs)
        if text != self.key.text:
            self.key.text = text

    def _show_empty(self):
        if not self._filter_error:
            text = "" if self.cards else "No scalars in this logdir yet; they appear here as soon as a run logs one."
            if self.message.text != text:
                self.message.text = text

    def _zoomed(self, card, event):
        if event.x0 is None or event.x1 is None:
            return
        card.window = (event.x0, event.x1)
        for line in card.lines.values():
            line.render(self.axis, card.window, lazy=True)

    def _rebuild(self):
        for card in self.cards.values():
            card.window = None
            for line in card.lines.values():
                line.render(self.axis)
            card.build(self.axis, self.log_y.active, self._runs_re, self._zoomed)

    def _resmooth(self):
        for card in self.cards.values():
            for line in card.lines.values():
                line.restyle(self.smoothing.value)

    def _filter(self):
        errors = []
        patterns = []
        for name, widget in (("runs", self.run_filter), ("tags", self.tag_filter)):
            try:
                patterns.append(compile_filter(widget.value or ""))
            except FilterError as e:            # RE2: linear-time matching, a typed pattern cannot stall the loop
                errors.append(f"Invalid {name} regex {widget.value!r}: {e.reason}")
                patterns.append(None)
        self._runs_re = patterns[0] or self._runs_re
        self._tags_re = patterns[1] or self._tags_re
        self._filter_error = "; ".join(errors)
        self.message.text = f'<span style="color:#c00">{html.escape(self._filter_error)}</span>' if errors else ""
        for tag, card in self.cards.items():
            card.layout.visible = self._tags_re.search(tag) is not None
            card.show_runs(self._runs_re)
        self._show_key()
        self._show_empty()
