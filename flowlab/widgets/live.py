"""A Bokeh document shown live in a notebook cell: the transport under every flowlab widget.

The layout is built in Python by the plot layer (``flowlab.plots``, the figures the dashboard uses too) and drawn by
BokehJS in the page. ``LiveDocument`` is an ipywidgets model (through anywidget, so JupyterLab, Notebook 7, VS Code
and Colab need nothing installed beyond the Python package) whose front end, ``live.js``:

- loads BokehJS by itself, offline and once per page: a single ``BokehRuntime`` model per kernel carries Bokeh's own
  JavaScript bundles, gzipped (~0.45 MB instead of ~1.65 MB), and every live document refers to it; a page that
  already has this BokehJS version (after a kernel restart, say) does not load it again;
- builds the document from ``_snapshot`` (its full JSON, sent when the layout changes and at the end of each cell,
  numbered like the updates: a view already at the end-of-cell snapshot's number keeps its drawing, and a view the
  page renders anew because a display was updated takes over the drawing of the one it replaces);
- applies the updates ``push()`` sends as custom comm messages: changed properties, and for data sources only the
  rows from an index on (``splice``), numeric columns as binary float64 buffers;
- sends nothing back: browser-side changes (auto-ranging, hover, a log toggle) stay in the page, so a running cell
  never has a queue of browser events waiting for it.

Updates are numbered. anywidget loads a widget's module asynchronously, so messages sent while a page is still
loading it are lost; a view that misses one ignores later deltas until the next *keyframe* (every property and
source this document has updated, in full), which ``push()`` sends every 0.5 s for 10 s after each snapshot and
every 10 s after that. The page keeps the messages since the last keyframe, so a second view of the same widget
starts complete.

In the saved notebook, the output also holds a static HTML rendering of the last state (``flowlab.plots.static``):
after every cell that changed a live document, its displays are updated, so GitHub and nbviewer show the widget as
it ended.
"""
from __future__ import annotations

import gzip
import html
import json
import logging
import pathlib
import threading
import time
import uuid
import weakref

import anywidget
import bokeh
import ipywidgets
import numpy as np
import traitlets
from bokeh.document import Document
from bokeh.models import ColumnDataSource

KEYFRAME_EARLY = 0.5     # seconds between keyframes while views of a new snapshot may still be loading
EARLY_FOR = 10.0         # ... for this long after a snapshot
KEYFRAME_PERIOD = 10.0   # seconds between keyframes afterwards

_BOKEH_JS = pathlib.Path(bokeh.__file__).parent / "server" / "static" / "js"
# Bokeh's bundles the widgets need, each with a model it registers (a page that has that model skips the bundle)
_BUNDLES = (("bokeh.min.js", "Plot"), ("bokeh-widgets.min.js", "Div"))
_log = logging.getLogger("flowlab")


def _column(values):
    """A data column as sent: float64 array for numbers, list for anything else (text)."""
    array = np.asarray(values)
    return array.astype(np.float64) if array.dtype.kind in "fiub" else list(values)


class BokehRuntime(anywidget.AnyWidget):
    """Bokeh's JavaScript, gzipped, for the page: one model per kernel, shared by every ``LiveDocument``."""
    _esm = "export default {};"
    version = traitlets.Unicode(bokeh.__version__).tag(sync=True)
    bundles = traitlets.List(traitlets.Bytes()).tag(sync=True)
    probes = traitlets.List(traitlets.Unicode()).tag(sync=True)


_runtime = None
_runtime_lock = threading.Lock()


def bokeh_runtime():
    """The kernel's ``BokehRuntime`` (made on first use, again if it was closed)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None or _runtime.comm is None:
            bundles = [gzip.compress((_BOKEH_JS / name).read_bytes(), 6) for name, _ in _BUNDLES]
            _runtime = BokehRuntime(bundles=bundles, probes=[probe for _, probe in _BUNDLES])
        return _runtime


class LiveDocument(anywidget.AnyWidget):
    """``root`` (a Bokeh layout) shown live in the notebook; see the module doc.

    Change it from one thread at a time with ``set`` and ``splice``, then ``push()``; after changing the layout
    itself call ``publish()``. The values set are kept here and written into the Bokeh models only when a snapshot or
    the static copy needs them: Bokeh's property machinery is too slow for the refresh path. ``before_settle`` is
    called (it is held weakly) before the end-of-cell snapshot, so its owner can flush what it has pending.
    """

    _esm = pathlib.Path(__file__).with_name("live.js")
    _runtime = traitlets.Instance(BokehRuntime).tag(sync=True, **ipywidgets.widget_serialization)
    _key = traitlets.Unicode().tag(sync=True)
    _snapshot = traitlets.Unicode().tag(sync=True)

    def __init__(self, root, before_settle=None, name="LiveDocument"):
        self._document = Document()
        self._document.add_root(root)
        self._name = name
        self._lock = threading.RLock()
        self._seq = 0
        self._values = {}         # model -> {attr: value} ("data": columns, float64 or text): the current state
        self._props = {}          # model -> {attr: value} not yet pushed
        self._splices = {}        # source -> first row not yet pushed
        self._touched = {}        # model -> attrs updated since the last snapshot (what keyframes repeat)
        self._last_key = self._published = time.monotonic()
        self._changed_since_settle = False
        self._display_id = uuid.uuid4().hex
        self._displayed = False
        self._before_settle = None if before_settle is None else weakref.WeakMethod(before_settle)
        super().__init__(_runtime=bokeh_runtime(), _key=uuid.uuid4().hex, _snapshot=self._snapshot_json())
        _after_cells(self)

    @property
    def root(self):
        return self._document.roots[0]

    # ------------------------------------------------------------------------------------------------ changing

    def set(self, model, **props):
        """Set properties of a model of the document (JSON values: text, numbers, booleans)."""
        with self._lock:
            self._values.setdefault(model, {}).update(props)
            self._props.setdefault(model, {}).update(props)
            self._touched.setdefault(model, set()).update(props)
            self._changed_since_settle = True

    def get(self, model, attr, default=None):
        """The value last ``set`` on ``model``'s ``attr`` here (``default`` if none was)."""
        with self._lock:
            return self._values.get(model, {}).get(attr, default)

    def data(self, source: ColumnDataSource):
        """The current columns of ``source``: float64 arrays for numbers, lists for text."""
        with self._lock:
            data = self._values.get(source, {}).get("data")
            if data is None:
                data = {name: _column(values) for name, values in source.data.items()}
            return data

    def splice(self, source: ColumnDataSource, at, columns):
        """Keep the first ``at`` rows of ``source`` and put ``columns`` (every column of it) after them."""
        with self._lock:
            old = self.data(source)
            if set(columns) != set(old):
                raise ValueError(f"LiveDocument.splice: columns must be {sorted(old)}, got {sorted(columns)}")
            new = {}
            for name, values in columns.items():
                values = _column(values)
                if isinstance(values, np.ndarray):
                    new[name] = np.concatenate([np.asarray(old[name], np.float64)[:at], values])
                else:
                    new[name] = list(old[name][:at]) + values
            self._values.setdefault(source, {})["data"] = new
            self._splices[source] = min(self._splices.get(source, at), at)
            self._touched.setdefault(source, set()).add("data")
            self._changed_since_settle = True

    def _sync_models(self):
        """Write the current state into the Bokeh models (for a snapshot or the static copy)."""
        for model, values in self._values.items():
            for attr, value in values.items():
                if getattr(model, attr) is not value:
                    setattr(model, attr, value)

    def push(self):
        """Send what changed since the last push (or a keyframe, when one is due). Returns whether it sent."""
        with self._lock:
            now = time.monotonic()
            period = KEYFRAME_EARLY if now - self._published < EARLY_FOR else KEYFRAME_PERIOD
            key = now - self._last_key >= period and bool(self._touched)
            if not (key or self._props or self._splices):
                return False
            if key:
                props = {m: {a: self._values[m][a] for a in attrs if a != "data"} for m, attrs in self._touched.items()}
                splices = {m: 0 for m, attrs in self._touched.items() if "data" in attrs}
                self._last_key = now
            else:
                props, splices = self._props, self._splices
            content, buffers = self._message(props, splices)
            self._props, self._splices = {}, {}
            self._seq += 1
            content.update(seq=self._seq, key=key)
            self.send(content, buffers)
            return True

    def _message(self, props, splices):
        buffers = []

        def column(values):
            if isinstance(values, np.ndarray) and values.dtype.kind in "fiub":
                buffers.append(np.ascontiguousarray(values, np.float64).tobytes())
                return {"buffer": len(buffers) - 1}
            return list(values)

        data = [[s.id, at, {name: column(values[at:]) for name, values in self._values[s]["data"].items()}]
                for s, at in splices.items()]
        return {"props": [[m.id, p] for m, p in props.items() if p], "data": data}, buffers

    def publish(self, rebuild=True):
        """Send the whole document as the new snapshot: after a layout change (``rebuild``: every view builds it
        again), and at the end of a cell (``rebuild=False``: what is pending is pushed first, and the snapshot
        carries that last update's number, so a view that applied it keeps what it draws, and only a view that
        missed an update, or one opened later, builds the document from it; building a panel's document again was a
        ~0.5 s task for the browser at the end of every cell)."""
        with self._lock:
            if not rebuild:
                self.push()
            self._props, self._splices, self._touched = {}, {}, {}
            self._sync_models()
            if rebuild:
                self._seq += 1
            self._snapshot = self._snapshot_json()
            self._last_key = self._published = time.monotonic()

    def _snapshot_json(self):
        return json.dumps({"seq": self._seq, "doc": self._document.to_json(deferred=False)}, allow_nan=False)

    # ------------------------------------------------------------------------------------------------ display

    def static_html(self):
        """The current state as self-contained HTML (no script): what a notebook viewer without a kernel shows."""
        with self._lock:
            self._sync_models()
            try:
                from ..plots.static import to_html
                return to_html(self.root)
            except Exception as e:          # a fallback must never break the live widget
                _log.warning("flowlab: no static rendering of %s: %s", self._name, e)
                return f"<pre>{html.escape(self._name)} (no static rendering: {html.escape(str(e))})</pre>"

    def _bundle(self):
        return {"application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                              "model_id": self.model_id},
                "text/plain": f"{self._name} (live; a static copy of its last state is kept for viewers without "
                              "a kernel)",
                "text/html": self.static_html()}

    def _ipython_display_(self):
        from IPython.display import display
        self._displayed = True
        display(self._bundle(), raw=True, display_id=self._display_id)

    def settle(self):
        """End of a cell: flush the owner, send a fresh snapshot and update every display's static copy."""
        owner_flush = self._before_settle() if self._before_settle is not None else None
        if owner_flush is not None:
            owner_flush()
        with self._lock:
            if not self._changed_since_settle:
                return
            self._changed_since_settle = False
            self.publish(rebuild=False)
            if self._displayed:
                from IPython.display import update_display
                update_display(self._bundle(), raw=True, display_id=self._display_id)


_live = weakref.WeakSet()
_hooked = False


def _after_cells(live):
    """Have ``live.settle()`` run after every cell of this kernel (one IPython hook for all live documents)."""
    global _hooked
    _live.add(live)
    if _hooked:
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    shell.events.register("post_run_cell", _settle_all)
    _hooked = True


def _settle_all(result=None):
    for live in list(_live):
        if live.comm is None:
            continue            # closed
        try:
            live.settle()
        except Exception:       # one broken widget must not keep the others (or the cell) from finishing
            _log.exception("flowlab: updating %s after the cell failed", live._name)
