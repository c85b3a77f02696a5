"""The page's state in its URL: the open tab, the run search and each view's settings survive a reload, and a link
opens the dashboard as it was shown (``/?tab=histograms&runs=lr%3D0.1``).

Each piece of state is a ``(key, model, property)``: the run list and the views list theirs in ``url_state()``.
``bind`` sets them from the page's query arguments when the session is made (a value that does not fit, an
unknown tab or a non-number, is ignored: the URL is typed by people) and makes the page write each one into the URL
whenever it changes (``history.replaceState``: no reload, no new history entry), leaving out values
equal to their defaults so that links stay short. Values travel as text and go through the same checks as typed
ones (the run search through RE2).
"""
from __future__ import annotations

from bokeh.models import CustomJS

_WRITE_JS = """
const url = new URL(window.location.href);
const value = model[prop];
if (value === initial) url.searchParams.delete(key);
else url.searchParams.set(key, typeof value === "boolean" ? (value ? "1" : "0") : String(value));
window.history.replaceState(window.history.state, "", url);
"""
_WRITE_TAB_JS = """
const url = new URL(window.location.href);
if (tabs.active === 0) url.searchParams.delete("tab");
else url.searchParams.set("tab", names[tabs.active]);
window.history.replaceState(window.history.state, "", url);
"""


def query_arguments(doc):
    """The page's query arguments as ``{key: text}`` (the last value of a repeated key); empty outside a server."""
    context = doc.session_context
    request = getattr(context, "request", None) if context is not None else None
    arguments = getattr(request, "arguments", None) or {}
    return {key: values[-1].decode("utf-8", "replace") for key, values in arguments.items() if values}


def _parse(text, current, model):
    """``text`` as a value of the type ``current`` has, or None when it does not fit."""
    try:
        if isinstance(current, bool):
            return {"1": True, "true": True, "0": False, "false": False}.get(text.lower())
        if isinstance(current, int):
            value = int(text)
            labels = getattr(model, "labels", None)
            return value if labels is None or 0 <= value < len(labels) else None
        if isinstance(current, float):
            value = float(text)
            start, end = getattr(model, "start", None), getattr(model, "end", None)
            if value != value or (start is not None and value < start) or (end is not None and value > end):
                return None
            return value
        if isinstance(current, str):
            return text[:1000]
    except ValueError:
        return None
    return None


def bind(arguments, state):
    """For each ``(key, model, property)`` of ``state``: write it into the page's URL when it changes (leaving out its
    present value, the default), then set it from ``arguments`` where the value there fits."""
    for key, model, prop in state:
        model.js_on_change(prop, CustomJS(args=dict(model=model, prop=prop, key=key, initial=getattr(model, prop)),
                                          code=_WRITE_JS))
    for key, model, prop in state:
        if key in arguments:
            value = _parse(arguments[key], getattr(model, prop), model)
            if value is not None:
                setattr(model, prop, value)


def bind_tabs(arguments, tabs):
    """The open tab's name in the URL (``tab``; the first tab is the default), and the tab ``arguments`` name opened."""
    names = [panel.name for panel in tabs.tabs]
    tabs.js_on_change("active", CustomJS(args=dict(tabs=tabs, names=names), code=_WRITE_TAB_JS))
    if arguments.get("tab") in names:
        tabs.active = names.index(arguments["tab"])
