"""Images tab: per run × tag a card showing the images of one logged step as a grid (a tap on one enlarges it, a tap
on the enlarged one goes back), with a step slider.

PNGs are decoded server-side with Pillow into the packed RGBA ``uint32`` array that ``figure.image_rgba`` draws, so
no image or data URL ever passes through HTML. Only the image on show is sent; the card follows the latest step
until the user moves the step slider back (and again once they move it to the end). When the store thins its sample
of a series (a reset: the newest image is always kept), a card that follows stays on the newest, and one the viewer
moved back stays on the step they chose, or the closest kept step before it. Cards come a page at a time
(``CardsView``), so only the images of the page are decoded and sent.

Decoding is bounded (``flowlab.plots.thumbnails``): each image is decoded once per server process, shrunk to the
card's ``SIZE`` while decoding, and shared by every session. In a server session an image not decoded yet is decoded
in the thumbnails' worker thread, never on the event loop (a 4000 × 4000 PNG held it for 0.1-0.5 s): the card says
"decoding" and is drawn on the loop turn after its images are ready. An image declaring more than ``MAX_PIXELS``
(4096 × 4096) pixels, or one that cannot be decoded, is drawn as a grey tile and the card's caption says why, so one
hostile image costs neither memory nor the other cards.
"""
from __future__ import annotations

import bisect
import html
import logging
import math
from functools import partial

import numpy as np
from bokeh.models import ColumnDataSource, Div, Range1d, Slider, TapTool

from flowlab.plots.figures import card, plain_figure
from flowlab.plots.thumbnails import Refused, cached_thumbnail, thumbnail_later, thumbnail_rgba

from .base import CardsView

SIZE = 320              # the longer side of the drawn image, in screen pixels
MAX_TILES = 16          # images of one step drawn as a grid
log = logging.getLogger(__name__)


# What a refused image is drawn as: a light grey square (packed RGBA, as image_rgba wants it)
_REFUSED_TILE = np.full((32, 32), int.from_bytes(bytes((0xdd, 0xdd, 0xdd, 0xff)), "little"), np.uint32)
_REFUSED_TILE.flags.writeable = False


def decode_rgba(png: bytes) -> np.ndarray | Refused:
    """An encoded image as ``image_rgba`` wants it, at most ``SIZE`` pixels on its longer side: ``uint32 [h, w]``
    of packed RGBA bytes, bottom row first (Bokeh's y axis points up); or ``Refused`` with the reason (more than
    ``MAX_PIXELS`` pixels, undecodable). Decoded once per process (``flowlab.plots.thumbnails``)."""
    return thumbnail_rgba(png, SIZE)


def _slider(title):
    # Sliders whose start equals their end are invalid in Bokeh: a one-position slider is hidden with end 1.
    return Slider(start=0, end=1, value=0, step=1, title=title, show_value=False, visible=False,
                  sizing_mode="stretch_width")


def grid_shape(n):
    """(columns, rows) of a near-square grid of ``n`` tiles, wider than tall."""
    columns = math.ceil(math.sqrt(n))
    return columns, math.ceil(n / columns)


class _Card:
    """One run × tag: the images of the step the slider selects, as a grid (at most ``MAX_TILES``); a tap on one
    shows it alone, at the card's full size, and a tap on it goes back to the grid. ``document()`` gives the session's
    document (None outside one): in a server session, images not decoded yet are decoded off the event loop."""

    def __init__(self, series, document=lambda: None):
        self.document = document
        self._waiting = set()                       # images whose decode in the worker this card waits for
        self._failed = {}                           # image -> Refused, for a decode that raised in the worker
        self.items = []                             # (step, tailer.Image), references into the store's series
        self._shown = None                          # (Image, enlarged sample or None) on show
        self.enlarged = None                        # the sample shown alone, or None for the grid
        self.step = _slider("step")
        self.source = ColumnDataSource({"image": [], "x": [], "y": [], "w": [], "h": []})
        self.tiles = ColumnDataSource({"left": [], "right": [], "bottom": [], "top": [], "sample": []})
        self.figure = plain_figure(x_range=Range1d(0, 1), y_range=Range1d(0, 1), width=SIZE, height=SIZE)
        self.figure.image_rgba(image="image", x="x", y="y", dw="w", dh="h", source=self.source)
        # transparent boxes over the tiles take the taps (and say which sample each is); only they: a tap that
        # selected in the images' own source would dim them
        boxes = self.figure.quad(left="left", right="right", bottom="bottom", top="top", source=self.tiles,
                                 fill_alpha=0, line_alpha=0, selection_fill_alpha=0, selection_line_alpha=0,
                                 nonselection_fill_alpha=0, nonselection_line_alpha=0)
        self.figure.add_tools(TapTool(renderers=[boxes]))     # (no toolbar: the tap is active by itself)
        self.figure.axis.visible = False
        self.figure.grid.visible = False
        self.caption = Div(text="", disable_math=True, styles={"color": "#777", "font-size": "9pt"})
        self.step.on_change("value", lambda attr, old, new: self.show())
        self.tiles.selected.on_change("indices", lambda attr, old, new: self._tapped(new))
        self.layout = card(series.tag, series.run, self.step, self.caption, self.figure)

    def add(self, steps, values, replace):
        following = not self.items or self.step.value >= len(self.items) - 1
        looking_at = None if following else self.items[int(self.step.value)][0]
        if replace:                     # the store thinned its sample: the newest is in it, the viewer's may not be
            self.items = []
        self.items += zip(steps, values)
        self.step.end = max(len(self.items) - 1, 1)
        self.step.visible = len(self.items) > 1
        if looking_at is None:
            index = len(self.items) - 1
        else:                           # the step the viewer chose, or the closest kept one before it
            index = max(0, bisect.bisect_right([s for s, _ in self.items], looking_at) - 1)
        self.step.value = max(index, 0)                 # triggers show() only when the value changed
        self.show()

    def _decoded(self, encoded):
        """The thumbnails of ``encoded`` (a list of images), or None when some are still to decode: then, in a
        server session, they are decoded in the worker thread and ``show`` runs again on the loop turn after the last
        of them (outside a server they are decoded here)."""
        doc = self.document()
        if doc is None or doc.session_context is None:
            return [decode_rgba(e) for e in encoded]
        pictures = [self._failed.get(e) or cached_thumbnail(e, SIZE) for e in encoded]
        missing = {e for e, p in zip(encoded, pictures) if p is None}
        for e in missing - self._waiting:
            self._waiting.add(e)
            thumbnail_later(e, SIZE).add_done_callback(partial(self._decoded_in_worker, doc, e))
        return None if missing else pictures

    def _decoded_in_worker(self, doc, encoded, future):
        """(In the worker thread.) Hand the decoded image to the loop: ``add_next_tick_callback`` is the document's
        one thread-safe call."""
        error = future.exception()
        if error is not None:                   # (Pillow's own errors come back as Refused: this is anything else)
            self._failed[encoded] = Refused(f"cannot be decoded ({type(error).__name__}: {error})")
        try:
            doc.add_next_tick_callback(partial(self._ready, encoded))
        except Exception:                       # the session ended meanwhile: nothing to draw into
            log.debug("images card: session gone before its image was decoded", exc_info=True)

    def _ready(self, encoded):
        self._waiting.discard(encoded)
        if not self._waiting:
            self.show()

    def _tapped(self, indices):
        if not indices:
            return
        sample = self.tiles.data["sample"][indices[0]]
        self.enlarged = None if self.enlarged is not None else sample
        self.tiles.selected.indices = []
        self.show()

    def show(self):
        """Send the images the slider selects (nothing when they are already on show)."""
        if not self.items:
            self.source.data = {k: [] for k in self.source.data}
            return
        step, image = self.items[min(int(self.step.value), len(self.items) - 1)]
        n = len(image.encoded)
        if self.enlarged is not None and self.enlarged >= n:
            self.enlarged = None
        if n == 0 or self._shown == (image, self.enlarged):
            return
        samples = [self.enlarged] if self.enlarged is not None else list(range(min(n, MAX_TILES)))
        decoded = self._decoded([image.encoded[i] for i in samples])
        if decoded is None:
            self.caption.text = "decoding…"             # drawn when the worker has them (``_ready``)
            return
        self._shown = (image, self.enlarged)
        refused = [(i, p.reason) for i, p in zip(samples, decoded) if isinstance(p, Refused)]
        pictures = [_REFUSED_TILE if isinstance(p, Refused) else p for p in decoded]
        cell_w, cell_h = max(p.shape[1] for p in pictures), max(p.shape[0] for p in pictures)
        columns, rows = grid_shape(len(pictures))
        gap = max(cell_w, cell_h) // 16 if len(pictures) > 1 else 0
        data = {k: [] for k in self.source.data}
        tiles = {k: [] for k in self.tiles.data}
        for k, (i, picture) in enumerate(zip(samples, pictures)):
            c, r = k % columns, k // columns
            x, y = c * (cell_w + gap), (rows - 1 - r) * (cell_h + gap)     # row 0 at the top
            h, w = picture.shape
            for name, value in (("image", picture), ("x", x), ("y", y), ("w", w), ("h", h)):
                data[name].append(value)
            for name, value in (("left", x), ("right", x + w), ("bottom", y), ("top", y + h), ("sample", i)):
                tiles[name].append(value)
        width, height = columns * cell_w + (columns - 1) * gap, rows * cell_h + (rows - 1) * gap
        self.figure.x_range.end, self.figure.y_range.end = width, height
        scale = SIZE / max(width, height)           # small images (MNIST's 28 px) are enlarged, big ones shrunk
        self.figure.width, self.figure.height = max(round(width * scale), 20), max(round(height * scale), 20)
        self.source.data = data
        self.tiles.data = tiles
        self.step.title = f"step {step}"
        if self.enlarged is not None:
            caption = f"image {self.enlarged + 1} of {n} (tap it for all)"
        elif n > 1:
            more = f", the first {MAX_TILES} shown" if n > MAX_TILES else ""
            caption = f"{n} images{more} (tap one to enlarge it)"
        else:
            caption = ""
        caption = html.escape(caption)
        for i, reason in refused:                   # Pillow's messages are text, never markup
            which = f"image {i + 1}" if n > 1 else "image"
            caption += f'<div style="color:#c00">{which} refused: {html.escape(reason)}</div>'
        self.caption.text = caption


class ImagesView(CardsView):
    title = "Images"
    kind = "image"
    empty_text = "No images in this logdir yet."

    def new_card(self, series):
        return _Card(series, document=lambda: self._root.document)
