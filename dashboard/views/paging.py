"""Which cards of a tab are on screen: a pager shared by every card view.

A tab with 40 or 400 series must not build 40 or 400 figures (each costs the server milliseconds to build and
serialise, and BokehJS far more to lay out and draw), so a card view shows one page of cards at a time and builds
only those; cards that leave the page are dropped (with what the session had sent of them), which keeps a session's
memory bounded by the page size whatever the logdir holds.

Usage (``CardsView`` in ``base.py`` is the worked example)::

    pager = Pager("histograms", on_change=view.refresh)   # name: the layout is "pager:histograms"
    pager.layout                                           # the controls, to put above the cards
    if pager.set_keys(keys):                               # every key, in display order; True: the page changed
        ...rebuild the cards of pager.visible...

``on_change`` runs (on the session's IOLoop, as Bokeh calls widget callbacks) when the viewer moves to another page or
changes the page size, so the view can rebuild at once instead of waiting for the store to change. The controls hide
while there are no more cards than the smallest page holds. For tests and benchmarks the layout's ``tags`` are
``[cards on this page, page index, page count]``, so a browser can tell when a page is complete
(``Bokeh.documents[0].get_model_by_name("pager:<name>").tags[0]``); a card view's grid (``cards:<name>``) carries
``[page index, cards built]`` once its children are that page's. ``FILLED_JS`` is the whole check, for the browser
tests and the benchmarks.
"""
from __future__ import annotations

from bokeh.layouts import row
from bokeh.models import Button, Div, Select

# ``(name) => bool`` in the page: the card view ``name``'s current page is filled: the grid holds that page's cards
# (not the previous page's, whose removal can arrive after the pager's new index), each card's data sources named
# ``cards-source:<name>`` hold rows, each card has a view (it is drawn, not only in the model) and BokehJS is idle.
FILLED_JS = """(name) => {
    if (!window.Bokeh || !Bokeh.documents.length) return false;
    const doc = Bokeh.documents[0];
    const pager = doc.get_model_by_name("pager:" + name), grid = doc.get_model_by_name("cards:" + name);
    if (!pager || !grid) return false;
    const sources = (m) => m.renderers ? m.renderers.map((r) => r.data_source) : (m.children || []).flatMap(sources);
    return pager.tags[0] > 0 && grid.children.length === pager.tags[0]
        && grid.tags[0] === pager.tags[1] && grid.tags[1] === pager.tags[0]
        && grid.children.every((card) => sources(card).filter((s) => s.name === "cards-source:" + name)
                                                     .every((s) => s.get_length() > 0))
        && grid.children.every((card) => Bokeh.index.find_one(card) != null)
        && Bokeh.index.roots.every((v) => v.is_idle);
}"""
PAGE_SIZE = 8               # the cards in view at 1400 × 900: two rows of four 320-px cards
PAGE_SIZES = (4, 8, 12, 24, 48)


class Pager:
    def __init__(self, name, page_size=PAGE_SIZE, on_change=None):
        if int(page_size) < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size!r}")
        self.page_size = int(page_size)
        self.page = 0
        self.on_change = on_change
        self._keys: list = []
        self._visible: list = []
        self.previous = Button(label="‹ previous", width=90, disabled=True)
        self.next = Button(label="next ›", width=90, disabled=True)
        self.label = Div(text="", disable_math=True, styles={"padding": "6px 8px", "color": "#555"})
        sizes = sorted(set(PAGE_SIZES) | {self.page_size})
        self.size = Select(options=[str(n) for n in sizes], value=str(self.page_size), width=70)
        self.previous.on_click(lambda: self.go(self.page - 1))
        self.next.on_click(lambda: self.go(self.page + 1))
        self.size.on_change("value", lambda attr, old, new: self._resize(int(new)))
        self.layout = row(self.previous, self.label, self.next, Div(text="per page", disable_math=True,
                                                                    styles={"padding": "6px 4px 6px 16px"}),
                          self.size, name=f"pager:{name}", tags=[0, 0, 0], visible=False)

    @property
    def pages(self):
        return max(1, -(-len(self._keys) // self.page_size))

    @property
    def visible(self) -> list:
        """The keys on the current page, in display order."""
        return list(self._visible)

    def set_keys(self, keys) -> bool:
        """Set every key in display order; returns whether the page's keys changed."""
        keys = list(keys)
        if keys == self._keys:
            return False
        self._keys = keys
        return self._place()

    def go(self, page):
        """Show page ``page`` (clamped to the pages there are)."""
        self.page = page
        if self._place() and self.on_change is not None:
            self.on_change()

    def _resize(self, page_size):
        first = self.page * self.page_size            # keep the first card on show in view
        self.page_size = page_size
        self.go(first // page_size)

    def _place(self):
        self.page = min(max(int(self.page), 0), self.pages - 1)
        start = self.page * self.page_size
        visible = self._keys[start:start + self.page_size]
        n = len(self._keys)
        self.previous.disabled = self.page == 0
        self.next.disabled = self.page >= self.pages - 1
        self.label.text = f"{start + 1}–{start + len(visible)} of {n}" if n else ""
        self.layout.visible = n > min(PAGE_SIZES)     # a handful of cards needs no controls
        self.layout.tags = [len(visible), self.page, self.pages]
        if visible == self._visible:
            return False
        self._visible = visible
        return True
