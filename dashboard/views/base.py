"""What every dashboard view (tab) is: built once per browser session, refreshed from the shared store.

A view keeps, per store series it shows, the ``(epoch, length)`` it has sent, and asks ``Store.read`` for the rest:
appended items go to its ``ColumnDataSource`` with ``stream``; a reset (purge, thinning) replaces the data.
``update()`` runs on the session's IOLoop thread (Bokeh documents must only change there).
Everything a view shows that came from a log (run names, tags, text, hparams) is text, never HTML: use
``html.escape`` before putting it in a ``Div``.
"""
from __future__ import annotations


class View:
    title = "View"
    reads_files = False     # True: also reads files the store does not tail, so update() runs on every tick

    def __init__(self, store):
        self.store = store
        self._seen: dict[tuple, tuple[int, int]] = {}     # series key -> (epoch, length) sent to this session

    def layout(self):
        """The Bokeh layout of this tab."""
        raise TypeError(f"{type(self).__name__} must define layout()")

    def update(self):
        """Bring the tab up to date with the store (called periodically on the session's IOLoop)."""
        raise TypeError(f"{type(self).__name__} must define update()")

    def delta(self, series):
        """What this session has not yet seen of ``series`` (``Delta.reset`` means: replace what you have)."""
        epoch, length = self._seen.get(series.key, (None, 0))
        d = self.store.read(series, epoch, length)
        self._seen[series.key] = (d.epoch, (0 if d.reset else length) + len(d.steps))
        return d
