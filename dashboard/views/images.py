"""Images tab: per run × tag a card showing one logged image, with a step slider and, when a step holds several
images, a sample slider.

PNGs are decoded server-side with Pillow into the packed RGBA ``uint32`` array that ``figure.image_rgba`` draws, so
no image or data URL ever passes through HTML. Only the image on show is sent; the card follows the latest step
until the user moves the step slider back (and again once they move it to the end). When the store thins its sample
of a series (a reset: the newest image is always kept), a card that follows stays on the newest, and one the viewer
moved back stays on the step they chose, or the closest kept step before it. Cards come a page at a time
(``CardsView``), so only the images of the page are decoded and sent.
"""
from __future__ import annotations

import bisect
import io

import numpy as np
from bokeh.models import ColumnDataSource, Range1d, Slider

from flowlab.plots.figures import card, plain_figure

from .base import CardsView

SIZE = 320              # the longer side of the drawn image, in screen pixels


def decode_rgba(png: bytes) -> np.ndarray:
    """A PNG as ``image_rgba`` wants it: ``uint32 [h, w]`` of packed RGBA bytes, bottom row first (Bokeh's y axis
    points up)."""
    from PIL import Image
    with Image.open(io.BytesIO(png)) as im:
        rgba = np.asarray(im.convert("RGBA"), dtype=np.uint8)
    return np.ascontiguousarray(rgba[::-1]).view("<u4")[..., 0]


def _slider(title):
    # Sliders whose start equals their end are invalid in Bokeh: a one-position slider is hidden with end 1.
    return Slider(start=0, end=1, value=0, step=1, title=title, show_value=False, visible=False,
                  sizing_mode="stretch_width")


class _Card:
    def __init__(self, series):
        self.items = []                             # (step, tailer.Image), references into the store's series
        self._shown = (None, 0)                     # (Image, sample index) on show
        self.step = _slider("step")
        self.sample = _slider("image")
        self.source = ColumnDataSource({"image": [], "w": [], "h": []})
        self.figure = plain_figure(x_range=Range1d(0, 1), y_range=Range1d(0, 1), width=SIZE, height=SIZE)
        self.figure.image_rgba(image="image", x=0, y=0, dw="w", dh="h", source=self.source)
        self.figure.axis.visible = False
        self.figure.grid.visible = False
        self.step.on_change("value", lambda attr, old, new: self.show())
        self.sample.on_change("value", lambda attr, old, new: self.show())
        self.layout = card(series.tag, series.run, self.step, self.sample, self.figure)

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

    def show(self):
        """Send the image the sliders select (nothing when it is already on show)."""
        if not self.items:
            self.source.data = {"image": [], "w": [], "h": []}
            return
        index = min(int(self.step.value), len(self.items) - 1)
        step, image = self.items[index]
        n = len(image.encoded)
        self.sample.end, self.sample.visible = max(n - 1, 1), n > 1
        sample = min(int(self.sample.value), max(n - 1, 0))
        if n == 0 or (self._shown[0] is image and self._shown[1] == sample):
            return
        self._shown = (image, sample)
        self.step.title = f"step {step}"
        self.sample.title = f"image {sample + 1} of {n}"
        pixels = decode_rgba(image.encoded[sample])
        h, w = pixels.shape
        self.figure.x_range.end, self.figure.y_range.end = w, h
        scale = SIZE / max(w, h)                    # small images (MNIST's 28 px) are enlarged, big ones shrunk
        self.figure.width, self.figure.height = max(round(w * scale), 20), max(round(h * scale), 20)
        self.source.data = {"image": [pixels], "w": [w], "h": [h]}


class ImagesView(CardsView):
    title = "Images"
    kind = "image"
    empty_text = "No images in this logdir yet."

    def new_card(self, series):
        return _Card(series)
