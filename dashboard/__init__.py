"""flowlab's live dashboard: a Tornado-hosted Bokeh app over one shared store of tailed event files.

    store.Store        tails the logdir once (a background thread) into append-only series with epochs
    views/<kind>.py    one module per tab; each view reads the store and sends sessions only deltas
    app / server       the Bokeh document per browser session, and the Tornado server (``flowlab serve``)

Installed as ``flowlab.dashboard`` (pyproject maps this folder there).
"""

from .notebook import show

__all__ = ["show"]
