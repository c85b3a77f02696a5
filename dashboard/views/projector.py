"""The Projector tab: embeddings (``Projector`` / ``add_embedding``) reduced to 2-D or 3-D on the server.

Every directory of the logdir holding a ``projector_config.pbtxt`` is a run here (the projector need not write event
files); the store reads its embeddings (``Store.projectors``) again whenever the config changes, and the sprites'
bytes for the hover thumbnails (``Store.sprite``).

Reduction: PCA by NumPy's SVD of the centred data (deterministic signs: each component's largest loading positive),
t-SNE when scikit-learn is installed and UMAP when umap-learn is (each only offered then; both seeded, so the same
data gives the same picture). In a server session no reduction blocks the IOLoop beyond a small PCA: t-SNE and UMAP
run in a worker process (``WORKERS``: numba's compiled code holds the GIL, and UMAP's first call spends ~15 s
compiling), larger PCAs in a thread; the result comes back through ``doc.add_next_tick_callback``, the note says
"computing …" meanwhile, and a newer choice supersedes a reduction still running. 3-D is shown honestly as two linked
2-D projections sharing component 2 (1-2 and 3-2), with the same points selected in both.
Points are coloured by a metadata column (numbers are categories too: the 19 most frequent values get colours, the
rest are "other"). Hover shows the label, and the sample's thumbnail when the embedding has a sprite: PNG data URLs
cut from the sprite here. Base64 data URLs hold no character that Bokeh's tooltip escaping changes, so the template
uses plain ``@thumb`` and nothing in a tooltip is marked safe; labels are escaped like every tooltip field.
"""
from __future__ import annotations

import base64
import html
import importlib.util
import io
import logging
import math
import multiprocessing
import threading
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial

import numpy as np
from bokeh.layouts import column, row
from bokeh.core.properties import value
from bokeh.models import ColumnDataSource, Div, HoverTool, Legend, LegendItem, Select
from bokeh.plotting import figure

from flowlab.plots.colours import run_colours
from flowlab.plots.figures import served
from flowlab.summary.projector import MAX_SPRITE_PIXELS, UnsafePath, unmatched_note

from .base import View

log = logging.getLogger(__name__)

MAX_POINTS = 5000           # points reduced and drawn (the first ones); the note says when there were more
MAX_TSNE_POINTS = 2000      # t-SNE's cost grows faster than UMAP's: keep the wait to seconds
INLINE_PCA_VALUES = 50_000  # a PCA of at most this many values runs at once on the IOLoop (milliseconds)
MAX_THUMBNAILS = 2000
THUMB_SIZE = 48             # longest side of a hover thumbnail, in pixels
OTHER_COLOR = "#bbbbbb"
SEED = 0                    # t-SNE's and UMAP's: the same embedding always gives the same picture

# Optional methods, offered only when their package is installed. Looked up, not imported: importing scikit-learn
# takes 1.5 s and umap-learn 2 s, which every server start would pay; they are imported where they run.
TSNE_AVAILABLE = importlib.util.find_spec("sklearn") is not None
UMAP_AVAILABLE = importlib.util.find_spec("umap") is not None


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


def _first_components(matrix):
    """``matrix`` as float64 on its first 50 principal components (as TensorBoard does before t-SNE)."""
    x = np.asarray(matrix, np.float64)
    return pca(x, 50)[0] if x.shape[1] > 50 else np.where(np.isfinite(x), x, 0.0)


def tsne(matrix, k: int, seed: int = SEED):
    """t-SNE coordinates [n, k] (scikit-learn), on the first 50 principal components."""
    try:
        from sklearn.manifold import TSNE
    except ImportError:
        raise RuntimeError("t-SNE needs scikit-learn (pip install scikit-learn)") from None
    x = _first_components(matrix)
    n = len(x)
    if n < 3:
        return np.zeros((n, k))
    return TSNE(n_components=k, perplexity=min(30.0, (n - 1) / 3), init="pca", random_state=seed,
                method="barnes_hut" if k < 4 else "exact").fit_transform(x)


def umap(matrix, k: int, seed: int = SEED):
    """UMAP coordinates [n, k] (umap-learn, 15 neighbours), on the first 50 principal components. Seeded, so
    single-threaded and the same for the same data. The first call in a process compiles numba code (~15 s)."""
    try:
        import umap as umap_learn
    except ImportError:
        raise RuntimeError("UMAP needs umap-learn (pip install umap-learn)") from None
    x = _first_components(matrix)
    n = len(x)
    if n < 4:                                       # too few points for a neighbour graph
        return np.zeros((n, k))
    with warnings.catch_warnings():                 # "n_jobs overridden by setting random_state": that is the point
        warnings.simplefilter("ignore", UserWarning)
        return umap_learn.UMAP(n_components=k, n_neighbors=min(15, n - 1), random_state=seed).fit_transform(x)


def reduce(matrix, method: str, k: int):
    """``(coordinates [n, k], explained variance ratios [k] or None)`` of ``matrix`` by ``method``: "PCA", "t-SNE"
    or "UMAP" (only PCA explains variance)."""
    if method == "PCA":
        return pca(matrix, k)
    if method == "t-SNE":
        return tsne(matrix, k), None
    if method == "UMAP":
        return umap(matrix, k), None
    raise ValueError(f"unknown reduction {method!r}")


class Workers:
    """Where a server's sessions reduce off the IOLoop, shared by all of them and started on first use: t-SNE and UMAP
    in one worker process (numba's compiled code holds the GIL, so in a thread it would stall every session; and a
    process can be ended, where a thread would hold up the interpreter's exit until it finished), PCA in a thread
    (LAPACK releases the GIL, and a PCA need not wait behind a UMAP). Each server ``hold()``s them while it runs;
    the last ``release()`` ends the process, abandoning what runs there."""

    def __init__(self):
        self._lock = threading.Lock()
        self._holders = 0
        self._process = self._thread = None

    def submit(self, method, matrix, k):
        """A ``concurrent.futures.Future`` of ``reduce(matrix, method, k)``."""
        with self._lock:
            if method == "PCA":
                self._thread = self._thread or ThreadPoolExecutor(1, thread_name_prefix="flowlab-pca")
                return self._thread.submit(reduce, matrix, method, k)
            for attempt in (1, 2):
                if self._process is None:       # spawned: forking a process that runs threads can deadlock
                    self._process = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
                try:
                    return self._process.submit(reduce, matrix, method, k)
                except BrokenProcessPool:       # the worker died (out of memory, killed): start another once
                    self._process = None
                    if attempt == 2:
                        raise

    def hold(self):
        with self._lock:
            self._holders += 1

    def release(self):
        """One holder fewer; with none left, end the worker process now."""
        with self._lock:
            self._holders = max(0, self._holders - 1)
            if self._holders or self._process is None:
                return
            pool, self._process = self._process, None
        processes = list((pool._processes or {}).values())    # (no public way to end a running task before 3.14)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()


WORKERS = Workers()


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
    palette = run_colours()
    color = {v: palette[i % len(palette)] for i, v in enumerate(order)}
    return ([v if v in kept else "other" for v in labels], [color.get(v, OTHER_COLOR) for v in labels])


def thumbnails(data: bytes, total: int, n: int, size: int = THUMB_SIZE, name: str = "") -> list[str]:
    """PNG data URLs of the first ``n`` images of a sprite (its encoded bytes, as ``Store.sprite`` reads them:
    size-capped) made for ``total`` images (TensorBoard's layout: a square grid of ceil(sqrt(total)) images a side,
    row-major), each scaled so its longest side is at most ``size``. ``name``: the sprite's, for errors."""
    from PIL import Image                           # Pillow only when there is a sprite
    side = math.ceil(math.sqrt(total))
    out = []
    try:
        sheet = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise UnsafePath(f"sprite {name!r}: {e}") from None
    with sheet:
        if sheet.width * sheet.height > MAX_SPRITE_PIXELS:   # a small PNG can declare a huge canvas
            raise UnsafePath(f"sprite {name!r} is {sheet.width}x{sheet.height} pixels; at most "
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

    def __init__(self, store):
        super().__init__(store)
        self._configs: dict[str, tuple] = {}       # run -> (version, [Embedding]) as the store read them
        self._shown = None                  # the run list's choice the Run menu was made for
        self._cache: dict[tuple, tuple] = {}       # (run, mtime, entry, method, dims) -> (coords, explained)
        self.shown = None                          # (run, mtime, entry index, method, dims, label column) drawn
        self._syncing = False                      # set while options are rewritten: no redraw per widget change
        self._waiting = None                       # the cache key of the reduction being computed for the page
        self._future = None                        # ... and its Future

        self.run_select = Select(title="Run", options=[], width=200)
        self.tensor_select = Select(title="Tensor", options=[], width=200)
        self.step_select = Select(title="Step", options=[], width=100)
        self.method_select = Select(title="Method", value="PCA", width=100, name="projector-method",
                                    options=["PCA"] + ["t-SNE"] * TSNE_AVAILABLE + ["UMAP"] * UMAP_AVAILABLE)
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
        self.note = Div(text="No embeddings in this logdir yet.", name="projector-note")
        self.controls = row(self.run_select, self.tensor_select, self.step_select, self.method_select,
                            self.dims_select, self.label_select, visible=False)
        self.front.visible = False
        # The side view joins the layout only in 3-D: a hidden plot still warns in the page that it "could not set
        # initial ranges" (BokehJS does not fit the ranges of a plot it does not draw).
        self.figures = row(self.front)
        self._layout = column(self.controls, self.note, self.figures)

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
        changed = False
        errors = []
        projectors = self.store.projectors()
        for run, asset in projectors.items():
            if asset.error is not None:             # half-written files (read again later), unsafe paths
                errors.append(f"Could not read {run}: {asset.error}")
            if asset.value is not None and self._configs.get(run, (None,))[0] != asset.version:
                self._configs[run] = (asset.version, asset.value)
                changed = True
        for run in [run for run in self._configs if projectors.get(run) is None or projectors[run].value is None]:
            del self._configs[run]
            changed = True
        if changed:
            self._draw()
        if errors:                                  # after the draw, which rewrites the note
            self.note.text = html.escape("; ".join(([self.note.text] if self.note.text else []) + errors))

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
            self._supersede()
            self.source.data = {k: [] for k in self.source.data}
            self._show_side(False)
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
        n = min(len(e.tensor), MAX_TSNE_POINTS if method == "t-SNE" else MAX_POINTS)
        key = shown[:5]
        if key == self._waiting:                    # on its way (only the colouring changed): drawn when it comes
            return
        self._supersede()
        if key not in self._cache:
            matrix = e.tensor[:n]
            doc = self._layout.document
            if served(doc) and (method != "PCA" or matrix.size > INLINE_PCA_VALUES):
                self._compute(doc, key, matrix, method, dims, n)
                return
            self._remember(key, reduce(matrix, method, dims))      # outside a server, or a small PCA
        coords, explained = self._cache[key]

        column_index = (e.metadata_header or ["label"]).index(self.label_select.value) \
            if e.metadata and self.label_select.value else None
        labels = [r[column_index] if column_index < len(r) else "" for r in e.metadata[:n]] \
            if column_index is not None else [""] * n
        category, colors = categories(labels)
        self.legend.visible = column_index is not None
        thumbs = [""] * n
        sprite_error = None
        if e.sprite:
            cut = min(n, MAX_THUMBNAILS)
            try:
                sprite = self.store.sprite(self.run_select.value, e)
                if sprite is not None:              # None: gone since the config was read
                    thumbs[:cut] = thumbnails(sprite, len(e.tensor), cut, name=e.sprite)
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
        rank = {c: i for i, c in enumerate(run_colours())}
        entries = sorted(first.items(), key=lambda item: rank.get(colors[item[1]], len(rank)))
        self.legend.items = [LegendItem(label=value(c), renderers=[self.points], index=j) for c, j in entries]
        self.hover.tooltips = _TOOLTIP_WITH_THUMB if any(thumbs) else [("label", "@label")]
        self._show_side(dims == 3)
        names = [f"{method} {j + 1}" if explained is None else
                 f"PC{j + 1} ({explained[j]:.1%} of the variance)" if j < dims else "" for j in range(3)]
        self.front.xaxis.axis_label, self.front.yaxis.axis_label = names[0], names[1]
        self.side.xaxis.axis_label, self.side.yaxis.axis_label = names[2], names[1]
        total = len(e.tensor)
        note = f"{method} of {n} points in {e.tensor.shape[1]} dimensions"
        if n < total:
            note += f" (the first {n} of {total})"
        if e.kind == "exception":
            note += f"; NaN: {e.info.get('nan_count', 0)}, Inf: {e.info.get('inf_count', 0)} (drawn as 0)"
        if unmatched_note(e):                       # OneFlow's Projector stored labels / x of any count
            note += "; " + unmatched_note(e)
        self.note.text = html.escape(note + (sprite_error or ""))

    def _show_side(self, shown):
        self.side.visible = shown
        figures = [self.front, self.side] if shown else [self.front]
        if list(self.figures.children) != figures:
            self.figures.children = figures

    # ---------------------------------------------------------------------------------------------- off the IOLoop
    def _remember(self, key, result):
        if len(self._cache) > 16:
            self._cache.clear()
        self._cache[key] = result

    def _supersede(self):
        """Forget the reduction being computed for the page (cancelled if it has not started)."""
        if self._future is not None:
            self._future.cancel()
        self._waiting = self._future = None

    def _compute(self, doc, key, matrix, method, dims, n):
        """Reduce in ``WORKERS``; the points shown stay until the result is drawn (``_computed``)."""
        try:
            future = WORKERS.submit(method, matrix, dims)
        except Exception as error:                  # no worker could be started (the interpreter is stopping...)
            self.note.text = html.escape(f"{method} failed: {type(error).__name__}: {error}")
            return
        self._waiting, self._future = key, future
        self.note.text = html.escape(f"computing {method} of {n} points…")

        def done(future):                           # on a worker's thread: the document changes on its IOLoop
            if not future.cancelled():
                try:
                    doc.add_next_tick_callback(partial(self._computed, key, method, future))
                except Exception:                   # the session ended meanwhile
                    log.debug("projector result dropped: the session is gone", exc_info=True)
        future.add_done_callback(done)

    def _computed(self, key, method, future):
        error = future.exception()
        if error is None:
            self._remember(key, future.result())    # kept even when superseded: choosing it again is instant
        if key != self._waiting:                    # superseded by a newer choice
            return
        self._waiting = self._future = None
        if error is not None:
            first_line = (str(error).strip().splitlines() or [""])[0][:300]
            self.note.text = html.escape(f"{method} failed: {type(error).__name__}: {first_line}")
            return
        self.shown = None                           # draw it, with whatever is chosen now
        self._draw()


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
