"""Text tab: per run × tag a card with the text logged at each step (newest first, the last ``MAX_STEPS``), rendered
as Markdown the way TensorBoard's text plugin does: a string is a Markdown document, an array of strings a table
whose cells are Markdown (a 1-D array one column, more than two dimensions the first 2-D slice, with a warning).

Nothing from a log can become markup of its own: Markdown goes through markdown-it-py with raw HTML disabled (any
``<tag>`` in the text comes out escaped), its link check (``javascript:``, ``vbscript:``, ``file:`` and non-image
``data:`` links stay plain text) and images off; tags, run names and warnings are ``html.escape``d; and every ``Div``
has Bokeh's TeX processing off. Cards come a page at a time (``CardsView``): only the page's text is rendered and sent.
"""
from __future__ import annotations

import html

import numpy as np
from bokeh.layouts import column
from bokeh.models import Div, InlineStyleSheet
from markdown_it import MarkdownIt

from flowlab.plots.figures import card

from .base import CardsView

MAX_STEPS = 20
# CommonMark plus GitHub tables; "html": False escapes raw HTML instead of passing it through. Images are off: a log
# should not make the browser fetch addresses.
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table").disable("image")
_CSS = ("table{border-collapse:collapse} th,td{border:1px solid #ccc;padding:2px 6px;vertical-align:top} "
        "p{margin:2px 0}")


def _link_open(renderer, tokens, idx, options, env):
    # A link opens in a new tab (the dashboard stays), with no handle on the dashboard's window.
    tokens[idx].attrSet("target", "_blank")
    tokens[idx].attrSet("rel", "noopener noreferrer")
    return renderer.renderToken(tokens, idx, options, env)


_MARKDOWN.add_render_rule("link_open", _link_open)


def render_markdown(text: str) -> str:
    """Safe HTML for one Markdown string from a log."""
    return _MARKDOWN.render(str(text))


def render_text(value) -> str:
    """Safe HTML for a text summary's value: a str, or a NumPy array of str (a table)."""
    if isinstance(value, str) or np.ndim(value) == 0:
        return render_markdown(value if isinstance(value, str) else np.asarray(value).item())
    table, warning = np.asarray(value), ""
    if table.ndim > 2:
        warning = (f"<p><em>{html.escape(f'A text summary of shape {table.shape}: showing its first 2-D slice.')}"
                   "</em></p>")
        table = table[(0,) * (table.ndim - 2)]
    rows = table.reshape(-1, 1) if table.ndim == 1 else table
    body = "".join("<tr>" + "".join(f"<td>{render_markdown(cell)}</td>" for cell in row) + "</tr>"
                   for row in rows.tolist())
    return f"{warning}<table><tbody>{body}</tbody></table>"


MAX_TEXT_WIDTH = 640       # px: about 90 characters a line


class _Card:
    def __init__(self, series):
        self.entries = column([])
        self.style = InlineStyleSheet(css=_CSS)      # one per card: a Bokeh model belongs to one session's document
        self.layout = card(series.tag, series.run, self.entries)
        # as wide as the text, up to a readable measure (a long paragraph would take the whole row)
        self.layout.styles = {**self.layout.styles, "max-width": f"{MAX_TEXT_WIDTH + 40}px"}

    def add(self, steps, values, replace):
        divs = [Div(text=f'<div style="color:#777;font-size:9pt">step {int(step)}</div>{render_text(value)}',
                    disable_math=True, width_policy="fit", max_width=MAX_TEXT_WIDTH, stylesheets=[self.style])
                for step, value in zip(steps, values)]
        kept = ([] if replace else list(self.entries.children))
        self.entries.children = (divs[::-1] + kept)[:MAX_STEPS]


class TextView(CardsView):
    title = "Text"
    kind = "text"
    empty_text = "No text summaries in this logdir yet."

    def new_card(self, series):
        return _Card(series)

    def show(self, card, delta):
        card.add(delta.steps[-MAX_STEPS:], delta.values[-MAX_STEPS:], delta.reset)
