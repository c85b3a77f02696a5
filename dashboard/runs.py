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

The checks travel as changes, not as lists (issue 29: no turn over ~100 ms at any logdir size). The table's
selection (its checkboxes) is not synced back: a click in the page sends the rows it toggled (``toggles``:
``_TOGGLED_JS``), where Bokeh sent the whole list of checked rows, ten thousand integers that the server decoded,
validated and walked one at a time (~35 ms of an uncheck's turn at 10,000 runs). The server keeps the checks as a
boolean array and sends its own changes (new runs, "check shown", ``check_only``) as the whole list of checked rows,
as an int32 array (one binary buffer), through ``checks``, which the page applies to the table (``_CHECKS_JS``)
whatever it last heard from the page.

A served session lists new runs ``LIST_SLICE`` a turn (``update``); until every run is listed, the runs not listed
yet are not shown (the cards draw listed runs only), and the summary says how many are still to come.
"""
from __future__ import annotations

import html
import weakref

import numpy as np
from bokeh.core.property.validation import validate as property_validation
from bokeh.layouts import column, row
from bokeh.models import (Button, CDSView, ColumnDataSource, CustomJS, DataTable, Div, HTMLTemplateFormatter,
                          IndexFilter, Selection, StringFormatter, TableColumn, TextInput)

from flowlab.plots.colours import run_colours
from flowlab.plots.figures import served

from .filters import FilterError, compile_filter
from .run_groups import RunGroups

WIDTH = 250
ROW_HEIGHT, MAX_HEIGHT = 24, 600      # the list scrolls past 25 runs
# Runs a served session lists in one turn of its IOLoop (``update``): 100,000 new runs at once were one turn of
# ~170 ms (their names and colours encoded and sent, their checks, the search over them: RE2 takes ~2 µs a name).
LIST_SLICE = 10_000

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


# In the page, on a change of the table's checks (a click, or the server's ``_CHECKS_JS``): send the server the rows
# whose check changed since the last change, with a sequence number (a toggle equal to the last one sent, after the
# server had changed the checks in between, would otherwise be no change of ``toggles.data``, and not sent).
_TOGGLED_JS = """
const n = source.get_length() ?? 0;
const state = checks.__flowlab_checks ?? (checks.__flowlab_checks = {before: null, seq: 0});
if (state.before == null) {             // first change in this page: from what the server last sent
  state.before = new Uint8Array(n);
  for (const i of checks.data.row) if (i < n) state.before[i] = 1;
}
const now = new Uint8Array(n);
for (const i of cb_obj.indices) if (i >= 0 && i < n) now[i] = 1;
const row = [], on = [];
for (let i = 0; i < n; i++) {
  const was = i < state.before.length ? state.before[i] : 0;
  if (now[i] !== was) { row.push(i); on.push(now[i]); }
}
state.before = now;
if (row.length) {
  state.seq += 1;
  toggles.data = {row: Int32Array.from(row), checked: Uint8Array.from(on),
                  seq: new Float64Array(row.length).fill(state.seq)};
}
"""
# In the page, when the server sends its checks (``checks``: the checked rows; its tags change every time): check
# exactly those rows in the table. What the page records as sent is set first, so that this sends nothing back.
_CHECKS_JS = """
const n = source.get_length() ?? 0;
const state = checks.__flowlab_checks ?? (checks.__flowlab_checks = {before: null, seq: 0});
const rows = checks.data.row, before = new Uint8Array(n);
for (const i of rows) if (i >= 0 && i < n) before[i] = 1;
state.before = before;
selected.indices = Array.from(rows);
"""


def run_colours_of(store, runs):
    """``run_colour(store, run)`` of each of ``runs``, as a NumPy string array: runs first seen here take the next
    palette colours in order, in one pass (a hundred thousand new runs one call each: ~40 ms of a turn)."""
    colours = _colours.setdefault(store, {})
    new = [run for run in dict.fromkeys(runs) if run not in colours]
    if new:
        palette = np.array(run_colours(), dtype=str)
        colours.update(zip(new, palette[np.arange(len(colours), len(colours) + len(new)) % len(palette)].tolist()))
    return np.array([colours[run] for run in runs], dtype=str) if runs else np.zeros(0, dtype="<U1")


class ShownRuns(frozenset):
    """The runs a run list shows (a frozenset of names), with the list's own view of them: ``mask``, per row of the
    list, whether its run is shown, and ``rows``, the list's run -> row (rows are only added: a run's row stays). A
    view with a row per run (a card of 100,000 lines) maps its runs to rows once and takes the mask, where 100,000
    lookups of names in the set were ~20 ms a click."""

    def __new__(cls, runs, mask, rows):
        shown = super().__new__(cls, runs)
        shown.mask, shown.rows = mask, rows
        return shown


class RunSelection:
    """One session's run list (see the module doc); ``layout()`` is its column of widgets."""

    def __init__(self, store):
        self.store = store
        self._runs: list[str] = []
        self._listed: dict[str, int] = {}            # the runs of ``_runs``: run -> row
        self._names = np.zeros(0, object)            # ``_runs`` as an array (``shown``: a mask picks the names)
        self._matching: set[str] | None = None      # runs the search matches (None: every run)
        self._matches = None                         # per row: whether the search matches it (None: no search)
        self._unlisted = 0                           # runs of the store not listed yet (``update``)
        self._search_job = None                      # a search under way over several turns (``_search``)
        self._shown: frozenset | None = None         # cached answer of shown()
        self._listeners = []
        self._quiet = False                          # set while the server changes the checks itself
        self._checked = np.zeros(0, bool)            # per row of the list: checked
        self._setting = False                        # set while ``_set_checks`` sets the table's selection
        self._pattern = None                         # the search, compiled (None: empty)
        self._error = ""                             # what is wrong with the search as typed
        # the checkboxes: set by the server, never synced back (the page sends its clicks through ``toggles``)
        self.source = ColumnDataSource({"run": [], "colour": []}, name="runs-source",
                                       selected=Selection(syncable=False))
        self.checks = ColumnDataSource({"row": np.zeros(0, np.int32)}, name="runs-checks", tags=[0])
        self.toggles = ColumnDataSource({"row": np.zeros(0, np.int32), "checked": np.zeros(0, np.uint8),
                                         "seq": np.zeros(0)}, name="runs-toggles")
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
        # (a change of the selection on the server: ``_set_checks``, or a test acting as the page)
        self.source.selected.on_change("indices", lambda attr, old, new: self._selected(new))
        self.toggles.on_change("data", lambda attr, old, new: self._toggled(new))
        self.source.selected.js_on_change("indices", CustomJS(
            args=dict(source=self.source, checks=self.checks, toggles=self.toggles), code=_TOGGLED_JS))
        self.checks.js_on_change("tags", CustomJS(
            args=dict(source=self.source, checks=self.checks, selected=self.source.selected), code=_CHECKS_JS))
        self.search.on_change("value", lambda attr, old, new: self._search())
        self.check_all.on_click(lambda: self._check(True))
        self.check_none.on_click(lambda: self._check(False))

    def layout(self):
        # (the tags keep the checks' channels in the document: nothing draws them)
        return column(Div(text="<b>Runs</b>"), self.search, row(self.check_all, self.check_none),
                      self.grouping.layout(), self.summary, self.table, width=WIDTH + 10, name="runs",
                      tags=[self.checks, self.toggles])

    def url_state(self):
        """What the page's URL keeps (see ``url_state``): the search and the grouping."""
        return [("runs", self.search, "value")] + self.grouping.url_state()

    # ------------------------------------------------------------------------------------------------ reading
    def shown(self) -> frozenset | None:
        """The runs the tabs show, or None when that is every run. Only listed runs are shown: while a served
        session lists a logdir's runs over several turns (``update``), the runs not listed yet are not."""
        if self._shown is None:
            if self._matching is None and self._checked.all() and not self._unlisted:
                self._shown = _EVERY
            elif self._matches is None or len(self._matches) == len(self._runs):
                # (a mask over the rows, the names picked by it: a set built of 100,000 names was ~40 ms of a click)
                mask = self._checked.copy() if self._matches is None else self._checked & self._matches
                self._shown = ShownRuns(self._names[mask].tolist(), mask, self._listed) \
                    if self._unlisted or not mask.all() else _EVERY
            else:                               # (runs listed since the search's last pass: as its set has them)
                checked = {self._runs[i] for i in np.flatnonzero(self._checked).tolist()}
                runs = checked & self._matching
                self._shown = frozenset(runs) if len(runs) < len(self._runs) or self._unlisted else _EVERY
        return None if self._shown is _EVERY else self._shown

    @property
    def rows(self) -> dict:
        """The listed runs' rows in the list (run -> row: rows are only added; ``ShownRuns.rows``)."""
        return self._listed

    def shows(self, run) -> bool:
        shown = self.shown()
        return shown is None or run in shown

    def check_only(self, runs):
        """Check exactly ``runs`` (those the list has), uncheck the others, as if done in the page."""
        wanted = set(runs)
        self._set_checks(np.fromiter((run in wanted for run in self._runs), bool, len(self._runs)))

    def on_change(self, callback):
        """Call ``callback()`` (on the session's IOLoop) whenever the shown runs or their grouping change."""
        self._listeners.append(callback)

    # ------------------------------------------------------------------------------------------------ updating
    def update(self) -> int:
        """Add the runs the store found since the last call, checked (on the session's IOLoop); returns how many.
        In a served session at most ``LIST_SLICE`` a call: the app calls again in the next turn while it lists
        ``app.LIST_ALONE`` or more (the runs not listed yet are not shown meanwhile: ``shown``).

        Names, colours and checks go as NumPy arrays: Bokeh hands a string array to the JSON encoder whole and sends
        an integer array as bytes, where it encoded (and walked, looking for models) a list of ten thousand one item
        at a time: 50 ms of the session's first turn, now ~10."""
        self.grouping.update()
        runs = self.store.runs()
        if len(runs) == len(self._runs):
            return 0
        listed = self._listed
        new = [run for run in runs if run not in listed]
        if served(self.table.document) and len(new) > LIST_SLICE:
            new = new[:LIST_SLICE]
        self._unlisted = len(runs) - len(self._runs) - len(new)
        start = len(self._runs)
        self._runs.extend(new)
        listed.update(zip(new, range(start, start + len(new))))
        self._names = np.concatenate([self._names, np.array(new, dtype=object)])
        self.source.stream({"run": np.array(new, dtype=str),
                            "colour": run_colours_of(self.store, new)})
        if self._pattern is not None:         # (before the checks: the summary counts the matches of every row)
            self._apply_search(self._pattern, start)
        # (quiet: the views learn of new runs' series from the store)
        self._set_checks(np.concatenate([self._checked[:start], np.ones(len(new), bool)]), quiet=True)
        self._shown = None
        self.table.height = min(MAX_HEIGHT, ROW_HEIGHT * len(self._runs) + 4)    # as tall as its rows, up to a max
        self._show_summary()
        return len(new)

    def _set_checks(self, checked, quiet=False):
        """Check the rows where ``checked`` (a boolean per row) is True, here and in the page (as an int32 array:
        one binary buffer); ``quiet``: without telling the views."""
        rows = np.flatnonzero(checked).astype(np.int32)
        changed = len(checked) != len(self._checked) or not np.array_equal(checked, self._checked)
        self._checked = checked
        self._setting = True
        try:
            with property_validation(False):     # (int32 rows: Bokeh would check each of them, ~0.5 µs a row)
                # (new tags every time: the page applies them even when they equal what it last had from the server;
                # first, so that the page, having applied them, finds nothing to send back when the selection comes)
                self.checks.update(data={"row": rows}, tags=[self.checks.tags[0] + 1])
                self.source.selected.indices = rows
        finally:
            self._setting = False
        if changed:
            self._quiet = quiet
            try:
                self._changed()
            finally:
                self._quiet = False

    def _selected(self, indices):
        """The table's selection changed on the server: by ``_set_checks``, or by a caller acting as the page."""
        if self._setting:
            return
        rows = np.asarray(indices, np.int64).reshape(-1)
        checked = np.zeros(len(self._runs), bool)
        checked[rows[(rows >= 0) & (rows < len(checked))]] = True
        if not np.array_equal(checked, self._checked):
            self._checked = checked
            self._changed()

    def _toggled(self, data):
        """The page's clicks: ``data`` holds the rows whose check changed and their new state (``_TOGGLED_JS``)."""
        rows = np.asarray(data.get("row", ()), np.int64).reshape(-1)
        checked = np.asarray(data.get("checked", ()), bool).reshape(-1)
        if len(rows) != len(checked):         # (not what the page sends: nothing to apply)
            return
        keep = (rows >= 0) & (rows < len(self._checked))
        rows, checked = rows[keep], checked[keep]
        if rows.size and not np.array_equal(self._checked[rows], checked):
            self._checked = self._checked.copy()
            self._checked[rows] = checked
            self._changed()

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
        pattern = pattern if self.search.value else None
        doc = self.table.document
        if pattern is not None and len(self._runs) > LIST_SLICE and served(doc):
            # ``LIST_SLICE`` runs a turn (RE2 takes ~2 µs a name: 100,000 were a turn of ~200 ms); the last search
            # stays in effect until this one is done, and a newer one replaces it
            job = self._search_job = [pattern, [], 0]
            self._show_summary()
            doc.add_next_tick_callback(lambda: self._search_some(job))
            return
        self._search_job = None
        self._apply_search(pattern)
        self._changed()

    def _search_some(self, job):
        """One turn of a search spread over turns (``_search``): the next ``LIST_SLICE`` runs, then (the last turn)
        the search's result applied."""
        if self._search_job is not job:            # replaced by a newer search
            return
        pattern, parts, done = job
        end = min(done + LIST_SLICE, len(self._runs))     # (runs listed meanwhile are searched too)
        parts.append(np.fromiter((pattern.search(run) is not None for run in self._runs[done:end]), bool, end - done))
        job[2] = end
        if end < len(self._runs):
            self.table.document.add_next_tick_callback(lambda: self._search_some(job))
            return
        self._search_job = None
        self._set_matches(pattern, np.concatenate(parts))
        self._changed()

    def _apply_search(self, pattern, start=0):
        """Search the runs with ``pattern`` (None: show every run); ``start``: the rows before it were searched with
        it already (runs just listed)."""
        self._pattern = pattern
        if pattern is None:
            self._matching = self._matches = None
            self.view.filter.indices = None
            return
        new = np.fromiter((pattern.search(run) is not None for run in self._runs[start:]), bool,
                          len(self._runs) - start)
        if start and self._matches is not None:
            self._matching |= {self._runs[start + i] for i in np.flatnonzero(new).tolist()}
            self._set_matches(pattern, np.concatenate([self._matches[:start], new]), self._matching)
        else:
            self._set_matches(pattern, new)

    def _set_matches(self, pattern, matches, matching=None):
        """The search ``pattern`` matches the rows where ``matches``; ``matching``: their runs, when known."""
        self._pattern, self._matches = pattern, matches
        self._matching = {self._runs[i] for i in np.flatnonzero(matches).tolist()} if matching is None else matching
        with property_validation(False):      # (int32 rows: one binary buffer, not a list checked and encoded)
            self.view.filter.indices = np.flatnonzero(matches).astype(np.int32)

    def _check(self, checked):
        """Check (or uncheck) every run the search shows."""
        rows = np.ones(len(self._runs), bool) if self._matches is None else self._matches
        self._set_checks(self._checked | rows if checked else self._checked & ~rows)

    def _show_summary(self):
        if self._error:
            text = f'<span style="color:#c00">{html.escape(self._error)}</span>'
        else:
            n = len(self._runs)        # (counted, not named: ``shown`` makes a set of names)
            shown = int(np.count_nonzero(self._checked if self._matches is None else self._checked & self._matches))
            text = f"{shown:,} of {n:,} runs shown"
            if self._unlisted:
                text += f"; {self._unlisted:,} more being listed"
            if self._search_job is not None:
                text += "; searching…"
        if self.summary.text != text:
            self.summary.text = text


_EVERY = frozenset({object()})      # shown()'s cached "every run" (distinct from any real set of runs)
