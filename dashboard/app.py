"""One browser session's Bokeh document: the status line on top, the run list (``runs``) on the left, then a tab per
registered view. Every view shows only the runs the list shows, and is updated again when that choice changes. The
open tab, the run search and the views' settings live in the page's URL (``url_state``).

``build_document(doc, store)`` is what the server's ``FunctionHandler`` calls for each new session (tests call it on
a bare ``Document``). A periodic callback on the session's IOLoop refreshes the status line and, when the store's
``version`` has moved, the view of the tab shown (a tab's view is made when the tab is first shown): views read only
through the store (which also holds the run assets: projectors, structure graphs), so nothing else can change what
they show. A view that raises is logged and the others keep updating.

Only the shown tab's models are in the document. A tab that is left keeps its view (its settings, what it was sent,
its caches) on the server, but its layout leaves the document, so the page releases its models; shown again, it is
brought up to date and its layout comes back. Every model a page holds is walked when it lays out and redraws, and
kept, every tab visited made each later one slower (~600 models fresh, ~2,200 after ten tabs: the Graph tab drew in
1.9 s fresh, 15–30 s as the ninth tab).

Colour scheme: the page follows the browser's ``prefers-color-scheme`` (``?theme=dark`` or ``?theme=light`` in the
URL overrides it), in CSS alone, so it is right from the first paint and follows a change of the system's setting
at once. The page's stylesheet (``page_css``, in the page template) sets custom properties that reach every shadow
root: ``--flowlab-*`` ones for the dashboard's own HTML and ``--bk-*`` ones that BokehJS reads when it paints a
canvas (plot, border and axis backgrounds, outlines, grid lines, axis, title and legend text), overriding the
models' colours, explicit ones included. Bokeh's widgets and legends keep their colours in their own shadow roots: the
document's ``Theme`` (``scheme_theme``) gives each a stylesheet that sets them, and makes a Div's own text colour
(a grey meant for a white page) light.
"""
from __future__ import annotations

import html
import logging
import traceback

from bokeh.core.templates import get_env
from bokeh.layouts import column, row
from bokeh.models import CustomJS, Div, TabPanel, Tabs
from bokeh.themes import Theme

from flowlab.plots.figures import EXPAND_TAG, served
from flowlab.summary.redact import redact

from . import url_state
from .runs import RunSelection
from .views import VIEWS
from .views.status import StatusLine

log = logging.getLogger(__name__)
PERIOD_MS = 100          # a session's tick: cheap when nothing moved (one integer compared)
# A server session's refresh that lists this many new runs leaves the tabs to the next IOLoop turn: ten thousand runs
# listed and the Scalars tab opened were one turn of ~100 ms (the loop's budget per turn; see views/scalars.py). The
# run list lists at most ``runs.LIST_SLICE`` runs a call: the next turn's refresh lists more, the tabs wait for all.
LIST_ALONE = 1000
# Sources a view fills in a compact form that the page expands on change (the scalars' flat columns) also need that
# expansion when they arrive with the document itself: re-emit them once it is ready.
READY_JS = f"""
for (const doc of Bokeh.documents)         // (a document-level callback is not itself in the document)
  for (const m of doc.all_models)
    if (m.tags.includes("{EXPAND_TAG}")) m.properties.data.change.emit();   // (re-setting equal data emits nothing)
// Canvases read their colours from CSS when they paint: paint again when the system's colour scheme changes
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {{
  for (const view of Bokeh.index.all_views()) if (view.request_paint != null) view.request_paint();
}});
"""

# ------------------------------------------------------------------------------------------------- colour scheme
SCHEMES = ("light", "dark")
# The dark scheme's colours: the page, the dashboard's own HTML (``--flowlab-*``, which ``flowlab.plots.figures``'
# cards use with their light colours as fallbacks), and what BokehJS reads from CSS when it paints a canvas
# (``--bk-<prefix>-<visual>``). Only prefixes that glyphs never use: a glyph's data colours stay as they are.
DARK = {
    "--flowlab-paper": "#121417", "--flowlab-ink": "#e4e7ea", "--flowlab-muted": "#9aa3ac",
    "--flowlab-frame": "#3b424a",
    "--bk-background-fill-color": "#1b1f24", "--bk-border-fill-color": "#1b1f24",
    "--bk-outline-line-color": "#3b424a", "--bk-grid-line-color": "#2e343b",
    "--bk-axis-line-color": "#8a939c", "--bk-major-tick-line-color": "#8a939c",
    "--bk-minor-tick-line-color": "#8a939c", "--bk-major-label-text-color": "#c3c9cf",
    "--bk-axis-label-text-color": "#c3c9cf", "--bk-text-color": "#e4e7ea", "--bk-label-text-color": "#e4e7ea",
    "--bokeh-icon-color": "#aab3bb",
}
LIGHT = {"--flowlab-muted": "#777777", "--flowlab-frame": "#dddddd"}
# Bokeh's widget colours in the dark scheme: the custom properties its stylesheets set on each widget's shadow root
# (base, buttons, tables), and the few colours its tables and selects hard-code.
DARK_WIDGETS = {
    "--color": "#e4e7ea", "--background-color": "#1f2429", "--hover-color": "#2a3036", "--border-color": "#4a525b",
    "--divider-color": "#353b42", "--surface-background-color": "#2a3036", "--inactive-bg": "#2a3036",
    "--inactive-fg": "#9aa3ac", "--active-bg": "#24435a", "--active-fg": "#8cc4ee", "--active-border": "#4f8fbf",
    "--highlight-color": "#6aa8d8", "--input-focus-border-color": "#6aa8d8", "--placeholder-color": "#7f8890",
    "--disabled-color": "#7f8890", "--disabled-background-color": "#2a3036", "--shortcut-color": "#9aa3ac",
    "--outline-color": "#4a525b", "--box-shadow-color": "rgba(0, 0, 0, 0.5)",
    "--default": "#262c32", "--default-border": "#4a525b", "--default-hover": "#2f363d",
    "--default-hover-border": "#5a636d", "--default-active": "#24435a", "--default-active-border": "#4f8fbf",
    "--default-disabled": "#22272c", "--default-disabled-border": "#353b42",
    "--light": "transparent", "--light-border": "transparent", "--light-hover": "#2a3036",
    "--light-hover-border": "#4a525b", "--light-active": "#24435a", "--light-active-border": "#4f8fbf",
    "--light-disabled": "transparent", "--light-disabled-border": "transparent",
    "--special": "#22272c", "--odd": "#1c2126", "--muted-text": "#8a939c", "--selected": "#1f3a4f",
    "color": "var(--color)",
}
_DARK_WIDGET_RULES = (
    ".slick-row{background:var(--background-color)}.slick-row.odd{background:var(--odd)}"
    ".slick-row.selected,.slick-cell.selected{background:var(--selected)}"
    ".slick-cell,.slick-header-column"
    "{border-right-color:var(--divider-color);border-bottom-color:var(--divider-color)}"
    ".slick-header-columns,.slick-header-column,.slick-headerrow,.slick-headerrow-column"
    "{background:var(--surface-background-color);border-color:var(--divider-color)}"
    ".slick-header-column:hover,.slick-header-column-active{background:var(--hover-color)}"
    "select.bk-input{background-image:url('data:image/svg+xml;utf8,<svg version=\"1.1\" viewBox=\"0 0 25 20\" "
    "xmlns=\"http://www.w3.org/2000/svg\"><path d=\"M 0,0 25,0 12.5,20 Z\" fill=\"%23c3c9cf\" /></svg>')}"
)
# Text that views colour on a Div itself (a dark grey meant for a white page) turns light in the dark scheme.
_DARK_TEXT = {"color": "var(--flowlab-ink) !important"}
# Legends are HTML whose colours BokehJS fixes when it first builds them (before they are in the page, where CSS
# could reach them): set them again.
_DARK_LEGEND = (":host{background-color:var(--bk-background-fill-color) !important;"
                "border-color:var(--flowlab-frame) !important}"
                ".bk-label,.bk-title{color:var(--bk-label-text-color) !important}")


def _rule(selector, properties):
    return selector + "{" + ";".join(f"{k}:{v}" for k, v in properties.items()) + "}"


def _in_scheme(scheme, css):
    """``css`` where the dark scheme applies: always (``scheme="dark"``), never ("light"), or when the browser
    prefers it (None)."""
    return {"dark": css, "light": ""}.get(scheme, f"@media (prefers-color-scheme: dark){{{css}}}")


def page_css(scheme=None):
    """The page's stylesheet for ``scheme`` ("light", "dark", or None: the browser's preference)."""
    return (_rule(":root", {"color-scheme": scheme or "light dark", **LIGHT})
            + _in_scheme(scheme, _rule(":root", DARK))
            + "html,body{background-color:var(--flowlab-paper,#ffffff);color:var(--flowlab-ink,#000000)}")


# BokehJS paints a colour bar's labels and title through an axis of its own that is not in the page, so no CSS
# variable reaches them: the theme colours them, light in the dark scheme and, where the browser decides, a grey
# that reads on both backgrounds (~4:1 against white and against the dark plot).
COLOR_BAR_INK = {"dark": DARK["--bk-major-label-text-color"], None: "#808080"}


def scheme_theme(scheme=None):
    """The document ``Theme`` for ``scheme``: stylesheets that set the colours of each Bokeh widget (and tab bar)
    and legend, make a ``Div``'s own text colour readable, and colour bars' ink (``COLOR_BAR_INK``); nothing for
    "light"."""
    if scheme == "light":
        return Theme(json={})
    widgets = _in_scheme(scheme, _rule(":host", DARK_WIDGETS) + _DARK_WIDGET_RULES)
    text = _in_scheme(scheme, _rule(":host", _DARK_TEXT))
    legend = _in_scheme(scheme, _DARK_LEGEND)
    ink = COLOR_BAR_INK[scheme]
    return Theme(json={"attrs": {"Widget": {"stylesheets": [widgets]}, "Tabs": {"stylesheets": [widgets]},
                                 "Markup": {"stylesheets": [text]}, "Legend": {"stylesheets": [legend]},
                                 "ColorBar": {"major_label_text_color": ink, "title_text_color": ink}}})


_THEMES = {scheme: scheme_theme(scheme) for scheme in (None, *SCHEMES)}
_PAGE = get_env().from_string(
    '{% extends "file.html.jinja" %}{% block preamble %}<style>{{ flowlab_css }}</style>{% endblock %}')


# When a tab's layout is swapped in the page. The layout that came in (a tab shown again) brought its compact sources
# (EXPAND_TAG) with their data, which fires nothing: expand them now, while the patch is applied and before any of
# its views is built (drawn over unexpanded rows, a card's run filter points past them: BokehJS errors). And the
# models of the layout that left stay in the page's model table until BokehJS recomputes it, 30 s after the last
# change that brought models (its ``recompute_timeout``): recompute it once the patch is applied, so the page holds
# the shown tab's models alone. (``_recompute_all_models`` is BokehJS 3's own step; where a later BokehJS lacks it,
# the page keeps its 30 s delay.)
SWAP_JS = f"""
for (const child of cb_obj.children)
  for (const m of child.references())
    if (Array.isArray(m.tags) && m.tags.includes("{EXPAND_TAG}")) m.properties.data.change.emit();
setTimeout(() => {{
  const doc = cb_obj.document;
  if (doc != null && typeof doc._recompute_all_models === "function") doc._recompute_all_models();
}}, 0);
"""


def apply_scheme(doc, scheme=None):
    """Make ``doc``'s page follow ``scheme``: "light", "dark", or None for the browser's preference."""
    doc.template = _PAGE
    doc.template_variables["flowlab_css"] = page_css(scheme)
    doc.theme = _THEMES[scheme]


def _broken(name, error):
    """A tab in place of a view that could not be built, so one bad view does not take the dashboard down."""
    detail = redact("".join(traceback.format_exception(error)))          # it may quote the logdir's URL
    return Div(text=f"<b>The {html.escape(name)} view failed to build.</b><pre>{html.escape(detail)}</pre>")


def build_document(doc, store, views=None, period_ms=PERIOD_MS):
    """Fill ``doc`` for one session over the shared ``store``; returns the view instances by name, a dict that
    fills in as tabs are first shown."""
    status = StatusLine(store)
    runs = RunSelection(store)
    entries = list(VIEWS if views is None else views)
    built, failed = {}, set()
    layouts, attached = {}, set()      # each built view's layout; the views whose layout is in the document
    # A tab's view is made when the tab is first shown (a placeholder until then): building every tab's models for
    # each new page was most of a first page's cost, whatever the logdir held. It stays on the server from then on,
    # its layout in the document only while its tab is shown (see the module doc).
    # (BokehJS 3.9 never draws a TabPanel child replaced in a live page: each tab holds a column whose children change)
    holders = [column(Div(text=""), sizing_mode="stretch_width") for _ in entries]
    swapped = CustomJS(code=SWAP_JS)
    for holder in holders:
        holder.js_on_change("children", swapped)
    panels = [TabPanel(title=getattr(cls, "title", name), child=holder, name=name)
              for (name, cls), holder in zip(entries, holders)]
    tabs = Tabs(tabs=panels, name="tabs", sizing_mode="stretch_width")
    root = column(status.layout(), row(runs.layout(), tabs, sizing_mode="stretch_width"),
                  sizing_mode="stretch_width", name="dashboard")
    stale, seen = set(), [None]
    arguments = url_state.query_arguments(doc)
    apply_scheme(doc, arguments.get("theme") if arguments.get("theme") in SCHEMES else None)
    url_state.bind(arguments, runs.url_state())
    url_state.bind_tabs(arguments, tabs)

    def open_tab(index):
        name, cls = entries[index]
        for other in sorted(attached - {name}):        # release the tabs no longer shown
            holders[[n for n, _ in entries].index(other)].children = [Div(text="")]
            attached.discard(other)
        if name in attached or name in failed:
            return
        if name in built:
            reattach(index, name)
            return
        try:
            view = cls(store)
            view.runs = runs
            child = view.layout()
            url_state.bind(arguments, getattr(view, "url_state", list)())
            built[name], layouts[name] = view, child
            attached.add(name)
            stale.add(name)
            if view.fill_before_shown:
                fill(name, view)
        except Exception as e:
            log.exception("dashboard view %s failed to build", name)
            child = _broken(name, e)
            failed.add(name)
        holders[index].children = [child]

    def reattach(index, name):
        """Bring a tab's view back into the document, up to date (in one message for a view filled before shown)."""
        view, child = built[name], layouts[name]
        if view.fill_before_shown and name in stale:
            fill(name, view)
        holders[index].children = [child]          # (its compact sources are expanded in the page: SWAP_JS)
        attached.add(name)

    def refresh():
        status.update()
        if runs.update() >= LIST_ALONE and served(doc):
            doc.add_next_tick_callback(refresh)         # the tabs in a turn of their own
            return
        if store.version != seen[0]:
            seen[0] = store.version
            stale.update(built)
        open_tab(tabs.active)
        for name in sorted(attached):
            if name in stale:
                fill(name, built[name])

    def fill(name, view):
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
