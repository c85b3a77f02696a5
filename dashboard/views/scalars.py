"""Scalars tab: one card per tag, one line per run, as TensorBoard draws them, built for a thousand runs and for
tens of thousands of tags.

Only a page of cards exists at a time (``PAGE_SIZE``, the shared ``Pager``): a card costs the server tens of
milliseconds to build and as many to join the document and be serialised, so 20,000 tags built at once held the
event loop for minutes. In a server session each card of a page is built in one IOLoop turn and joins the page in
the next, from the turn after the request, and a card that leaves the page is dropped with what the session had
seen of it. A card of more than ``RUN_SLICE`` runs is built over more turns (its runs read a slice a turn, then its
figure, then its fill), and so is what changes all of its lines (a new smoothing, x axis or scale, a zoom, new
points: the lines a slice a turn, then the fill computed, then sent): no turn holds the loop for more than ~60 ms, at
ten thousand runs or at a hundred thousand (issue 29; tests/test_dashboard_turns.py). A card is 42
Bokeh models of its own (``_Card.build``; the models every card shares are ``_Parts``): what a turn costs grows with
them, Bokeh walking every model of the document each time one joins it. The tag filter (RE2) picks among all tags
and the pager pages the matches. The "all shown" export is formatted off the loop and streamed over HTTP
(``export_stream``).

A card is one figure whose runs are rows of one ``ColumnDataSource`` drawn by two ``MultiLine`` glyphs (raw, faint;
smoothed, bold, or 1 px past ``DENSE_LINES`` runs drawn, which the page's canvas strokes four times faster): its
cost in the page and on the wire does not grow with a renderer per run (a thousand runs made ~15,000 Bokeh models
and a 40 s first page). The server sends a card's points as a few flat arrays that the page
expands into rows (see ``_Card``). Each row holds the points on display of one run: at most its share of the card's
points budget (``CARD_POINTS`` split among its runs, at most ``LIMIT`` and at least ``LINE_FLOOR`` a run:
``line_share``; split again when that share is off by more than a factor of two), chosen by
``flowlab.summary.thinning.downsample_many`` (each x bucket's first, last, min and max and its first NaN, +Inf and
-Inf), so a spike survives at any zoom; NaN and ±Inf break the line and are marked by a red tick across the plot
(the readout under the card names them). Zooming (a ``RangesUpdate`` from the browser) adds the exact points of the
visible range when there are fewer than the share. New points resend the card's flat arrays (one message); a row is
downsampled again when it has grown past twice its share. Lines read the store's columns without copying (see
``store``).

Smoothing is TensorBoard's debiased exponential moving average, computed server-side over the full series (so it
does not depend on what is on display) and carried forward incrementally as points stream in. The x axis (step /
relative / wall), the log toggles, "ignore outliers" and "link x" rebuild the figures over the same sources.

Cards sit under a header per tag group; the groups flow side by side, so groups of one card share a line rather than
each leaving the rest of its line empty. Cards come in three sizes (a control; in the URL) and one at a time can be
enlarged to the tab's width (its group then takes a line of its own); "link x"
gives every card one shared x range in the page, so zooming or panning one zooms them all (each card's
``RangesUpdate`` still brings its exact points) and reset gives back the range of all of them. Hovering a card reads
each run's value at the pointer's step into a line under the plot, nothing over the curves (``_READOUT_JS``); at rest
those lines are each run's last value.

Which runs are drawn is the run list's choice (``dashboard.runs``: checked and matching its search), applied to every
mark of a card: an index filter over its lines' and one-point dots' rows (the readout under it follows the filter), its
NaN/Inf ticks filled for the shown runs only, its groups' bands made of shown runs, and its download taking the shown
runs; each run has the list's colour. Run names and tags reach the page as Bokeh
titles and source columns (plain text); the filter error is an escaped Div.
"""
from __future__ import annotations

import html
import json
import math
from typing import NamedTuple

import numpy as np
from bokeh.core.property.validation import validate as property_validation
from bokeh.events import MouseLeave, MouseMove, RangesUpdate
from bokeh.layouts import column, row
from bokeh.models import (AllIndices, AllLabels, BasicTickFormatter, BasicTicker, BoxZoomTool, Button, CDSView,
                          ColumnDataSource, CrosshairTool, CustomJS, CustomJSTickFormatter,
                          DataRange1d, DatetimeAxis, DatetimeTicker, DatetimeTickFormatter, Div, GlyphRenderer, Grid,
                          IndexFilter, InlineStyleSheet, LinearAxis, LinearScale, LogAxis, LogScale, MultiLine,
                          PanTool, Patches, RadioButtonGroup, Range1d, ResetTool, SaveTool, Scatter, Segment,
                          Slider, Switch, TextInput, Title, UnionRenderers, VSpan, WheelZoomTool)
from bokeh.plotting import figure

from flowlab.plots.colours import run_colours
from flowlab.plots.data import group_band
from flowlab.plots.figures import (compact_ticks, expand_in_page, nudge_next_turn, scale_ticker, served,
                                   value_labels)
from flowlab.summary.summary_writer import counted_histogram
from flowlab.summary.thinning import downsample, downsample_many

from .. import export_cells
from ..export_stream import EXPORTS, export_chunks
from ..filters import FilterError, compile_filter
from ..runs import run_colour
from .base import PAGE_POLL_MS, View, no_page_yet
from .paging import Pager

LIMIT = 2000                       # points per line on display, at most
# Points a card holds and sends, in all, split evenly among its lines (``line_share``): what a card's fill, its
# joining the page and its message cost grows with them, and at 100,000 runs of 100 points (10 million points) its
# fill and its join were single turns of ~140 and ~80 ms. A line never gets fewer than ``LINE_FLOOR`` (the
# downsampler's ``LINE_FLOOR // 4`` buckets, each with its first, last, extremes and NaN/Inf: the shape, every
# bucket's spike and every kind of non-finite value stay), so a card of more than ``CARD_POINTS // LINE_FLOOR`` runs
# holds more than ``CARD_POINTS``: ~1.5 million points at 100,000 runs of 100 points.
CARD_POINTS = 300_000
LINE_FLOOR = 20
# A card costs the server some 25 ms to build and 20-40 ms to join the page (42 Bokeh models; see ``_Card.build``):
# a page of 8 (two rows of four medium cards) is built one card per IOLoop turn in a server session, and joins the
# page in the next, so no turn holds the loop for more than one card, whatever the number of tags (20,000 tags built
# every card at once: minutes).
PAGE_SIZE = 8
BUILD_BATCH = 1
# Runs of a card read per IOLoop turn while it is built (``ScalarsView._read_some``): ~20-30 ms of a 2-core machine.
RUN_SLICE = 1000
X_AXES = ("step", "relative", "wall")
_X_COLUMN = {"step": "steps", "relative": "rel", "wall": "walls"}
_X_LABEL = {"step": "step", "relative": "time since the run's first point", "wall": "wall time"}
ALARM = "#d62728"
# Card sizes (figure width, height) the size control offers; an enlarged card is as wide as the tab and this tall.
SIZES = {"S": (300, 200), "M": (400, 270), "L": (560, 380)}
ENLARGED_HEIGHT = 600
READOUT_LINES = 5                  # the hover readout's lines at most (the runs nearest the pointer)
DENSE_LINES = 1000                 # a card drawing more runs than this draws its smoothed lines 1 px wide
READOUT_LINE_PX = 15


def line_share(lines, limit=LIMIT):
    """The points each of a card's ``lines`` lines may show: ``CARD_POINTS`` split among them, at most ``limit`` and
    at least ``LINE_FLOOR`` (``limit`` when that is smaller)."""
    return max(min(limit, CARD_POINTS // max(int(lines), 1)), min(LINE_FLOOR, limit))


def choose_lines(lines, axis, window=None):
    """``line.choose(axis, window)`` for each of ``lines`` (a card's, or a slice of them), the series longer than
    their limit downsampled together (``downsample_many``: a thousand lines in a few NumPy passes, not a thousand
    calls); returns whether any line's points changed."""
    long = [line for line in lines if len(line.values) > line.limit]
    changed = False
    for line in lines:
        if len(line.values) <= line.limit:
            changed |= line.choose(axis, window)
    if not long:
        return changed
    xs = [line.x(axis) for line in long]
    picks = downsample_many(xs, [line.values for line in long], [line.limit for line in long])
    if window is not None:
        picks = _with_window(long, xs, picks, window)
    for line, idx in zip(long, picks):
        changed |= line.show(idx)
    return changed


def _with_window(lines, xs, picks, window):
    """``picks`` (each line's downsampled points) and the exact points of ``window`` (an x range) where it holds part
    of the series: one point beyond each edge, downsampled to the line's limit when more (together)."""
    spans, at = [], []
    for i, x in enumerate(xs):
        inside = np.flatnonzero((x >= window[0]) & (x <= window[1]))
        if 0 < inside.size < len(x):
            lo, hi = max(int(inside[0]) - 1, 0), min(int(inside[-1]) + 2, len(x))
            spans.append((lo, hi))
            at.append(i)
    if not at:
        return picks
    picks = list(picks)
    wide = [k for k, (lo, hi) in enumerate(spans) if hi - lo > lines[at[k]].limit]
    thinned = downsample_many([xs[at[k]][slice(*spans[k])] for k in wide],
                              [lines[at[k]].values[slice(*spans[k])] for k in wide],
                              [lines[at[k]].limit for k in wide])
    thinned = dict(zip(wide, thinned))
    for k, i in enumerate(at):
        lo, hi = spans[k]
        span = lo + thinned[k] if k in thinned else np.arange(lo, hi)
        picks[i] = np.union1d(picks[i], span)
    return picks


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


def ema_rows(series, weight):
    """``ema(values, weight)`` of each of ``series`` (arrays), from a fresh state: ``[(smoothed, state)]``. The
    series of one length whose values are all finite are smoothed together, a row each of one matrix (ten thousand
    runs of a hundred points: one NumPy pass instead of ten thousand); the others one by one."""
    out = [None] * len(series)
    by_length: dict[int, list[int]] = {}
    for i, values in enumerate(series):
        by_length.setdefault(len(values), []).append(i)
    for length, members in by_length.items():
        block = np.asarray([series[i] for i in members], np.float64).reshape(len(members), length)
        finite = np.isfinite(block).all(axis=1)
        for i in np.asarray(members)[~finite]:
            out[i] = ema(series[i], weight)
        rows = np.asarray(members)[finite]
        if not rows.size:
            continue
        block = block[finite]
        if length == 0:
            smoothed = block
        elif weight <= 0:
            smoothed = block.copy()
        else:               # ``ema``'s chunked closed form, along each row
            chunk = max(1, int(100 * math.log(10) / -math.log(weight)))
            smoothed = np.empty_like(block)
            last = np.zeros(len(block))
            for a in range(0, length, chunk):
                part = block[:, a:a + chunk]
                wj = weight ** np.arange(part.shape[1])
                smoothed[:, a:a + chunk] = (wj * weight * last[:, None]
                                            + (1 - weight) * wj * np.cumsum(part / wj, axis=1))
                last = smoothed[:, a + part.shape[1] - 1].copy()
        lasts = smoothed[:, -1] if length else np.zeros(len(block))
        if length and weight > 0:
            smoothed = smoothed / (1 - weight ** (1 + np.arange(length)))
        for k, i in enumerate(rows):
            state = (float(block[k, -1]), length) if length and weight <= 0 else (float(lasts[k]), length)
            out[i] = (smoothed[k] if length else series[i].astype(np.float64), state if length else (0.0, 0))
    return out


# Tick labels of the relative axis (hours since a run's first point) as durations: "45s", "12m 30s", "3h 20m".
_DURATION_JS = """
const s = Math.round(tick * 3600), sign = s < 0 ? "-" : "", a = Math.abs(s);
const h = Math.floor(a / 3600), m = Math.floor((a % 3600) / 60), r = a % 60;
if (h) return sign + h + "h" + (m ? " " + m + "m" : "");
if (m) return sign + m + "m" + (r ? " " + r + "s" : "");
return sign + r + "s";
"""


def wall_format():
    """Wall-clock ticks short enough for a 400-px card: times within a day, the date once the span is days."""
    return DatetimeTickFormatter(seconds="%H:%M:%S", minsec="%H:%M:%S", minutes="%H:%M", hourmin="%H:%M",
                                 hours="%H:%M", days="%b %d", months="%b %Y", years="%Y")

# Builds the file in the browser from the card's sources (what is on display: zoom in for every point), its cells
# written as the server's export writes them (``export_cells``: formulas quoted away, NaN and ±Inf kept apart).
# ±Inf reach the page as NaN in ``flat`` (gaps in the line); the marks name each non-finite point, per run and step,
# in the order of the points.
_DOWNLOAD_JS = export_cells.CELLS_JS + """
const f = flat.data, r = rows.data, m = marks.data, only = shown == null ? null : new Set(shown);
const format = cb_obj.origin.name === "download-json" ? "json" : "csv";       // the button clicked
const named = new Map(), SPECIAL = {"NaN": NaN, "+Inf": Infinity, "-Inf": -Infinity};
for (let k = 0; k < m.run.length; k++) {
  const key = m.run[k] + "\\u0000" + m.steps[k];
  if (!named.has(key)) named.set(key, []);
  named.get(key).push(m.what[k]);
}
const rows_out = [];
for (let i = 0; i < r.run.length; i++)
  for (let j = only != null && !only.has(r.run[i]) ? r.stop[i] : r.start[i]; j < r.stop[i]; j++) {
    let value = f.ys[j];
    const what = Number.isNaN(value) ? named.get(r.run[i] + "\\u0000" + f.steps[j]) : undefined;
    if (what && what.length)
      value = SPECIAL[what.shift()];
    rows_out.push({run: r.run[i], step: f.steps[j], wall_time: f.walls[j] / 1000, value: value});
  }
let text;
if (format === "csv") {
  text = "run,step,wall_time,value\\n" +
         rows_out.map((o) => [csv_text(o.run), csv_number(o.step), csv_number(o.wall_time),
                              csv_number(o.value)].join(",")).join("\\n") + "\\n";
} else {
  text = JSON.stringify(rows_out.map((o) => ({run: o.run, step: json_number(o.step),
                                               wall_time: json_number(o.wall_time), value: json_number(o.value)})));
}
const a = document.createElement("a");
a.href = URL.createObjectURL(new Blob([text], {type: format === "csv" ? "text/csv" : "application/json"}));
a.download = (tag.replace(/[^A-Za-z0-9_.-]+/g, "_") || "scalars") + "." + format;
document.body.appendChild(a);
a.click();
a.remove();
setTimeout(() => URL.revokeObjectURL(a.href), 10000);
"""


EXPORT_LIMIT = 5_000_000        # points in one "download all" file (~150 MB of CSV)
# Downloads the file the server streams for the export the button registered (``export_stream``): the page only
# follows a link, so the file never passes through the document or the websocket.
_SAVE_JS = """
const d = source.data;
if (!d.url.length) return;
const a = document.createElement("a");
a.href = d.url[0];
a.download = d.name[0];
document.body.appendChild(a);
a.click();
a.remove();
"""


def export_text(columns, fmt):
    """The whole export file of ``columns`` at once (see ``export_stream.export_chunks``, which the server streams)."""
    return "".join(export_chunks(columns, fmt))


def _column(name, doc, read=None):
    """A ``_Line`` attribute kept in its card's ``_Lines`` column ``name`` (one item per row); ``read``: what the
    stored item is turned into when read (a NumPy bool into a Python one)."""
    def get(line):
        value = line.of.columns[name][line.row]
        return value if read is None else read(value)

    def put(line, value):
        line.of.columns[name][line.row] = value
    return property(get, put, doc=doc)


class _Lines:
    """A card's lines (one per run, in row order), column by column: a NumPy array per attribute (the series' arrays,
    names and colours in arrays of objects, which the garbage collector neither tracks nor walks), and a ``_Line``
    made on each access as a view of one row. One object per run (a ``_Line`` each, 100,000 at 100,000 runs) made
    every full collection walk them all: 35-70 ms of CPU landing in a loop turn of ~30 ms (and lists, a pointer
    each to check, ~20-30 ms). A mapping of run name to ``_Line``, in row order; every line shows at most ``limit``
    points (the card's share, ``line_share``). Rows are only added."""

    # name, dtype, an empty line's value
    COLUMNS = (("run", object, ""), ("colour", object, ""), ("steps", object, None), ("walls", object, None),
               ("values", object, None), ("ema", object, None), ("last", np.float64, 0.0), ("count", np.int64, 0),
               ("constant", bool, True), ("shown", object, None))

    def __init__(self, limit):
        self.limit = limit
        self.rows: dict[str, int] = {}        # run -> row (str and int: a dict the collector does not track)
        self.columns = {name: np.empty(16, dtype) for name, dtype, _ in self.COLUMNS}
        self.size = 0
        self._rows_of, self._codes = None, np.zeros(0, np.int64)     # each line's row in the run list (``shown_in``)

    def add(self, run, colour):
        """A new line for ``run``, empty, in the next row."""
        row = self.size
        if row == len(self.columns["run"]):     # (room for twice as many rows)
            for name, column in self.columns.items():
                grown = np.empty(2 * len(column), column.dtype)
                grown[:row] = column[:row]
                self.columns[name] = grown
        empty = {"run": run, "colour": colour, "steps": _NO_STEPS, "shown": _NO_STEPS}
        for name, _, value in self.COLUMNS:
            self.columns[name][row] = empty.get(name, _NO_VALUES if value is None else value)
        self.rows[run] = row
        self.size = row + 1
        return _Line(self, row)

    def __len__(self):
        return self.size

    def __contains__(self, run):
        return run in self.rows

    def __iter__(self):
        return iter(self.rows)          # (in row order: a dict keeps the order runs were added)

    def keys(self):
        return self.rows.keys()

    def __getitem__(self, run):
        return _Line(self, self.rows[run])

    def get(self, run, default=None):
        row = self.rows.get(run)
        return default if row is None else _Line(self, row)

    def values(self, start=0, stop=None):
        """The lines of rows ``start`` to ``stop`` (every row by default), as a list of ``_Line``: made for the rows
        asked only, so take a slice of a big card's (``RUN_SLICE``), not all 100,000 at once, in a served session
        (a list of that many objects held over turns is what the collector would walk again)."""
        stop = self.size if stop is None else min(stop, self.size)
        return [_Line(self, row) for row in range(start, stop)]

    def items(self):
        return [(line.run, line) for line in self.values()]

    def shown_in(self, shown):
        """Whether each row's run is one of ``shown`` (a set of runs; the run list's ``ShownRuns``: by the list's rows,
        each line's row in the list looked up once, not each name in the set at every click)."""
        mask, rows = getattr(shown, "mask", None), getattr(shown, "rows", None)
        if mask is None or rows is None:
            return np.fromiter((run in shown for run in self.rows), bool, self.size)
        codes = self.list_rows(rows)
        out = np.zeros(self.size, bool)
        known = np.flatnonzero((codes >= 0) & (codes < len(mask)))     # (a run not listed yet is not shown)
        out[known] = mask[codes[known]]
        return out

    def list_rows(self, rows, again=True):
        """Each line's row in the run list whose run -> row is ``rows`` (-1: not listed yet), remembered: looked up
        for the lines added since, and (``again``) the ones not listed before. (A card being built looks its lines
        up a slice a turn, as it reads them: its first click does not look up 100,000 names, ~15 ms.)"""
        if self._rows_of is not rows:
            self._rows_of, self._codes = rows, np.zeros(0, np.int64)
        codes = self._codes
        runs = self.columns["run"]
        if len(codes) < self.size:
            codes = np.concatenate([codes, np.fromiter((rows.get(run, -1) for run in runs[len(codes):self.size]),
                                                       np.int64, self.size - len(codes))])
        missing = np.flatnonzero(codes < 0) if again else ()
        if len(missing):
            codes[missing] = np.fromiter((rows.get(run, -1) for run in runs[missing]), np.int64, missing.size)
        self._codes = codes
        return codes


_NO_STEPS = np.zeros(0, np.int64)
_NO_VALUES = np.zeros(0)
_NO_STEPS.flags.writeable = _NO_VALUES.flags.writeable = False      # (shared by every empty line)


class _Line:
    """One run in one card (a row of its ``_Lines``): its series (the store's columns, not copied), its smoothing and
    the points on display (at most ``limit``: the card's share, ``line_share``). A view of the row, made when asked
    for: two lines of the same row are the same run's."""

    __slots__ = ("of", "row")

    def __init__(self, of, row):
        self.of, self.row = of, row

    run = _column("run", "The run's name.")
    colour = _column("colour", "The run's colour (the run list's).")
    steps = _column("steps", "The series' steps (int64).")
    walls = _column("walls", "The series' wall times (seconds).")
    values = _column("values", "The series' values.")
    ema = _column("ema", "The smoothed values (TensorBoard's debiased EMA).")
    constant = _column("constant", "Whether every value is the first (the series is drawn as it is, unsmoothed).",
                       bool)
    shown = _column("shown", "Indices of the points on display (sorted, unique).")

    @property
    def limit(self):
        return self.of.limit

    @property
    def state(self):
        """The smoothing's ``(last, count)``, to carry it forward as points come (``ema``)."""
        columns = self.of.columns
        return float(columns["last"][self.row]), int(columns["count"][self.row])

    @state.setter
    def state(self, state):
        columns = self.of.columns
        columns["last"][self.row], columns["count"][self.row] = state

    def __eq__(self, other):
        return isinstance(other, _Line) and other.of is self.of and other.row == self.row

    def __hash__(self):
        return hash((id(self.of), self.row))

    def _rel(self, walls):
        return (walls - self.walls[0]) / 3600.0 if len(self.walls) else walls

    def x(self, axis):
        return self.steps if axis == "step" else self.walls if axis == "wall" else self._rel(self.walls)

    def shown_points(self):
        """``(steps, walls, values, smooth)`` of the shown points, as stored (slices, not copies, when every point
        is shown)."""
        smooth = self.values if self.constant else self.ema
        if len(self.shown) == len(self.values):      # (``shown`` is sorted and unique: every index)
            return self.steps, self.walls, self.values, smooth
        idx = self.shown
        return self.steps[idx], self.walls[idx], self.values[idx], smooth[idx]

    def row_columns(self):
        """The shown points of this run as the card sends them (±Inf drawn as gaps: the marks show them)."""
        idx = self.shown
        ys = self.values[idx]
        smooth = ys if self.constant else self.ema[idx]
        return {"steps": self.steps[idx].astype(np.float64), "walls": self.walls[idx] * 1000.0,
                "rel": self._rel(self.walls[idx]),
                "ys": np.where(np.isinf(ys), np.nan, ys), "smooth": np.where(np.isinf(smooth), np.nan, smooth)}

    @property
    def data(self):
        """The shown points as columns ``step, rel, wall, value, smooth`` (what the page has of this run)."""
        c = self.row_columns()
        return {"step": c["steps"], "rel": c["rel"], "wall": c["walls"], "value": self.values[self.shown],
                "smooth": self.values[self.shown] if self.constant else self.ema[self.shown]}

    def set(self, steps, walls, values, weight, smoothed=None):
        self.steps, self.walls, self.values = steps, walls, values
        self.constant = bool(len(values)) and bool(np.all(values == values[0]))
        self.resmooth(weight, smoothed)

    def resmooth(self, weight, smoothed=None):
        """Smooth the whole series again (``smoothed``: its ``(ema, state)`` when already computed, by
        ``ema_rows``)."""
        self.ema, self.state = ema(self.values, weight) if smoothed is None else smoothed

    def append(self, steps, walls, values, weight):
        """Take the grown series (``steps`` etc. are the whole of it); returns True when the shown points must be
        chosen again (smoothing of a series no longer constant, or past twice the budget), else just adds the new
        points to what is shown."""
        start = len(self.values)
        self.steps, self.walls, self.values = steps, walls, values
        new = values[start:]
        smoothed, self.state = ema(new, weight, self.state)
        self.ema = np.concatenate([self.ema, smoothed])
        was_constant = self.constant
        self.constant = was_constant and bool(np.all(new == values[0]))
        if was_constant != self.constant or len(self.shown) + len(new) > 2 * self.limit:
            return True
        self.shown = np.concatenate([self.shown, np.arange(start, len(values))])
        return False

    def choose(self, axis, window=None):
        """The points to show: the downsampled series, plus the exact points of ``window`` (an x range) when the
        window holds part of the series and at most ``limit`` points. Returns whether they changed."""
        if len(self.values) <= self.limit:      # every point, zoomed or not (what downsample and the window say)
            if len(self.shown) == len(self.values):
                return False
            self.shown = np.arange(len(self.values))
            return True
        x = self.x(axis)
        idx = downsample(x, self.values, self.limit)
        if window is not None and len(self.values):
            idx = _with_window([self], [x], [idx], window)[0]
        return self.show(idx)

    def show(self, idx):
        """Show the points ``idx`` (sorted, unique indices); returns whether they changed."""
        if np.array_equal(idx, self.shown):
            return False
        self.shown = idx
        return True


class _Packed:
    """A card's lines' shown points, one run after another, packed a slice of runs at a time as a card's runs are
    read (``add``), for ``_Card.fill``: into columns made at the start for ``capacity`` points (twice as much room
    when a slice needs more), so that the fill allocates nothing big (one that concatenated ten thousand runs' points,
    40 MB of new arrays, spent a third of its turn in the kernel, faulting their pages in). Columns: steps, walls (s),
    values (as stored: ±Inf kept), smoothed values, walls (ms); and per run, the count of its points, its series'
    first wall time and whether the series is a single point, its name and its colour (as string arrays: at 100,000
    runs, what a fill spent on them one run at a time, ~40 ms, is spread over the turns that pack)."""

    def __init__(self, capacity):
        self.columns = [np.empty(int(capacity)) for _ in range(5)]
        self.used, self.runs = 0, 0
        self._lengths, self._first_wall, self._single, self._names, self._colours = [], [], [], [], []

    @classmethod
    def of(cls, lines):
        """``lines`` packed at once."""
        packed = cls(sum(len(line.shown) for line in lines))
        packed.add(lines)
        return packed

    def add(self, lines):
        """Pack ``lines`` after those packed before."""
        parts = [line.shown_points() for line in lines]
        lengths = np.fromiter((len(p[0]) for p in parts), np.int64, len(parts))
        end = self.used + int(lengths.sum())
        if end > len(self.columns[0]):          # (past the estimate: twice as much room, what was packed kept)
            capacity = max(end, 2 * len(self.columns[0]))
            grown = [np.empty(capacity) for _ in self.columns]
            for new, old in zip(grown, self.columns):
                new[:self.used] = old[:self.used]
            self.columns = grown
        if parts:
            for k in range(4):              # (int64 steps cast to float64 as they are copied)
                np.concatenate([p[k] for p in parts], out=self.columns[k][self.used:end])
            np.multiply(self.columns[1][self.used:end], 1000.0, out=self.columns[4][self.used:end])
        self._lengths.append(lengths)
        self._first_wall.append(np.fromiter((ln.walls[0] if len(ln.walls) else 0.0 for ln in lines), np.float64,
                                            len(lines)))
        self._single.append(np.fromiter((len(ln.values) == 1 for ln in lines), bool, len(lines)))
        self._names.append(_strings([ln.run for ln in lines]))
        codes = _palette_codes()
        self._colours.append(np.fromiter((codes[ln.colour] for ln in lines), np.uint16, len(lines)))
        self.used, self.runs = end, self.runs + len(lines)

    def holds(self, runs):
        """Whether every one of a card's ``runs`` lines is packed."""
        return self.runs == runs

    def take(self):
        """``(lengths, first_wall, single, names, colours, steps, walls, values, smooth, walls_ms)`` (colours: their
        places in the runs' palette, ``_palette_codes``): the per-run
        arrays and the columns (the caller's to change: each ``_Packed`` is taken once)."""
        per_run = [np.concatenate(parts) if parts else empty for parts, empty in (
            (self._lengths, np.zeros(0, np.int64)), (self._first_wall, np.zeros(0)), (self._single, np.zeros(0, bool)),
            (self._names, _strings([])), (self._colours, np.zeros(0, np.uint16)))]
        return (*per_run, *(column[:self.used] for column in self.columns))


def _palette_codes():
    """Each run colour's place in the runs' palette (``run_colours``; a run's colour is one of them: ``run_colour``).
    A card sends its rows' colours as these (an integer array: bytes on the wire, where 100,000 colour strings were
    ~9 ms of JSON in the turn a card joins the page); the page looks them up in ``_Parts.palette``."""
    global _PALETTE_CODES
    if _PALETTE_CODES is None:
        _PALETTE_CODES = {colour: k for k, colour in enumerate(run_colours())}
    return _PALETTE_CODES


_PALETTE_CODES = None


def _strings(items):
    """``items`` (str) as a NumPy string array: Bokeh serialises it as one list that the JSON encoder writes whole."""
    return np.array(items, dtype=str) if items else np.zeros(0, dtype="<U1")


_ROW_COLUMNS = ("run", "colour", "start", "stop", "first_wall", "axis", "x0", "x1", "y0", "y1", "dot_x", "dot_y")

# Expands a card's flat columns into the MultiLine rows in the page: one typed array per column on the wire, however
# many runs (a thousand runs as a list of arrays each was 5,000 buffers and seconds of Bokeh encoding per page). The
# rows' ``axis`` is the x axis's place in ``X_AXES``, an int8 per row: bytes on the wire, where 100,000 strings
# "step" were ~8 ms of JSON in the turn a card joins the page.
_EXPAND_JS = "const AXES = " + json.dumps(X_AXES) + """;
const f = flat.data, r = rows.data, n = r.run.length, axis = AXES[r.axis[0]];
const xs = [], ys = [], smooth = [];
for (let i = 0; i < n; i++) {
  const a = r.start[i], b = r.stop[i];
  const walls = f.walls.slice(a, b);      // copies: BokehJS may read a subarray's whole underlying buffer
  xs.push(axis === "step" ? f.steps.slice(a, b) : axis === "wall" ? walls
          : walls.map((w) => (w - r.first_wall[i]) / 3600000));
  ys.push(f.ys.slice(a, b));
  smooth.push(f.smooth.slice(a, b));
}
const names = palette.data.colour;          // (each row's colour: its place in the runs' palette)
target.data = {run: r.run.slice(), colour: Array.from(r.colour, (k) => names[k]), xs, ys, smooth,
               dot_x: r.dot_x.slice(), dot_y: r.dot_y.slice()};
"""

# The readout under a card, in place of a tooltip over the curves: one line per drawn run (and run group) with its
# colour, name, step and smoothed value (NaN/±Inf named). Under the pointer: each run's point nearest the pointer's x,
# the runs nearest its y when there are more than ``lines``; otherwise (a legend): each run's last point. Listed top
# curve first. Written into the readout's own DOM, not its ``text``: a model change would lay out the whole page
# again on every mouse move (and nothing goes to the server). Names come from logs: escaped.
_READOUT_JS = """
if (cb_obj === readout) {               // resized: it draws itself again (after this), empty: fill it after that
  setTimeout(() => again.execute(source), 0);
  return;
}
const fig = card.children[0], view = cb_context.index.find_one(readout);
const box = view == null ? null : view.shadow_el.querySelector(".readout");
if (box == null || fig.renderers == null) return;              // (not built yet: a placeholder)
const hover = cb_obj.event_name === "mousemove" && Number.isFinite(cb_obj.x);
const plot = hover ? cb_context.index.find_one(fig) : null;
if (hover && plot == null) return;
const x = hover ? cb_obj.x : Infinity, near = 30;             // px: a run's end this close still counts
const sx = (v) => plot.frame.x_scale.compute(v);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => "&#" + c.charCodeAt(0) + ";");
const num = (v) => {
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : String(Number(v.toPrecision(5)));
};
// The index of the point of xs (ascending) nearest x on screen, -1 when x is beyond its ends by more than near.
const nearest = (xs) => {
  const n = xs.length;
  if (!n || !hover) return n - 1;
  let lo = 0, hi = n;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid + 1; else hi = mid; }
  let j = Math.min(lo, n - 1);
  if (lo > 0 && Math.abs(sx(xs[lo - 1]) - cb_obj.sx) <= Math.abs(sx(xs[j]) - cb_obj.sx)) j = lo - 1;
  return (x < xs[0] || x > xs[n - 1]) && Math.abs(sx(xs[j]) - cb_obj.sx) > near ? -1 : j;
};
const found = [];
const d = source.data, f = flat.data, r = rows.data, m = marks.data, g = bands.data;
const keep = fig.renderers[0].view.filter.indices;             // null: every row is drawn
for (const i of keep == null ? d.run.map((_, k) => k) : keep) {
  if (d.xs[i] == null) continue;
  const j = nearest(d.xs[i]);
  if (j < 0) continue;
  const step = f.steps[r.start[i] + j], raw = f.ys[r.start[i] + j];
  let text = num(d.smooth[i][j]);
  if (!Number.isFinite(raw)) {                                 // (±Inf travel as NaN: the marks name them)
    const k = m.run.findIndex((run, q) => run === d.run[i] && m.steps[q] === step);
    text = k < 0 ? "NaN" : m.what[k];
  }
  found.push({name: d.run[i], colour: d.colour[i], step, value: d.smooth[i][j], text});
}
for (let i = 0; i < g.group.length; i++) {
  const j = nearest(g.xs[i]);
  if (j >= 0)
    found.push({name: g.group[i] + " (" + g.runs[i] + " runs)", colour: g.colour[i],
                step: r.axis[0] === 0 ? g.xs[i][j] : null, value: g.ys[i][j], text: num(g.ys[i][j])});
}
const height = (o) => Number.isFinite(o.value) ? o.value : -Infinity;
const top = (a, b) => height(b) - height(a);
const off = (o) => Number.isFinite(o.value) ? Math.abs(plot.frame.y_scale.compute(o.value) - cb_obj.sy) : Infinity;
const shown = found.length <= lines ? found : found.sort(hover ? (a, b) => off(a) - off(b) : top).slice(0, lines);
shown.sort(top);
box.className = hover ? "readout" : "readout idle";
const step = (o) => o.step == null ? "" : "step " + Math.round(o.step).toLocaleString("en-US");
box.innerHTML = shown.map((o) => '<div class="line"><span class="swatch" style="background:' + esc(o.colour) +
  '"></span><span class="name">' + esc(o.name) + '</span><span class="step">' + step(o) +
  '</span><span class="value">' + esc(o.text) + "</span></div>").join("");
"""
_READOUT_CSS = """
.bk-clearfix { display: block !important; }
.readout { max-width: 480px; font: 11px/15px sans-serif; color: var(--flowlab-ink, #333);
           font-variant-numeric: tabular-nums; }
.line { display: flex; align-items: center; gap: 6px; white-space: nowrap; }
.swatch { flex: none; width: 8px; height: 8px; border-radius: 2px; }
.name { flex: 1 1 auto; min-width: 0; overflow: hidden; text-overflow: ellipsis; }
.step { flex: none; color: var(--flowlab-muted, #777); }
.value { flex: none; min-width: 4.5em; text-align: right; font-weight: 600; }
.idle .value { font-weight: normal; }
"""


class _Parts:
    """Models every card of one view (one document) shares, because the page keeps no per-card state in them: the
    sources' selection policy, the "every row" filter, scales, tickers,
    tick formatters, label policy, grids, the box-zoom overlay's handles and the readout's stylesheet. Made per card
    they were half of a card's ~100 Bokeh models, and a card's models are what its loop turn costs: building them,
    Bokeh's walk over every model of the document when the card joins it, and serialising them."""

    def __init__(self):
        self.policy, self.all_rows = UnionRenderers(), AllIndices()
        self.labels = AllLabels()
        self.handles = BoxZoomTool().overlay.handles           # (Bokeh's default look: built by its own default)
        self.readout_css = InlineStyleSheet(css=_READOUT_CSS)
        # the runs' palette, which the cards' rows name colours by (``_palette_codes``): sent once per page
        self.palette = self.source({"colour": list(run_colours())})
        self._made = {}

    def _one(self, key, make):
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def source(self, data, **kwargs):
        return ColumnDataSource(data, selection_policy=self.policy, **kwargs)

    def scale(self, log):
        return self._one(("scale", log), LogScale if log else LinearScale)

    def x_ticks(self, axis, log):
        """(ticker, formatter) of an x axis: steps (whole, compact: 200k), durations since a run's start, wall-clock
        times; on a log scale every decade or its 1-2-5 multiples labelled (BokehJS's own gives "1" and "0.5" over
        1.5 decades)."""
        if axis == "wall":
            return (self._one("wall-ticker", lambda: DatetimeTicker(desired_num_ticks=5)),
                    self._one("wall-labels", wall_format))
        ticker = self._one("log-ticker", scale_ticker) if log else \
            self._one(("x-ticker", axis), lambda: BasicTicker(desired_num_ticks=5,
                                                              min_interval=1 if axis == "step" else 0.0))
        if axis == "relative":
            return ticker, self._one("durations", lambda: CustomJSTickFormatter(code=_DURATION_JS))
        return ticker, (self._one("value-labels", value_labels) if log else self._one("steps", compact_ticks))

    def y_ticks(self, log):
        if log:
            return self._one("log-ticker", scale_ticker), self._one("value-labels", value_labels)
        return self._one("y-ticker", BasicTicker), self._one("y-labels", BasicTickFormatter)

    def grid(self, dimension, ticker):
        """A grid on ``ticker``'s ticks: the same model in every card (it keeps no state of its own)."""
        return self._one(("grid", dimension, ticker.id), lambda: Grid(dimension=dimension, ticker=ticker))


class _Card:
    """One tag: a figure drawing every run as a row of one MultiLine source, a red tick at each NaN/Inf, the hover
    readout under it, downloads and the enlarge button.

    The server sends ``flat`` (the shown points of every run, one after another: ``steps``, ``walls`` in ms, ``ys``,
    ``smooth``) and ``rows`` (per run: ``run``, ``colour`` (its place in ``_Parts.palette``), ``start``/``stop`` in
    ``flat``, ``first_wall``, the x ``axis`` (its place in ``X_AXES``), the box its shown points span on that axis,
    ``x0``..``y1``, and ``dot_x``/``dot_y``, the point of a run that has only one, which a line cannot draw; NaN
    otherwise); the page expands them into ``source`` (``_EXPAND_JS``), which the lines and the dots draw. ±Inf
    travel as NaN (gaps: the ticks show them). ``layout`` is ``column(figure, readout, buttons)``. ``parts`` are the view's shared models (``_Parts``)."""

    def __init__(self, tag, parts, limit=LIMIT):
        self.tag, self.parts = tag, parts
        # each line's points on display: ``share`` (``line_share`` of its lines, ``limit`` at most), split again when
        # the lines outgrow it (``split``)
        self.limit = self.share = limit
        self.lines = _Lines(self.share)        # run -> its ``_Line``, in row order
        self.packed = None                    # its lines' points packed as they were read, for its first fill
        self.read_from = None                 # the store's version when its runs began to be read
        self.grown = False                    # lines changed by a ``_grow`` still under way (over several turns)
        self.grow_at = 0                      # the run (of its tag's series) where that ``_grow`` goes on
        self.looked_at = None                 # the store's version when its last ``_grow`` pass began
        self.window = None                    # the zoomed x range, if any
        # tagged: the page re-emits it once the document is ready (app.READY_JS), expanding a card that arrived full
        self.flat = parts.source({c: np.zeros(0) for c in ("steps", "walls", "ys", "smooth")})
        self.rows = parts.source({c: [] for c in _ROW_COLUMNS})
        # filled in the page only: never synced back (the server would get every expanded point of every run)
        self.source = parts.source({c: [] for c in ("run", "colour", "xs", "ys", "smooth", "dot_x", "dot_y")},
                                   syncable=False)
        self.marks = parts.source({c: [] for c in ("run", "colour", "steps", "walls", "rel", "what")})
        # the page rebuilds the drawn rows whenever either part changes (new points, another x axis)
        expand = CustomJS(args=dict(flat=self.flat, rows=self.rows, target=self.source, palette=parts.palette),
                          code=_EXPAND_JS)
        expand_in_page(self.flat, self.source, expand)
        self.rows.js_on_change("data", expand)
        self.axis = "step"
        self._visible = (None, [])             # (shown runs, line count), rows shown
        self._mask = (None, None)              # (shown runs, line count), whether each line is shown
        # the shown points' values, per-run counts, per-run lowest and highest finite value (NaN: none) (fill)
        self._points = (np.zeros(0), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
        # the shown NaN/±Inf points (``fill``): row, step, wall, value, its run's first wall; every row's run, colour
        self._nonfinite = (np.zeros(0, np.int64), *[np.zeros(0)] * 4, _strings([]), np.zeros(0, np.uint16))
        # run groups: a mean line and a band (± std or min-max) per group, built on the server (few points)
        self.bands = parts.source({c: [] for c in ("group", "runs", "colour", "xs", "ys", "band_xs", "band_ys")})
        self.grouped = frozenset()             # runs drawn as part of a group, not as lines of their own
        self.y_range = None
        self.rows_shown = None                 # rows of the runs shown (None: all), for the y range
        self.ignore_outliers = False
        self.renderers = []
        self._wanted, self._extras = set(), {}     # what the card draws besides its lines (``_draw_extra``)
        # one filter, the runs shown, for the drawn rows (``source``) and the per-run rows (``rows``)
        self.filter = IndexFilter(None)
        # both buttons: the format is the clicked button's (its name)
        self.shown = None                      # the runs the run list shows (None: every run)
        self._marked_for = None                # the (shown, grouped) the ticks were filled for
        self._download_runs = None             # the runs the download takes (None: all), as last sent
        self.download = CustomJS(args=dict(flat=self.flat, rows=self.rows, marks=self.marks, tag=tag, shown=None),
                                 code=_DOWNLOAD_JS)
        buttons = [Button(label=f"⤓ {fmt.upper()}", width=70, height=26, button_type="light", name=f"download-{fmt}")
                   for fmt in ("csv", "json")]
        for button in buttons:
            button.js_on_event("button_click", self.download)
        self.size, self.enlarged = SIZES["M"], False
        self.enlarge = Button(label="⤢", width=30, height=26, button_type="light", name="enlarge")
        # never synced back: the page writes the hover readout into its DOM, not into its text
        self.readout = Div(text='<div class="readout"></div>', syncable=False, stylesheets=[parts.readout_css],
                           height=READOUT_LINE_PX, margin=(0, 5, 0, 5))
        self.layout = column(Div(), self.readout, row(*buttons, self.enlarge), name=f"card:{tag}")
        self.show_values = CustomJS(args=dict(readout=self.readout, card=self.layout, source=self.source,
                                              flat=self.flat, rows=self.rows, marks=self.marks, bands=self.bands,
                                              lines=READOUT_LINES), code=_READOUT_JS)
        self.show_values.args = dict(self.show_values.args, again=self.show_values)
        for source in (self.source, self.bands):         # the last values, as the lines change
            source.js_on_change("data", self.show_values)
        for prop in ("width", "height", "sizing_mode"):   # (the readout's view draws itself again, empty)
            self.readout.js_on_change(prop, self.show_values)
        self.filter.js_on_change("indices", self.show_values)
        self._apply_size()

    @property
    def figure(self):
        """The card's figure (None until it is built)."""
        fig = self.layout.children[0]
        return None if isinstance(fig, Div) else fig

    def resize(self, size=None, enlarged=None):
        """Give the card another ``size`` (width, height) or make it ``enlarged`` (as wide as the tab, and tall) or
        not: the figure keeps its data and its ranges (zoom)."""
        self.size = self.size if size is None else size
        self.enlarged = self.enlarged if enlarged is None else enlarged
        self._apply_size()

    def _apply_size(self):
        width, height = self.size
        stretch = "stretch_width" if self.enlarged else "fixed"
        # flex-basis 100%: in the group's wrapping row, the enlarged card takes a line of its own, all of it
        self.layout.update(sizing_mode="stretch_width" if self.enlarged else None,
                           styles={"flex": "1 1 100%"} if self.enlarged else {})
        self.readout.update(sizing_mode=stretch, width=width - 10)
        self.enlarge.update(label="⤡" if self.enlarged else "⤢", html_attributes={
            "title": "back to the card size" if self.enlarged else "enlarge to the tab's width"})
        fig = self.figure
        if fig is not None:
            fig.update(sizing_mode=stretch, width=width, height=ENLARGED_HEIGHT if self.enlarged else height)

    def _size_readout(self):
        """Room for one line per run, up to ``READOUT_LINES``: the card does not change height as the pointer moves."""
        height = READOUT_LINE_PX * min(max(len(self.lines), 1), READOUT_LINES)
        if self.readout.height != height:
            self.readout.height = height

    def line(self, run, store):
        line = self.lines.get(run)
        if line is None:
            line = self.lines.add(run, run_colour(store, run))
            self._size_readout()
        return line

    def split(self, lines=None, force=False):
        """Split the card's points budget (``CARD_POINTS``) among ``lines`` lines (None: those it has): when the
        share each line had is off by more than a factor of two (or ``force``), each line gets the new one; its
        points must then be chosen again (``choose_lines``). Returns whether the share changed. (The slack: a run
        coming now and then does not have every line chosen again; the card holds at most twice its budget.)"""
        want = line_share(len(self.lines) if lines is None else lines, self.limit)
        if want == self.share or not force and want <= 2 * self.share and self.share <= 2 * want:
            return False
        self.share = self.lines.limit = want
        return True

    def fill(self, packed=None):
        """Send every run's shown points for the card's ``axis`` (two messages for the card, whatever changed: the
        per-run ``rows``, then the points, ``flat``, on whose arrival the page expands them). Built from the runs'
        points concatenated, with no NumPy work per run beyond taking them: ten thousand runs are one pass.
        ``packed``: the lines' points already packed (``_Packed``: a card built over several turns packs each slice
        of runs as it reads them), else they are packed now. Names and colours go as NumPy string arrays, which
        Bokeh hands to the JSON encoder whole (a list of ten thousand names was encoded one string at a time: most
        of the message's cost). ``send(prepare(packed))``: a big card's fill is two turns, one computing, one
        sending (at 100,000 runs each ~30-50 ms)."""
        self.send(self.prepare(packed))

    def prepare(self, packed=None):
        """What ``fill`` sends, computed (NumPy over the packed points), not sent: for ``send``, in this turn or the
        next (if the card's lines changed meanwhile, its fill is asked for again)."""
        n = len(self.lines)
        if packed is None or not packed.holds(n):
            packed = _Packed.of(self.lines.values())
        lengths, first_wall, single, runs, colours, steps, walls, values, smooth, walls_ms = packed.take()
        stops = np.cumsum(lengths)
        starts = stops - lengths
        # the shown NaN/±Inf points, for the ticks (``_fill_marks``): their run (row), step, wall time and value
        bad = np.flatnonzero(~np.isfinite(values))
        owner = np.searchsorted(stops, bad, side="right")
        nonfinite = (owner, steps[bad], walls[bad], values[bad], first_wall[owner], runs, colours)
        values[np.isinf(values)] = np.nan           # (the packed columns are this fill's own)
        smooth[np.isinf(smooth)] = np.nan
        ys = values
        flat = {"steps": steps, "walls": walls_ms, "ys": ys, "smooth": smooth}
        x = steps if self.axis == "step" else walls_ms if self.axis == "wall" else \
            (walls - np.repeat(first_wall, lengths)) / 3600.0
        # numbers as arrays (binary on the wire): lists of ten thousand runs' numbers were most of a page's encoding
        rows = {"run": runs, "colour": colours, "start": starts.astype(np.int32), "stop": stops.astype(np.int32),
                "first_wall": first_wall * 1000.0, "axis": np.full(n, X_AXES.index(self.axis), np.int8)}
        rows.update(self._extent_and_dots(single, lengths, starts, x, ys, smooth))
        return rows, flat, nonfinite, (values, lengths, rows["y0"], rows["y1"])

    def send(self, prepared):
        """Send what ``prepare`` computed: the rows, then the points, the ticks, the y range and the line width."""
        rows, flat, self._nonfinite, self._points = prepared
        # the runs' names, colours and axis go again only when they changed (a new smoothing, new points or a zoom
        # changes none of them: at 100,000 runs they were ~30 ms of JSON a fill); the page merges the columns sent
        # into the ones it has (a ``ColumnDataChanged`` of some columns) and expands the rows as after any change
        current = self.rows.data
        kept = [k for k in ("run", "colour", "axis") if isinstance(current[k], np.ndarray)
                and len(current[k]) == len(rows[k]) and np.array_equal(current[k], rows[k])]
        if kept:
            self.rows.data.update({k: v for k, v in rows.items() if k not in kept})
        else:
            self.rows.data = rows
        if np.isfinite(rows["dot_x"]).any():
            self._draw_extra("dots")
        self.flat.data = flat            # after rows: the page expands when flat arrives
        self._fill_marks()
        self.scale_y()
        self._fit_line_width()

    def line_width(self):
        """The smoothed lines' width: 2 px, 1 px when the card draws more than ``DENSE_LINES`` runs (the page's
        canvas strokes 10,000 lines of 100 points in ~1.9 s 2 px wide, ~0.45 s 1 px wide, and that many lines are
        a band of colour either way)."""
        drawn = len(self.lines) if self.rows_shown is None else len(self.rows_shown)
        return 1 if drawn > DENSE_LINES else 2

    def _fit_line_width(self):
        if len(self.renderers) == 2 and self.renderers[1].glyph.line_width != self.line_width():
            self.renderers[1].glyph.line_width = self.line_width()

    def scale_y(self):
        """The y range: around a constant series, a span of a fifth of its value (BokehJS would make one up); with
        ``ignore_outliers`` (a ``Range1d`` then), the 5th to 95th percentile of the shown runs' points on display,
        padded, as TensorBoard's option of that name."""
        rows = self.rows_shown
        values, lengths, lowest, highest = self._points
        if not isinstance(self.y_range, Range1d):
            # the span alone, from each shown run's lowest and highest (``_extent_and_dots``; fmin and fmax pass over
            # NaN): no copy of the points (at 100,000 runs, taking the shown runs' 1.5 million was ~20-50 ms a click)
            if rows is not None:
                rows = np.asarray(rows, np.intp)
                rows = rows[rows < len(lowest)]         # (rows of lines come since the last fill: not drawn yet)
                lowest, highest = lowest[rows], highest[rows]
            lo, hi = float(np.fmin.reduce(lowest, initial=np.inf)), float(np.fmax.reduce(highest, initial=-np.inf))
            if not (math.isfinite(lo) and math.isfinite(hi)):
                return
        else:
            if rows is not None:
                keep = np.zeros(len(lengths), bool)
                keep[np.asarray(rows, np.intp)] = True
                values = values[np.repeat(keep, lengths)]
            values = values[np.isfinite(values)]
            if not values.size:
                return
            lo, hi = float(values.min()), float(values.max())
        if isinstance(self.y_range, DataRange1d):     # (its start and end are read once, when the page makes it)
            span = abs(lo) * 0.2 or 1.0 if lo == hi else 2.0     # (the span it gives a constant; 2 by default)
            if self.y_range.default_span != span:
                self.y_range.default_span = span
        elif self.y_range is not None:
            if lo != hi:
                lo, hi = (float(v) for v in np.percentile(values, [5, 95]))
            pad = (hi - lo) * 0.05 or abs(hi) * 0.1 or 1.0
            self.y_range.update(start=lo - pad, end=hi + pad)

    @staticmethod
    def _extent_and_dots(single, lengths, starts, x, ys, smooth):
        """Per run (a row each, as the drawn rows: the run list's filter applies), on the card's axis (``x``, the
        shown points' x of every run one after another, as ``ys`` and ``smooth``): the box its shown points span,
        which the ranges have at the first paint, before the page has expanded the lines (BokehJS warns "could not
        set initial ranges" when it cannot); and its point when it has only one (``single``: its series is one point;
        a dot: a line needs two), else NaN."""
        n = len(lengths)
        some = np.flatnonzero(lengths > 0)

        def per_run(reduce, column):        # a run without points (or without finite values, for y): NaN
            out = np.full(n, np.nan)
            if some.size:
                out[some] = reduce.reduceat(column, starts[some])
            return out
        columns = {"x0": per_run(np.minimum, x), "x1": per_run(np.maximum, x),
                   # (±Inf are NaN in ys already; fmin/fmax skip NaN)
                   "y0": per_run(np.fmin, ys), "y1": per_run(np.fmax, ys)}
        one = single & (lengths == 1)
        at = np.minimum(starts, max(len(x) - 1, 0))
        columns["dot_x"] = np.where(one, x[at], np.nan) if len(x) else np.full(n, np.nan)
        columns["dot_y"] = np.where(one, smooth[at], np.nan) if len(x) else np.full(n, np.nan)
        return columns

    def _fill_marks(self):
        """The red ticks of NaN/Inf points of the runs shown (a group's members' too: the group's band holds them), one
        row each (run, step, what): a run the run list hides has none, filled here for the shown runs, not filtered
        in the page. The download is told the shown runs too."""
        shown = self.shown
        self._marked_for = (shown, self.grouped)
        owner, steps, walls, values, first_wall, runs, colours = self._nonfinite
        mask = self.shown_mask(shown)[:len(runs)]         # (the rows of the last fill: lines are only added)
        if shown is not None and len(owner):
            keep = mask[owner]
            owner, steps, walls, values, first_wall = (a[keep] for a in (owner, steps, walls, values, first_wall))
        marks = {"run": runs[owner].tolist(), "colour": [run_colours()[k] for k in colours[owner].tolist()],
                 "steps": steps.tolist(),
                 "walls": (walls * 1000.0).tolist(), "rel": ((walls - first_wall) / 3600.0).tolist(),
                 "what": np.where(np.isnan(values), "NaN", np.where(values > 0, "+Inf", "-Inf")).tolist()}
        if marks != dict(self.marks.data):
            self.marks.data = marks
        if marks["run"]:
            self._draw_extra("marks")
        # the card's runs the download takes (None: all of them; else this card's shown runs, however many runs the
        # logdir has)
        runs = None if shown is None or mask.all() else runs[mask]
        if not _same_rows(self._download_runs, runs):   # (a string array: a list of 9,999 names cost ~60 ms to send)
            self._download_runs = runs
            self.download.args = dict(self.download.args, shown=runs)

    def build(self, axis, log_y, visible_rows, on_zoom, log_x=False, x_range=None, attach=True):
        """A new figure over the card's sources (for another x axis or scale), at the card's size. ``x_range``: a
        range the figure shares with other cards (linked x zoom), else its own. ``attach`` False: the card keeps
        showing its figure until ``attach(figure)`` (building the figure and its joining the page are then two
        turns' work, not one).

        Only what the card draws and the shared parts (``_Parts``): ``figure()``'s own defaults and plotting methods
        made ~60 models a card (a selection and a muted glyph per renderer, tickers, grids, scales...), and a card's
        models are what its loop turns cost. Glyph renderers keep BokehJS's own selection and muted glyphs
        ("auto"). The dots of one-point runs, the run groups' bands and means, and the NaN/Inf ticks are drawn from
        when a card first has them (``_draw_extra``): most cards never do."""
        parts = self.parts
        log_x = log_x and axis != "wall"
        self.axis = axis
        with property_validation(False):     # (``visible_rows``: int32 rows, which Bokeh would check one by one)
            self.filter.indices = visible_rows
        self._views = {"lines": CDSView(filter=self.filter), "rows": CDSView(filter=self.filter)}
        raw = self._draw(self.source, MultiLine(xs="xs", ys="ys", line_color="colour", line_alpha=0.25), "lines")
        smoothed = self._draw(self.source, MultiLine(xs="xs", ys="smooth", line_color="colour",
                                                     line_width=self.line_width()),
                              "lines")
        extent = self._draw(self.rows, Segment(x0="x0", y0="y0", x1="x1", y1="y1"), "rows", visible=False)
        # (a shared range takes every renderer of its cards: the same x as these)
        self._x_renderers, self._y_renderers = [raw, extent], [raw, smoothed, extent]
        # The figure and its fitted ranges are not synced back: nothing on the server reads what the page computes
        # for them (fitted starts and ends, the plot's inner size), and applying those patches cost the server three
        # messages a card. (A zoom still reaches it: ``RangesUpdate`` is an event.)
        x_range = DataRange1d(renderers=list(self._x_renderers), syncable=False) if x_range is None else x_range
        y_range = Range1d(0, 1) if self.ignore_outliers else \
            DataRange1d(renderers=list(self._y_renderers), syncable=False)
        # hover: the readout under the plot, not a tooltip over the curves (see _READOUT_JS), and a thin vertical
        # line at the pointer, the x it reads (drawn on the overlay canvas: the lines are not drawn again)
        box_zoom = BoxZoomTool()
        box_zoom.overlay.handles = parts.handles
        tools = [PanTool(), WheelZoomTool(), box_zoom, ResetTool(), SaveTool(),
                 CrosshairTool(dimensions="height", line_color="#888", line_alpha=0.6, visible=False)]
        x_ticker, x_labels = parts.x_ticks(axis, log_x)
        y_ticker, y_labels = parts.y_ticks(log_y)
        x_axis = (DatetimeAxis if axis == "wall" else LogAxis if log_x else LinearAxis)(
            axis_label=_X_LABEL[axis], ticker=x_ticker, formatter=x_labels, major_label_policy=parts.labels)
        y_axis = (LogAxis if log_y else LinearAxis)(ticker=y_ticker, formatter=y_labels,
                                                    major_label_policy=parts.labels)
        # (a ``figure`` for its model name, which the page's scripts and tests look for; nothing of its defaults)
        fig = figure(title=Title(text=self.tag, text_font_size="10pt"), x_range=x_range, y_range=y_range,
                     x_axis_type=None, y_axis_type=None, tools=tools, output_backend="canvas", syncable=False)
        fig.update(x_scale=parts.scale(log_x), y_scale=parts.scale(log_y), below=[x_axis], left=[y_axis],
                   center=[parts.grid(0, x_ticker), parts.grid(1, y_ticker)], renderers=[raw, smoothed, extent])
        fig.toolbar.logo = None                 # (room for every tool button on a small card)
        self.y_range = y_range
        self.scale_y()
        fig.js_on_event(MouseMove, self.show_values)
        fig.js_on_event(MouseLeave, self.show_values)
        fig.on_event(RangesUpdate, lambda event: on_zoom(self, event))
        self.renderers = [raw, smoothed]
        self._extras = {}
        for name in self._wanted:                # (before it joins the page: one message, not one per extra)
            self._draw_extra(name, fig)
        if attach:
            self.attach(fig)
        return fig

    def attach(self, fig):
        """Show ``fig`` (made by ``build``) in place of the card's figure."""
        self.layout.children[0] = fig
        self._apply_size()

    def _draw(self, source, glyph, view, **kwargs):
        """A renderer of ``glyph`` over ``source`` through the named view (``lines``: the drawn rows; ``rows``: the
        per-run rows, both filtered to the runs shown), or every row when ``view`` is None."""
        view = CDSView(filter=self.parts.all_rows) if view is None else self._views[view]
        return GlyphRenderer(data_source=source, glyph=glyph, view=view, **kwargs)

    def _draw_extra(self, name, fig=None):
        """Draw ``name`` ("dots": one-point runs; "groups": the run groups' bands and means; "marks": the NaN/Inf
        ticks) on this card from now on, in this figure and any it is rebuilt with."""
        self._wanted.add(name)
        fig = self.figure if fig is None else fig
        if fig is None or name in self._extras:
            return
        if name == "dots":
            # (from the rows the page expands: their colours are names there, places in the palette in ``rows``)
            drawn = [self._draw(self.source, Scatter(x="dot_x", y="dot_y", fill_color="colour", line_color="colour",
                                                     size=5), "lines")]
            on_x, on_y = drawn, drawn
        elif name == "groups":
            view = CDSView(filter=self.parts.all_rows)
            band = GlyphRenderer(data_source=self.bands, view=view, glyph=Patches(
                xs="band_xs", ys="band_ys", fill_color="colour", fill_alpha=0.25, line_color=None))
            means = GlyphRenderer(data_source=self.bands, view=view,
                                  glyph=MultiLine(xs="xs", ys="ys", line_color="colour", line_width=2.5))
            drawn, on_x, on_y = [band, means], [band], [band]
        else:       # the plot's whole height, and they stretch neither axis; under the lines, which they would
            # hide (a run's NaN steps are often where another run's line goes on), and light enough to read them over
            drawn = [self._draw(self.marks, VSpan(x=_X_COLUMN[self.axis], line_color=ALARM, line_width=1.5,
                                                  line_alpha=0.5), None, level="underlay")]
            on_x, on_y = [], []
        self._extras[name] = drawn
        fig.renderers = [*fig.renderers, *drawn]
        self._x_renderers += on_x
        self._y_renderers += on_y
        for rng, renderers in ((fig.x_range, self._x_renderers), (fig.y_range, self._y_renderers)):
            if isinstance(rng, DataRange1d) and rng.renderers:         # (not a linked x range: it takes them all)
                rng.renderers = list(renderers)

    def fill_groups(self, groups, band, axis, colour_of, weight):
        """Draw ``groups`` (``{name: [runs]}`` of shown runs, each with at least one) as a mean line and a band
        (``band``: "std" for ± one standard deviation, "range" for min to max) per group, step by step over the
        runs that logged the step (``plots.data.group_band``); their runs' own lines are hidden."""
        columns = {c: [] for c in self.bands.data}
        for name, runs in groups.items():
            lines = [self.lines[run] for run in runs if run in self.lines]
            if not lines:
                continue
            # over at most ``limit`` spans of steps: cheap for a million points a run
            # (a group is one line however many runs it holds: the card's ``limit``, not a line's share)
            steps, mean, std, low, high, _ = group_band([(line.steps, line.values) for line in lines], self.limit)
            x = steps.astype(np.float64)
            if axis != "step":        # mean wall time (ms) or hours since each run's start, step by step
                x = group_band([(line.steps, line.x(axis)) for line in lines], self.limit)[1] * \
                    (1000.0 if axis == "wall" else 1)
            lower, upper = (mean - std, mean + std) if band == "std" else (low, high)
            mean, lower, upper = (smooth(v, weight) for v in (mean, lower, upper))    # as the runs' lines are
            keep = downsample(x, mean, self.limit)
            x, mean, lower, upper = x[keep], mean[keep], lower[keep], upper[keep]
            ok = np.isfinite(lower) & np.isfinite(upper)
            columns["group"].append(name)
            columns["runs"].append(len(lines))
            columns["colour"].append(colour_of(lines[0].run))
            columns["xs"].append(x)
            columns["ys"].append(mean)
            columns["band_xs"].append(np.concatenate([x[ok], x[ok][::-1]]))
            columns["band_ys"].append(np.concatenate([upper[ok], lower[ok][::-1]]))
        self.bands.data = columns
        self.grouped = frozenset(run for runs in groups.values() for run in runs)
        if columns["group"]:
            self._draw_extra("groups")

    def show_runs(self, shown):
        """Draw the runs ``shown`` (the run list's choice, None: every run): their lines and one-point dots (an index
        filter over the rows: the page keeps every run's points), their NaN/Inf ticks and the download's runs."""
        visible_rows = self.visible_rows(shown)
        self.shown = shown
        if self._marked_for != (self.shown, self.grouped):
            self._fill_marks()
        if not _same_rows(self.filter.indices, visible_rows):
            with property_validation(False):     # (as in ``build``)
                self.filter.indices = visible_rows
        if not _same_rows(self.rows_shown, visible_rows):
            self.rows_shown = visible_rows
            self.scale_y()
            self._fit_line_width()

    def visible_rows(self, shown):
        """Rows of the ``shown`` runs (None: every run), as an int32 array, or None when that is every row,
        remembered until the runs or the choice change. None is the filter's "every row": a list of row indices would
        be checked against the page's rows before the page has expanded them (at a new page's first draw), and BokehJS
        logs a warning for each index beyond them. An array, not a list, because Bokeh sends an array as one binary
        buffer: ten thousand indices as a list were walked and encoded one at a time (~30 ms of an uncheck's turn)."""
        key = (shown, len(self.lines), self.grouped)
        if self._visible[0] != key:
            if shown is None and not self.grouped:
                rows = None
            else:
                keep = self.shown_mask(shown)
                if self.grouped:
                    keep = keep & np.fromiter((run not in self.grouped for run in self.lines), bool, len(self.lines))
                rows = None if keep.all() else np.flatnonzero(keep).astype(np.int32)
            self._visible = key, rows
        return self._visible[1]

    def shown_mask(self, shown):
        """Whether each line (in row order) is of a run ``shown`` (None: every run), remembered until the runs or the
        choice change: one pass over 100,000 lines (~10 ms) for the rows drawn, the ticks and the download."""
        key = (shown, len(self.lines))
        if self._mask[0] != key:
            mask = np.ones(len(self.lines), bool) if shown is None else self.lines.shown_in(shown)
            self._mask = key, mask
        return self._mask[1]


class _Refill(NamedTuple):
    """A card's fill spread over turns (``ScalarsView._refill``): its lines (rows 0 to ``lines``: those it had when
    asked), its new figure (``rebuild``: False, True
    or the figure once made), its lines packed so far (None before the first turn), and whether its run groups are
    filled again and its lines smoothed again and their points chosen again first; once all are packed, the fill
    computed (``prepared``: ``_Card.prepare``), sent in the next turn."""
    card: object
    lines: int
    rebuild: object
    packed: object
    groups: bool
    resmooth: bool
    rechoose: bool
    prepared: object = None


def _same_rows(a, b):
    """Whether two filters' rows (None: every row; else an array or a list of row indices) are the same."""
    if a is None or b is None:
        return a is b
    return a is b or np.array_equal(a, b)


def group_of(tag):
    """A tag's group: what comes before its first ``/`` (``train/loss`` -> ``train``); top-level tags share ``""``."""
    return tag.split("/", 1)[0] if "/" in tag else ""


class _Group:
    """The cards of one tag prefix on the current page under a header that folds them away (folded stays folded
    from page to page). The header counts the group's tags in all pages that match the tag filter."""

    def __init__(self, name):
        self.name, self.tags, self.total = name, [], 0
        self.toggle = Button(label="", button_type="light", height=28, align="start", name=f"group:{name}",
                             styles={"font-weight": "bold"})
        self.grid = row(children=[Div()], sizing_mode="stretch_width", styles={"flex-wrap": "wrap"}, spacing=12)
        self.layout = column(self.toggle, self.grid)
        self.widen(False)
        self.toggle.on_click(self.fold)
        self._label()

    def show(self, cards, total):
        """Show ``cards`` (this page's, in order) of the group's ``total`` matching tags."""
        self.tags, self.total = [card.tag for card in cards], total
        layouts = [card.layout for card in cards] or [Div()]      # (Bokeh warns about empty layouts)
        if layouts != list(self.grid.children):
            self.grid.children = layouts
        self._label()

    def widen(self, whole_line):
        """Groups flow side by side in the tab (a group of one card does not leave the rest of its line empty): a
        group is as wide as its cards in one line, shrunk to the tab's width (its cards then wrap); one holding the
        enlarged card takes a line of its own."""
        styles = {"flex": "1 1 100%"} if whole_line else {"flex": "0 1 auto", "min-width": "0"}
        if self.layout.styles != styles:        # (as the enlarged card: stretched, else BokehJS sizes it to fit)
            self.layout.update(sizing_mode="stretch_width" if whole_line else None, styles=styles)

    def fold(self):
        self.grid.visible = not self.grid.visible
        self._label()

    def _label(self):
        arrow = "▾" if self.grid.visible else "▸"
        shown = f"{len(self.tags)}" if len(self.tags) == self.total else f"{len(self.tags)} of {self.total}"
        self.toggle.label = f"{arrow} {self.name or 'top level'}  ({shown})"


class ScalarsView(View):
    title = "Scalars"

    def __init__(self, store, limit=LIMIT):
        super().__init__(store)
        self.limit = limit
        self.cards: dict[str, _Card] = {}      # the current page's cards only: a tag off the page costs nothing
        self.parts = _Parts()                  # models every card shares
        self.pager = Pager("scalars", PAGE_SIZE, on_change=self._repage)
        self._by_tag: dict[str, list] = {}     # every tag's series (one per run), in the store's run order
        self._by_tag_of = None                 # (the store's scalar and histogram lists, ``_by_tag`` made of them)
        self._rank: dict[str, tuple] = {}      # each tag's (group's place, own place, group) in the order tags came
        self._group_rank: dict[str, int] = {}  # each tag group's place in the order groups came
        self._ranked = 0                       # tags placed so far (gone ones included: places stay unique)
        self._matching: list[str] = []         # the tags the filter leaves, in display order: the pager's keys
        self._pending: list[str] = []          # tags of the page whose cards are still to build
        # cards being built, their runs read a slice a server turn (``_read_some``): tag -> (card, series to read)
        self._reading: dict[str, tuple] = {}
        # cards of more than RUN_SLICE runs whose fill is spread over turns (``_refill``): tag -> ``_Refill``
        self._refilling: dict[str, _Refill] = {}
        self._growing: set[str] = set()        # cards of more than RUN_SLICE runs still reading new points (``_grow``)
        self._scheduled = False                # a call of ``_build_some`` is on its way (``_schedule``)
        self._unplaced: list[_Card] = []       # cards built and not yet in the page (``_place`` puts them there)
        self.tag_filter = TextInput(title="Tags (regex)", placeholder="all tags", width=110, name="tag-filter")
        self.smoothing = Slider(title="Smoothing", start=0, end=0.999, step=0.001, value=0.6, width=110,
                                name="smoothing")
        self.x_axis = RadioButtonGroup(labels=["Step", "Relative", "Wall"], active=0, name="x-axis")
        self.log_y = Switch(active=False, name="log-y")
        self.log_x = Switch(active=False, name="log-x")
        self.outliers = Switch(active=False, name="ignore-outliers")
        self.card_size = RadioButtonGroup(labels=list(SIZES), active=list(SIZES).index("M"), name="card-size")
        self.link_x = Switch(active=False, name="link-x")
        self._shared_x = None                  # the x range every card shares while x is linked
        self.enlarged = None                   # the card enlarged to the tab's width, if any
        self.message = Div(text="", name="scalars-message")
        self.export = ColumnDataSource({"name": [], "url": [], "n": []}, name="scalars-export")
        self._exports = 0
        self.export.js_on_change("data", CustomJS(args=dict(source=self.export), code=_SAVE_JS))
        self.export_buttons = [Button(label=f"⤓ all shown ({fmt.upper()})", width=108, height=30,
                                      button_type="light", name=f"export-{fmt}") for fmt in ("csv", "json")]
        for button, fmt in zip(self.export_buttons, ("csv", "json")):
            button.on_click(lambda fmt=fmt: self.export_shown(fmt))
        # a group per tag prefix, in the order they came (a blank Div until the first: Bokeh warns about empty layouts)
        self.groups: dict[str, _Group] = {}
        self.grid = row(children=[Div()], sizing_mode="stretch_width", name="scalar-groups",
                        styles={"flex-wrap": "wrap", "align-items": "flex-start"}, spacing=24)
        self._tags_re = compile_filter("")
        self._error = ""                       # what is wrong with the typed tag filter (the last good one holds)
        self.counts_elsewhere = 0              # histograms whose NaN/Inf count scalars are left to the Anomalies tab
        self._grouped_for = None               # the run list's choice and grouping every card's groups were made for
        self.tag_filter.on_change("value", lambda attr, old, new: self._filter())
        self.smoothing.on_change("value_throttled", lambda attr, old, new: self._resmooth())
        self.x_axis.on_change("active", lambda attr, old, new: self._rebuild())
        self.log_y.on_change("active", lambda attr, old, new: self._rebuild())
        self.log_x.on_change("active", lambda attr, old, new: self._rebuild())
        self.outliers.on_change("active", lambda attr, old, new: self._rebuild())
        self.card_size.on_change("active", lambda attr, old, new: self._resize())
        self.link_x.on_change("active", lambda attr, old, new: self._rebuild())

    def url_state(self):
        """What the page's URL keeps of this tab (see ``dashboard.url_state``)."""
        return [("tags", self.tag_filter, "value"), ("smoothing", self.smoothing, "value"),
                ("x", self.x_axis, "active"), ("logx", self.log_x, "active"), ("logy", self.log_y, "active"),
                ("outliers", self.outliers, "active"), ("size", self.card_size, "active"),
                ("linkx", self.link_x, "active")]

    @property
    def axis(self):
        return X_AXES[self.x_axis.active]

    def layout(self):
        controls = row(self.tag_filter, self.smoothing,
                       column(Div(text="X axis"), self.x_axis), column(Div(text="Log x"), self.log_x),
                       column(Div(text="Log y"), self.log_y), column(Div(text="Ignore outliers"), self.outliers),
                       column(Div(text="Link x"), self.link_x), column(Div(text="Card size"), self.card_size),
                       # (the tag keeps the export source in the document: nothing draws it)
                       column(Div(text="Download"), row(*self.export_buttons), tags=[self.export]),
                       styles={"flex-wrap": "wrap", "row-gap": "4px"})      # wraps on a narrow window
        return column(controls, self.message, self.pager.layout, self.grid, sizing_mode="stretch_width")

    def update(self):
        self._by_tag = self._scalars_by_tag()
        by_tag = self._by_tag
        if by_tag.keys() != self._rank.keys():          # tags came (or went): place them, page again
            self._order_tags(by_tag.keys() - self._rank.keys())
        self._grow(list(self.cards.values()))
        grouping, shown = self.runs.grouping, self.runs.shown()
        grouped_for = (shown, grouping.active and tuple(grouping.groups(self.store.runs()).items()), grouping.band)
        regroup = grouped_for != self._grouped_for          # the run list changed the groups
        self._grouped_for = grouped_for
        for card in self.cards.values():             # the run list may have changed what is shown
            if regroup:
                self._fill_groups(card, shown)
            card.show_runs(shown)
        self._show_message()

    def _order_tags(self, new_tags):
        """Give new tags their place and page the tags the filter leaves. Tags that come together are sorted (top
        level first, then by group and name); a later tag goes last in its group (a new group last), so the cards
        before it never move."""
        for tag in sorted(new_tags, key=lambda tag: (group_of(tag) != "", group_of(tag), tag)):
            group = group_of(tag)
            self._group_rank.setdefault(group, len(self._group_rank))
            self._ranked += 1
            self._rank[tag] = (self._group_rank[group], self._ranked, group)
        for tag in self._rank.keys() - self._by_tag.keys():    # gone from the store (a run deleted)
            del self._rank[tag]
        order = sorted(self._by_tag, key=self._rank.__getitem__)
        search = self._tags_re.search
        # (20,000 tags: the order and the search take tens of milliseconds; an empty filter needs no search)
        self._matching = order if not self._tags_re.pattern else [tag for tag in order if search(tag) is not None]
        self.pager.set_keys(self._matching)
        if set(self.pager.visible) != set(self.cards) | set(self._reading) or self._pending:
            self._repage()
        else:
            self._place()                    # the group headers' counts

    def _repage(self):
        """Drop the cards that left the page (with what this session had seen of them) and build those that came:
        at once outside a server, else ``BUILD_BATCH`` per IOLoop turn from the next one on."""
        visible = self.pager.visible
        for tag in [tag for tag in self.cards if tag not in visible]:
            card = self.cards.pop(tag)
            if self.enlarged is card:
                self.enlarged = None
            self._forget(tag)
        for tag in [tag for tag in self._reading if tag not in visible]:
            del self._reading[tag]
            self._forget(tag)
        for tag in [tag for tag in self._refilling if tag not in visible]:
            del self._refilling[tag]
        self._growing &= set(visible)
        self._pending = [tag for tag in visible if tag not in self.cards and tag not in self._reading]
        doc = self.grid.document
        if doc is None or doc.session_context is None:
            self._build_some()
        else:                   # even the first card: the page's request is answered without it
            self._schedule()    # (if already on its way, it takes the new pending list)
        self._place()

    def _forget(self, tag):
        """Forget what this session had seen of ``tag``'s series: back on the page later, its card starts afresh."""
        for series in self._by_tag.get(tag, ()):
            self._seen.pop(series.key, None)

    def _build_some(self):
        """Build the next ``BUILD_BATCH`` cards of the page (all of them outside a server), or go on reading the runs
        of the card being built (``_read_some``), or have the next ``BUILD_BATCH`` built ones join the page; one of
        these a server turn. A card costs the server tens of milliseconds to build, and as much again to join the
        document (Bokeh walks every model of the document) and be serialised: a turn of its own for each, and no
        other session waits for a whole page; a card of thousands of runs reads them over several turns. Cards are
        built while the session has no page yet (the browser loads BokehJS meanwhile), and join only once one has
        connected: its first pull serialises the whole document in one turn (``no_page_yet``)."""
        self._scheduled = False
        doc = self.grid.document
        spread = served(doc)
        waiting = spread and no_page_yet(doc)
        if spread and self._unplaced and not waiting:
            self._place(self._unplaced[:BUILD_BATCH])
            self._show_message()
        elif spread and self._reading:
            self._read_some(spread)
        elif spread and self._growing:
            self._grow_some()
        elif spread and self._refilling:
            self._refill_some()
        elif self._pending:
            batch, self._pending = ((self._pending[:BUILD_BATCH], self._pending[BUILD_BATCH:]) if spread
                                    else (self._pending, []))
            shown = self.runs.shown()
            for tag in batch:
                if (tag in self._by_tag and tag not in self.cards and tag not in self._reading
                        and tag in self.pager.visible):
                    card = _Card(tag, self.parts, self.limit)
                    card.shown = shown          # its first ticks: those of the shown runs
                    card.resize(size=self.size)
                    card.enlarge.on_click(lambda card=card: self._toggle_enlarged(card))
                    card.read_from = self.store.version
                    self._reading[tag] = (card, list(self._by_tag[tag]))
            self._read_some(spread)
            if not spread:
                self._place(self._unplaced)
                self._show_message()
        if not spread:
            return
        if self._pending or self._reading or self._growing or self._refilling or (self._unplaced and not waiting):
            self._schedule()
        elif self._unplaced:                   # built, waiting for a page: look again soon
            self._schedule(PAGE_POLL_MS)

    def _schedule(self, after_ms=None):
        """Have ``_build_some`` called on the next turn of the session's IOLoop (or ``after_ms`` later), unless a
        call is on its way: one at a time, whatever asks for it in the meantime."""
        if self._scheduled:
            return
        self._scheduled = True
        doc = self.grid.document
        if after_ms is None:
            doc.add_next_tick_callback(self._build_some)
        else:
            doc.add_timeout_callback(self._build_some, after_ms)

    def _read_some(self, spread):
        """Build the cards being built (``_reading``): read their runs' series whole, then, in a turn of its own,
        read what the store gained meanwhile and make the card's figure, then, in another, fill it; the card then
        waits to join the page (``_unplaced``). In a server session one step of one card a turn, the runs read
        ``RUN_SLICE`` a turn (a card of at most ``RUN_SLICE`` runs takes every step in one turn, ~20-40 ms);
        outside a server every card at once. A run costs a card tens of microseconds of Python
        (its line, its smoothing, its points chosen): ten thousand runs read, drawn and filled in one turn held the
        loop for a third of a second."""
        weight, axis = self.smoothing.value, self.axis
        done = []
        for tag, (card, todo) in list(self._reading.items()):
            step = spread and len(card.lines) + len(todo) > RUN_SLICE       # (else all in this turn)
            if todo:
                take, rest = (todo[:RUN_SLICE], todo[RUN_SLICE:]) if spread else (todo, [])
                if card.packed is None:         # (its first slice: every line gets its share of the card's points)
                    card.split(max(len(card.lines), len(todo)), force=True)
                pairs = []
                for series in take:
                    d = self.delta(series)
                    if d.reset or len(d.steps):
                        whole = d if d.reset else self.store.read(series)
                        pairs.append((card.line(series.run, self.store), whole))
                self._set_lines(card, pairs, weight, axis)
                if card.packed is None:         # (room for the card's share of points; more when a slice needs it)
                    card.packed = _Packed(len(todo) * min(card.share, 100))
                # (what its first fill sends of them, unless the store gained more meanwhile)
                card.packed.add([line for line, _ in pairs])
                if getattr(self.runs, "rows", None) is not None:      # (the run list's rows of these lines)
                    card.lines.list_rows(self.runs.rows, again=False)
                self._reading[tag] = (card, rest)
                if step:
                    break
            if not card.renderers:
                self._catch_up(card)
                self._build(card)
                if step:
                    break
            self._catch_up(card)
            del self._reading[tag]
            done.append(card)
            if spread:
                break
        shown = self.runs.shown()
        for card in done:
            self.cards[card.tag] = card
            card.looked_at = card.read_from     # (every run read up to then: ``_catch_up``)
            self._unplaced.append(card)         # (``_place`` has the page expand it once it is in)
            packed, card.packed = card.packed, None
            card.fill(packed)
            self._fill_groups(card, shown)
            card.show_runs(shown)

    def _catch_up(self, card):
        """Read what the store gained of a card being built since its runs were read (nothing to look at when the
        store's version did not move)."""
        if card.read_from != self.store.version:
            card.read_from = self.store.version
            if self._read_new(card)[0]:
                card.packed = None              # (its lines changed: packed again when filled)
            if card.split():                    # (runs came meanwhile, as many as it had: rare, and chosen at once)
                choose_lines(list(card.lines.values()), self.axis, card.window)

    @staticmethod
    def _set_lines(card, pairs, weight, axis):
        """Give each ``(line, whole)`` of ``pairs`` its whole series (a ``Delta`` read from the start), smoothed
        together (``ema_rows``), and choose their points (together: ``choose_lines``)."""
        for (line, whole), smoothed in zip(pairs, ema_rows([w.values for _, w in pairs], weight)):
            line.set(whole.steps, whole.wall_times, whole.values, weight, smoothed)
        choose_lines([line for line, _ in pairs], axis, card.window)

    def _read_new(self, card, budget=None):
        """Give ``card``'s lines what this session has not seen of each run's series, or of the next ``budget``
        runs that have something new, from where the last call left off (``card.grow_at``: a pass over 100,000
        runs that started from the first run every turn looked at ~50 times as many as it read, ~40 ms a turn by
        its end); returns ``(whether any line changed, whether every run was looked at)``. (A run gone from before
        where a pass stopped moves the rest back one: one run is then looked at only by the next pass.)"""
        weight, axis = self.smoothing.value, self.axis
        changed, reset, again, read = False, [], [], 0
        every = self._by_tag.get(card.tag, ())
        start = card.grow_at if budget is not None and card.grow_at < len(every) else 0
        done = True
        for at in range(start, len(every)):
            series = every[at]
            if self.unchanged(series):          # (most runs, most times: no lock, no read)
                continue
            if budget is not None and read >= budget:
                card.grow_at, done, changed = at, False, True
                break
            read += 1
            d = self.delta(series)
            if not (d.reset or len(d.steps)):
                continue
            line = card.line(series.run, self.store)
            whole = d if d.reset else self.store.read(series)     # the whole series, zero-copy
            if d.reset:
                reset.append((line, whole))
            elif line.append(whole.steps, whole.wall_times, whole.values, weight):
                again.append(line)
            changed = True
        if done:
            card.grow_at = 0
        choose_lines(again, axis, card.window)          # (together: one ``downsample_many``)
        self._set_lines(card, reset, weight, axis)      # series read whole (a new run, a reset) together
        return changed, done

    def _grow(self, cards):
        """Bring ``cards`` (built) up to date with the store: what each session has not seen of each run's
        series. In a server session a card of more than ``RUN_SLICE`` runs reads at most ``RUN_SLICE`` grown runs
        a turn (``_grow_some`` goes on in the next turns), and is filled once all are read (``_refill``): ten
        thousand runs that each logged a point were ~250 ms of one turn."""
        doc = self.grid.document
        spread = served(doc)
        version = self.store.version
        for card in cards:
            if card.looked_at == version and card.tag not in self._growing:
                continue        # (the run list changed, not the store: 100,000 runs looked at for nothing ~60 ms)
            if not card.grow_at:
                card.looked_at = version        # (a poll meanwhile bumps it: the next update looks again)
            budget = RUN_SLICE if spread and len(card.lines) > RUN_SLICE else None
            changed, whole = self._read_new(card, budget)
            card.grown |= changed
            if not whole:
                self._growing.add(card.tag)
                self._schedule()
                continue
            self._growing.discard(card.tag)
            split = card.split()                # (runs came: each line's share of the card's points is smaller)
            if card.grown or split:
                card.grown = False
                self._refill(card, rechoose=split)

    def _grow_some(self):
        """The next turn of a big card's ``_grow``."""
        tag = next(iter(self._growing))
        card = self.cards.get(tag)
        if card is None:
            self._growing.discard(tag)
        else:
            self._grow([card])

    def _refill(self, card, rebuild=False, groups=True, resmooth=False, rechoose=False):
        """Send ``card`` what its lines show now (``_Card.fill``), and (``groups``) its run groups
        (``_fill_groups``); with ``resmooth``, its lines smoothed again first (``_smooth``); with ``rechoose``, their
        points chosen again (``choose_lines``: another x axis, a zoom, a new share of the card's points); with
        ``rebuild``, on a new figure (``_build``: another x axis or scale). At once outside a server or for a card of
        at most ``RUN_SLICE`` runs; else from the next turn on: its lines packed ``RUN_SLICE`` a turn, then figure and
        fill in a turn of their own (packing ten thousand runs' points at once took ~50 ms, a new smoothing ~160 ms
        in all). The page shows what it had until then. A card asked again meanwhile starts again (every change to
        a card's lines asks for its fill)."""
        if not served(self.grid.document) or len(card.lines) <= RUN_SLICE:
            if resmooth:
                self._smooth(list(card.lines.values()))
            if rechoose:
                choose_lines(list(card.lines.values()), self.axis, card.window)
            if rebuild:
                self._build(card)
            card.fill()
            if groups:
                self._fill_groups(card, self.runs.shown())
            return
        earlier = self._refilling.get(card.tag)
        if earlier is not None:             # (what the earlier ask wanted too; a figure made: made again)
            rebuild, groups = rebuild or earlier.rebuild is not False, groups or earlier.groups
            resmooth, rechoose = resmooth or earlier.resmooth, rechoose or earlier.rechoose
        self._refilling[card.tag] = _Refill(card, len(card.lines), rebuild, None, groups, resmooth,
                                            rechoose)
        self._schedule()

    def _refill_some(self):
        """One turn of the first card's ``_refill``: smooth and choose (if asked) and pack the next ``RUN_SLICE`` of
        its lines; all packed, make its new figure (if asked), then compute its fill (``_Card.prepare``), then show
        the figure and send the fill, each in a turn of its own (``rebuild`` is then the figure). (A line grown
        while its card is smoothed again goes on from its old smoothing until its slice comes: every line is
        smoothed whole when the ask starts again, as a growth's ``_refill`` makes it.)"""
        tag, ask = next(iter(self._refilling.items()))
        card, lines, rebuild, packed, groups, resmooth, rechoose, _ = ask
        if packed is None:      # (room for the card's share of points; more when a slice needs it)
            packed = _Packed(lines * min(card.share, 100))
        if packed.runs < lines:
            some = card.lines.values(packed.runs, min(packed.runs + RUN_SLICE, lines))
            if resmooth:
                self._smooth(some)
            if rechoose:
                choose_lines(some, self.axis, card.window)
            packed.add(some)
            self._refilling[tag] = ask._replace(packed=packed)
            return
        if rebuild is True and self.cards.get(tag) is card:     # its figure, shown with its fill in the next turns
            self._refilling[tag] = ask._replace(rebuild=self._build(card, attach=False), packed=packed)
            return
        if ask.prepared is None and self.cards.get(tag) is card:    # the fill computed; sent in the next turn
            self._refilling[tag] = ask._replace(prepared=card.prepare(packed))   # (packed afresh if runs came)
            return
        del self._refilling[tag]
        if self.cards.get(tag) is not card:
            return
        if rebuild:
            card.attach(rebuild)
        card.send(ask.prepared)
        if groups:
            self._fill_groups(card, self.runs.shown())

    def _fill_groups(self, card, shown):
        """The card's run groups (the run list's ``grouping``) of the runs the run list shows; runs in no group keep
        their own lines."""
        grouping = self.runs.grouping
        if not grouping.active and not card.grouped:        # (no groups: no pass over a card's 100,000 runs)
            return
        groups = grouping.groups([run for run in card.lines if shown is None or run in shown])
        if groups or card.grouped:      # a group takes its first run's colour: distinct from every other run's
            card.fill_groups(groups, grouping.band, self.axis, lambda run: run_colour(self.store, run),
                             self.smoothing.value)

    def _place(self, joining=()):
        """Lay out the page's cards under their groups' headers, in display order: those already in it and
        ``joining``, built cards that join it now (the other built ones wait: ``_build_some`` has them join a few a
        turn). The grid's ``tags`` say ``[page index, cards placed]`` (for tests and benchmarks: the page is complete
        when that is the pager's)."""
        waiting = {id(card) for card in self._unplaced} - {id(card) for card in joining}
        totals: dict[str, int] = {}
        for tag in self._matching:
            group = self._rank[tag][2]
            totals[group] = totals.get(group, 0) + 1
        on_page: dict[str, list] = {}
        for tag in self.pager.visible:
            card = self.cards.get(tag)
            if card is not None and id(card) not in waiting:
                on_page.setdefault(group_of(tag), []).append(card)
        for name in on_page:
            if name not in self.groups:
                self.groups[name] = _Group(name)
        for name, group in self.groups.items():
            group.show(on_page.get(name, []), totals.get(name, 0))
            if group.layout.visible != (name in on_page):        # (a group off the page is out of the grid too)
                group.layout.visible = name in on_page
        self._widen_groups()
        layouts = [self.groups[name].layout for name in on_page] or [Div()]
        if layouts != list(self.grid.children):
            self.grid.children = layouts
        placed = {id(card) for cards in on_page.values() for card in cards}
        joined = [card for card in self._unplaced if id(card) in placed]
        nudge_next_turn(self.grid.document, *[card.flat for card in joined])    # it reached a live page with its data
        self._unplaced = [card for card in self._unplaced
                          if id(card) not in placed and self.cards.get(card.tag) is card]
        built = sum(len(cards) for cards in on_page.values())
        if self.grid.tags != [self.pager.page, built]:
            self.grid.tags = [self.pager.page, built]

    def _show_message(self):
        """What is wrong with the typed tag filter, else why there is nothing to show."""
        text = f'<span style="color:#c00">{html.escape(self._error)}</span>' if self._error else \
            "" if self._by_tag else "No scalars in this logdir yet; they appear here as soon as a run logs one."
        if self.counts_elsewhere and not self._error:
            n = self.counts_elsewhere
            text += (" " if text else "") + (f"The NaN/Inf counts logged with {n:,} histogram{'s' if n != 1 else ''} "
                                             "are on the Anomalies tab.")
        if self.message.text != text:
            self.message.text = text

    def _scalars(self):
        """The store's scalar series this tab draws: all but the NaN/Inf counts a ``SummaryWriter`` logs beside a
        histogram (``<tag>/nan_count``, ``<tag>/inf_count``), which the Anomalies tab shows with their histogram
        (``self.counts_elsewhere`` says how many histograms have them); sorted by run, then tag."""
        by_tag = self._scalars_by_tag()
        return sorted((series for every in by_tag.values() for series in every), key=lambda s: (s.run, s.tag))

    def _scalars_by_tag(self):
        """``_scalars`` by tag (``{tag: [series, in the store's run order]}``), made again only when the store's
        series changed (the store then makes new lists): at 100,000 runs making it is ~40 ms, and the tab is brought
        up to date at every poll that changed anything. A tag's own check (``counted_histogram``) is made once."""
        scalars, histograms = self.store.series("scalar"), self.store.series("histogram")
        cached = self._by_tag_of
        # (the store's lists, made again when its series change; a kind it has none of: a new empty list each time)
        if cached is not None and all(a is b or not (a or b) for a, b in zip(cached, (scalars, histograms))):
            return cached[2]
        by_tag: dict[str, list] = {}
        for series in scalars:                                  # sorted by run, then tag
            every = by_tag.get(series.tag)
            if every is None:
                every = by_tag[series.tag] = []
            every.append(series)
        twins = set()
        counted = {tag: base for tag in by_tag if (base := counted_histogram(tag)) is not None}
        if counted:
            logged = {(s.run, s.tag) for s in histograms}
            for tag, base in counted.items():
                kept = [series for series in by_tag[tag] if (series.run, base) not in logged]
                twins.update((series.run, base) for series in by_tag[tag] if (series.run, base) in logged)
                if kept:
                    by_tag[tag] = kept
                else:
                    del by_tag[tag]
        self.counts_elsewhere = len(twins)
        self._by_tag_of = (scalars, histograms, by_tag)
        return by_tag

    def export_shown(self, fmt):
        """Every series the tab shows (runs the run list shows, tags the filter leaves), in full, as one file the
        page saves: the data as logged, not the points on display."""
        shown = [series for series in self._scalars()
                 if self.runs.shows(series.run) and self._tags_re.search(series.tag) is not None]
        total = sum(len(series) for series in shown)
        if total > EXPORT_LIMIT:
            self.message.text = html.escape(f"{total:,} points are shown: at most {EXPORT_LIMIT:,} go into one "
                                            "download; uncheck runs or filter tags first.")
            return
        columns = []
        for series in shown:                # zero-copy slices: the worker thread formats them (export_stream)
            whole = self.store.read(series)
            columns.append((series.run, series.tag, whole.steps, whole.wall_times, whole.values))
        token = EXPORTS.add(self.store, columns, fmt)
        self._exports += 1          # (a second download of the same file must still change the source)
        self.export.data = {"name": [f"scalars.{fmt}"], "url": [f"export/scalars/{token}.{fmt}"],
                            "n": [self._exports]}

    def _zoomed(self, card, event):
        if event.x0 is None or event.x1 is None:
            return
        card.window = (event.x0, event.x1)
        if self.axis == "wall":                     # the datetime axis is in milliseconds; lines keep seconds
            card.window = (event.x0 / 1000.0, event.x1 / 1000.0)
        # (a zoom leaves the groups' bands as they are; a big card's lines are chosen again a slice a turn)
        if served(self.grid.document) and len(card.lines) > RUN_SLICE:
            self._refill(card, groups=False, rechoose=True)
        elif choose_lines(list(card.lines.values()), self.axis, card.window):
            self._refill(card, groups=False)

    @property
    def size(self):
        """The cards' (width, height) the size control asks for."""
        return list(SIZES.values())[self.card_size.active]

    def _resize(self):
        for card in [*self.cards.values(), *(card for card, _ in self._reading.values())]:
            card.resize(size=self.size)

    def _toggle_enlarged(self, card):
        """Enlarge ``card`` to the tab's width, or give it back its size when it is the one enlarged: one at a time."""
        previous, self.enlarged = self.enlarged, (None if self.enlarged is card else card)
        if previous is not None:
            previous.resize(enlarged=False)
        if self.enlarged is not None:
            card.resize(enlarged=True)
        self._widen_groups()

    def _widen_groups(self):
        """The group holding the enlarged card takes a line of its own; the others flow side by side."""
        wide = None if self.enlarged is None else group_of(self.enlarged.tag)
        for name, group in self.groups.items():
            group.widen(name == wide)

    def _build(self, card, attach=True):
        card.ignore_outliers = self.outliers.active
        if self.link_x.active and self._shared_x is None:
            self._shared_x = DataRange1d(syncable=False)      # (see ``_Card.build``)
        return card.build(self.axis, self.log_y.active, card.visible_rows(self.runs.shown()), self._zoomed,
                          log_x=self.log_x.active, x_range=self._shared_x if self.link_x.active else None,
                          attach=attach)

    def _read_again(self):
        """Have the cards being built read their runs again from the first: their lines were smoothed, and their points
        chosen, for the smoothing and x axis of when they began."""
        for tag, (card, _) in self._reading.items():
            self._forget(tag)
            card.packed, card.read_from = None, self.store.version
            card.renderers = []             # (its figure too, if made: for the axis of when it began)
            self._reading[tag] = (card, list(self._by_tag.get(tag, ())))

    def _rebuild(self):
        self._shared_x = None           # a new axis or scale: no zoom carries over, linked or not
        self._read_again()
        for card in self.cards.values():
            card.window = None
            # rows name the new axis: the page redraws the lines (chosen again on it, a slice a turn for a big card)
            self._refill(card, rebuild=True, rechoose=True)

    def _resmooth(self):
        self._read_again()
        for card in self.cards.values():
            self._refill(card, resmooth=True)       # (and the groups' means and bands, smoothed as the lines are)

    def _smooth(self, lines):
        """Smooth ``lines`` again, together (``ema_rows``), with the smoothing now chosen."""
        weight = self.smoothing.value
        for line, smoothed in zip(lines, ema_rows([line.values for line in lines], weight)):
            line.resmooth(weight, smoothed)

    def _filter(self):
        try:                                    # RE2: linear-time matching, a typed pattern cannot stall the loop
            self._tags_re = compile_filter(self.tag_filter.value or "")
            self._error = ""
        except FilterError as e:                # keep the last good pattern
            self._error = f"Invalid tags regex {self.tag_filter.value!r}: {e.reason}"
        self.pager.set_keys(())                 # a new search starts at its first match (page 0)
        self._order_tags(())
        self._show_message()
