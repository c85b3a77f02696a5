"""Text tab: per run × tag a card with the text logged at each step (newest first, the last ``MAX_STEPS``), rendered
as Markdown the way TensorBoard's text plugin does: a string is a Markdown document, an array of strings a table
whose cells are Markdown (a 1-D array one column, more than two dimensions the first 2-D slice, with a warning).

Nothing from a log can become markup of its own: Markdown goes through markdown-it-py with raw HTML disabled (any
``<tag>`` in the text comes out escaped), its link check (``javascript:``, ``vbscript:``, ``file:`` and non-image
``data:`` links stay plain text) and images off; tags, run names and warnings are ``html.escape``d; and every ``Div``
has Bokeh's TeX processing off. Cards come a page at a time (``CardsView``): only the page's text is rendered and sent.

Rendering is bounded, whatever a log holds (a 103-byte text tensor can declare a million cells; before these caps
one rendered 1,000,000 Markdown cells on the IOLoop: 47.7 s and 26.7 MB of HTML per session):

- a table shows ``MAX_TABLE_ROWS`` (25) rows at a time and its first ``MAX_TABLE_COLUMNS`` (20) columns; a card
  whose tables are longer gets a row pager (‹ rows / rows ›), and each table says which rows are shown and how many
  rows and columns are not;
- the Markdown rendered for one logged value (a document, or a table's page of cells) is at most
  ``MAX_VALUE_CHARS`` (20,000) characters, a cell at most ``MAX_CELL_CHARS`` (1,000); text past a cap is cut, and
  the cut is said. Markdown costs at most about 9 µs per character (pathological input such as 20,000 ``[``), so a
  value renders in under ~0.2 s and a card of ``MAX_STEPS`` values stays bounded too.
"""
from __future__ import annotations

import html

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import Button, Div, InlineStyleSheet
from markdown_it import MarkdownIt

from flowlab.plots.figures import card

from .base import CardsView

MAX_STEPS = 20
MAX_TABLE_ROWS = 25         # rows of a table rendered at once (a page of the card's row pager)
MAX_TABLE_COLUMNS = 20      # columns of a table rendered
MAX_VALUE_CHARS = 20_000    # characters of Markdown rendered for one logged value (a document, or a page of cells)
MAX_CELL_CHARS = 1_000      # characters of one table cell rendered
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


def _note(text):
    return f"<p><em>{html.escape(text)}</em></p>"


def _cut(text, limit):
    """``text`` cut to ``limit`` characters, and how many were cut."""
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


def table_rows(value) -> int:
    """How many rows ``render_text`` shows ``value`` as (0 for a document): what the row pager pages over."""
    if isinstance(value, str) or np.ndim(value) == 0:
        return 0
    shape = np.shape(value)
    return shape[0] if len(shape) <= 2 else shape[-2]


def render_text(value, first_row=0) -> str:
    """Safe HTML for a text summary's value: a str, or a NumPy array of str (a table), within the caps of the module
    docstring: a table's rows ``first_row`` to ``first_row + MAX_TABLE_ROWS`` (clamped to its last page)."""
    if isinstance(value, str) or np.ndim(value) == 0:
        text, cut = _cut(str(value if isinstance(value, str) else np.asarray(value).item()), MAX_VALUE_CHARS)
        return render_markdown(text) + (_note(f"… {cut:,} more characters not shown") if cut else "")
    table, notes = np.asarray(value), []         # sliced below before any cell is read: a million cost nothing
    if table.ndim > 2:
        notes.append(f"A text summary of shape {table.shape}: showing its first 2-D slice.")
        table = table[(0,) * (table.ndim - 2)]
    table = table.reshape(-1, 1) if table.ndim == 1 else table
    n_rows, n_columns = table.shape
    first_row = max(0, min(int(first_row), (max(n_rows, 1) - 1) // MAX_TABLE_ROWS * MAX_TABLE_ROWS))
    shown = table[first_row:first_row + MAX_TABLE_ROWS, :MAX_TABLE_COLUMNS]       # a view: nothing else is touched
    budget, cut_cells = MAX_VALUE_CHARS, 0
    body = []
    for cells in shown.tolist():
        tds = []
        for cell in cells:
            text, cut = _cut(str(cell), min(MAX_CELL_CHARS, budget))
            budget -= len(text)
            cut_cells += bool(cut)
            tds.append(f"<td>{render_markdown(text) if text else ''}{'…' if cut else ''}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    if n_rows > len(shown):
        notes.append(f"Rows {first_row + 1:,}–{first_row + len(shown):,} of {n_rows:,} shown "
                     f"({n_rows - len(shown):,} rows not shown; at most {MAX_TABLE_ROWS} at a time).")
    if n_columns > MAX_TABLE_COLUMNS:
        notes.append(f"The first {MAX_TABLE_COLUMNS} of {n_columns:,} columns shown.")
    if cut_cells:
        notes.append(f"{cut_cells:,} cells cut (…): at most {MAX_CELL_CHARS:,} characters a cell and "
                     f"{MAX_VALUE_CHARS:,} a table page are shown.")
    return "".join(map(_note, notes)) + f"<table><tbody>{''.join(body)}</tbody></table>"


MAX_TEXT_WIDTH = 640       # px: about 90 characters a line


class _Card:
    """The newest ``MAX_STEPS`` values of one run × tag, newest first; tables longer than ``MAX_TABLE_ROWS`` rows
    are paged together by the card's row pager, which shows only while one is."""

    def __init__(self, series):
        self.entries = column([])
        self.shown = []                              # (step, value) of each entry, as entries.children
        self.first_row = 0                           # the row pager's position (a multiple of MAX_TABLE_ROWS)
        self.style = InlineStyleSheet(css=_CSS)      # one per card: a Bokeh model belongs to one session's document
        self.previous = Button(label="‹ rows", width=70, disabled=True)
        self.next = Button(label="rows ›", width=70)
        self.previous.on_click(lambda: self.page_rows(-1))
        self.next.on_click(lambda: self.page_rows(+1))
        self.pager = row(self.previous, self.next, visible=False)
        self.layout = card(series.tag, series.run, self.pager, self.entries)
        # as wide as the text, up to a readable measure (a long paragraph would take the whole row)
        self.layout.styles = {**self.layout.styles, "max-width": f"{MAX_TEXT_WIDTH + 40}px"}

    def _html(self, step, value):
        return f'<div style="color:#777;font-size:9pt">step {int(step)}</div>{render_text(value, self.first_row)}'

    def add(self, steps, values, replace):
        new = list(zip(steps, values))[::-1][:MAX_STEPS]
        divs = [Div(text=self._html(step, value), disable_math=True, width_policy="fit", max_width=MAX_TEXT_WIDTH,
                    stylesheets=[self.style]) for step, value in new]
        kept = ([] if replace else list(zip(self.shown, self.entries.children)))
        entries = (list(zip(new, divs)) + kept)[:MAX_STEPS]
        self.shown = [entry for entry, _ in entries]
        self.entries.children = [div for _, div in entries]
        self._place_pager()

    def _rows(self):
        return max((table_rows(value) for _, value in self.shown), default=0)

    def _place_pager(self):
        rows = self._rows()
        self.pager.visible = rows > MAX_TABLE_ROWS
        self.previous.disabled = self.first_row == 0
        self.next.disabled = self.first_row + MAX_TABLE_ROWS >= rows

    def page_rows(self, delta):
        """Show the tables' previous (-1) or next (+1) ``MAX_TABLE_ROWS`` rows: only entries whose table spans more
        than one page are rendered again."""
        last = max(self._rows() - 1, 0) // MAX_TABLE_ROWS * MAX_TABLE_ROWS
        first_row = max(0, min(self.first_row + delta * MAX_TABLE_ROWS, last))
        if first_row == self.first_row:
            return
        self.first_row = first_row
        for (step, value), div in zip(self.shown, self.entries.children):
            if table_rows(value) > MAX_TABLE_ROWS:
                div.text = self._html(step, value)
        self._place_pager()


class TextView(CardsView):
    title = "Text"
    kind = "text"
    empty_text = "No text summaries in this logdir yet."

    def new_card(self, series):
        return _Card(series)

    def show(self, card, delta):
        card.add(delta.steps[-MAX_STEPS:], delta.values[-MAX_STEPS:], delta.reset)
