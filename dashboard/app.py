"""One browser session's Bokeh document: the status line on top, the run list (``runs``) on the left, then a tab per
registered view. Every view shows only the runs the list shows, and is updated again when that choice changes. The
open tab, the run search and the views' settings live in the page's URL (``url_state``).

``build_document(doc, store)`` is what the server's ``FunctionHandler`` calls for each new session (tests call it on
a bare ``Document``). A periodic callback on the session's IOLoop refreshes the status line and, when the store's
``version`` has moved, every view opened so far (a tab's view first updates when the tab is shown) — and always the
views that read files the store does not tail (``reads_files``: the projector's), which pace themselves; a view that
raises is logged and the others keep updating.
"""
from __future__ import annotations

import html
import logging
import traceback

from bokeh.layouts import column, row
from bokeh.models import CustomJS, Div, TabPanel, Tabs

from flowlab.plots.figures import EXPAND_TAG

from . import url_state
from .runs import RunSelection
from .views import VIEWS
from .views.status import StatusLine

log = logging.getLogger(__name__)
PERIOD_MS = 100          # a session's tick: cheap when nothing moved (one integer compared)
# Sources a view fills in a compact form that the page expands on change (the scalars' flat columns) also need that
# expansion when they arrive with the document itself: re-emit them once it is ready.
READY_JS = f"""
for (const doc of Bokeh.documents)         // (a document-level callback is not itself in the document)
  for (const m of doc.all_models)
    if (m.tags.includes("{EXPAND_TAG}")) m.properties.data.change.emit();   // (re-setting equal data emits nothing)
"""


def _broken(name, error):
    """A tab in place of a view that could not be built, so one bad view does not take the dashboard down."""
    detail = "".join(traceback.format_exception(error))
    return Div(text=f"<b>The {html.escape(name)} view failed to build.</b><pre>{html.escape(detail)}</pre>")


def build_document(doc, store, views=None, period_ms=PERIOD_MS):
    """Fill ``doc`` for one session over the shared ``store``; returns the view instances by name, a dict that
    fills in as tabs are first shown."""
    status = StatusLine(store)
    runs = RunSelection(store)
    entries = list(VIEWS if views is None else views)
    built, failed = {}, set()
    # A tab's view is made when the tab is first shown (a placeholder until then) and from then on stays current:
    # building every tab's models for each new page was most of a first page's cost, whatever the logdir held.
    # (BokehJS 3.9 never draws a TabPanel child replaced in a live page: each tab holds a column whose children change)
    holders = [column(Div(text=""), sizing_mode="stretch_width") for _ in entries]
    panels = [TabPanel(title=getattr(cls, "title", name), child=holder, name=name)
              for (name, cls), holder in zip(entries, holders)]
    tabs = Tabs(tabs=panels, name="tabs", sizing_mode="stretch_width")
    root = column(status.layout(), row(runs.layout(), tabs, sizing_mode="stretch_width"),
                  sizing_mode="stretch_width", name="dashboard")
    stale, seen = set(), [None]
    arguments = url_state.query_arguments(doc)
    url_state.bind(arguments, runs.url_state())
    url_state.bind_tabs(arguments, tabs)

    def open_tab(index):
        name, cls = entries[index]
        if name in built or name in failed:
            return
        try:
            view = cls(store)
            view.runs = runs
            child = view.layout()
            url_state.bind(arguments, getattr(view, "url_state", list)())
            built[name] = view
            stale.add(name)
        except Exception as e:
            log.exception("dashboard view %s failed to build", name)
            child = _broken(name, e)
            failed.add(name)
        holders[index].children = [child]

    def refresh():
        status.update()
        runs.update()
        if store.version != seen[0]:
            seen[0] = store.version
            stale.update(built)
        open_tab(tabs.active)
        for name in sorted(built):
            view = built[name]
            if not (name in stale or view.reads_files):
                continue
            stale.discard(name)
            try:
                view.update()
            except Exception:
                log.exception("dashboard view %s failed to update", name)

    def runs_changed():
        stale.update(built)
        refresh()

    runs.on_change(runs_changed)
    tabs.on_change("active", lambda attr, old, new: refresh())
    doc.title = "flowlab dashboard"
    if doc.session_context is None:
        refresh()                # outside a server: filled before it joins the document
        doc.add_root(root)
    else:
        # A server builds the document while it answers the page's HTTP request: fill the first tab on the next turn
        # of the IOLoop instead, so the browser loads BokehJS while the server fills the tab (for a thousand runs,
        # a few tenths of a second each). Whatever is done before the page connects arrives with the document.
        doc.add_root(root)
        doc.add_next_tick_callback(refresh)
    doc.js_on_event("document_ready", CustomJS(code=READY_JS))
    doc.add_periodic_callback(refresh, period_ms)
    return built
