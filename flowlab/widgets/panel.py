"""``WatchPanel``: a live notebook view of watched tensors, fed by ``flow.watch`` / ``flow.watch_diff``.

Each watched ``(tensor, value|gradient)`` gets a row: its name and step, a histogram of its latest value (linear or
log count axis, switched in the page; log from the start when the first histogram is spiky; hover reads a bar's
bucket and count), the trend of its statistics over every step (mean ± std, the min…max envelope, red bands over
steps that held NaN/Inf) and a table of the latest step's statistics (its "hist" row: the step of the histogram
shown). A ``stats=True`` watch gets no histogram.

Where the work happens: as a watch handler the panel asks for summaries computed where the tensor lives
(``watch_summary``): every call appends the tensor's six statistics to the row's ``StatsFeed``, and a histogram is
computed only on the first call after each screen refresh, so watching costs a few microseconds a step on the compute
side whatever the tensor's size. The refresh thread (``_live``) takes each feed's statistics in bulk into the row's
``Trend``, and sends at most ``refresh_hz`` updates a second through a ``LiveDocument``, each holding only what
changed (see ``live``). ``watch_event`` takes the histograms (and whole values from plain watches).
"""
from __future__ import annotations

import html
import sys
import threading

import numpy as np
from bokeh.layouts import column
from bokeh.layouts import row as bokeh_row

from ..ops.stats import stats_vector
from ..plots import (Trend, fit_histogram, fit_trend, heading, histogram_columns, histogram_data, histogram_source,
                     histogram_view, is_spiky, stats_columns, stats_source, stats_view, tensor_summary, trend_columns,
                     trend_figure, trend_source)
from ..watching import StatsFeed, TensorHistogram, TensorStats
from ._live import DEFAULT_HZ, LiveView, Refresher, check_hz, resolve_mode

WAITING = '<span style="color:#777">WatchPanel: waiting for the first watched value…</span>'


class _Row:
    """One watched (lbn, kind): its pending data (under the panel's data lock) and, once shown, its Bokeh models
    (under the panel's UI lock)."""

    def __init__(self, lbn, kind, histograms, max_points):
        self.lbn, self.kind, self.histograms = lbn, kind, histograms
        self.trend = Trend(max_points)
        self.stats = self.step = None       # the latest TensorStats and its step
        self.hist = self.hist_step = None   # the latest TensorHistogram (or array) not yet shown, and its step
        self.hist_label = ""                # the stats table's "hist" row: the step of the histogram shown
        self.hist_step_shown = None         # and that step
        self.dirty = False
        self.layout = self.stats_source = self.hist_source = self.trend_source = self.trend_fig = self.toggle = None
        self.hist_figures = ()      # (linear, log) count axes
        self.log_decided = False

    def add_stats(self, step, stats):
        if step != self.step:            # a tensor watched twice reports each step twice
            self.trend.add(step, stats)
            self.stats, self.step = stats, step
            self.dirty = True

    def add_feed(self, shape, steps, vectors):
        """Statistics taken from a ``StatsFeed`` (one row a step, in step order; ``steps`` an int64 array)."""
        self.trend.extend(steps, vectors)
        self.stats, self.step = TensorStats.from_vector(shape, vectors[-1]), int(steps[-1])
        self.dirty = True

    @property
    def title(self):
        return f"{self.lbn} {self.kind}" + ("" if self.histograms else " (stats)")

    def header_html(self):
        kind = html.escape(self.kind) + ("" if self.histograms else " (stats: no histogram)")
        return f'<b>{html.escape(self.lbn)}</b> &nbsp;<span style="color:#777">{kind}</span>'


class WatchPanel(LiveView):
    """Live histograms, stats and trends of watched tensors.

    ``display(panel)`` in a notebook, then pass it as the handler of ``flow.watch`` / ``flow.watch_diff`` (or call
    ``panel.watch(tensor, ...)`` inside a job). Rows appear as tensors first report. ``log_counts`` is the
    histograms' count axis: ``"auto"`` (log when the first histogram is spiky), True or False; a checkbox in each
    row switches it. ``refresh()`` pushes what is pending now; ``close()`` does so and stops the refresh thread.
    Outside Jupyter (or with ``mode="terminal"``) it prints one stats line per row at most once a second instead.
    """

    def __init__(self, max_points=500, refresh_hz=DEFAULT_HZ, bins=30, log_counts="auto", mode=None, file=None):
        self.mode = resolve_mode(mode, "WatchPanel")
        self.refresh_hz = check_hz(refresh_hz, "WatchPanel")
        if not isinstance(bins, int) or isinstance(bins, bool) or not 1 <= bins <= 1000:
            raise ValueError(f"WatchPanel: bins must be an int in [1, 1000], got {bins!r}")
        if log_counts not in ("auto", True, False):
            raise ValueError(f"WatchPanel: log_counts must be 'auto', True or False, got {log_counts!r}")
        Trend(max_points)        # validates max_points now rather than at the first value
        self.max_points, self.bins, self.log_counts = max_points, bins, log_counts
        self._file = file
        self._rows = {}                        # (lbn, kind) -> _Row, in order of first report
        self._histogram_keys = set()           # (lbn, kind) watched with histograms (see watch_summary)
        self._wanted = {}                      # (lbn, kind) -> the next call should ship a histogram
        self._feeds = {}                       # (lbn, kind) -> (shape, StatsFeed) of its statistics
        self._data_lock = threading.Lock()     # pending data; held only for a few assignments
        self._ui_lock = threading.RLock()      # Bokeh models and the live document
        period = 1.0 / self.refresh_hz if self.mode == "notebook" else max(1.0, 1.0 / self.refresh_hz)
        self._refresher = Refresher(self.refresh, period, "flowlab-watch-panel")
        if self.mode == "notebook":
            from .live import LiveDocument
            self._root = column(heading(WAITING), sizing_mode="stretch_width")
            self.widget = LiveDocument(self._root, before_settle=self._settle, name="WatchPanel")

    # ---------------------------------------------------------------------------------------------- attaching

    def watch(self, tensor, values=True, gradients=False, stats=False, every=1):
        """Inside a job: watch ``tensor``'s value and/or gradient with this panel (``stats=True``: no histogram)."""
        import flowlab as flow
        if not (values or gradients):
            raise ValueError("WatchPanel.watch: nothing to watch; pass values=True and/or gradients=True")
        if values:
            flow.watch(tensor, self, stats=stats, every=every)
        if gradients:
            flow.watch_diff(tensor, self, stats=stats, every=every)

    def watch_all(self, tensors, values=True, gradients=False, stats=False, every=1):
        for tensor in tensors:
            self.watch(tensor, values=values, gradients=gradients, stats=stats, every=every)

    def watch_summary(self, blob_def, kind):
        """The watch protocol (see ``flowlab.watching``): statistics every call, a histogram when the screen wants
        a new one."""
        key = (blob_def.logical_blob_name, kind)
        self._histogram_keys.add(key)
        self._wanted[key] = True
        wanted = self._wanted
        if key not in self._feeds:
            self._feeds[key] = (tuple(blob_def.shape), StatsFeed(self._refresher.poke, self._take_feeds))
        return self.bins, lambda: wanted[key], self._feeds[key][1]

    def _row(self, key, histograms):
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = _Row(*key, histograms or key in self._histogram_keys, self.max_points)
        return row

    def _take_feeds(self):
        """Fold what the feeds hold into the rows (the refresh thread, or the job's thread when a feed is full)."""
        with self._data_lock:
            for key, (shape, feed) in self._feeds.items():
                if not len(feed):
                    continue
                steps, vectors = feed.take(arrays=True)
                if len(steps):
                    self._row(key, False).add_feed(shape, steps, vectors)

    # ------------------------------------------------------------------------------------- dispatcher thread

    def watch_event(self, value, blob_def, kind, step):
        """Called by the watch dispatcher with a ``TensorHistogram``, a ``TensorStats`` (``stats=True`` watches) or a
        whole array."""
        key = (blob_def.logical_blob_name, kind)
        stats = hist = None
        if isinstance(value, TensorHistogram):
            hist = value
        elif isinstance(value, TensorStats):
            stats = value
        else:
            array = np.asarray(value)
            stats, hist = TensorStats.from_vector(array.shape, stats_vector(np, array)), array
        with self._data_lock:
            row = self._row(key, hist is not None)
            if stats is not None:
                row.add_stats(step, stats)
            if hist is not None:
                row.hist, row.hist_step = hist, step
                row.dirty = True
                self._wanted[key] = False
        self._refresher.poke()

    # ------------------------------------------------------------------------------------------------ display

    def refresh(self):
        """Push every pending update now (the refresh thread calls this too)."""
        with self._ui_lock:
            self._take_feeds()
            with self._data_lock:    # take a consistent snapshot, then let watch_event go on
                updates = []
                for row in self._rows.values():
                    if row.dirty:
                        updates.append((row, row.stats, row.step, row.hist, row.hist_step, row.trend.take()))
                        row.hist, row.dirty = None, False
            if not updates:
                return
            if self.mode == "terminal":
                self._print(updates)
            else:
                self._show(updates)

    def _show(self, updates):
        live, built = self.widget, False
        for row, stats, step, hist, hist_step, trend in updates:
            columns = None if hist is None else histogram_columns(histogram_data(hist, self.bins))
            if row.layout is None:
                self._build(row, columns)
                built = True
            if columns is not None and row.hist_source is not None:
                self._show_histogram(row, columns, hist_step)
                self._wanted[(row.lbn, row.kind)] = True       # the next call ships a fresh one
            if stats is not None:
                live.splice(row.stats_source, 0, stats_columns(stats, step, row.hist_label))
            if trend is not None:
                at, values = trend
                live.splice(row.trend_source, at, trend_columns(values))
                fit_trend(live, row.trend_fig, live.data(row.trend_source))
        if built:
            self._root.children = [row.layout for row in self._rows.values() if row.layout is not None]
            live.publish()
        else:
            live.push()

    def _show_histogram(self, row, columns, step):
        self.widget.splice(row.hist_source, 0, columns)
        fit_histogram(self.widget, row.hist_figures, columns)
        # histograms come one per refresh: the table's "hist" row says which step this one is (canvas text: an axis
        # label or a title that changes would make the page lay the plot out again)
        row.hist_step_shown = step
        row.hist_label = str(step) + ("" if len(columns["top"]) else ": no finite")
        if not row.log_decided:
            self._set_log(row, bool(is_spiky(columns["top"])))

    def _settle(self):
        """The end of a cell (and ``close``), before the live document's snapshot: push what is pending, then give
        each row whose histogram is older than its statistics the last step's histogram. During a run a histogram is
        asked for only once the last one was drawn, so the one shown trails by up to a refresh period; at the end the
        row's feed still holds the last step's copy (``StatsFeed.latest``: tensors copied whole, on the host) and
        the final picture is exact. Last, every range is fitted tight (``_fit_tight``)."""
        self.refresh()
        if self.mode != "notebook":
            return
        with self._ui_lock:
            with self._data_lock:
                stale = [(row, self._feeds[key][1]) for key, row in self._rows.items()
                         if row.hist_source is not None and key in self._feeds and row.step is not None
                         and row.hist_step_shown != row.step]
            for row, feed in stale:
                latest = feed.latest()
                if latest is None:
                    continue            # summarised in place (a large or device tensor): no copy to draw from
                step, value = latest
                with self._data_lock:
                    stats, last = row.stats, row.step
                if step != last:
                    continue
                self._show_histogram(row, histogram_columns(histogram_data(value, self.bins)), step)
                self.widget.splice(row.stats_source, 0, stats_columns(stats, last, row.hist_label))
            self._fit_tight()

    def _fit_tight(self):
        """The run is over (for now): fit every range to what it shows, with no room left for growth (a trend's step
        axis keeps up to a third of itself empty while it runs). Under the UI lock."""
        live = self.widget
        for row in self._rows.values():
            if row.trend_fig is not None:
                fit_trend(live, row.trend_fig, live.data(row.trend_source), tight=True)
            if row.hist_source is not None and row.hist_step_shown is not None:
                fit_histogram(live, row.hist_figures, live.data(row.hist_source), tight=True)

    def _build(self, row, columns):
        """The row's Bokeh models (before any data: ``_show`` fills them through the live document)."""
        row.stats_source, row.trend_source = stats_source(), trend_source()
        head, parts = [heading(row.header_html())], []
        if row.histograms:
            row.hist_source = histogram_source()
            log = self.log_counts if self.log_counts != "auto" else columns is not None and is_spiky(columns["top"])
            view, row.toggle = histogram_view(row.hist_source, log=bool(log), x_label=row.kind)
            row.hist_figures = tuple(view.children)
            row.log_decided = self.log_counts != "auto" or columns is not None
            head.append(row.toggle)
            parts.append(view)
        row.trend_fig = trend_figure(row.trend_source, y_label=row.kind)
        parts += [row.trend_fig, stats_view(row.stats_source)]
        row.layout = column(bokeh_row(*head, sizing_mode="stretch_width"),
                            bokeh_row(*parts, sizing_mode="stretch_width"), sizing_mode="stretch_width")

    def _set_log(self, row, log):
        linear, logarithmic = row.hist_figures
        self.widget.set(row.toggle, active=log)
        self.widget.set(linear, visible=not log)
        self.widget.set(logarithmic, visible=log)
        row.log_decided = True

    def _print(self, updates):
        out = self._file or sys.stdout
        for row, stats, step, _, _, _ in updates:
            if stats is None:
                continue
            s = tensor_summary(stats)
            print(f"[step {step}] {row.title}: shape={s['shape']} min={s['min']:.4g} max={s['max']:.4g} "
                  f"mean={s['mean']:.4g} std={s['std']:.4g} nan={s['nan']} inf={s['inf']}", file=out, flush=True)

    def __repr__(self):
        with self._data_lock:
            titles = [row.title for row in self._rows.values()]
        return f"WatchPanel({self.mode}, rows={titles})"
