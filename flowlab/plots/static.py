"""Static HTML for flowlab's Bokeh layouts: what a saved notebook shows where no kernel and no JavaScript run.

A live widget (``WatchPanel``, ``TrainingProgress``) is drawn by BokehJS, but GitHub and nbviewer run no JavaScript, so
each widget also puts this rendering of its last state into the notebook output as ``text/html``. It is not a second
plot layer: it exports the same Bokeh models (their properties and their ``ColumnDataSource`` data, read in Python),
and it covers exactly the subset that flowlab's builders (``flowlab.plots.figures``) use:

* ``Column`` and ``Row``: flexbox ``<div>``s; stretch-width children share what fixed-width ones leave of the width;
  children with ``visible=False`` are left out.
* ``Div``: its ``text`` is trusted HTML (the builders escape what came from users) and goes in as is.
* ``Checkbox``: a static label such as "☑ log count" (the toggle cannot act without JavaScript, but it tells which of
  a histogram's linear/log figures is the one shown).
* ``figure`` / ``Plot``: an inline ``<svg>``: ``LinearScale`` or ``LogScale``; ``Range1d``, and ``DataRange1d``
  auto-ranged as BokehJS 3 does it; at most one ``LinearAxis``/``LogAxis`` below and one left; ``Grid``s; the title;
  ``GlyphRenderer``s of ``Quad``, ``Line``, ``VArea`` and ``Text`` (per-row text and colour; upright, unboxed) on a
  ``ColumnDataSource``, clipped to the frame.

Non-finite data is left out where BokehJS leaves it out: a ``Line`` breaks at it; a ``VArea``'s outline skips the point,
so the area bridges it (BokehJS 3.9's canvas ``lineTo`` ignores it: checked in Chromium); a ``Quad`` with one is not
drawn; on a log axis, values ≤ 0 count as non-finite.

Any other model, glyph, scale, ticker or vectorised visual raises ``TypeError`` naming the class, so an unsupported
figure never silently renders wrong (the caller falls back to text); a glyph naming a missing or non-numeric column
raises ``ValueError``. Tick positions and label formats are this module's own (round 1-2-5 steps, compact labels,
never overlapping), not BokehJS's pixel for pixel; the live figures' step-axis labels, log-axis ticks and their labels
follow the same rules in BokehJS (``figures.compact_ticks``, ``scale_ticker``, ``value_labels``: models tagged
``COMPACT_TICKS``, ``SCALE_TICKS``, ``VALUE_LABELS``, which this module draws as its own).

The output holds no ``<script>``, no ``<style>`` block and no external reference, only inline attributes (sanitisers
such as GitHub's keep those), and every string taken from a model is escaped with ``html.escape``. Coordinates are
rounded to 0.1 px and every glyph renderer is one ``<path>`` (lines and areas in relative steps), so a panel of
500-point trends stays small.
"""
from __future__ import annotations

import html
import math

import numpy as np
from bokeh.core.property.vectorization import Field, Value
from bokeh.models import (AllIndices, BasicTicker, BasicTickFormatter, Checkbox, Column, ColumnDataSource, DataRange1d,
                          Div, GlyphRenderer, Grid, Line, LinearAxis, LinearScale, LogAxis, LogScale, LogTicker,
                          LogTickFormatter, Model, Plot, Quad, Range1d, Row, Text, Title, VArea)
from bokeh.plotting import figure

__all__ = ["to_html", "data_range"]

FONT = "helvetica,arial,sans-serif"   # Bokeh's default canvas font
CHAR_EM = 0.6        # width of a tick label's character, in ems: an upper estimate for digits in Helvetica/Arial
LABEL_GAP = 4.0      # px kept free between neighbouring tick labels
FAR = 1e5            # px: coordinates beyond are clamped (the frame's clip hides them) to keep numbers short
_STRETCH = ("stretch_width", "stretch_both", "scale_width", "scale_both")
_DASHES = {"solid": [], "dashed": [6], "dotted": [2, 4], "dotdash": [2, 4, 6, 4], "dashdot": [6, 4, 2, 4]}


def to_html(layout, width=900):
    """Self-contained HTML (``<div>``s and inline ``<svg>``) showing ``layout``'s current state, for a layout
    ``width`` px wide at most (stretch-width figures are drawn at their share of it and scale down with the page).

    Raises ``TypeError`` naming the class of any model outside the supported subset (see the module docstring)."""
    plots = [m for m in _walk(layout) if type(m) in (Plot, figure)]
    return (f'<div style="max-width:{_n(width)}px;font-family:{FONT}">' + _render(layout, float(width), plots)
            + "</div>")


def data_range(plot, dimension, name=None, plots=()):
    """``(start, end)`` of ``plot``'s range along ``dimension`` (0 or ``"x"``, 1 or ``"y"``), the extra range ``name``
    if given: a ``Range1d`` as set, a ``DataRange1d`` computed as BokehJS computes it (see ``_auto_range``).
    ``plots``: other figures of the layout, which share auto ranges with ``plot`` when they hold the same range."""
    dim = _dimension(dimension)
    rng, log = _range(plot, dim, name), _is_log(plot, dim, name)
    if type(rng) is Range1d:
        return float(rng.start), float(rng.end)
    if type(rng) is DataRange1d:
        shares = [p for p in plots if any(r is rng for r in _ranges(p, dim).values())]
        linked = [plot] + [p for p in shares if p is not plot and p.visible]
        return _auto_range(rng, dim, log, linked)
    raise TypeError(f"static rendering does not support {type(rng).__name__}")


# ------------------------------------------------------------------------------------------------------------ layout

def _walk(model):
    yield model
    if type(model) in (Row, Column):
        for child in model.children:
            yield from _walk(child)


def _render(model, width, plots):
    kind = type(model)
    if kind in (Row, Column):
        return _flex(model, width, plots)
    if kind is Div:
        text = html.escape(model.text) if model.render_as_text else model.text
        return f'<div style="{_fixed_style(model)}{_styles(model)}">{text}</div>'
    if kind is Checkbox:
        mark = "☑" if model.active else "☐"
        return f'<div style="font-size:9pt;margin:2px 8px">{mark} {html.escape(str(model.label))}</div>'
    if kind in (Plot, figure):
        return _figure_svg(model, width, plots)
    raise TypeError(f"static rendering does not support {kind.__name__}")


def _stretches(model):
    """Whether ``model`` takes the width its parent gives it; a layout does when any child does (as in BokehJS, where
    a row of stretch-width figures fills the cell)."""
    if model.sizing_mode in _STRETCH or model.width_policy == "max":
        return True
    return type(model) in (Row, Column) and any(_stretches(c) for c in model.children if c.visible)


def _fixed_width(model):
    return None if _stretches(model) else model.width


def _fixed_style(model):
    width = _fixed_width(model)
    return f"width:{_n(width)}px;" if width is not None else ""


def _styles(model):
    """A layout's ``styles`` dict as inline CSS (``card_grid`` wraps with it); a ``Styles`` model is not supported."""
    if not isinstance(model.styles, dict):
        raise TypeError(f"static rendering does not support {type(model.styles).__name__} styles")
    return "".join(f"{html.escape(str(k).replace('_', '-'))}:{html.escape(str(v))};" for k, v in model.styles.items())


def _flex(layout, width, plots):
    horizontal = type(layout) is Row
    children = [c for c in layout.children if c.visible]
    stretching = [_stretches(c) for c in children]
    fixed = sum(_fixed_width(c) or 0 for c, stretch in zip(children, stretching) if not stretch)
    share = max(width - fixed, 0.0) / sum(stretching) if horizontal and any(stretching) else width
    parts = []
    for child, stretch in zip(children, stretching):
        if stretch:
            child_width = max(share, child.min_width or 0)
            style = "flex:1 1 0;min-width:0" if horizontal else "width:100%"
        else:
            child_width = _fixed_width(child) or width
            style = "flex:0 0 auto"
        parts.append(f'<div style="{style}">{_render(child, float(child_width), plots)}</div>')
    direction = "row" if horizontal else "column"
    return f'<div style="display:flex;flex-direction:{direction};{_styles(layout)}">' + "".join(parts) + "</div>"


# ------------------------------------------------------------------------------------------------------------ ranges

def _dimension(dimension):
    dim = {"x": 0, "y": 1}.get(dimension, dimension)
    if dim not in (0, 1):
        raise ValueError(f"data_range: dimension must be 0, 1, 'x' or 'y', got {dimension!r}")
    return dim


def _ranges(plot, dim):
    extra = plot.extra_x_ranges if dim == 0 else plot.extra_y_ranges
    return {"default": plot.x_range if dim == 0 else plot.y_range, **extra}


def _range(plot, dim, name):
    ranges = _ranges(plot, dim)
    if (name or "default") not in ranges:
        raise ValueError(f"{type(plot).__name__} has no {'xy'[dim]} range named {name!r}")
    return ranges[name or "default"]


def _is_log(plot, dim, name):
    scale = plot.x_scale if dim == 0 else plot.y_scale
    if name and name != "default":
        scale = (plot.extra_x_scales if dim == 0 else plot.extra_y_scales).get(name, scale)
    if type(scale) not in (LinearScale, LogScale):
        raise TypeError(f"static rendering does not support {type(scale).__name__}")
    return type(scale) is LogScale


def _given(value):
    """An explicitly set ``start``/``end`` of a ``DataRange1d`` (unset ones are NaN in Python)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _auto_range(rng, dim, log, plots):
    """BokehJS 3's ``DataRange1d.update`` in Python: the union of the data bounds of the range's renderers (its
    ``renderers`` if set, otherwise every glyph renderer of the figures sharing it, whatever range name they draw on,
    as BokehJS does), padded by ``range_padding`` around the centre, then explicitly set ends put back. With no data at
    all: 0…1 on a linear axis (BokehJS would give NaN), 0.1…10 padded on a log one (as BokehJS does)."""
    lo, hi = math.inf, -math.inf
    chosen = rng.renderers if isinstance(rng.renderers, list) and rng.renderers else None
    for plot in plots:
        for renderer in plot.renderers:
            if (chosen is None or any(r is renderer for r in chosen)) and (renderer.visible or not rng.only_visible):
                r_lo, r_hi = _renderer_bounds(renderer, dim, log)
                lo, hi = min(lo, r_lo), max(hi, r_hi)
    start, end = rng.start if _given(rng.start) else None, rng.end if _given(rng.end) else None
    if not log and lo > hi:
        lo = start if start is not None else (end - 1.0 if end is not None else 0.0)
        return lo, (end if end is not None else lo + 1.0)
    lo, hi = _padded(rng, start if start is not None else lo, end if end is not None else hi, log)
    if start is not None and (start > 0 or not log):
        lo = start
    if end is not None and (end > 0 or not log):
        hi = end
    lo, hi = (hi, lo) if rng.flipped else (lo, hi)
    return _follow(rng, lo, hi)


def _padded(rng, lo, hi, log):
    """BokehJS's ``DataRange1d._compute_range`` without the follow part: ``(start, end)`` around the data's centre."""
    padding, percent = rng.range_padding, rng.range_padding_units == "percent"
    if log:
        if not (math.isfinite(lo) and lo > 0):
            lo = hi / 100 if math.isfinite(hi) and hi > 0 else 0.1
        if not (math.isfinite(hi) and hi > 0):
            hi = lo * 100
        if hi == lo:
            span, centre = rng.default_span + 0.001, math.log10(lo)
        else:
            a, b = (math.log10(lo), math.log10(hi)) if percent else (math.log10(lo - padding), math.log10(hi + padding))
            span, centre = (b - a) * (1 + padding if percent else 1), (a + b) / 2
        span = _clamp_interval(rng, span)
        return 10 ** (centre - span / 2), 10 ** (centre + span / 2)
    span = rng.default_span if hi == lo else ((hi - lo) * (1 + padding) if percent else hi - lo + 2 * padding)
    span, centre = _clamp_interval(rng, span), (lo + hi) / 2
    return centre - span / 2, centre + span / 2


def _clamp_interval(rng, span):
    low = rng.min_interval if rng.min_interval is not None else 0.0
    high = rng.max_interval if rng.max_interval is not None else math.inf
    return min(max(span, low), high)


def _follow(rng, start, end):
    sign = -1 if rng.flipped else 1
    if rng.follow_interval is not None and abs(start - end) > rng.follow_interval:
        if rng.follow == "start":
            end = start + sign * rng.follow_interval
        elif rng.follow == "end":
            start = end - sign * rng.follow_interval
    return start, end


def _renderer_bounds(renderer, dim, log):
    """``(lo, hi)`` of a renderer's data along ``dim`` over the elements BokehJS indexes (every coordinate finite); on
    a log range, as BokehJS's ``log_bounds``: lowest positive low end, highest high end of elements reaching above 0."""
    lo, hi = _extents(renderer, dim)
    if log:
        lo, hi = lo[lo > 0], hi[hi > 0]
    return (float(lo.min()) if lo.size else math.inf), (float(hi.max()) if hi.size else -math.inf)


def _extents(renderer, dim):
    glyph, values = renderer.glyph, _glyph_data(renderer)
    if type(glyph) is Quad:
        a, b = (values["left"], values["right"]) if dim == 0 else (values["bottom"], values["top"])
        ok = np.isfinite(values["left"] + values["right"] + values["bottom"] + values["top"])
    elif type(glyph) in (Line, Text):
        a = b = values["x"] if dim == 0 else values["y"]
        ok = np.isfinite(values["x"] + values["y"])
    else:
        a, b = (values["x"], values["x"]) if dim == 0 else (values["y1"], values["y2"])
        ok = np.isfinite(values["x"] + values["y1"] + values["y2"])
    return np.minimum(a, b)[ok], np.maximum(a, b)[ok]


# -------------------------------------------------------------------------------------------------------- glyph data

_COORDS = {Quad: ("left", "right", "top", "bottom"), Line: ("x", "y"), VArea: ("x", "y1", "y2"), Text: ("x", "y")}


def _check_renderer(renderer):
    if type(renderer) is not GlyphRenderer:
        raise TypeError(f"static rendering does not support {type(renderer).__name__}")
    glyph, source = renderer.glyph, renderer.data_source
    for model in (glyph, source, renderer.view.filter):
        if type(model) not in (Quad, Line, VArea, Text, ColumnDataSource, AllIndices):
            raise TypeError(f"static rendering does not support {type(model).__name__}")
    if type(glyph) not in _COORDS:
        raise TypeError(f"static rendering does not support {type(glyph).__name__} as a glyph")
    # Each of these changes what BokehJS draws; none is used by flowlab's builders.
    unsupported = {"coordinates": renderer.coordinates is not None, "muted": renderer.muted,
                   "a selection": bool(source.selected.indices), "decorations": bool(glyph.decorations),
                   "a hatch_pattern": getattr(glyph, "hatch_pattern", None) is not None,
                   "a border_radius": bool(getattr(glyph, "border_radius", 0))}
    if type(glyph) is Text:
        unsupported.update({"an angle": _scalar(glyph.angle, "angle") != 0,
                            "an offset": _scalar(glyph.x_offset, "x_offset") != 0 or _scalar(glyph.y_offset,
                                                                                             "y_offset") != 0,
                            "a background or border": _scalar(glyph.background_fill_color, "background") is not None
                            or _scalar(glyph.border_line_color, "border") is not None})
    for what, present in unsupported.items():
        if present:
            raise TypeError(f"static rendering does not support {type(glyph).__name__} with {what}")


def _glyph_data(renderer):
    """The glyph's coordinates as float64 arrays of the source's length (constants broadcast, None as NaN)."""
    _check_renderer(renderer)
    glyph, data = renderer.glyph, renderer.data_source.data
    columns, constants = {}, {}
    for prop in _COORDS[type(glyph)]:
        kind, value = _spec(glyph, prop)
        (columns if kind == "field" else constants)[prop] = value
    arrays = {prop: _column(data, name, glyph, prop) for prop, name in columns.items()}
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) > 1:
        raise ValueError(f"{type(glyph).__name__}: columns of different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else len(next(iter(data.values()), ()))
    arrays.update({prop: np.full(n, value, np.float64) for prop, value in constants.items()})
    return arrays


def _spec(glyph, prop):
    """``("field", column name)`` or ``("value", number)`` of a glyph's coordinate property."""
    spec = getattr(glyph, prop)
    if isinstance(spec, dict):
        spec = Field(spec["field"], spec.get("transform")) if "field" in spec else Value(spec.get("value"))
    if isinstance(spec, str):
        return "field", spec
    if isinstance(spec, Field):
        if isinstance(spec.transform, Model):
            raise TypeError(f"static rendering does not support {type(spec.transform).__name__}")
        return "field", spec.field
    if isinstance(spec, Value):
        spec = spec.value
    if isinstance(spec, (int, float, np.number)) and not isinstance(spec, bool):
        return "value", float(spec)
    raise TypeError(f"static rendering does not support {type(glyph).__name__}.{prop} = {spec!r}")


def _column(data, name, glyph, prop):
    if name not in data:
        raise ValueError(f"{type(glyph).__name__}.{prop}: the source has no column {name!r}")
    values = np.asarray(data[name])
    if values.dtype.kind in "fiub":
        return values.astype(np.float64).ravel()
    try:                       # a list holding None (Bokeh's missing value) comes as an object array
        return np.asarray(data[name], np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"{type(glyph).__name__}.{prop}: column {name!r} is not numeric") from None


# ------------------------------------------------------------------------------------------------------------ scales

class Scale:
    """Data → px along one dimension, as BokehJS's ``LinearScale``/``LogScale`` map it: ``start`` to ``p0``, ``end``
    to ``p1``; on a log scale values ≤ 0 map to NaN (not drawn), and ends ≤ 0 are taken as 1 (as BokehJS does)."""

    def __init__(self, start, end, log, p0, p1):
        if log:
            start, end = (v if v > 0 else 1.0 for v in (start, end))
            if start == end:
                start, end = 10.0 ** math.floor(math.log10(start)), 10.0 ** (math.floor(math.log10(start)) + 1)
        elif start == end:
            end = start + 1.0
        self.start, self.end, self.log, self.p0, self.p1 = start, end, log, p0, p1
        self._a, self._b = (math.log10(start), math.log10(end)) if log else (start, end)

    def __call__(self, values):
        v = np.asarray(values, np.float64)
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), np.nan)
        with np.errstate(over="ignore", invalid="ignore"):
            return self.p0 + (v - self._a) * ((self.p1 - self.p0) / (self._b - self._a))


# ------------------------------------------------------------------------------------------------ ticks and labels

def linear_ticks(lo, hi, n):
    """``(ticks, step)``: multiples of the 1-2-5 step nearest ``span / n`` in ``[lo, hi]``, so about ``n`` of them."""
    span = hi - lo
    if not (math.isfinite(span) and span > 0):
        return np.array([lo] if math.isfinite(lo) else []), 1.0
    ideal = span / n
    magnitude = 10.0 ** math.floor(math.log10(ideal))
    step = min((m * magnitude for m in (1, 2, 5, 10)), key=lambda s: abs(math.log(s / ideal)))
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return np.arange(first, last + 1) * step, step


def log_ticks(lo, hi, n):
    """``(ticks, None)``: the powers of ten in ``[lo, hi]`` when there are three or more (every k-th when more than
    ``n``), else their 1-2-5 multiples (1-5 when more than ``n``) when three or more; failing that linear ticks
    ``(ticks, step)``. ``figures.scale_ticker`` is the same rule in BokehJS, with ``n`` = 5. (BokehJS's own LogTicker
    puts linear ticks on a range of less than two decades: a loss from 1.2 down to 0.04 got "1" and "0.5" alone.)"""
    first, last = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    if last - first >= 2:
        stride = max(1, math.ceil((last - first + 1) / n))
        return 10.0 ** np.arange(first + (-first) % stride, last + 1, stride), None
    for mantissas in ((1, 2, 5), (1, 5)):
        ticks = [m * 10.0 ** d for d in range(first - 1, last + 1) for m in mantissas
                 if lo * (1 - 1e-9) <= m * 10.0 ** d <= hi * (1 + 1e-9)]
        if len(ticks) >= 3 and (len(ticks) <= n or len(mantissas) == 2):
            return np.array(ticks), None
    return linear_ticks(lo, hi, n)


def _trim(text):
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


# The tag of a tick formatter whose labels are ``tick_texts``' (``figures.compact_ticks``: the same rule in BokehJS).
COMPACT_TICKS = "compact ticks"
# The tags of a ticker whose ticks are ``log_ticks``' on a log scale (``figures.scale_ticker``) and of a formatter
# whose labels are ``value_label``'s (``figures.value_labels``): the same rules in BokehJS.
SCALE_TICKS, VALUE_LABELS = "scale ticks", "value labels"


def value_label(value):
    """A number as a short label of its own: "0.05", "250", "2.5k", "10M", "1e-5" (``figures.value_labels`` is the
    same in BokehJS)."""
    value = float(f"{value:.12g}")                # k * step's rounding noise gone
    size = abs(value)
    if not value:
        return "0"
    if 1e4 <= size < 1e15:
        k = min(int(math.log10(size) / 3 + 1e-9), 4)
        return f"{_trim(f'{value / 1000 ** k:.6g}')}{'kMGT'[k - 1]}"
    if 1e-3 <= size < 1e4:
        return _trim(f"{value:.6g}")
    return _e_label(value)


def _e_label(value):
    mantissa, exponent = f"{value:.5e}".split("e")
    return f"{_trim(mantissa)}e{int(exponent):+d}"


def value_texts(ticks):
    """Labels for the ticks of one scale (a log axis, a colour bar), in one style: ``value_label``'s when none of
    them needs e-notation, e-notation for every non-zero tick otherwise (a colour bar from 1e12 to 1e16 read "1T"
    beside "1e+16"). ``figures.value_labels`` is the same in BokehJS."""
    values = [float(f"{t:.12g}") for t in ticks]
    if all(v == 0 or 1e-3 <= abs(v) < 1e15 for v in values):
        return [value_label(v) for v in values]
    return [_e_label(v) if v else "0" for v in values]


def _decimals(step):
    """The decimals that write multiples of ``step`` exactly (one more than its leading digit's for 2.5, 0.25)."""
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    scaled = step * 10 ** decimals
    return decimals + (abs(round(scaled) - scaled) > 1e-6 * scaled)


def tick_texts(ticks, step):
    """Labels for ``ticks``: by value (``value_texts``) when ``step`` is None (log ticks), otherwise with the decimals
    the step needs, thousands as k/M/G/T, tiny or huge numbers in e-notation."""
    if step is None:
        return value_texts(ticks)
    big = max((abs(t) for t in ticks), default=0.0)
    if 1e4 <= big < 1e15:
        k = min(int(math.log10(big) // 3), 4)
        decimals = _decimals(step / 1000 ** k)
        return [_trim(f"{t / 1000 ** k:.{decimals}f}") + ("kMGT"[k - 1] if t else "") for t in ticks]
    if 1e-3 <= big < 1e4:
        decimals = _decimals(step)
        return [_trim(f"{t:.{decimals}f}") for t in ticks]
    for digits in range(1, 17):    # e-notation: the fewest digits that tell the ticks apart and match them
        labels = [f"{t:.{digits}g}" for t in ticks]
        if len(set(labels)) == len(labels) and all(abs(float(s) - t) <= 0.01 * step for s, t in zip(labels, ticks)):
            return labels
    return [f"{t:g}" for t in ticks]


def _fits(px, labels, font_px, horizontal):
    """Whether tick labels at ``px`` leave each other room: side by side (x axis) by their estimated widths, stacked
    (y axis) by the font's height."""
    order = np.argsort(px)
    for i, j in zip(order[:-1], order[1:]):
        room = abs(px[j] - px[i])
        need = ((len(labels[i]) + len(labels[j])) / 2 * CHAR_EM * font_px + LABEL_GAP if horizontal
                else 1.2 * font_px)
        if room < need:
            return False
    return True


def axis_ticks(scale, font_px, horizontal):
    """``(data values, px, labels)`` of an axis's ticks: about five, fewer when their labels would overlap."""
    lo, hi = sorted((scale.start, scale.end))
    for n in (5, 4, 3, 2, 1):
        ticks, step = log_ticks(lo, hi, n) if scale.log else linear_ticks(lo, hi, n)
        labels, px = tick_texts(ticks, step), scale(ticks)
        if _fits(px, labels, font_px, horizontal):
            return ticks, px, labels
    return ticks[:1], px[:1], labels[:1]


# ---------------------------------------------------------------------------------------------- numbers and paints

def _n(value):
    """A px value rounded to 0.1, as short as it writes: "12", "12.5", ".5", "-.5"."""
    return _tenths(int(round(float(value) * 10)))


def _tenths(k):
    """An integer count of tenths as SVG writes it shortest: 125 → "12.5", 120 → "12", 5 → ".5", -5 → "-.5"."""
    if not k:
        return "0"
    whole, tenth = divmod(abs(k), 10)
    return ("-" if k < 0 else "") + (str(whole) if whole else "") + (f".{tenth}" if tenth else "")


def _path_numbers(values):
    """Numbers of a path's data, separated as tightly as SVG's grammar (and minifiers such as SVGO) allow: no space
    before a minus sign, nor before ".5" after a number that already has its decimal point ("1.2.5" is 1.2, .5)."""
    out, previous = [], None
    for token in map(_tenths, values):
        if previous is not None and not (token[0] == "-" or (token[0] == "." and "." in previous)):
            out.append(" ")
        out.append(token)
        previous = token
    return "".join(out)


def _to_tenths(px):
    return np.rint(np.clip(px, -FAR, FAR) * 10).astype(np.int64)


def _polyline(x, y, close=False):
    """``M x0 y0 l dx dy …`` through finite points: relative steps are shorter, and differences of coordinates already
    rounded to 0.1 add up to those coordinates exactly."""
    xs, ys = _to_tenths(x), _to_tenths(y)
    steps = np.column_stack([np.diff(xs), np.diff(ys)]).ravel()
    return f"M{_path_numbers([xs[0], ys[0]])}" + (f"l{_path_numbers(steps)}" if steps.size else "") + (
        "Z" if close else "")


def _quad_d(left, right, top, bottom):
    """One ``M…Z`` rectangle per quad with four finite corners (BokehJS skips the others) and an area: a histogram's
    empty bin is a zero-height quad, of which BokehJS strokes a mere hairline along the axis."""
    ok = np.isfinite(left + right + top + bottom) & (left != right) & (top != bottom)
    l, r, t, b = (_to_tenths(v[ok]) for v in (left, right, top, bottom))
    return "".join(f"M{_tenths(a)} {_tenths(c)}H{_tenths(d)}V{_tenths(e)}H{_tenths(a)}Z" for a, c, d, e in
                   zip(l.tolist(), t.tolist(), r.tolist(), b.tolist()))


def _line_d(x, y):
    """A line broken at every non-finite point, as BokehJS strokes it; a lone finite point draws nothing."""
    finite = np.flatnonzero(np.isfinite(x + y))
    runs = np.split(finite, np.flatnonzero(np.diff(finite) > 1) + 1)
    return "".join(_polyline(x[run], y[run]) for run in runs if len(run) > 1)


def _varea_d(x, y1, y2):
    """The area as BokehJS 3 fills it: one polygon along the finite (x, y1) points and back along the finite (x, y2)
    ones. Its canvas ``lineTo`` skips non-finite points, so the area bridges a NaN rather than breaking there."""
    lower, upper = np.isfinite(x + y1), np.isfinite(x + y2)
    px = np.concatenate([x[lower], x[upper][::-1]])
    py = np.concatenate([y1[lower], y2[upper][::-1]])
    return _polyline(px, py, close=True) if len(px) >= 3 else ""


def _scalar(value, what):
    if isinstance(value, Value):
        value = value.value
    if isinstance(value, dict) and set(value) == {"value"}:
        value = value["value"]
    if isinstance(value, (Field, dict)):
        raise TypeError(f"static rendering does not support a vectorised {what}")
    return value


def _color(color, alpha, what):
    """``(css color, opacity)``; None for no paint."""
    color, alpha = _scalar(color, what), _scalar(alpha, what)
    if color is None:
        return None
    if hasattr(color, "to_css"):
        color = color.to_css()
    elif isinstance(color, tuple):
        alpha *= color[3] if len(color) == 4 else 1.0
        color = f"rgb({','.join(str(int(c)) for c in color[:3])})"
    return html.escape(str(color)), float(alpha)


def _fill_attrs(model, prefix="fill"):
    """SVG ``fill`` of a model's ``{prefix}_color``/``{prefix}_alpha`` (a glyph's fill, a text's colour…)."""
    paint = _color(getattr(model, f"{prefix}_color"), getattr(model, f"{prefix}_alpha"), f"{prefix}_color")
    if paint is None:
        return ' fill="none"'
    color, alpha = paint
    return f' fill="{color}"' + (f' fill-opacity="{alpha:.3g}"' if alpha != 1 else "")


def _line_attrs(model, prefix="line"):
    """SVG ``stroke…`` of a model's ``{prefix}_color``, ``_alpha``, ``_width``, ``_join``, ``_cap`` and ``_dash``."""
    paint = _color(getattr(model, f"{prefix}_color"), getattr(model, f"{prefix}_alpha"), f"{prefix}_color")
    if paint is None:
        return ""
    color, alpha = paint
    width = float(_scalar(getattr(model, f"{prefix}_width"), f"{prefix}_width"))
    attrs = f' stroke="{color}" stroke-width="{width:.3g}"' + (f' stroke-opacity="{alpha:.3g}"' if alpha != 1 else "")
    join = getattr(model, f"{prefix}_join", "miter")
    if join != "miter":        # Bokeh's default is bevel, SVG's miter
        attrs += f' stroke-linejoin="{html.escape(str(join))}"'
    cap = getattr(model, f"{prefix}_cap", "butt")
    if cap != "butt":
        attrs += f' stroke-linecap="{html.escape(str(cap))}"'
    dash = getattr(model, f"{prefix}_dash", [])
    if isinstance(dash, str):
        dash = _DASHES.get(dash, dash.split())
    if dash:
        attrs += f' stroke-dasharray="{" ".join(str(float(d)) for d in dash)}"'
    return attrs


_ANCHOR = {"left": "start", "center": "middle", "right": "end"}
_BASELINE = {"middle": "central", "top": "hanging", "hanging": "hanging", "bottom": "text-after-edge",
             "alphabetic": "alphabetic", "ideographic": "ideographic"}


def _per_row(glyph, prop, data, n):
    """A text glyph's ``text`` or ``text_color``, one per row: a column's values or a constant repeated."""
    spec = getattr(glyph, prop)
    if isinstance(spec, dict):
        spec = Field(spec["field"]) if "field" in spec else Value(spec.get("value"))
    if isinstance(spec, Field) or (isinstance(spec, str) and spec in data):
        name = spec.field if isinstance(spec, Field) else spec
        if name not in data:
            raise ValueError(f"{type(glyph).__name__}.{prop}: the source has no column {name!r}")
        return list(data[name])
    return [spec.value if isinstance(spec, Value) else spec] * n


def _text_svg(glyph, data, x, y):
    """One ``<text>`` per row with finite coordinates, in the glyph's font, alignment and colour."""
    n = len(x)
    texts, colors = _per_row(glyph, "text", data, n), _per_row(glyph, "text_color", data, n)
    alpha = float(_scalar(glyph.text_alpha, "text_alpha"))
    style = str(_scalar(glyph.text_font_style, "text_font_style"))
    attrs = (f' font-size="{_n(_px(glyph.text_font_size, 16))}"'
             f' font-family="{html.escape(str(_scalar(glyph.text_font, "text_font")))}"'
             f' text-anchor="{_ANCHOR.get(_scalar(glyph.text_align, "text_align"), "start")}"'
             f' dominant-baseline="{_BASELINE.get(_scalar(glyph.text_baseline, "text_baseline"), "alphabetic")}"'
             + (' font-weight="bold"' if "bold" in style else "") + (' font-style="italic"' if "italic" in style else "")
             + (f' fill-opacity="{alpha:.3g}"' if alpha != 1 else ""))
    out = []
    for i in np.flatnonzero(np.isfinite(x + y)):
        color = colors[i].to_css() if hasattr(colors[i], "to_css") else str(colors[i])
        out.append(f'<text x="{_n(x[i])}" y="{_n(y[i])}" fill="{html.escape(color)}"{attrs}>'
                   f'{html.escape(str(texts[i]))}</text>')
    return "".join(out)


def _glyph_svg(renderer, xs, ys):
    glyph, v = renderer.glyph, _glyph_data(renderer)
    if type(glyph) is Text:
        return _text_svg(glyph, renderer.data_source.data, xs(v["x"]), ys(v["y"]))
    if type(glyph) is Quad:
        d = _quad_d(xs(v["left"]), xs(v["right"]), ys(v["top"]), ys(v["bottom"]))
        paint = _fill_attrs(glyph) + _line_attrs(glyph)
    elif type(glyph) is Line:
        d, paint = _line_d(xs(v["x"]), ys(v["y"])), ' fill="none"' + _line_attrs(glyph)
    else:
        d, paint = _varea_d(xs(v["x"]), ys(v["y1"]), ys(v["y2"])), _fill_attrs(glyph)
    return f'<path d="{d}"{paint}/>' if d else ""


# ----------------------------------------------------------------------------------------------------------- figures

def _px(size, default):
    """A CSS font size ("8pt", "13px", "1.2em") in px."""
    size = _scalar(size, "text_font_size")
    try:
        text = str(size).strip()
        for unit, factor in (("px", 1.0), ("pt", 4 / 3), ("em", 16.0), ("rem", 16.0)):
            if text.endswith(unit):
                return float(text[: -len(unit)]) * factor
        return float(text)
    except ValueError:
        return default


# Models drawn as the kind named here (their BokehJS code follows this module's rule, see the tags above).
_SAME_AS = {BasicTickFormatter: COMPACT_TICKS, LogTicker: SCALE_TICKS, LogTickFormatter: VALUE_LABELS}


def _check_plot(plot):
    """Raise ``TypeError`` for anything of ``plot`` this module would not draw as BokehJS does."""
    for side in ("above", "right"):
        for model in getattr(plot, side):
            raise TypeError(f"static rendering does not support {type(model).__name__} {side} a figure")
    for side, dim in (("below", 0), ("left", 1)):
        axes = getattr(plot, side)
        for axis in axes:
            log = _is_log(plot, dim, None)
            kinds = (LogAxis, LogTicker, LogTickFormatter) if log else (LinearAxis, BasicTicker, BasicTickFormatter)
            for model, kind in zip((axis, axis.ticker, axis.formatter), kinds):
                if type(model) is not kind and _SAME_AS.get(kind) not in model.tags:
                    raise TypeError(f"static rendering does not support {type(model).__name__} on a "
                                    f"{'log' if log else 'linear'} scale")
            if (axis.x_range_name if dim == 0 else axis.y_range_name) != "default" or len(axes) > 1:
                raise TypeError(f"static rendering does not support a {type(axis).__name__} on an extra range")
    for model in plot.center:
        if type(model) is not Grid or model.x_range_name != "default" or model.y_range_name != "default":
            raise TypeError(f"static rendering does not support {type(model).__name__} in a figure")
    if plot.title is not None and type(plot.title) is not Title:
        raise TypeError(f"static rendering does not support {type(plot.title).__name__} as a title")
    if plot.title is not None and plot.title.text and plot.title_location not in ("above", None):
        raise TypeError(f"static rendering does not support a Title {plot.title_location} a figure")
    if plot.match_aspect:
        raise TypeError(f"static rendering does not support {type(plot).__name__} with match_aspect")
    for renderer in plot.renderers:
        _check_renderer(renderer)


def _border(plot, side):
    value = getattr(plot, f"min_border_{side}")
    return float(value if value is not None else plot.min_border if plot.min_border is not None else 5)


def _axis_depth(axis, label_extent, label_font):
    """px an axis takes beside the frame: ticks, their labels, its own label."""
    if axis is None or not axis.visible:
        return 0.0
    depth = axis.major_tick_out + axis.major_label_standoff + label_extent + 2
    return depth + (axis.axis_label_standoff + label_font if axis.axis_label else 0)


def _figure_svg(plot, width, plots):
    _check_plot(plot)
    w, h = float(width if _stretches(plot) else plot.width), float(plot.height)
    xaxis, yaxis = (plot.below or [None])[0], (plot.left or [None])[0]
    fonts = {axis: (_px(axis.major_label_text_font_size, 11), _px(axis.axis_label_text_font_size, 13))
             for axis in (xaxis, yaxis) if axis is not None}
    shown = plot.title is not None and plot.title.visible and plot.title_location is not None
    title = plot.title.text if shown and plot.title.text else ""
    title_font = _px(plot.title.text_font_size, 13) if title else 0.0
    x_font, x_label_font = fonts.get(xaxis, (11, 13))
    y_font, y_label_font = fonts.get(yaxis, (11, 13))

    top = max(_border(plot, "top"), title_font + 10 if title else y_font / 2 + 4)
    bottom = max(_border(plot, "bottom"), _axis_depth(xaxis, x_font, x_label_font))
    right = max(_border(plot, "right"), 10.0)
    ys = Scale(*data_range(plot, 1, plots=plots), _is_log(plot, 1, None), h - bottom, top)
    y_ticks = axis_ticks(ys, y_font, False)
    label_width = max((len(s) for s in y_ticks[2]), default=0) * CHAR_EM * y_font
    left = max(_border(plot, "left"), _axis_depth(yaxis, label_width, y_label_font))
    xs = Scale(*data_range(plot, 0, plots=plots), _is_log(plot, 0, None), left, w - right)
    x_ticks = axis_ticks(xs, x_font, True)
    frame = (left, top, max(w - right, left + 1), max(h - bottom, top + 1))

    clip = f"fl-clip-{html.escape(plot.id)}-{_n(w)}x{_n(h)}"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_n(w)} {_n(h)}" width="100%" '
             f'style="max-width:{_n(w)}px;height:auto;display:block" font-family="{FONT}">',
             f'<defs><clipPath id="{clip}">{_rect(frame)}</clipPath></defs>',
             _rect((0, 0, w, h), _fill_attrs(plot, "border_fill")),
             _rect(frame, _fill_attrs(plot, "background_fill")),
             _grids(plot, frame, x_ticks[1], y_ticks[1]),
             f'<g clip-path="url(#{clip})">' + _glyphs(plot, xs, ys, plots) + "</g>",
             _rect(frame, ' fill="none"' + _line_attrs(plot, "outline_line")),
             _axis_svg(xaxis, 0, frame, x_ticks, fonts.get(xaxis), figure_width=w),
             _axis_svg(yaxis, 1, frame, y_ticks, fonts.get(yaxis), label_width=label_width)]
    if title:
        parts.append(_title_svg(plot.title, frame, title_font))
    return "".join(parts) + "</svg>"


def _rect(box, attrs=""):
    x0, y0, x1, y1 = box
    return f'<rect x="{_n(x0)}" y="{_n(y0)}" width="{_n(x1 - x0)}" height="{_n(y1 - y0)}"{attrs}/>'


def _glyphs(plot, xs, ys, plots):
    """Each visible renderer's path, on its own (possibly extra) ranges."""
    out, scales = [], {}
    for renderer in plot.renderers:
        if not renderer.visible:
            continue
        for dim, name, default in ((0, renderer.x_range_name, xs), (1, renderer.y_range_name, ys)):
            if name != "default" and (dim, name) not in scales:
                scales[dim, name] = Scale(*data_range(plot, dim, name, plots), _is_log(plot, dim, name),
                                           default.p0, default.p1)
        out.append(_glyph_svg(renderer, scales.get((0, renderer.x_range_name), xs),
                              scales.get((1, renderer.y_range_name), ys)))
    return "".join(out)


def _grids(plot, frame, x_px, y_px):
    x0, y0, x1, y1 = frame
    out = []
    for grid in plot.center:
        if not grid.visible or grid.grid_line_color is None:
            continue
        if grid.dimension == 0:
            lines = "".join(f"M{_n(p)} {_n(y0)}V{_n(y1)}" for p in x_px)
        else:
            lines = "".join(f"M{_n(x0)} {_n(p)}H{_n(x1)}" for p in y_px)
        if lines:
            out.append(f'<path d="{lines}" fill="none"{_line_attrs(grid, "grid_line")}/>')
    return "".join(out)


def _axis_svg(axis, dim, frame, ticks, fonts, figure_width=0.0, label_width=0.0):
    """Axis line, outward ticks, tick labels and the axis label, below (``dim`` 0) or left of (1) the frame. An x tick
    label at the figure's edge moves in rather than being cut off; the y axis label goes beyond ``label_width``."""
    if axis is None or not axis.visible:
        return ""
    x0, y0, x1, y1 = frame
    _, px, labels = ticks
    tick_font, label_font = fonts
    t_in, t_out, standoff = axis.major_tick_in, axis.major_tick_out, axis.major_label_standoff
    if dim == 0:
        line = f"M{_n(x0)} {_n(y1)}H{_n(x1)}"
        marks = "".join(f"M{_n(p)} {_n(y1 - t_in)}V{_n(y1 + t_out)}" for p in px)
        text_y = y1 + t_out + standoff + 0.8 * tick_font
        half = [len(s) * CHAR_EM * tick_font / 2 for s in labels]
        text_x = [min(max(p, h), figure_width - h) for p, h in zip(px, half)]
        texts = "".join(f'<text x="{_n(x)}" y="{_n(text_y)}">{html.escape(s)}</text>' for x, s in zip(text_x, labels))
        anchor = "middle"
    else:
        line = f"M{_n(x0)} {_n(y0)}V{_n(y1)}"
        marks = "".join(f"M{_n(x0 + t_in)} {_n(p)}H{_n(x0 - t_out)}" for p in px)
        text_x = x0 - t_out - standoff
        texts = "".join(f'<text x="{_n(text_x)}" y="{_n(p + 0.35 * tick_font)}">{html.escape(s)}</text>'
                        for p, s in zip(px, labels))
        anchor = "end"
    out = [f'<path d="{line}" fill="none"{_line_attrs(axis, "axis_line")}/>',
           f'<path d="{marks}" fill="none"{_line_attrs(axis, "major_tick_line")}/>' if marks else "",
           f'<g font-size="{_n(tick_font)}" text-anchor="{anchor}"{_fill_attrs(axis, "major_label_text")}>{texts}</g>']
    if axis.axis_label:
        out.append(_axis_label_svg(axis, dim, frame, tick_font, label_font, label_width))
    return "".join(out)


def _axis_label_svg(axis, dim, frame, tick_font, label_font, label_width):
    x0, y0, x1, y1 = frame
    reach = axis.major_tick_out + axis.major_label_standoff + axis.axis_label_standoff
    if dim == 0:
        position = f'x="{_n((x0 + x1) / 2)}" y="{_n(y1 + reach + tick_font + 0.8 * label_font)}"'
    else:       # rotated: the baseline is vertical and the letters extend left of it
        position = f'transform="translate({_n(x0 - reach - label_width)},{_n((y0 + y1) / 2)}) rotate(-90)"'
    style = axis.axis_label_text_font_style
    font_style = ' font-style="italic"' if "italic" in style else ""
    weight = ' font-weight="bold"' if "bold" in style else ""
    return (f'<text {position} font-size="{_n(label_font)}" text-anchor="middle"{font_style}{weight}'
            f'{_fill_attrs(axis, "axis_label_text")}>{html.escape(str(axis.axis_label))}</text>')


def _title_svg(title, frame, font):
    x0, y0, x1, _ = frame
    anchor, x = {"left": ("start", x0), "center": ("middle", (x0 + x1) / 2), "right": ("end", x1)}[title.align]
    weight = ' font-weight="bold"' if "bold" in title.text_font_style else ""
    return (f'<text x="{_n(x)}" y="{_n(y0 - 6)}" font-size="{_n(font)}" text-anchor="{anchor}"{weight}'
            f'{_fill_attrs(title, "text")}>{html.escape(str(title.text))}</text>')

