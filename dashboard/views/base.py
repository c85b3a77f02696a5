"""What every dashboard view (tab) is: built once per browser session, refreshed from the shared store.

A view keeps, per store series it shows, the ``(epoch, length)`` it has sent, and asks ``Store.read`` for the rest:
appended items go to its ``ColumnDataSource`` with ``stream``; a reset (purge, thinning) replaces the data.
``update()`` runs on the session's IOLoop thread (Bokeh documents must only change there).
Everything a view shows that came from a log (run names, tags, text, hparams) is text, never HTML: use
``html.escape`` before putting it in a ``Div``.
"""
from __future__ import annotations

import html

from bokeh.layouts import column
from bokeh.models import Div

from flowlab.plots.figures import CardParts, card_grid, nudge_next_turn, served, text_div

from ..run_groups import NoGroups
from .paging import PAGE_SIZE, Pager

# Cards built per IOLoop turn in a server session: a default page in one turn (each turn makes the browser lay out
# and draw the whole page again: two turns of four filled a page later than one of eight), bigger pages in several.
BUILD_BATCH = 8
# How often a server session's card builder looks again for a page to send its cards to (``no_page_yet``).
PAGE_POLL_MS = 50


def no_page_yet(doc):
    """True for a server session's document that no browser page has connected to yet. Cards built then would join
    the document before the page pulls it, and the pull serialises the whole document in one IOLoop turn (Bokeh
    computes every property of every model there: ~0.4 ms a model, ~130 ms for a page of Scalars cards on a 2-core
    machine). Built after the page connects, each card is its own turn's small patch instead."""
    context = doc.session_context if doc is not None else None
    session = getattr(context, "session", None)
    return session is not None and session.connection_count == 0



class EveryRun:
    """The run selection of a view used on its own (tests, benchmarks): every run is shown, none grouped."""
    grouping = NoGroups()

    @staticmethod
    def shown():
        return None

    @staticmethod
    def shows(run):
        return True


class View:
    title = "View"
    # True: the first update() runs before the view's layout joins the page, so the page gets the tab whole in one
    # message and lays it out once (a view that makes many models at once); False for views that spread their
    # building over IOLoop turns or compute in threads, which need the document
    fill_before_shown = False
    # The session's ``dashboard.runs.RunSelection``, set by the app after the view is made: a view shows only the
    # runs it ``shows()``, and is updated again when the selection changes.
    runs = EveryRun()

    def __init__(self, store):
        self.store = store
        self._seen: dict[tuple, tuple[int, int]] = {}     # series key -> (epoch, length) sent to this session

    def layout(self):
        """The Bokeh layout of this tab."""
        raise TypeError(f"{type(self).__name__} must define layout()")

    def update(self):
        """Bring the tab up to date with the store (called periodically on the session's IOLoop)."""
        raise TypeError(f"{type(self).__name__} must define update()")

    def unchanged(self, series):
        """True when this session has seen all of ``series``: nothing to read (its epoch and length, read without the
        store's lock: a poll under way bumps the store's ``version`` when it is done, and the view looks again)."""
        return self._seen.get(series.key) == (series.epoch, len(series))

    def delta(self, series):
        """What this session has not yet seen of ``series`` (``Delta.reset`` means: replace what you have)."""
        epoch, length = self._seen.get(series.key, (None, 0))
        d = self.store.read(series, epoch, length)
        self._seen[series.key] = (d.epoch, (0 if d.reset else length) + len(d.steps))
        return d


class CardsView(View):
    """A tab showing one card per ``(run, tag)`` series of one ``kind``, a page of cards at a time (``Pager``).

    Only the cards of the current page exist: a card is built when its series comes on the page (its first delta is then
    everything the store holds, flagged ``reset``) and dropped when it leaves, with what was sent of it, so a session
    costs the same for 40 series as for 4,000. In a server session a page's cards are built a few per IOLoop turn
    (``BUILD_BATCH``), so the first ones show at once and other sessions are served in between. Subclasses say how to
    make and fill a card: a card has a ``layout`` and ``add(steps, values, replace)``, and may list in
    ``expanded_sources`` the sources the page expands (``flowlab.plots.figures.expand_in_page``); ``show`` may be
    overridden to adapt the call. ``refresh()`` brings the page up to date (``update`` is the periodic entry point; a
    page change calls ``refresh`` at once).
    """
    kind = ""
    empty_text = ""
    page_size = PAGE_SIZE

    def __init__(self, store):
        super().__init__(store)
        self.empty = text_div(self.empty_text, visible=False)     # shown by the first update that finds nothing
        self.grid = card_grid()
        self.grid.name = f"cards:{self.kind_name}"
        self.pager = Pager(self.kind_name, self.page_size, on_change=self.refresh)
        self.parts = CardParts()                # models every card of this view shares
        self._cards: dict[tuple, object] = {}
        self._series: dict[tuple, object] = {}
        self._order: list = []                  # the page's keys in display order
        self._pending: list = []                # keys of the page whose cards are still to build
        self._waiting_for_page = False          # a look for a connected page is on its way (``no_page_yet``)
        self._root = column(*self.controls(), self.pager.layout, self.empty, self.grid)

    @property
    def kind_name(self):
        """The tab's name in model names (``pager:<name>``, ``cards:<name>``, ``cards-source:<name>``)."""
        return type(self).__name__.removesuffix("View").lower()

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
        self._series = {s.key: s for s in self.store.series(self.kind) if self.runs.shows(s.run)}
        self.refresh(keys_changed=self.pager.set_keys(self._series))

    def refresh(self, keys_changed=True):
        """Build the cards that came on the page, drop those that left, and send the page's cards what is new."""
        if keys_changed:
            visible = [key for key in self.pager.visible if key in self._series]
            for key in set(self._cards) - set(visible):
                del self._cards[key]
                self._seen.pop(key, None)                    # back on the page later: it starts afresh
            self._pending = [key for key in visible if key not in self._cards]
            self._order = visible
            self._build_some()
        for key, card in self._cards.items():
            self._send(key, card)
        self.empty.visible = not self._series
        if self._series or not self.store.series(self.kind):
            self.empty.text = html.escape(self.empty_text)
        else:
            self.empty.text = "None of the checked runs has any: check more runs in the run list."

    def _build_some(self):
        """Build the next ``BUILD_BATCH`` cards of the page (all of them outside a server). In a server session the
        rest follow on the next IOLoop turns: a card costs the server ~15-30 ms (building and serialising its Bokeh
        models), and other sessions must not wait for a page of 48, nor this one for its first cards."""
        doc = self._root.document
        if no_page_yet(doc):
            if not self._waiting_for_page:      # (one look at a time, however often the store refreshes meanwhile)
                self._waiting_for_page = True
                doc.add_timeout_callback(self._look_for_page, PAGE_POLL_MS)
            return
        spread = served(doc)
        batch, self._pending = ((self._pending[:BUILD_BATCH], self._pending[BUILD_BATCH:]) if spread
                                else (self._pending, []))
        built = []
        for key in batch:
            if key in self._series:
                card = self._cards[key] = self.new_card(self._series[key])
                self._send(key, card)
                built.append(card)
        nudge_next_turn(doc, *[s for card in built for s in getattr(card, "expanded_sources", ())])
        shown = [self._cards[key].layout for key in self._order if key in self._cards]
        if shown != list(self.grid.children):
            self.grid.children = shown or [Div(text="", width=0, height=0, visible=False)]   # Bokeh warns about empty layouts
        # Which page the grid shows, set after its children: the page receives each change as its own message, so
        # the pager's new page index can arrive while the grid still holds the previous page's cards.
        self.grid.tags = [self.pager.page, len(shown)]
        if self._pending:
            doc.add_next_tick_callback(self._build_some)

    def _look_for_page(self):
        self._waiting_for_page = False
        self._build_some()

    def _send(self, key, card):
        d = self.delta(self._series[key])
        if d.reset or d.steps:
            self.show(card, d)
