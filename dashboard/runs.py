"""Which runs a session shows, and in which colour: the run list beside the tabs.

A run has one colour for the life of the server, the same in every session and on every tab (``run_colour``): runs
take the colours of ``flowlab.plots.colours.run_colours`` in the order the server first sees them: colorcet's Glasbey
palette (which starts with Category10's ten) moved to a mid lightness, so that every run colour has at least 3 : 1
contrast with the plot's background in the light and in the dark scheme (Category10's orange, pink, olive and cyan
had 2–2.6 : 1 on white, some Glasbey colours 1.2 : 1), without the reds that would read as a NaN mark (Category10's red
among them), and ordered so that the first 37 runs are each at least ΔE 20 (CIE76) from every other. 249 runs get
249 colours; past that the palette repeats (the list and hovers still name every run).

``RunSelection`` is one session's run list: a table with a checkbox, a colour swatch and the name of each run, a
search box (RE2, so a typed pattern cannot stall the server: see ``filters``), and buttons that check or uncheck the
runs the search shows. A run is shown on the tabs when it is checked and matches the search; new runs arrive
checked. Views ask ``shows(run)`` (or ``shown()``), and register ``on_change(callback)`` to redraw when the choice
changes. The table scrolls and only draws its visible rows, so a thousand runs cost the page little.
"""
from __future__ import annotations

import html
import weakref

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import (Button, CDSView, ColumnDataSource, DataTable, Div, HTMLTemplateFormatter, IndexFilter,
                          StringFormatter, TableColumn, TextInput)

from flowlab.plots.colours import run_colours

from .filters import FilterError, compile_filter
from .run_groups import RunGroups

WIDTH = 250
ROW_HEIGHT, MAX_HEIGHT = 24, 600      # the list scrolls past 25 runs

_colours: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # store -> {run: colour}


def palette_colour(i):
    """The ``i``-th run's colour."""
    colours = run_colours()
    return colours[i % len(colours)]


def run_colour(store, run):
    """A run's colour, the same in every session of a server: runs take palette colours in order of first sight."""
    colours = _colours.setdefault(store, {})
    colour = colours.get(run)
    if colour is None:
        colour = colours[run] = palette_colour(len(colours))
    return colour


class RunSelection:
    """One session's run list (see the module doc); ``layout()`` is its column of widgets."""

    def __init__(self, store):
        self.store = store
        self._runs: list[str] = []
        self._matching: set[str] | None = None      # runs the search matches (None: every run)
        self._shown: frozenset | None = None         # cached answer of shown()
        self._listeners = []
        self._quiet = False                          # set while the server changes the checks itself
        self._pattern = None                         # the search, compiled (None: empty)
        self._error = ""                             # what is wrong with the search as typed
        self.source = ColumnDataSource({"run": [], "colour": []}, name="runs-source")
        self.view = CDSView(filter=IndexFilter(None))
        # The colour is ours (a palette entry); the run name is drawn as text by StringFormatter, never as HTML.
        swatch = HTMLTemplateFormatter(template='<span style="color:<%- value %>;font-size:15px">&#9632;</span>')
        self.table = DataTable(
            source=self.source, view=self.view, selectable="checkbox", index_position=None, header_row=False,
            columns=[TableColumn(field="colour", title="", formatter=swatch, width=22, sortable=False),
                     TableColumn(field="run", title="Run", formatter=StringFormatter(), sortable=False,
                                 width=WIDTH - 60)],
            # fixed widths: BokehJS 3.9's column autosizing throws ("row is not defined"); no jquery-ui to reorder
            width=WIDTH, height=ROW_HEIGHT, row_height=ROW_HEIGHT, name="runs-table", autosize_mode="none",
            reorderable=False)
        self.search = TextInput(placeholder="filter runs (regex)", width=WIDTH, name="run-search")
        self.check_all = Button(label="check shown", width=WIDTH // 2 - 5, height=28, name="runs-all",
                                button_type="light")
        self.check_none = Button(label="uncheck shown", width=WIDTH // 2 - 5, height=28, name="runs-none",
                                 button_type="light")
        self.summary = Div(text="", width=WIDTH, name="runs-summary", styles={"font-size": "12px", "color": "#555"})
        self.grouping = RunGroups(store, WIDTH)      # which shown runs are drawn together (see run_groups)
        self.grouping.on_change(self._notify)
        self.source.selected.on_change("indices", lambda attr, old, new: self._changed())
        self.search.on_change("value", lambda attr, old, new: self._search())
        self.check_all.on_click(lambda: self._check(True))
        self.check_none.on_click(lambda: self._check(False))

    def layout(self):
        return column(Div(text="<b>Runs</b>"), self.search, row(self.check_all, self.check_none),
                      self.grouping.layout(), self.summary, self.table, width=WIDTH + 10, name="runs")

    def url_state(self):
        """What the page's URL keeps (see ``url_state``): the search and the grouping."""
        return [("runs", self.search, "value")] + self.grouping.url_state()

    # ------------------------------------------------------------------------------------------------ reading
    def shown(self) -> frozenset | None:
        """The runs the tabs show, or None when that is every run."""
        if self._shown is None:
            checked = {self._runs[i] for i in np.asarray(self.source.selected.indices, np.int64).tolist()
                       if i < len(self._runs)}
            runs = checked if self._matching is None else checked & self._matching
            self._shown = frozenset(runs) if len(runs) < len(self._runs) else _EVERY
        return None if self._shown is _EVERY else self._shown

    def shows(self, run) -> bool:
        shown = self.shown()
        return shown is None or run in shown

    def check_only(self, runs):
        """Check exactly ``runs`` (those the list has), uncheck the others, as if done in the page."""
        wanted = set(runs)
        self.source.selected.indices = [i for i, run in enumerate(self._runs) if run in wanted]

    def on_change(self, callback):
        """Call ``callback()`` (on the session's IOLoop) whenever the shown runs or their grouping change."""
        self._listeners.append(callback)

    # ------------------------------------------------------------------------------------------------ updating
    def update(self) -> int:
        """Add the runs the store found since the last call, checked (on the session's IOLoop); returns how many.

        Names, colours and checks go as NumPy arrays: Bokeh hands a string array to the JSON encoder whole and sends
        an integer array as bytes, where it encoded (and walked, looking for models) a list of ten thousand one item
        at a time: 50 ms of the session's first turn, now ~10."""
        self.grouping.update()
        runs = self.store.runs()
        if len(runs) == len(self._runs):
            return 0
        known = set(self._runs)
        new = [run for run in runs if run not in known]
        start = len(self._runs)
        self._runs.extend(new)
        self._quiet = True          # the views learn of new runs' series from the store
        try:
            self.source.stream({"run": np.array(new, dtype=str),
                                "colour": np.array([run_colour(self.store, run) for run in new], dtype=str)})
            self.source.selected.indices = np.concatenate([np.asarray(self.source.selected.indices, np.int32),
                                                           np.arange(start, len(self._runs), dtype=np.int32)])
        finally:
            self._quiet = False
        if self._pattern is not None:
            self._apply_search(self._pattern)
        self._shown = None
        self.table.height = min(MAX_HEIGHT, ROW_HEIGHT * len(self._runs) + 4)    # as tall as its rows, up to a max
        self._show_summary()
        return len(new)

    def _changed(self):
        self._shown = None
        self._show_summary()
        if not self._quiet:
            self._notify()

    def _notify(self):
        for callback in self._listeners:
            callback()

    def _search(self):
        try:
            pattern = compile_filter(self.search.value or "")
        except FilterError as e:     # keep the last good search; say what is wrong with this one
            self._error = f"Invalid regex {e.pattern!r}: {e.reason}"
            self._show_summary()
            return
        self._error = ""
        self._apply_search(pattern if self.search.value else None)
        self._changed()

    def _apply_search(self, pattern):
        self._pattern = pattern
        if pattern is None:
            self._matching = None
            self.view.filter.indices = None
        else:
            rows = [i for i, run in enumerate(self._runs) if pattern.search(run) is not None]
            self._matching = {self._runs[i] for i in rows}
            self.view.filter.indices = rows

    def _check(self, checked):
        """Check (or uncheck) every run the search shows."""
        rows = {i for i, run in enumerate(self._runs) if self._matching is None or run in self._matching}
        indices = set(self.source.selected.indices)
        self.source.selected.indices = sorted(indices | rows if checked else indices - rows)

    def _show_summary(self):
        if self._error:
            text = f'<span style="color:#c00">{html.escape(self._error)}</span>'
        else:
            shown, n = self.shown(), len(self._runs)
            text = f"{n if shown is None else len(shown):,} of {n:,} runs shown"
        if self.summary.text != text:
            self.summary.text = text


_EVERY = frozenset({object()})      # shown()'s cached "every run" (distinct from any real set of runs)
