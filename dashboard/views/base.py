"""What every dashboard view (tab) is: built once per browser session, refreshed from the shared store.

A view keeps, per store series it shows, the ``(epoch, length)`` it has sent, and asks ``Store.read`` for the rest:
appended items go to its ``ColumnDataSource`` with ``stream``; a reset (purge, thinning) replaces the data.
``update()`` runs on the session's IOLoop thread (Bokeh documents must only change there).
Everything a view shows that came from a log (run names, tags, text, hparams) is text, never HTML: use
``html.escape`` before putting it in a ``Div``.
"""
from __future__ import annotations

from bokeh.layouts import column

from flowlab.plots.figures import card_grid, text_div


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


class CardsView(View):
    """A tab showing one card per ``(run, tag)`` series of one ``kind``; subclasses say how to make and fill a card.

    A card has a ``layout`` and ``add(steps, values, replace)``; ``show`` may be overridden to adapt the call.
    """
    kind = ""
    empty_text = ""

    def __init__(self, store):
        super().__init__(store)
        self.empty = text_div(self.empty_text)
        self.grid = card_grid()
        self._cards: dict[tuple, object] = {}
        self._root = column(*self.controls(), self.empty, self.grid)

    def controls(self):
        """Widgets above the cards."""
        return ()

    def new_card(self, series):
        raise TypeError(f"{type(self).__name__} must define new_card()")

    def show(self, card, delta):
        card.add(delta.steps, delta.values, delta.reset)

    def layout(self):
        return self._root

    def update(self):
        for series in self.store.series(self.kind):
            card = self._cards.get(series.key)
            if card is None:
                card = self._cards[series.key] = self.new_card(series)
                self.grid.children.append(card.layout)
            d = self.delta(series)
            if d.reset or d.steps:
                self.show(card, d)
        self.empty.visible = not self._cards
