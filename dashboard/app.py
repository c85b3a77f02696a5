"""One browser session's Bokeh document: the status line on top, then a tab per registered view.

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

from bokeh.layouts import column
from bokeh.models import Div, TabPanel, Tabs

from .views import VIEWS
from .views.status import StatusLine

log = logging.getLogger(__name__)
PERIOD_MS = 250


def _broken(name, error):
    """A tab in place of a view that could not be built, so one bad view does not take the dashboard down."""
    detail = "".join(traceback.format_exception(error))
    return Div(text=f"<b>The {html.escape(name)} view failed to build.</b><pre>{html.escape(detail)}</pre>")


def build_document(doc, store, views=None, period_ms=PERIOD_MS):
    """Fill ``doc`` for one session over the shared ``store``; returns the built view instances by name."""
    status = StatusLine(store)
    built, panels = {}, []
    for name, cls in VIEWS if views is None else views:
        try:
            view = cls(store)
            child = view.layout()
            built[name] = view
        except Exception as e:
            log.exception("dashboard view %s failed to build", name)
            child = _broken(name, e)
        panels.append(TabPanel(title=getattr(cls, "title", name), child=child, name=name))
    tabs = Tabs(tabs=panels, name="tabs", sizing_mode="stretch_width")
    root = column(status.layout(), tabs, sizing_mode="stretch_width", name="dashboard")
    names = [panel.name for panel in panels]
    # A tab's view starts updating when it is first shown: building every card of every tab for each new page
    # (Bokeh figures cost ~30 ms each) is what made first pages slow; from then on it stays current.
    opened, stale, seen = set(), set(built), [None]

    def refresh():
        status.update()
        if store.version != seen[0]:
            seen[0] = store.version
            stale.update(built)
        opened.add(names[tabs.active])
        for name in sorted(opened):
            view = built.get(name)
            if view is None or not (name in stale or view.reads_files):
                continue
            stale.discard(name)
            try:
                view.update()
            except Exception:
                log.exception("dashboard view %s failed to update", name)

    tabs.on_change("active", lambda attr, old, new: refresh())
    refresh()                 # the first page already shows what the store holds (filled before it joins the doc)
    doc.title = "flowlab dashboard"
    doc.add_root(root)
    doc.add_periodic_callback(refresh, period_ms)
    return built
