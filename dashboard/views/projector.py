"""The Projector tab: embeddings (``Projector`` / ``add_embedding``) reduced to 2-D or 3-D on the server.

Every directory of the logdir holding a ``projector_config.pbtxt`` is a run here (the projector writes no event
files, so the store never sees these); its config is read again with ``read_projector`` whenever its mtime changes.
The logdir is searched again at most every ``rescan_seconds``.

Reduction: PCA by NumPy's SVD of the centred data (deterministic signs: each component's largest loading positive),
or t-SNE when scikit-learn is importable (the choice is only offered then). 3-D is shown honestly as two linked 2-D
projections sharing component 2 (1-2 and 3-2), with the same points selected in both.
Points are coloured by a metadata column (numbers are categories too: the 19 most frequent values get colours, the
rest are "other"). Hover shows the label, and the sample's thumbnail when the embedding has a sprite: PNG data URLs
cut from the sprite here. Base64 data URLs hold no character that Bokeh's tooltip escaping changes, so the template
uses plain ``@thumb`` and nothing in a tooltip is marked safe; labels are escaped like every tooltip field.
"""
from __future__ import annotations

import base64
import html
import io
import math
import os
import time
from collections import Counter

import numpy as np
from bokeh.layouts import column, row
from bokeh.core.properties import value
from bokeh.models import ColumnDataSource, Div, HoverTool, Legend, LegendItem, Select
from bokeh.plotting import figure

from flowlab.plots.figures import CATEGORICAL
from flowlab.summary.projector import (CONFIG_FILE, MAX_SPRITE_BYTES, MAX_SPRITE_PIXELS, UnsafePath, read_file_capped,
                                      read_projector)

from .base import View

MAX_POINTS = 5000           # points reduced and drawn (the first ones); the note says when there were more
MAX_TSNE_POINTS = 2000      # t-SNE runs on the IOLoop: keep it to seconds
MAX_THUMBNAILS = 2000
THUMB_SIZE = 48             # longest side of a hover thumbnail, in pixels
OTHER_COLOR = "#bbbbbb"

try:                        # optional: t-SNE is only offered when scikit-learn is there
    from sklearn.manifold import TSNE
except ImportError:         # pragma: no cover - depends on the environment
    TSNE = None


# ------------------------------------------------------------------------------------------------------ pure data

def pca(matrix, k: int):
    """(coordinates [n, k], explained variance ratios [k]) of the centred ``matrix`` [n, d] by SVD. Components past
    the data's rank (or d) are 0. Signs are fixed so each component's largest-magnitude loading is positive."""
    x = np.asarray(matrix, np.float64)
    x = np.where(np.isfinite(x), x, 0.0)            # NaN/Inf would poison the SVD (the TSV holds 0 there too)
    x = x - x.mean(axis=0)
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    signs = np.sign(vt[np.arange(len(vt)), np.abs(vt).argmax(axis=1)])
    signs[signs == 0] = 1
    coords = u * s * signs
    total = float((s ** 2).sum())
    ratios = (s ** 2) / total if total > 0 else np.zeros_like(s)
    out, explained = np.zeros((len(x), k)), np.zeros(k)
    m = min(k, coords.shape[1])
    out[:, :m], explained[:m] = coords[:, :m], ratios[:m]
    return out, explained


def tsne(matrix, k: int, seed: int = 0):
    """t-SNE coordinates [n, k] (scikit-learn), on the first 50 principal components as TensorBoard does."""
    if TSNE is None:
        raise RuntimeError("t-SNE needs scikit-learn (pip install scikit-learn)")
    x = np.asarray(matrix, np.float64)
    if x.shape[1] > 50:
        x = pca(x, 50)[0]
    n = len(x)
    if n < 3:
        return np.zeros((n, k))
    return TSNE(n_components=k, perplexity=min(30.0, (n - 1) / 3), init="pca", random_state=seed,
                method="barnes_hut" if k < 4 else "exact").fit_transform(x)


def categories(labels: list, limit: int = 20) -> tuple[list, list]:
    """(category, colour) per label: the ``limit - 1`` most frequent labels (all of them when there are no more than
    ``limit``) get a palette colour each, ordered numerically when every label is a number; the rest are "other"."""
    counts = Counter(labels)
    kept = set(counts) if len(counts) <= limit else {v for v, _ in counts.most_common(limit - 1)}

    def key(v):
        try:
            return (0, float(v), "")
        except ValueError:
            return (1, 0.0, v)
    order = sorted(kept, key=key) if all(key(v)[0] == 0 for v in kept) else sorted(kept)
    color = {v: CATEGORICAL[i % len(CATEGORICAL)] for i, v in enumerate(order)}
    return ([v if v in kept else "other" for v in labels], [color.get(v, OTHER_COLOR) for v in labels])


def thumbnails(sprite_path: str, total: int, n: int, size: int = THUMB_SIZE) -> list[str]:
    """PNG data URLs of the first ``n`` images of a sprite made for ``total`` images (TensorBoard's layout: a square
    grid of ceil(sqrt(total)) images a side, row-major), each scaled so its longest side is at most ``size``."""
    from PIL import Image                           # Pillow only when there is a sprite
    side = math.ceil(math.sqrt(total))
    out = []
    # the path came from a log: a regular file, size-capped, opened without blocking (read_projector confined it)
    data = read_file_capped(sprite_path, "sprite", MAX_SPRITE_BYTES)
    try:
        sheet = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise UnsafePath(f"sprite {sprite_path!r}: {e}") from None
    with sheet:
        if sheet.width * sheet.height > MAX_SPRITE_PIXELS:   # a small PNG can declare a huge canvas
            raise UnsafePath(f"sprite {sprite_path!r} is {sheet.width}x{sheet.height} pixels; at most "
                             f"{MAX_SPRITE_PIXELS} pixels are decoded")
        w, h = sheet.width // side, sheet.height // side
        scale = min(1.0, size / max(w, h, 1))
        for i in range(n):
            r, c = divmod(i, side)
            tile = sheet.crop((c * w, r * h, (c + 1) * w, (r + 1) * h))
            if scale < 1.0:
                tile = tile.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.NEAREST)
            buffer = io.BytesIO()
            tile.save(buffer, format="PNG")
            out.append("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii"))
    return out


# ------------------------------------------------------------------------------------------------------ the view

class ProjectorView(View):
    title = "Projector"
    rescan_seconds = 5.0
    reads_files = True      # projector files are not event files: the store's version never moves for them

    def __init__(self, store):
        super().__init__(store)
        self._configs: dict[str, tuple] = {}       # run -> (mtime, [Embedding])
        self._scanned = -math.inf
        self._shown = None                  # the run list's choice the Run menu was made for
        self._cache: dict[tuple, tuple] = {}       # (run, mtime, entry, method, dims) -> (coords, explained)
        self.shown = None                          # (run, mtime, entry index, method, dims, label column) drawn
        self._syncing = False                      # set while options are rewritten: no redraw per widget change

        self.run_select = Select(title="Run", options=[], width=200)
        self.tensor_select = Select(title="Tensor", options=[], width=200)
        self.step_select = Select(title="Step", options=[], width=100)
        self.method_select = Select(title="Method", options=["PCA"] + (["t-SNE"] if TSNE is not None else []),
                                    value="PCA", width=100)
        self.dims_select = Select(title="Dimensions", options=["2-D", "3-D"], value="2-D", width=100)
        self.label_select = Select(title="Colour by", options=[], width=160)
        for widget in (self.run_select, self.tensor_select, self.step_select, self.method_select, self.dims_select,
                       self.label_select):
            widget.on_change("value", lambda attr, old, new: None if self._syncing else self._draw())

        self.source = ColumnDataSource({k: [] for k in ("c0", "c1", "c2", "label", "category", "color", "thumb")})
        self.hover = HoverTool(tooltips=[("label", "@label")])
        self.front = self._figure("component 1", "component 2")
        self.side = self._figure("component 3", "component 2", y_range=self.front.y_range)
        self.side.visible = False
        self.points = self.front.scatter(x="c0", y="c1", source=self.source, color="color", size=6, alpha=0.8)
        self.side.scatter(x="c2", y="c1", source=self.source, color="color", size=6, alpha=0.8)
        self.legend = Legend(items=[], label_text_font_size="8pt", glyph_height=12, spacing=1)
        self.front.add_layout(self.legend, "right")      # beside the points, never over them
        self.note = Div(text="No embeddings in this logdir yet.")
        self.controls = row(self.run_select, self.tensor_select, self.step_select, self.method_select,
                            self.dims_select, self.label_select, visible=False)
        self.front.visible = False
        self._layout = column(self.controls, self.note, row(self.front, self.side))

    def _figure(self, x_label, y_label, **kwargs):
        fig = figure(width=600, height=480, tools="pan,wheel_zoom,box_select,lasso_select,reset",
                     x_axis_label=x_label, y_axis_label=y_label, output_backend="canvas", **kwargs)
        fig.add_tools(self.hover)
        return fig

    def layout(self):
        return self._layout

    # ---------------------------------------------------------------------------------------------- reading configs
    def update(self):
        shown = self.runs.shown()
        if shown != self._shown:                    # the run list's choice: its runs in the Run menu
            self._shown = shown
            self._draw()
        now = time.monotonic()
        if now - self._scanned < self.rescan_seconds:
            return
        self._scanned = now
        changed = False
        found = set()
        errors = []
        for run, path in self._config_paths():
            found.add(run)
            try:
                mtime = os.stat(path).st_mtime_ns
                if run not in self._configs or self._configs[run][0] != mtime:
                    self._configs[run] = (mtime, read_projector(os.path.dirname(path)))
                    changed = True
            except (OSError, ValueError) as e:      # half-written files (read again next scan), unsafe paths
                errors.append(f"Could not read {run}: {type(e).__name__}: {e}")
        for run in set(self._configs) - found:
            del self._configs[run]
            changed = True
        if changed:
            self._draw()
        if errors:                                  # after the draw, which rewrites the note
            self.note.text = html.escape("; ".join(([self.note.text] if self.note.text else []) + errors))

    def _config_paths(self):
        logdir = self.store.logdir
        for directory, subdirs, files in os.walk(logdir):
            if CONFIG_FILE in files:
                yield os.path.relpath(directory, logdir).replace(os.sep, "/"), os.path.join(directory, CONFIG_FILE)
            # An embedding's own directory holds tensors.tsv and never a config: no need to look inside.
            subdirs[:] = sorted(d for d in subdirs if not os.path.exists(os.path.join(directory, d, "tensors.tsv")))

    def _embeddings(self):
        return self._configs.get(self.run_select.value, (None, []))[1]

    @staticmethod
    def _tensor_key(e):
        return e.tag if e.kind == "embedding" else f"{e.kind}/{e.tag}"

    def _sync_selects(self):
        """Options from what is on disk now; a choice that still exists is kept (the step follows new steps when
        the latest one was shown)."""
        self._syncing = True
        try:
            _options(self.run_select, sorted(run for run in self._configs if self.runs.shows(run)))
            embeddings = self._embeddings()
            _options(self.tensor_select, list(dict.fromkeys(self._tensor_key(e) for e in embeddings)))
            steps = sorted({e.step for e in embeddings if self._tensor_key(e) == self.tensor_select.value})
            _options(self.step_select, [str(s) for s in steps], latest=True)
            i = self._entry()
            e = embeddings[i] if i is not None else None
            _options(self.label_select, (e.metadata_header or ["label"]) if e is not None and e.metadata else [])
        finally:
            self._syncing = False

    def _entry(self):
        """The index of the chosen embedding in the run's list, or None."""
        for i, e in enumerate(self._embeddings()):
            if self._tensor_key(e) == self.tensor_select.value and str(e.step) == self.step_select.value:
                return i
        return None

    # ---------------------------------------------------------------------------------------------- drawing
    def _draw(self):
        self._sync_selects()
        i = self._entry()
        self.controls.visible = self.front.visible = i is not None     # nothing to show: one line of text
        if i is None:
            self.source.data = {k: [] for k in self.source.data}
            self.side.visible = False
            self.note.text = "No embeddings of the checked runs." if self._configs else \
                "No embeddings in this logdir yet."
            self.shown = None
            return
        embeddings = self._embeddings()
        e = embeddings[i]
        method, dims = self.method_select.value, 3 if self.dims_select.value == "3-D" else 2
        shown = (self.run_select.value, self._configs[self.run_select.value][0], i, method, dims,
                 self.label_select.value)
        if shown == self.shown:
            return
        self.shown = shown
        limit = MAX_TSNE_POINTS if method == "t-SNE" else MAX_POINTS
        n = min(len(e.tensor), limit)
        key = shown[:5]
        if key not in self._cache:
            if len(self._cache) > 16:
                self._cache.clear()
            matrix = e.tensor[:n]
            self._cache[key] = tsne(matrix, dims) if method == "t-SNE" else pca(matrix, dims)
        result = self._cache[key]
        coords, explained = (result, None) if method == "t-SNE" else result

        column_index = (e.metadata_header or ["label"]).index(self.label_select.value) \
            if e.metadata and self.label_select.value else None
        labels = [r[column_index] if column_index < len(r) else "" for r in e.metadata[:n]] \
            if column_index is not None else [""] * n
        category, colors = categories(labels)
        self.legend.visible = column_index is not None
        thumbs = [""] * n
        sprite_error = None
        if e.sprite and os.path.exists(e.sprite):
            cut = min(n, MAX_THUMBNAILS)
            try:
                thumbs[:cut] = thumbnails(e.sprite, len(e.tensor), cut)
            except (OSError, ValueError) as error:      # a bad sprite: the points without thumbnails, and why
                sprite_error = f"; sprite not shown: {error}"
        self.source.data = {"c0": coords[:, 0].tolist(), "c1": coords[:, 1].tolist(),
                            "c2": coords[:, 2].tolist() if dims == 3 else [0.0] * n,
                            "label": labels, "category": category, "color": colors, "thumb": thumbs}
        # one legend entry per category, in colour order (the palette's order: numeric labels ascending), each
        # drawn with the glyph of its first point
        first = {}
        for j, c in enumerate(category):
            first.setdefault(c, j)
        rank = {c: i for i, c in enumerate(CATEGORICAL)}
        entries = sorted(first.items(), key=lambda item: rank.get(colors[item[1]], len(rank)))
        self.legend.items = [LegendItem(label=value(c), renderers=[self.points], index=j) for c, j in entries]
        self.hover.tooltips = _TOOLTIP_WITH_THUMB if any(thumbs) else [("label", "@label")]
        self.side.visible = dims == 3
        names = [f"t-SNE {j + 1}" if explained is None else
                 f"PC{j + 1} ({explained[j]:.1%} of the variance)" if j < dims else "" for j in range(3)]
        self.front.xaxis.axis_label, self.front.yaxis.axis_label = names[0], names[1]
        self.side.xaxis.axis_label, self.side.yaxis.axis_label = names[2], names[1]
        total = len(e.tensor)
        note = f"{method} of {n} points in {e.tensor.shape[1]} dimensions"
        if n < total:
            note += f" (the first {n} of {total})"
        if e.kind == "exception":
            note += f"; NaN: {e.info.get('nan_count', 0)}, Inf: {e.info.get('inf_count', 0)} (drawn as 0)"
        self.note.text = html.escape(note + (sprite_error or ""))


# The thumbnail comes first; @label is escaped by Bokeh like every field not marked {safe}.
_TOOLTIP_WITH_THUMB = ('<div style="display:flex;align-items:center;gap:6px">'
                       '<img src="@thumb" style="image-rendering:pixelated;width:64px;height:auto">'
                       '<span>@label</span></div>')


def _options(select, values, latest=False):
    """Set ``select``'s options; keep its value when still offered, else pick the first (``latest``: the last, and
    move on to a new last value when the old last one was chosen)."""
    old = list(select.options)
    if old != values:
        select.options = values
    if values and (select.value not in values or latest and old and select.value == old[-1]):
        select.value = values[-1] if latest else values[0]
    elif not values and select.value != "":
        select.value = ""
