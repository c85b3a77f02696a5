"""``WatchPanel``: a live notebook view of watched tensors, fed by ``flow.watch`` / ``flow.watch_diff``.

Each watched ``(tensor, value|gradient)`` gets a row: a histogram, a stats table (NaN/Inf in red) and the trend of
mean ± std over steps; a ``stats=True`` watch ships no values, so its row shows the stats and the trend only.

Data flow and threads: ``watch_event`` runs on the watch dispatcher thread and must not slow training down, so it
only summarises the value with NumPy (summary, histogram, one trend point) and stores it as the row's pending update
(a newer value replaces an unsent one). The refresh thread (see ``_live``) then pushes the pending rows at most
``refresh_hz`` times a second: Bokeh changes of a row are batched with ``document.hold()``, widget changes with
``hold_sync()``. Each row is one ``jupyter_bokeh.BokehModel`` (one Bokeh document, one comm) so the dashboard can
reuse the same figures from ``flowlab.plots``. Columns are sent as lists, not NumPy arrays: jupyter_bokeh sends
every binary buffer as two extra comm messages, and these columns are short.
"""
from __future__ import annotations

import html
import sys
import threading

from ..plots import (Trend, histogram_data, histogram_figure, histogram_source, stats_html, stats_table,
                     tensor_summary, trend_figure, trend_source)
from ..watching import TensorStats
from ._live import Refresher, check_hz, resolve_mode


class _Row:
    """One watched (lbn, kind): its pending data (under the panel's data lock) and, once shown, its Bokeh models
    (under the panel's UI lock)."""

    def __init__(self, lbn, kind, stats_only, max_points):
        self.lbn, self.kind, self.stats_only = lbn, kind, stats_only
        self.trend = Trend(max_points)
        self.summary = self.hist = self.step = None
        self.dirty = False
        self.widget = self.doc = self.hist_source = self.trend_source = self.table = None

    @property
    def title(self):
        return f"{self.lbn} {self.kind}" + (" (stats)" if self.stats_only else "")


class WatchPanel:
    """Live histograms, stats and trends of watched tensors.

    ``display(panel)`` in a notebook, then pass it as the handler of ``flow.watch`` / ``flow.watch_diff`` (values,
    gradients, ``stats=True``), or call ``panel.watch(tensor, ...)`` inside a job. Rows appear as tensors first
    report. ``refresh()`` pushes what is pending now; ``close()`` does so and stops the refresh thread. Outside
    Jupyter (or with ``mode="terminal"``) it prints one stats line per row at most once a second instead.
    """

    def __init__(self, max_points=1000, refresh_hz=10, bins=30, mode=None, file=None):
        self.mode = resolve_mode(mode, "WatchPanel")
        self.max_points, self.bins = int(max_points), int(bins)
        self.refresh_hz = check_hz(refresh_hz, "WatchPanel")
        Trend(self.max_points)   # validates max_points now rather than at the first value
        self._file = file
        self._rows = {}                        # (lbn, kind, stats_only) -> _Row, in order of first report
        self._data_lock = threading.Lock()     # pending data; held only for a few assignments
        self._ui_lock = threading.RLock()      # widgets and Bokeh models
        period = 1.0 / self.refresh_hz if self.mode == "notebook" else max(1.0, 1.0 / self.refresh_hz)
        self._refresher = Refresher(self.refresh, period, "flowlab-watch-panel")
        self.box = None
        if self.mode == "notebook":
            import ipywidgets
            self.box = ipywidgets.VBox([])

    # ---------------------------------------------------------------------------------------------- attaching

    def watch(self, tensor, values=True, gradients=False, stats=False, every=1):
        """Inside a job: watch ``tensor``'s value and/or gradient with this panel."""
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

    # ------------------------------------------------------------------------------------- dispatcher thread

    def watch_event(self, value, blob_def, kind, step):
        """Called by the watch dispatcher for each delivered value (an ndarray or ``TensorStats``)."""
        stats_only = isinstance(value, TensorStats)
        summary = tensor_summary(value)
        hist = None if stats_only else {k: v.tolist() for k, v in histogram_data(value, self.bins).items()}
        key = (blob_def.logical_blob_name, kind, stats_only)
        with self._data_lock:
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = _Row(blob_def.logical_blob_name, kind, stats_only, self.max_points)
            row.summary, row.hist, row.step = summary, hist, step
            row.trend.append(step, summary["mean"], summary["std"])
            row.dirty = True
        self._refresher.poke()

    # ------------------------------------------------------------------------------------------------ display

    def refresh(self):
        """Push every pending update now (the refresh thread calls this too)."""
        with self._ui_lock:
            with self._data_lock:    # take a consistent snapshot, then let watch_event go on
                updates = [(row, row.summary, row.hist, row.step, row.trend.take())
                           for row in self._rows.values() if row.dirty]
                for row in self._rows.values():
                    row.dirty = False
            if not updates:
                return
            if self.mode == "terminal":
                self._print(updates)
            else:
                self._show(updates)

    def _show(self, updates):
        new = [row for row, *_ in updates if row.widget is None]
        for row in new:
            self._build(row)
        for row, summary, hist, step, trend in updates:
            doc = row.doc
            doc.hold("combine")      # one batch of Bokeh events per row and flush
            try:
                if hist is not None:
                    row.hist_source.data = hist
                row.table.text = stats_html(summary, title=f"step {step}")
                if trend is not None:
                    change, columns = trend
                    if change == "stream":
                        row.trend_source.stream(columns)
                    else:
                        row.trend_source.data = columns
            finally:
                doc.unhold()
        if new:
            with self.box.hold_sync():
                self.box.children = tuple(self.box.children) + tuple(row.widget for row in new)

    def _build(self, row):
        import ipywidgets
        from bokeh.layouts import row as bokeh_row
        from jupyter_bokeh import BokehModel
        row.trend_source = trend_source()
        row.table = stats_table()
        figures = []
        if not row.stats_only:
            row.hist_source = histogram_source()
            figures.append(histogram_figure(row.hist_source, "histogram"))
        figures += [trend_figure(row.trend_source, "trend"), row.table]
        kind = html.escape(row.kind) + (" (stats)" if row.stats_only else "")
        title = ipywidgets.HTML(f"<b>{html.escape(row.lbn)}</b> &nbsp;{kind}")
        layout = bokeh_row(*figures)
        row.widget = ipywidgets.VBox([title, BokehModel(layout)])
        row.doc = layout.document     # BokehModel put the layout in a document of its own

    def _print(self, updates):
        out = self._file or sys.stdout
        for row, s, _, step, _ in updates:
            print(f"[step {step}] {row.title}: shape={s['shape']} min={s['min']:.4g} max={s['max']:.4g} "
                  f"mean={s['mean']:.4g} std={s['std']:.4g} nan={s['nan']} inf={s['inf']}", file=out, flush=True)

    def _repr_mimebundle_(self, **kwargs):
        if self.box is not None:
            return self.box._repr_mimebundle_(**kwargs)
        return {"text/plain": repr(self)}

    def __repr__(self):
        with self._data_lock:
            titles = [row.title for row in self._rows.values()]
        return f"WatchPanel({self.mode}, rows={titles})"

    def close(self):
        """Push what is pending and stop the refresh thread; the widgets stay on screen."""
        self._refresher.stop()
        self.refresh()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
