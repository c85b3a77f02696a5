"""Bokeh figure builders shared by the notebook widgets and the dashboard.

Each builder takes a ``ColumnDataSource`` (the caller owns it and updates its data: a widget from its refresh thread,
the dashboard through ``doc.add_next_tick_callback``) and returns a toolbar-free figure drawn with the canvas backend
(software WebGL is slow in headless browsers and gains nothing at these sizes). Live-widget figures take the width of
their notebook cell (``sizing_mode="stretch_width"``) at a fixed height; dashboard cards have a fixed size. Figure
titles are canvas text, never parsed as HTML; text that ends up in HTML is escaped with ``html.escape``.
Interaction (the log-count toggle, hover) runs in the browser alone: nothing a viewer does is sent back to Python.
"""
from __future__ import annotations

import html
import math
import re

import numpy as np
from bokeh.core.properties import value
from bokeh.layouts import column, row
from bokeh.models import (AllIndices, AllLabels, BasicTickFormatter, BasicTicker, CDSView, Checkbox,
                          ColumnDataSource, CustomJS, CustomJSHover, CustomJSTicker, CustomJSTickFormatter,
                          DataRange1d, Div, HoverTool, Line, LinearAxis, LinearScale, Patches, Plot, Quad, Range1d,
                          Segment, Title, UnionRenderers, VArea)
from bokeh.plotting import figure

from .colours import ALARM
from .data import Trend, finite_extent, sticky_range, tensor_summary
from .static import COMPACT_TICKS, SCALE_TICKS, VALUE_LABELS

WIDTH, HEIGHT = 320, 200        # a dashboard card's figure
LIVE_HEIGHT = 170               # a live widget's figure: this high, as wide as the cell
STATS_WIDTH = 190
VALUE, BAND, ENVELOPE = "#4c78a8", "#f58518", "#9ecae9"

# A plot whose glyphs carry fixed dark colours (labels, a palette's dark end) stays light on a page in a dark colour
# scheme: these, as its ``styles``, give its canvas back Bokeh's light colours (the scheme's --bk-* ones are set
# on the page's root, and the nearest setting wins).
LIGHT_CANVAS = {"--bk-background-fill-color": "#ffffff", "--bk-border-fill-color": "#ffffff",
                "--bk-outline-line-color": "#e5e5e5", "--bk-grid-line-color": "#e5e5e5",
                "--bk-axis-line-color": "#000000", "--bk-major-tick-line-color": "#000000",
                "--bk-minor-tick-line-color": "#000000", "--bk-major-label-text-color": "#444444",
                "--bk-axis-label-text-color": "#444444", "--bk-text-color": "#444444",
                "--bk-label-text-color": "#444444"}


# A number's text without trailing zeros (plots.static's ``_trim``), for the tick formatters below.
_TRIM_JS = """
const trim = (s) => {
  s = s.includes(".") ? s.replace(/0+$/, "").replace(/\\.$/, "") : s;
  return s === "-0" ? "0" : s;
};
"""


# Tick labels of a linear axis as plots.static writes them (``tick_texts``: "0, 20k, 40k", "0.5M", "0, 1e+18,
# 2e+18"), not BokehJS's default, which turns every label of an axis reaching 100,000 into e-notation ("2.000e+4",
# "0.000e+0"). ``tags`` tell plots.static which labels these are. ``g`` is Python's "{:.<digits>g}" format.
_COMPACT_TICKS_JS = _TRIM_JS + """
const big = Math.max(...ticks.map(Math.abs));
const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : 1;
const decimals = (step) => {        // that write multiples of step exactly (2.5: one)
  const d = Math.max(0, -Math.floor(Math.log10(step) + 1e-9)), scaled = step * 10 ** d;
  return d + (Math.abs(Math.round(scaled) - scaled) > 1e-6 * scaled ? 1 : 0);
};
if (big >= 1e4 && big < 1e15) {
  const k = Math.min(Math.floor(Math.log10(big) / 3), 4);
  return trim((tick / 1000 ** k).toFixed(decimals(step / 1000 ** k))) + (tick ? "kMGT"[k - 1] : "");
}
if (big >= 1e-3 && big < 1e4) return trim(tick.toFixed(decimals(step)));
const g = (t, digits) => {
  if (t === 0) return "0";
  const [mantissa, e] = t.toExponential(digits - 1).split("e"), exponent = Number(e);
  if (exponent < -4 || exponent >= digits)
    return trim(mantissa) + "e" + (exponent < 0 ? "-" : "+") + String(Math.abs(exponent)).padStart(2, "0");
  return trim(t.toFixed(digits - 1 - exponent));
};
for (let digits = 1; digits <= 16; digits++) {    // the fewest digits that tell the ticks apart and match them
  const labels = ticks.map((t) => g(t, digits));
  if (new Set(labels).size === labels.length && ticks.every((t, i) => Math.abs(Number(labels[i]) - t) <= 0.01 * step))
    return labels[index];
}
return g(tick, 6);
"""


def compact_ticks():
    """A tick formatter for linear axes (steps, and the values of the widgets' trends): thousands as k/M/G/T with the
    decimals the tick spacing needs, e-notation past them and for tiny numbers (see ``_COMPACT_TICKS_JS``), drawn the
    same by ``plots.static``."""
    return CustomJSTickFormatter(code=_COMPACT_TICKS_JS, tags=[COMPACT_TICKS])


# Ticks of a log axis or a colour bar and a label for each: plots.static's rules (``log_ticks`` with n = 5,
# ``linear_ticks``, ``value_label``) in BokehJS, so a saved copy draws them the same (``tags``). BokehJS's LogTicker
# puts linear ticks on a range of less than two decades (a loss from 1.2 down to 0.04 got "1" and "0.5" alone; a
# colour bar over a decade or two 1…9, crowded at its top), and BasicTickFormatter wrote "7.0e+2" for 700.
_SCALE_TICKS_JS = """
const lo = Math.min(cb_data.start, cb_data.end), hi = Math.max(cb_data.start, cb_data.end);
if (!(isFinite(lo) && isFinite(hi))) return [];
if (!(hi > lo)) return [lo];
if (log && lo > 0) {
  const first = Math.ceil(Math.log10(lo) - 1e-9), last = Math.floor(Math.log10(hi) + 1e-9);
  if (last - first >= 2) {                  // three powers of ten or more: those, every k-th when many
    const stride = Math.max(1, Math.ceil((last - first + 1) / 5)), ticks = [];
    for (let d = first + (((-first) % stride) + stride) % stride; d <= last; d += stride) ticks.push(10 ** d);
    return ticks;
  }
  for (const mantissas of [[1, 2, 5], [1, 5]]) {      // a decade or two: 1-2-5 multiples of its powers (1-5: fewer)
    const ticks = [];
    for (let d = first - 1; d <= last; d++)
      for (const m of mantissas) {
        const t = m * 10 ** d;
        if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) ticks.push(t);
      }
    if (ticks.length >= 3 && (ticks.length <= 5 || mantissas.length == 2)) return ticks;
  }
}
// linear, and a log range too narrow for three of those: multiples of the 1-2-5 step nearest a fifth of the span
const ideal = (hi - lo) / 5, magnitude = 10 ** Math.floor(Math.log10(ideal));
let step = magnitude;
for (const m of [2, 5, 10])
  if (Math.abs(Math.log(m * magnitude / ideal)) < Math.abs(Math.log(step / ideal))) step = m * magnitude;
const ticks = [];
for (let k = Math.ceil(lo / step - 1e-9); k <= Math.floor(hi / step + 1e-9); k++) ticks.push(k * step);
return ticks;
"""
_VALUE_LABELS_JS = _TRIM_JS + """
const value = Number(tick.toPrecision(12)), size = Math.abs(value);     // k * step's rounding noise gone
if (value === 0) return "0";
// one style for the whole scale: when a tick needs e-notation every tick gets it (not "1T" beside "1e+16")
const plain = (t) => { const s = Math.abs(Number(t.toPrecision(12))); return s === 0 || (s >= 1e-3 && s < 1e15); };
if (ticks.every(plain)) {
  if (size >= 1e4) {
    const k = Math.min(Math.floor(Math.log10(size) / 3 + 1e-9), 4);
    return trim((value / 1000 ** k).toPrecision(6)) + "kMGT"[k - 1];
  }
  return trim(value.toPrecision(6));
}
const [mantissa, exponent] = value.toExponential(5).split("e");
return trim(mantissa) + "e" + exponent;
"""


def scale_ticker(log=True):
    """Ticks of a log axis (``log``) or of a colour bar on either scale: see ``_SCALE_TICKS_JS``."""
    return CustomJSTicker(args={"log": bool(log)}, major_code=_SCALE_TICKS_JS, tags=[SCALE_TICKS])


def value_labels():
    """A label for each tick by its value, in one style for all the ticks of a scale: "0.05", "700", "10k", or
    e-notation for every tick when one needs it ("1e+12 … 1e+16", not "1T" beside "1e+16"): ``_VALUE_LABELS_JS``,
    the same as ``plots.static.value_texts``."""
    return CustomJSTickFormatter(code=_VALUE_LABELS_JS, tags=[VALUE_LABELS])


def _figure(title="", width=WIDTH, height=HEIGHT, **kwargs):
    fig = figure(title=title, width=width, height=height, tools="", toolbar_location=None, output_backend="canvas",
                 **kwargs)
    fig.title.text_font_size = "10pt"
    fig.xaxis.major_label_text_font_size = fig.yaxis.major_label_text_font_size = "8pt"
    fig.xaxis.axis_label_text_font_size = fig.yaxis.axis_label_text_font_size = "8pt"
    return fig


def _live_figure(**kwargs):
    fig = _figure(height=LIVE_HEIGHT, sizing_mode="stretch_width", min_width=220, **kwargs)
    # room for the axes held fixed: neighbouring rows' axes line up, and while the labels fit in it a new label width
    # moves nothing (a y-axis between 40 and 58 px wide in a 50 px border, an x-axis of 42-46 in the default, had the
    # page lay a WatchPanel's document out about once a second, each time a frame of ~20 ms of forced layout)
    fig.min_border_left, fig.min_border_bottom = 60, 48
    return fig


# ------------------------------------------------------------------------------------------- ranges set by Python
# A live figure's ranges are Range1d set from Python with its data, in the same update (``fit_range``): BokehJS's
# DataRange1d recomputes its bounds inside a paint, and when they change asks for another paint and lays the plot
# out again (a WatchPanel's histograms and trends changed range on 10 of 18 updates). ``sticky_range`` changes them
# only when the data leaves them or shrinks to under half of them, so most updates repaint once and lay out nothing.

def live_range():
    """A range for ``fit_range`` (0…1 until the first fit, as BokehJS shows an empty auto range)."""
    return Range1d(start=0, end=1)


def fit_range(live, rng, extent, start=None, log=False, headroom=0.25, tight=False):
    """Set ``rng`` (a ``Range1d`` of a figure in the ``LiveDocument`` ``live``) to show ``extent`` (``(lo, hi)``,
    finite; None: leave it), moving it only when ``sticky_range`` says so; ``log``: for a log axis (``extent`` and
    ``start`` positive); ``headroom``: ``sticky_range``'s. ``tight``: fitted afresh, as a first fit (a run that
    is over: no room left for growth that will not come). ``live=None``: set the model itself, fitted afresh (a
    figure drawn once: a static copy).
    Returns whether it changed."""
    if extent is None:
        return False
    ends = (None, None) if live is None else (live.get(rng, "start"), live.get(rng, "end"))
    shown = None if None in ends else ends
    current = None if tight else shown
    if log:         # fitted in decades: headroom and the "half full" rule mean the same on a log axis
        decades = lambda e: None if e is None else (math.log10(e[0]), math.log10(e[1]))     # noqa: E731
        new = sticky_range(decades(current), *decades(extent), start=None if start is None else math.log10(start),
                           headroom=headroom)
        if new == decades(shown):
            return False
        new = (10.0 ** new[0], 10.0 ** new[1])
    else:
        new = sticky_range(current, *extent, start=start, headroom=headroom)
        if new == shown:
            return False
    if live is None:
        rng.update(start=new[0], end=new[1])
    else:
        live.set(rng, start=new[0], end=new[1])
    return True


# ------------------------------------------------------------------------------------------------------ histograms

def histogram_source():
    return ColumnDataSource({"left": [], "right": [], "top": [], "top_log": []})


def histogram_columns(hist):
    """The source columns for ``histogram_data`` output: ``top_log`` is ``top`` with empty bins as NaN, which a log
    axis cannot draw."""
    top = np.asarray(hist["top"], np.float64)
    return {"left": np.asarray(hist["left"], np.float64), "right": np.asarray(hist["right"], np.float64),
            "top": top, "top_log": np.where(top > 0, top, np.nan)}


def is_spiky(top, ratio=20.0):
    """Whether a histogram's tallest bin dwarfs the typical non-empty one (a ReLU's zeros, a gradient's peak at 0):
    then a linear count axis shows one bar and hides the tails."""
    counts = np.asarray(top, np.float64)
    counts = counts[counts > 0]
    return counts.size > 2 and counts.max() > ratio * np.median(counts)


LOG_COUNT_FLOOR = 0.5    # where a log count axis starts: the bars stand on it, so a count of 1 shows

# Hover texts of histogram bars: the range to four significant digits, counts in full.
BUCKET_TIP = ("bucket", "@left{%0.4g} … @right{%0.4g}")
BUCKET_FORMATS = {"@left": "printf", "@right": "printf"}


def histogram_bars(fig, source, color=VALUE, alpha=0.7, log=False, top="top", tooltips=(), add_glyph=None,
                   **renderer_kwargs):
    """Draw ``source``'s rows (``left``, ``right`` and the count column ``top``) as bars on ``fig``, with a hover
    that reads a bar's bucket range and count after ``tooltips`` (other columns: the step, the run). The one
    histogram-bars builder of the widgets and the dashboard.

    ``color`` is a colour or a ``{"field": ...}`` spec; overlapping histograms take ``alpha`` < 1 so each shows
    through. ``log``: the bars stand on 0.5 of a log count axis and their tops come from the ``{top}_log`` column
    (empty buckets NaN: see ``histogram_columns``). ``add_glyph(fig, source, glyph, **kwargs)`` adds the renderer
    (a dashboard card's ``CardParts.add_glyph``; default: the figure's own). Returns the renderer."""
    glyph = Quad(left="left", right="right", top=f"{top}_log" if log else top, bottom=LOG_COUNT_FLOOR if log else 0,
                 fill_color=color, fill_alpha=alpha, line_color=color, line_alpha=min(1.0, alpha + 0.3))
    renderer = (add_glyph(fig, source, glyph, **renderer_kwargs) if add_glyph is not None else
                fig.add_glyph(source, glyph, **renderer_kwargs))
    fig.add_tools(HoverTool(renderers=[renderer], point_policy="follow_mouse", formatters=dict(BUCKET_FORMATS),
                            tooltips=list(tooltips) + [BUCKET_TIP, ("count", f"@{top}{{0,0.[00]}}")]))
    return renderer


def histogram_view(source, log=False, x_label=None):
    """Bars of ``source`` (see ``histogram_columns``) on a linear and on a log count axis, one shown at a time, and the
    ``Checkbox`` that switches between them in the browser. Returns ``(view, toggle)``.

    Nothing of the figures themselves changes as new histograms come (which step one is shows in ``stats_view``'s
    "hist" row, canvas text): BokehJS lays a plot out again whenever an axis property changes, and moves a title's
    element when its width does, each forcing the page to recalculate styles. For the same reason the ranges are
    set from Python with the data (``fit_histogram``), not auto-ranged in the page."""
    linear = _live_figure(x_axis_label=x_label, y_axis_label="count", x_range=live_range(), y_range=live_range())
    histogram_bars(linear, source)
    logarithmic = _live_figure(x_axis_label=x_label, y_axis_label="count (log)", y_axis_type="log",
                               x_range=linear.x_range, y_range=Range1d(start=LOG_COUNT_FLOOR, end=10))
    logarithmic.yaxis.ticker, logarithmic.yaxis.formatter = scale_ticker(), value_labels()
    histogram_bars(logarithmic, source, log=True)
    linear.visible, logarithmic.visible = not log, log
    toggle = Checkbox(label="log count", active=log, margin=(0, 8, 0, 8))
    toggle.js_on_change("active", CustomJS(args={"linear": linear, "logarithmic": logarithmic}, code=(
        "linear.visible = !cb_obj.active; logarithmic.visible = cb_obj.active;")))
    return column(linear, logarithmic, sizing_mode="stretch_width"), toggle


def fit_histogram(live, figures, columns, tight=False):
    """Fit the ranges of ``histogram_view``'s ``figures`` (linear, log) to ``columns`` (``histogram_columns``),
    set in ``live`` with them: every bucket and the tallest count inside (see ``fit_range``; ``tight``: afresh)."""
    linear, logarithmic = figures
    fit_range(live, linear.x_range, finite_extent(columns["left"], columns["right"]), tight=tight)
    top = finite_extent(columns["top"])
    if top is not None and top[1] > 0:
        fit_range(live, linear.y_range, (0.0, top[1]), start=0.0, tight=tight)
        fit_range(live, logarithmic.y_range, (LOG_COUNT_FLOOR, max(top[1], 1.0)), start=LOG_COUNT_FLOOR, log=True,
                  tight=tight)


# ---------------------------------------------------------------------------------------------- bands over steps

def draw_bands(fig, source, bands, line, marks, tooltips, add_glyph=None):
    """Draw a series over steps on ``fig``: the one band-over-steps builder (the widgets' trends, the dashboard's
    distributions).

    ``bands``: ``(lower, upper, colour, alpha)`` column pairs of ``source``, each a ``VArea`` over ``step``, drawn in
    order (the outermost first); ``line``: ``(column, colour)``, the line drawn over them, which a vertical hover
    follows, showing ``tooltips`` (``{%…}`` formats are printf); ``marks``: ``(left, right, top)`` columns of red
    marks the plot's full height where ``top`` is 1 (NaN elsewhere), from ``left`` to ``right`` (the same column: a
    line at the step). The marks live on a 0…1 range of their own: the value axis follows the bands and the line.
    ``add_glyph``: as for ``histogram_bars``. Returns the line's renderer."""
    def add(glyph, **kwargs):
        if add_glyph is not None:
            return add_glyph(fig, source, glyph, **kwargs)
        return fig.add_glyph(source, glyph, **kwargs)

    drawn = [add(VArea(x="step", y1=lower, y2=upper, fill_color=colour, fill_alpha=alpha))
             for lower, upper, colour, alpha in bands]
    name, colour = line
    centre = add(Line(x="step", y=name, line_color=colour, line_width=1.5))
    if isinstance(fig.y_range, DataRange1d):
        fig.y_range.renderers = drawn + [centre]
    fig.extra_y_ranges = {"marks": Range1d(0, 1)}
    left, right, top = marks
    # outlined: a mark one step wide (or none) on a long run is thinner than a pixel, and must still show
    add(Quad(left=left, right=right, bottom=0, top=top, fill_color=ALARM, fill_alpha=0.35, line_color=ALARM,
             line_alpha=0.6, line_width=1), y_range_name="marks")
    printf = {field for _, text in tooltips for field in re.findall(r"(@\w+)\{%", text)}
    # limit: a pointer right over a point hits both segments that meet there, which name the same step
    fig.add_tools(HoverTool(renderers=[centre], mode="vline", limit=1, tooltips=list(tooltips),
                            formatters=dict.fromkeys(sorted(printf), "printf")))
    return centre


# ---------------------------------------------------------------------------------------------------------- trends

def trend_source():
    return ColumnDataSource({c: [] for c in Trend.COLUMNS + ("mark",)})


def trend_columns(columns):
    """The source columns for ``Trend`` columns: ``mark`` is 1 over buckets that saw NaN/Inf (drawn as red bands
    the plot's full height), NaN elsewhere."""
    return dict(columns, mark=np.where(np.asarray(columns["nonfinite"]) > 0, 1.0, np.nan))


def trend_figure(source, y_label="value"):
    """A ``Trend`` over steps (``draw_bands``): the mean as a line, mean ± std as a band, the min…max envelope faint
    behind, and a red band the plot's height over every step that held NaN/Inf. Hover reads a bucket's numbers.
    Its ranges are ``Range1d``s set with the data, never auto ranges: from Python (``fit_trend``), or by the page's
    own script where the page fills the source (the ``HealthPanel``'s)."""
    fig = _live_figure(x_axis_label="step", y_axis_label=y_label, x_range=live_range(), y_range=live_range())
    fig.xaxis.formatter = compact_ticks()
    fig.yaxis.formatter = compact_ticks()      # a diverging gradient norm: "3e+18", not BokehJS's "3.000e+18"
    draw_bands(fig, source, [("min", "max", ENVELOPE, 0.35), ("lower", "upper", BAND, 0.3)], ("mean", BAND),
               ("step", "end", "mark"), tooltips=[
                   ("step", "@step{0,0}"), ("mean", "@mean{%0.4g}"), ("mean ± std", "@lower{%0.4g} … @upper{%0.4g}"),
                   ("min … max", "@min{%0.4g} … @max{%0.4g}"), ("NaN/Inf", "@nonfinite{0,0}")])
    return fig


def fit_trend(live, fig, columns, tight=False):
    """Fit ``trend_figure`` ``fig``'s ranges to a trend source's full ``columns`` (every step, every finite value of
    the bands and the line, so a spike shows), set in ``live`` with them (see ``fit_range``). ``tight``: fitted
    afresh, for a run that is over (while it runs the step axis keeps room to grow: up to a third of it empty)."""
    # steps only grow: room for half as many again when outgrown, so the axis moves once per 1.5x of the run
    fit_range(live, fig.x_range, finite_extent(columns["step"], columns["end"]), headroom=0.5, tight=tight)
    fit_range(live, fig.y_range, finite_extent(*(columns[c] for c in ("min", "max", "lower", "upper", "mean"))),
              tight=tight)


# ------------------------------------------------------------------------------------------- numbers that change
# Drawn as canvas text in small figures, not as Div HTML: BokehJS lays the whole document out again whenever a Div's
# text changes (measured: a third of the page's time while a panel updated 20 times a second), whereas new text in
# a figure repaints that figure only.

STATS_ROWS = ("step", "shape", "min", "max", "mean", "std", "NaN", "Inf", "hist")
TEXT_FONT, TEXT_SIZE, TEXT_COLOR, LABEL_COLOR = value("monospace"), "9pt", "#222222", "#777777"


def _number(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "—" if math.isnan(v) else str(v)
    return f"{v:.5g}" if isinstance(v, float) else str(v)


def _text_figure(**kwargs):
    fig = figure(tools="", toolbar_location=None, output_backend="canvas", x_axis_location=None,
                 y_axis_location=None, outline_line_color=None, min_border=2, **kwargs)
    fig.grid.visible = False
    return fig


def stats_source():
    return ColumnDataSource(stats_columns(None))


def stats_columns(summary, step=None, histogram=""):
    """The source columns of ``stats_view`` for a ``tensor_summary`` (or an array / ``TensorStats``) at ``step``;
    non-zero NaN/Inf counts in red; ``histogram``: what the "hist" row says (the step of the histogram shown beside
    the table). ``summary=None``: the labels alone."""
    if summary is not None and not isinstance(summary, dict):
        summary = tensor_summary(summary)
    values = {"step": "" if step is None else str(step), "hist": histogram}
    for key, label in (("shape", "shape"), ("min", "min"), ("max", "max"), ("mean", "mean"), ("std", "std"),
                       ("nan", "NaN"), ("inf", "Inf")):
        values[label] = "" if summary is None else _number(summary.get(key, ""))
    alarm = {"NaN": summary is not None and summary.get("nan"), "Inf": summary is not None and summary.get("inf")}
    return {"y": [i + 0.5 for i in range(len(STATS_ROWS))], "label": list(STATS_ROWS),
            "value": [values[r] for r in STATS_ROWS], "color": [ALARM if alarm.get(r) else TEXT_COLOR
                                                               for r in STATS_ROWS]}


def stats_view(source):
    """A fixed-size table of a tensor's statistics (see ``stats_columns``), one row a line."""
    fig = _text_figure(width=STATS_WIDTH, height=LIVE_HEIGHT, x_range=Range1d(0, 1),
                       y_range=Range1d(len(STATS_ROWS) + 0.5, 0))
    style = {"text_font": TEXT_FONT, "text_font_size": TEXT_SIZE, "text_baseline": "middle", "source": source}
    fig.text(x=0.03, y="y", text="label", text_color=LABEL_COLOR, **style)
    fig.text(x=0.3, y="y", text="value", text_color="color", **style)
    return fig


def bar_columns(fraction):
    """The columns of a progress bar's quad from 0 to ``fraction`` (of 1) in ``status_view``."""
    return {"left": [0.0], "right": [fraction], "bottom": [0.12], "top": [0.36]}


def status_sources():
    """``(text, done)`` sources of ``status_view``: one line of text, and the done part of a progress bar."""
    return ColumnDataSource({"text": [""]}), ColumnDataSource(bar_columns(0.0))


def status_view(text, done, bar=True):
    """One line of status text across the cell's width, above a progress bar (``done`` from 0 to 1) if ``bar``."""
    fig = _text_figure(height=40 if bar else 22, sizing_mode="stretch_width", x_range=Range1d(0, 1),
                       y_range=Range1d(0, 1))
    fig.text(x=0.0, y=0.74 if bar else 0.5, text="text", text_font=TEXT_FONT, text_font_size=TEXT_SIZE,
             text_color=TEXT_COLOR, text_baseline="middle", source=text)
    if bar:
        track = ColumnDataSource(bar_columns(1.0))
        fig.quad(left="left", right="right", bottom="bottom", top="top", source=track, fill_color="#e8e8e8",
                 line_color=None)
        fig.quad(left="left", right="right", bottom="bottom", top="top", source=done, fill_color=VALUE,
                 line_color=None)
    return fig


def heading(text_html, **kwargs):
    """A ``Div`` of trusted HTML (callers escape what came from users) across the cell's width, for text that does
    not change (see above)."""
    return Div(text=text_html, sizing_mode="stretch_width", disable_math=True, **kwargs)


# ------------------------------------------------------------------------------------------ dashboard building blocks

def plain_figure(title="", width=WIDTH, height=HEIGHT, **kwargs):
    """A small toolbar-free canvas figure, as every builder here makes; for views that draw their own glyphs."""
    return _figure(title, width, height, **kwargs)


def text_div(text, **kwargs):
    """A ``Div`` showing ``text`` as text: HTML-escaped, and with Bokeh's TeX processing off (``$$…$$`` in a log is
    not mathematics)."""
    return Div(text=html.escape(str(text)), disable_math=True, **kwargs)


def card(title, subtitle, *children):
    """One run × tag box of a dashboard tab: ``title`` (the tag) and ``subtitle`` (the run) escaped, then
    ``children``."""
    # colours from the dashboard page's colour scheme when it sets them (flowlab.dashboard.app.page_css)
    head = Div(text=f"<b>{html.escape(str(title))}</b> &nbsp;<span style=\"color:var(--flowlab-muted,#777)\">"
                    f"{html.escape(str(subtitle))}</span>", disable_math=True)
    return column(head, *children, styles={"border": "1px solid var(--flowlab-frame,#ddd)", "border-radius": "4px",
                                           "padding": "6px"})


def card_grid():
    """A wrapping row for cards; views append to its ``children``. (It starts with an empty Div: Bokeh warns about
    layouts without children in every session; hidden, it takes no gap at the start of the first row.)"""
    return row([Div(text="", width=0, height=0, visible=False)], styles={"flex-wrap": "wrap", "gap": "10px"})


# ------------------------------------------------------------------------------------ sources expanded in the page
# A server sends a compact form (flat columns: one typed array each on the wire, however many lines or polygons) and
# the page expands it into what a glyph draws (ragged rows), in a source that is never synced back. The expansion runs
# when the compact source's data is set, streamed or patched, when the document is ready (the dashboard's READY_JS
# re-emits every source tagged EXPAND_TAG: a model's first data fires no change in the page), and on
# ``nudge_next_turn`` (for a source that reached a live page inside a patch, with its data).
EXPAND_TAG = "flowlab:expand-on-ready"


def expand_in_page(source, target, callback):
    """Run ``callback`` (a ``CustomJS`` that fills ``target`` from ``source``) in the page whenever ``source``
    changes (see above). ``target`` holds the callback too: a model reaches the page only when something the document
    shows refers to it, and a glyph draws ``target``, not ``source``."""
    source.tags = [EXPAND_TAG, 0]
    for event in ("data", "streaming", "patching", "tags"):
        source.js_on_change(event, callback)
    target.js_on_change("tags", callback)


def served(doc):
    """Whether ``doc`` is a Bokeh server session's document: work for it can go on over later IOLoop turns
    (``add_next_tick_callback``), where a document outside a server (a test, a static copy) is built at once."""
    return doc is not None and doc.session_context is not None


def nudge_next_turn(doc, *sources):
    """Make the page expand ``sources`` on the IOLoop turn after this one, with a message of a few bytes each, when
    ``doc`` is a served document (sources it received in this turn's patch arrived with their data)."""
    def nudge():
        for source in sources:
            source.tags = [EXPAND_TAG, source.tags[-1] + 1]
    if sources and served(doc):
        doc.add_next_tick_callback(nudge)


# ----------------------------------------------------------------------------------- histogram cards over steps
# One row per bucket in flat float columns (step, left, right, count, top) and one glyph per source, however many
# steps: BokehJS's cost grows with glyphs and ragged arrays, hardly with rows. Ranges and colours follow the data in
# the browser, so streaming rows is the only message a new step needs. Glyphs go in through ``add_glyph``: the
# plotting methods (``fig.quad``...) also build a nonselection and a muted glyph per renderer, models that nothing
# here uses and that each cost building, sending and initialising in the browser.


class CardParts:
    """Models that the cards of one document share because the page keeps no per-card state in them: a ticker, a
    tick formatter and label policy, the scale (BokehJS copies it for each plot), the "every row" filter of a
    renderer's view and a source's selection policy. Made per card they were two fifths of a card's models, each
    built, serialised and initialised in the page. (A Bokeh model belongs to one document: one ``CardParts`` per
    view.)"""

    def __init__(self):
        self.ticker = BasicTicker()
        self.formatter = BasicTickFormatter()
        self.labels = AllLabels()
        self.scale = LinearScale()
        self.all_rows = AllIndices()
        self.selection = UnionRenderers()
        self._steps = None

    @property
    def step_formatter(self):
        """Tick labels of a step axis: none below step 0 (where offset ridges rise above the first step, ``-100``
        would read as a step), thousands separated."""
        if self._steps is None:
            self._steps = CustomJSTickFormatter(code="return tick < 0 ? '' : tick.toLocaleString('en-US');")
        return self._steps

    def source(self, data, **kwargs):
        return ColumnDataSource(data, selection_policy=self.selection, **kwargs)

    def add_glyph(self, fig, source, glyph, **kwargs):
        return fig.add_glyph(source, glyph, view=CDSView(filter=self.all_rows), **kwargs)

    def axis(self, label, formatter=None, **kwargs):
        # no minor ticks: a page of cards is relaid out as a whole, and every drawn part of every card adds style
        # lookups to it (BokehJS reads each visual's colours through getComputedStyle)
        return LinearAxis(axis_label=label, ticker=self.ticker, formatter=formatter or self.formatter,
                          major_label_policy=self.labels, major_label_text_font_size="8pt",
                          axis_label_text_font_size="8pt", minor_tick_line_color=None, **kwargs)


def card_figure(title, subtitle, parts, width=WIDTH, height=HEIGHT, x_axis_label=None, y_axis_label=None,
                y_range=None, y_formatter=None):
    """A dashboard card that is one figure (one canvas: no DOM layout of its own for BokehJS to measure): ``title``
    (the tag) in bold over ``subtitle`` (the run) in grey, both canvas text (never parsed as HTML), and a thin frame;
    ``parts`` the view's ``CardParts``.

    Built from a bare ``Plot`` with only what a card draws: ``figure()`` adds grids, tools and defaults that a page of
    cards pays for three times, building them, serialising them and initialising them in the browser. The plot and
    its ranges are not synced back (``syncable=False``): nothing on the server reads what the page computes for them
    (ranges fitted to the data, the plot's inner size), and applying those patches took the server as long as
    building the cards."""
    y_range = y_range or DataRange1d()
    y_range.syncable = False
    fig = Plot(width=width, height=height, x_range=DataRange1d(syncable=False), y_range=y_range,
               x_scale=parts.scale, y_scale=parts.scale, toolbar_location=None, output_backend="canvas",
               border_fill_color="white", outline_line_color="#dddddd", syncable=False,
               title=Title(text=str(title), text_font_size="10pt", text_font_style="bold"))
    fig.add_layout(parts.axis(x_axis_label), "below")
    fig.add_layout(parts.axis(y_axis_label, formatter=y_formatter), "left")
    # A title added "above" sits between the figure's own title and the plot.
    # (grey in the dashboard's dark scheme too, which sets every title's colour through --bk-text-color)
    fig.add_layout(Title(text=str(subtitle), text_font_size="8pt", text_font_style="normal", text_color="#777777",
                         styles={"--bk-text-color": "var(--flowlab-muted, #777777)"}),
                   "above")
    return fig


HISTOGRAM_MODES = ("offset", "overlay")


# A step's outline from its bucket rows: up from the baseline (the step) at the first bucket's left edge, along each
# bucket's top, down to the baseline between buckets that do not touch (empty buckets have no row), down at the end.
_OUTLINE_JS = """
const d = rows.data, n = d.step.length, xs = [], ys = [], steps = [];
let a = 0;
while (a < n) {
  const s = d.step[a];
  let b = a;
  while (b < n && d.step[b] === s) b++;
  const x = [d.left[a]], y = [s];
  for (let i = a; i < b; i++) {
    if (i > a && d.left[i] !== d.right[i - 1]) { x.push(d.right[i - 1], d.left[i]); y.push(s, s); }
    x.push(d.left[i], d.right[i]); y.push(d.top[i], d.top[i]);
  }
  x.push(d.right[b - 1]); y.push(s);
  xs.push(new Float64Array(x)); ys.push(new Float64Array(y)); steps.push(s);
  a = b;
}
target.data = {xs, ys, step: steps};
"""


# The bucket (``format`` "bucket": its range; "count": its count) of the ridge of step ``value`` under the pointer,
# from the card's bucket rows; the step itself for any other format.
_RIDGE_BUCKET_JS = """
const d = rows.data, x = special_vars.x;
const short = (v) => String(Number(v.toPrecision(4)));
if (format !== "bucket" && format !== "count") return Number(value).toLocaleString("en-US");
for (let i = 0; i < d.step.length; i++)
  if (d.step[i] === value && d.left[i] <= x && x <= d.right[i])
    return format === "bucket" ? short(d.left[i]) + " … " + short(d.right[i]) : d.count[i].toLocaleString("en-US");
return format === "bucket" ? "between buckets" : "0";
"""


class HistogramCard:
    """Histograms of one series over steps in TensorBoard's two modes, one shown at a time (``show``), from a source of
    flat bucket rows (``step``, ``left``, ``right``, ``count``, ``top``; a step's rows together, steps in order):

    - "offset": ridges on a step axis, each step's histogram one filled outline from ``step`` up to its buckets'
      ``top`` (polygons the page builds from the rows: one path per step draws ~5x faster than a quad per bucket),
      filled by step through ``colors`` (a colour mapper without low/high: each source's own range, so one mapper
      serves every card), later steps in front; the step axis is flipped (oldest at the top);
    - "overlay": each bucket's top as a segment at its ``count``, coloured by step, on a count axis.

    ``source`` is drawn plain; ``highlight(source)`` adds one drawn in red (the newest step). ``figure`` is the
    card; the page's outline sources are named ``cards-source:<name>``. Hovering reads the step, bucket range and
    count under the pointer (where ridges or tops overlap, of the newest step: the one in front). A mode's glyphs
    (and the overlay's count axis) are made when it is first shown, and the highlight's when it is first needed:
    most viewers never leave the default mode, most series never need the highlight, and a page of cards would carry
    their models for nothing. ``sources`` are the ones the page expands (see ``expand_in_page``)."""

    def __init__(self, title, subtitle, source, colors, parts, mode="offset", name="histograms", width=WIDTH,
                 height=300):
        self.parts, self.name = parts, name
        self.figure = card_figure(title, subtitle, parts, width, height, x_axis_label="value", y_axis_label="step",
                                  y_range=DataRange1d(flipped=True, range_padding=0.02),
                                  y_formatter=parts.step_formatter)
        self.sources, self.colors = [source], colors
        # The drawn outlines are built in the page after the first paint: an undrawn glyph over the server's rows
        # gives the ranges their extent from the start (else BokehJS warns "could not set initial ranges")
        extent = parts.add_glyph(self.figure, source, Segment(x0="left", y0="step", x1="right", y1="step"))
        extent.visible = False
        self.figure.y_range.renderers = [extent]
        self.outlines = []                  # the page's polygons of each source, in offset mode
        self.modes: dict[str, list] = {}
        self.mode = None
        self.show(mode)

    def show(self, mode):
        if mode not in HISTOGRAM_MODES:
            raise ValueError(f"mode must be one of {HISTOGRAM_MODES}, got {mode!r}")
        self.mode = mode
        if mode not in self.modes:
            self.modes[mode] = [] if mode == "offset" else self._count_axis()
            for i, source in enumerate(self.sources):
                self._draw(mode, source, plain=i == 0)
        for name, renderers in self.modes.items():
            for r in renderers:
                r.visible = name == mode
        step_axis, *count_axis = self.figure.left
        step_axis.visible = mode == "offset"
        for axis in count_axis:
            axis.visible = mode == "overlay"

    def highlight(self, source):
        """Draw ``source`` in red over the others, in every mode made so far."""
        self.sources.append(source)
        for mode in self.modes:
            self._draw(mode, source, plain=False).visible = mode == self.mode

    def _count_axis(self):
        self.figure.extra_y_ranges = {"count": DataRange1d(start=0, syncable=False)}
        self.figure.add_layout(self.parts.axis("count", y_range_name="count"), "left")
        return []

    def _draw(self, mode, source, plain):
        fill = {"field": "step", "transform": self.colors}
        if mode == "offset":
            outline = self.parts.source({"xs": [], "ys": [], "step": []}, syncable=False,
                                        name=f"cards-source:{self.name}")
            expand_in_page(source, outline, CustomJS(args=dict(rows=source, target=outline), code=_OUTLINE_JS))
            glyph = Patches(xs="xs", ys="ys", fill_color=fill, fill_alpha=0.85,
                            line_color="#333333" if plain else ALARM, line_alpha=0.35 if plain else 1.0,
                            line_width=0.5 if plain else 1.5)
            renderer = self.parts.add_glyph(self.figure, outline, glyph)
            self.outlines.append(outline)
            self.figure.y_range.renderers = self.figure.y_range.renderers + [renderer]
            # a ridge is one polygon: the bucket under the pointer is looked up in its step's rows
            bucket = CustomJSHover(args=dict(rows=source), code=_RIDGE_BUCKET_JS)
            tips, formatters = [("step", "@step{0,0}"), ("bucket", "@step{bucket}"), ("count", "@step{count}")], \
                {"@step": bucket}
        else:
            glyph = Segment(x0="left", y0="count", x1="right", y1="count", line_color=fill if plain else ALARM,
                            line_alpha=0.7 if plain else 1.0, line_width=1.2 if plain else 2)
            renderer = self.parts.add_glyph(self.figure, source, glyph, y_range_name="count")
            count = self.figure.extra_y_ranges["count"]
            count.renderers = count.renderers + [renderer]
            tips = [("step", "@step{0,0}"), BUCKET_TIP, ("count", "@count{0,0.[00]}")]
            formatters = dict(BUCKET_FORMATS)
        # where ridges or tops overlap, the newest step is the one in front: it alone is named
        self.figure.add_tools(HoverTool(renderers=[renderer], tooltips=tips, formatters=formatters,
                                        sort_by=[("@step", "descending")], limit=1, point_policy="follow_mouse"))
        self.modes[mode].append(renderer)
        return renderer


def distribution_card(title, subtitle, source, columns, parts, labels=None, color="#e8743b", width=WIDTH,
                      height=HEIGHT):
    """A distribution over steps (``draw_bands``): ``columns`` names an odd number of percentile columns of
    ``source``, lowest to highest (min … max); each pair from the outside in is a band over ``step``, the outermost
    faintest, and the middle one a line. Where the ``empty`` column is 1 (a step with nothing finite) a red line
    crosses the plot. Hovering over the plot reads the step and every column's value there, highest first, named by
    ``labels`` (default: the column names). A ``card_figure`` titled ``title`` over ``subtitle``, with the view's
    ``parts``."""
    fig = card_figure(title, subtitle, parts, width, height, x_axis_label="step")
    fig.xaxis.formatter = compact_ticks()
    labels = list(columns) if labels is None else list(labels)
    bands = [(columns[k], columns[-1 - k], color, 0.2) for k in range(len(columns) // 2)]
    tooltips = [("step", "@step{0,0}")] + [(label, f"@{c}{{%0.4g}}") for label, c in zip(labels[::-1],
                                                                                           columns[::-1])]
    draw_bands(fig, source, bands, (columns[len(columns) // 2], "#8c2d04"), ("step", "step", "empty"), tooltips,
               add_glyph=parts.add_glyph)
    return fig
