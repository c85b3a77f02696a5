"""Bokeh figure builders shared by the notebook widgets and the dashboard.

Each builder takes a ``ColumnDataSource`` (the caller owns it and updates its data: a widget from its refresh thread,
the dashboard through ``doc.add_next_tick_callback``) and returns a small, toolbar-free figure drawn with the canvas
backend (software WebGL is slow in headless browsers and gains nothing at these sizes). Figure titles are drawn as
canvas text, never parsed as HTML; text that ends up in HTML (``stats_table``) is escaped with ``html.escape``.
"""
from __future__ import annotations

import html
import math

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div
from bokeh.plotting import figure

from .data import Trend, tensor_summary

WIDTH, HEIGHT = 320, 200


def histogram_source():
    return ColumnDataSource({"left": [], "right": [], "top": []})


def trend_source():
    return ColumnDataSource({c: [] for c in Trend.COLUMNS})


def _figure(title, **kwargs):
    fig = figure(title=title, width=WIDTH, height=HEIGHT, tools="", toolbar_location=None, output_backend="canvas",
                 **kwargs)
    fig.title.text_font_size = "10pt"
    fig.xaxis.major_label_text_font_size = fig.yaxis.major_label_text_font_size = "8pt"
    return fig


def histogram_figure(source=None, title=""):
    """Bars from ``left``/``right``/``top`` columns (see ``histogram_data``)."""
    source = source if source is not None else histogram_source()
    fig = _figure(title)
    fig.quad(left="left", right="right", top="top", bottom=0, source=source, fill_color="#4c78a8",
             line_color="#4c78a8", fill_alpha=0.7)
    fig.y_range.start = 0
    return fig


def trend_figure(source=None, title="", y_label="mean ± std"):
    """The mean as a line over ``step`` with a mean ± std band (``lower``/``upper`` columns, see ``Trend``)."""
    source = source if source is not None else trend_source()
    fig = _figure(title, x_axis_label="step", y_axis_label=y_label)
    fig.varea(x="step", y1="lower", y2="upper", source=source, fill_color="#f58518", fill_alpha=0.25)
    fig.line(x="step", y="mean", source=source, line_color="#f58518", line_width=1.5)
    fig.xaxis.axis_label_text_font_size = fig.yaxis.axis_label_text_font_size = "8pt"
    return fig


def line_figure(source, x="step", y="value", title="", y_label=None):
    """A plain scalar series (a loss curve)."""
    fig = _figure(title, x_axis_label=x, y_axis_label=y_label)
    fig.line(x=x, y=y, source=source, line_color="#4c78a8", line_width=1.5)
    fig.xaxis.axis_label_text_font_size = fig.yaxis.axis_label_text_font_size = "8pt"
    return fig


def _number(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "—" if math.isnan(v) else str(v)
    return f"{v:.5g}" if isinstance(v, float) else str(v)


_ROW = '<tr><th style="text-align:left;padding-right:8px;font-weight:normal">{}</th><td{}>{}</td></tr>'
_ALARM = ' style="color:#c00;font-weight:bold"'


def stats_html(summary, title=None):
    """An HTML table of a ``tensor_summary`` (or an array / ``TensorStats``); non-zero NaN/Inf counts in red."""
    if not isinstance(summary, dict):
        summary = tensor_summary(summary)
    rows = [] if title is None else [f'<tr><th colspan="2" style="text-align:left">{html.escape(str(title))}</th></tr>']
    for key, label in (("shape", "shape"), ("min", "min"), ("max", "max"), ("mean", "mean"), ("std", "std"),
                       ("nan", "NaN"), ("inf", "Inf")):
        value = summary.get(key, "")
        alarm = _ALARM if key in ("nan", "inf") and value else ""
        rows.append(_ROW.format(label, alarm, html.escape(_number(value))))
    return '<table style="font-size:9pt;font-family:monospace">' + "".join(rows) + "</table>"


def stats_table(summary=None, title=None):
    """A Bokeh ``Div`` showing ``stats_html``; update it with ``div.text = stats_html(...)``."""
    text = stats_html(summary, title) if summary is not None else ""
    return Div(text=text, width=200, height=HEIGHT)


# ------------------------------------------------------------------------------------------ dashboard building blocks

def plain_figure(title="", width=WIDTH, height=HEIGHT, **kwargs):
    """A small toolbar-free canvas figure, as every builder here makes; for views that draw their own glyphs."""
    fig = _figure(title, **kwargs)
    fig.width, fig.height = width, height
    return fig


def text_div(text, **kwargs):
    """A ``Div`` showing ``text`` as text: HTML-escaped, and with Bokeh's TeX processing off (``$$…$$`` in a log is
    not mathematics)."""
    return Div(text=html.escape(str(text)), disable_math=True, **kwargs)


def card(title, subtitle, *children):
    """One run × tag box of a dashboard tab: ``title`` (the tag) and ``subtitle`` (the run) escaped, then
    ``children``."""
    head = Div(text=f"<b>{html.escape(str(title))}</b> &nbsp;<span style=\"color:#777\">"
                    f"{html.escape(str(subtitle))}</span>", disable_math=True)
    return column(head, *children, styles={"border": "1px solid #ddd", "border-radius": "4px", "padding": "6px"})


def card_grid():
    """A wrapping row for cards; views append to its ``children``. (It starts with an empty Div: Bokeh warns about
    layouts without children in every session.)"""
    return row([Div(text="", width=0, height=0)], styles={"flex-wrap": "wrap", "gap": "10px"})
